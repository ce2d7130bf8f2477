"""What every page and action shares: the templates, rendering, redirects and the action log.

Every page is drawn by `render`, which adds what each needs (the actor, a
CSRF token, the mode); every action ends in `redirect` and is recorded by
`log_action` with the actor who made it and the address it came from.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.templating import Jinja2Templates

from pgqueue._errors import BarrierNotFound, QueueNotFound, WorkflowNotFound
from pgqueue._log import get_logger
from pgqueue._web import formats
from pgqueue._web.state import state_of

HERE = Path(__file__).parent  # the templates and static files ship beside the code
PAGE = 50  # rows per page of messages, poison and barriers

log = get_logger("pgqueue.web")

# What a page answers 404 for; every other error is the database's (503) or a bug (500).
NOT_FOUND = (QueueNotFound, BarrierNotFound, WorkflowNotFound)

templates = Jinja2Templates(
    env=jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(HERE / "templates")),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
)
templates.env.filters["age"] = formats.age
templates.env.filters["since"] = formats.since_text
templates.env.filters["size"] = formats.size
templates.env.globals["urlencode"] = urlencode
templates.env.globals["cli"] = formats.command


async def render(request: Request, template: str, **context: Any) -> Response:
    """A page, with what every page needs: the actor, a CSRF token, the mode."""
    st = state_of(request)
    actor: str = request.state.actor
    context.update(
        actor=actor,
        read_only=st.read_only,
        csrf=st.signer.sign("csrf", actor),
        root=request.scope.get("root_path", ""),
        now=datetime.now(UTC),
    )
    response: Response = templates.TemplateResponse(request, template, context)
    return response


def redirect(request: Request, path: str, **params: str) -> RedirectResponse:
    """A 303 to `path` under the app's mount point, with `params` as its query."""
    root = request.scope.get("root_path", "")
    query = ("?" + urlencode(params)) if params else ""
    return RedirectResponse(f"{root}{path}{query}", status_code=303)


def log_action(request: Request, action: str, **fields: Any) -> None:
    """Record an action with the actor who made it and the address it came from."""
    log.info(
        "web.action",
        action=action,
        actor=request.state.actor,
        address=request.client.host if request.client else None,
        **fields,
    )
