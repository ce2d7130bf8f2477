"""The pages an error is shown on: a 400, 404, 405 or 409 within the dashboard's layout.

A request the guard has not let in yet (no actor) gets plain text: the
layout draws the actor and a form token, which it does not have. Any
other status is its detail in plain text.
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from pgqueue._web.pages import render


async def http_error(request: Request, exc: Exception) -> Response:
    """The response of an HTTPException: a page for the statuses a reader can act on."""
    assert isinstance(exc, HTTPException)
    if exc.status_code in (404, 405, 409, 400):
        return await error_page(request, exc.status_code, exc.detail, exc.headers)
    return PlainTextResponse(exc.detail, exc.status_code, exc.headers)


async def error_page(
    request: Request, status: int, detail: str, headers: Mapping[str, str] | None = None
) -> Response:
    """A page saying `detail` with `status` (plain text before the guard named an actor)."""
    if not hasattr(request.state, "actor"):
        return PlainTextResponse(detail, status, headers)
    response = await render(request, "error.html", status=status, detail=detail)
    response.status_code = status
    response.headers.update(headers or {})  # a 405's Allow
    return response
