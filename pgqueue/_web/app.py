"""The dashboard assembled: its routes, its middleware and its lifespan, over an AsyncClient.

Every page is server-rendered HTML; a few lines of JS refresh marked parts of
it while the tab is visible. Every action is a POST from a confirmation page,
carrying a CSRF token, and is logged with the actor who made it. A read-only
app registers no POST routes and draws no controls, and its own connections
are read-only sessions, so a missed path fails in the database as well.

One module a page area: queues.py (the overview and one queue), poison.py
(with selection.py), barriers.py, workflows.py, workers.py; login.py (and
/healthz). What they share: state.py (the app's state and client),
snapshot.py (the overview's cache), pages.py (rendering, redirects, the
action log), guard.py (the middleware), error_pages.py, headers.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import psycopg
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from pgqueue._async_client import AsyncClient
from pgqueue._errors import PgQueueError
from pgqueue._log import get_logger
from pgqueue._web.barriers import barrier_list, barrier_page
from pgqueue._web.error_pages import http_error
from pgqueue._web.guard import Guard
from pgqueue._web.headers import Dashboard
from pgqueue._web.login import healthz, login
from pgqueue._web.pages import HERE
from pgqueue._web.poison import poison_act, poison_confirm, poison_list, poison_message
from pgqueue._web.queues import overview, queue_action, queue_page
from pgqueue._web.security import AuthCallable, Credentials, Signer
from pgqueue._web.snapshot import refresh_snapshot
from pgqueue._web.state import State, check_grants, web_dsn
from pgqueue._web.workers import workers_page
from pgqueue._web.workflows import workflow_list, workflow_page

log = get_logger("pgqueue.web")


def create_app(
    dsn: str | None = None,
    *,
    client: AsyncClient | None = None,
    read_only: bool = False,
    auth: AuthCallable | None = None,
    secret: str | None = None,
    allow_owner: bool = False,
    allowed_hosts: Sequence[str] | None = None,
) -> Starlette:
    """The dashboard as an ASGI app, to serve alone or mount under a path of your own app.

    allowed_hosts: the host names requests may name (their Host header); None for any.
    """
    st = State(
        dsn=dsn,
        read_only=read_only,
        signer=Signer.from_env(secret),
        creds=Credentials.from_env(),
        auth=auth,
        allow_owner=allow_owner,
        hosts=None if allowed_hosts is None else frozenset(allowed_hosts),
        client=client,
    )
    if client is None:
        web_dsn(dsn, read_only)  # fail now on a missing DSN, not on the first request
    routes: list[Route | Mount] = [
        Route("/", overview),
        Route("/queue", queue_page),
        Route("/poison", poison_list),
        Route("/poison/message", poison_message),
        Route("/barriers", barrier_list),
        Route("/barrier", barrier_page),
        Route("/workflows", workflow_list),
        Route("/workflow", workflow_page),
        Route("/workers", workers_page),
        Route("/healthz", healthz),
        Route("/login", login, methods=["GET", "POST"]),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    if not read_only:
        routes += [
            Route("/queue/{action:str}", queue_action, methods=["POST"]),
            Route("/poison/confirm", poison_confirm),
            Route("/poison/act", poison_act, methods=["POST"]),
        ]

    @asynccontextmanager
    async def closing(app: Starlette) -> AsyncIterator[None]:
        try:  # the first page should not wait for the overview's query
            await refresh_snapshot(st)
        except (psycopg.Error, PgQueueError) as exc:
            log.warning("web.snapshot_failed", error=str(exc).strip())
        yield
        task = st.snapshot.task
        if task is not None and not task.done():
            await asyncio.wait([task], timeout=5)  # a refresh under way ends before its pool
        if st.client is not None and st.owns_client:
            await st.client.close()

    app = Dashboard(
        routes=routes,
        middleware=[Middleware(Guard)],
        exception_handlers={HTTPException: http_error},
        lifespan=closing,
    )
    app.state.pgqueue = st
    return app


# check_grants and web_dsn live in state.py; `pgqueue web` (pgqueue/_cli/web.py) imports them here.
__all__ = ["check_grants", "create_app", "web_dsn"]
