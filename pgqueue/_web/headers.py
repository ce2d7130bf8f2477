"""The security headers, on every response the dashboard sends.

They are set on the way out of the whole app, outside Starlette's own error
handling, not by a page or a middleware inside it: a 500 that
ServerErrorMiddleware writes, a 404 or 405 of the router, a refusal of the
login or of CSRF and a static file all carry the same headers as a page.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
    " object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
)

HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    # errors and static files too: one rule, and nothing of an operator's kept in a cache
    "Cache-Control": "no-store",
}


class SecurityHeaders:
    """An ASGI wrapper that sets HEADERS on every HTTP response passing through it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on; add the headers to the response's start, replacing any."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])  # optional in ASGI
                headers = MutableHeaders(scope=message)
                for name, value in HEADERS.items():
                    headers[name] = value
            await send(message)

        await self.app(scope, receive, send_secured)


class Dashboard(Starlette):
    """A Starlette app whose every response carries the security headers.

    Starlette puts its ServerErrorMiddleware outside every middleware an app
    declares, so a header middleware declared there misses the 500s: the
    headers wrap the whole stack instead.
    """

    def build_middleware_stack(self) -> ASGIApp:
        """The usual stack, inside SecurityHeaders."""
        return SecurityHeaders(super().build_middleware_stack())
