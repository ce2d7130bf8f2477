"""The workers page: every registered worker, as the registry's heartbeats report it."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from pgqueue._web.pages import render
from pgqueue._web.state import client_of, state_of


async def workers_page(request: Request) -> Response:
    """Every registered worker: host, pid, queues, concurrency, in flight, last seen."""
    client = await client_of(state_of(request))
    workers = await client.list_workers()
    return await render(request, "workers.html", workers=workers)
