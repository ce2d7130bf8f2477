"""The two pages the guard serves without a login: the token's login form and /healthz.

The login exchanges PGQUEUE_WEB_TOKEN for a signed session cookie (strict
same-site, HTTP-only, scoped to the mount point); what the cookie signs is
security.py's `Credentials.session_subject`.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from pgqueue._log import get_logger
from pgqueue._web.pages import redirect, templates
from pgqueue._web.security import SESSION_COOKIE, SESSION_TTL_SECONDS
from pgqueue._web.state import state_of

log = get_logger("pgqueue.web")


async def healthz(request: Request) -> Response:
    """Up: says only that."""
    return PlainTextResponse("ok")


async def login(request: Request) -> Response:
    """Exchange the token for a signed session cookie (GET shows the form)."""
    st = state_of(request)
    if request.method == "GET":
        return templates.TemplateResponse(
            request, "login.html", {"error": None, "root": request.scope.get("root_path", "")}
        )
    form = await request.form()
    token = str(form.get("token") or "")
    if not st.creds.bearer(token):
        log.warning("web.login_refused", client=request.client.host if request.client else None)
        return templates.TemplateResponse(
            request,
            "login.html",
            {"error": "wrong token", "root": request.scope.get("root_path", "")},
            status_code=403,
        )
    response = redirect(request, "/")
    response.set_cookie(
        SESSION_COOKIE,
        st.signer.sign("session", st.creds.session_subject()),
        max_age=SESSION_TTL_SECONDS,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path=request.scope.get("root_path", "") or "/",
    )
    return response
