"""The middleware in front of every page: who asks, from where, and with which form.

It refuses a Host header not served (DNS rebinding), a request without a
login (but for the login and health pages and the static files), a POST from
another site, and a NUL character in any parameter; it turns a stale form
token, a refused role, a database that does not answer and an invalid
argument into the response that says so. The rules themselves (signatures,
credentials, origins) are security.py's; the security headers, headers.py's.
"""

from __future__ import annotations

import psycopg
from starlette.datastructures import FormData
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from pgqueue._errors import ConnectionLost, InvalidArgument
from pgqueue._log import get_logger
from pgqueue._web import params
from pgqueue._web.error_pages import error_page
from pgqueue._web.pages import redirect
from pgqueue._web.security import CSRF_TTL_SECONDS, authenticate, same_origin
from pgqueue._web.state import RefusedRole, state_of

log = get_logger("pgqueue.web")


class Refused(Exception):
    """A state-changing request without a valid form token."""


class Guard(BaseHTTPMiddleware):
    """Authenticate, refuse NUL characters, and check CSRF on every POST (headers: headers.py)."""

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        """Refuse what must not pass; let the rest through."""
        st = state_of(request)
        if st.hosts is not None and _host_name(request) not in st.hosts:
            # a page on 127.0.0.1 must not answer a name that only resolves there
            # (DNS rebinding: another site's pages reading this one's)
            return PlainTextResponse("unknown host name; use 127.0.0.1", 400)
        path = request.url.path[len(request.scope.get("root_path", "")) :]
        open_paths = path in ("/healthz", "/login") or path.startswith("/static/")
        actor = await authenticate(request, st.creds, st.signer, st.auth)
        if actor is None and not open_paths:
            if st.creds.token is not None and not st.creds.users and request.method == "GET":
                response: Response = redirect(request, "/login")
            else:
                response = PlainTextResponse(
                    "authentication required", 401, {"WWW-Authenticate": 'Basic realm="pgqueue"'}
                )
            return response
        request.state.actor = actor or "anonymous"
        if request.method not in ("GET", "HEAD") and not same_origin(request):
            return _refuse(request, "the request came from another site")
        if (problem := params.nul_problem(request.query_params.multi_items())) is not None:
            return await error_page(request, 400, problem)
        try:
            response = await call_next(request)
        except Refused:
            response = _refuse(
                request, "missing or stale form token; reload the page and try again"
            )
        except RefusedRole as exc:
            response = PlainTextResponse(str(exc), 503)
        except (ConnectionLost, psycopg.OperationalError) as exc:
            log.warning("web.database_unreachable", error=str(exc).strip())
            response = PlainTextResponse(
                "the database does not answer; the page will work again once it does", 503
            )
        except InvalidArgument as exc:
            response = await error_page(request, 400, str(exc))
        return response


def _host_name(request: Request) -> str:
    host = request.headers.get("host", "")
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _refuse(request: Request, reason: str) -> Response:
    log.warning(
        "web.csrf_refused",
        path=request.url.path,
        reason=reason,
        actor=getattr(request.state, "actor", None),
        address=request.client.host if request.client else None,
    )
    return PlainTextResponse(f"refused: {reason}", 403)


async def checked_form(request: Request) -> FormData:
    """The POSTed form, once its CSRF token is proven to be this actor's, fresh, and signed here."""
    form = await request.form()
    token = form.get("csrf")
    st = state_of(request)
    if (
        not isinstance(token, str)
        or st.signer.verify("csrf", token, CSRF_TTL_SECONDS) != request.state.actor
    ):
        raise Refused
    if (problem := params.nul_problem(form.multi_items())) is not None:
        raise params.BadParameter(problem)
    return form
