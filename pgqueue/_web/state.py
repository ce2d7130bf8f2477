"""What the dashboard keeps between requests, and its one client to the database.

The client is opened on first use, with the dashboard's session settings (a
statement timeout; read-only sessions for a read-only app), and its role is
checked once: a role that cannot operate pgqueue, or holds more than it
should, is refused before any page is drawn.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from starlette.requests import Request

from pgqueue._async_client import AsyncClient
from pgqueue._errors import InvalidArgument, PgQueueError
from pgqueue._log import get_logger
from pgqueue._retry import RetryPolicy
from pgqueue._settings import resolve_dsn
from pgqueue._web import queries
from pgqueue._web.security import AuthCallable, Credentials, Signer

log = get_logger("pgqueue.web")

# A page should answer or fail within seconds, not wait out a worker's retry budget.
WEB_RETRY = RetryPolicy(attempts=3, deadline_seconds=5.0)


@dataclass
class Snapshot:
    """The overview's figures, shared by every viewer, refreshed at most so often."""

    rows: list[queries.QueueRow] = field(default_factory=list)
    taken: float = 0.0  # time.monotonic() of the last refresh
    cost: float = 0.0  # seconds the last refresh took
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    task: asyncio.Task[None] | None = None  # the refresh running behind the pages

    def stale(self) -> bool:
        """Whether the figures are older than max(5 s, 10 x what the query costs)."""
        return time.monotonic() - self.taken > max(5.0, 10 * self.cost)


@dataclass
class State:
    """What the app keeps between requests."""

    dsn: str | None
    read_only: bool
    signer: Signer
    creds: Credentials
    auth: AuthCallable | None
    allow_owner: bool
    hosts: frozenset[str] | None = None  # the Host headers served; None: any
    client: AsyncClient | None = None
    owns_client: bool = False
    checked: bool = False
    snapshot: Snapshot = field(default_factory=Snapshot)
    sampled: float = 0.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class RefusedRole(PgQueueError):
    """The dashboard's login role is not one it should run as."""


def state_of(request: Request) -> State:
    """The State of the app serving this request."""
    st: State = request.app.state.pgqueue
    return st


def web_dsn(dsn: str | None, read_only: bool) -> str:
    """The DSN with the dashboard's session settings: a statement timeout; read-only if asked."""
    resolved = resolve_dsn(dsn)
    if resolved is None:
        raise InvalidArgument("no database given: pass --dsn, or set PGQUEUE_DSN (or DATABASE_URL)")
    options = conninfo_to_dict(resolved).get("options") or ""
    extra = "-c statement_timeout=15000"
    if read_only:
        extra += " -c default_transaction_read_only=on"
    return make_conninfo(resolved, options=f"{options} {extra}".strip())


async def client_of(state: State) -> AsyncClient:
    """The app's client, opened (and its role checked) on first use."""
    if state.client is not None and state.checked:
        return state.client
    async with state.lock:
        if state.client is None:
            state.client = await _open_client(state)
            state.owns_client = True
        if not state.checked:
            grants = await state.client.run(queries.GRANTS)
            check_grants(grants, state.allow_owner)
            if state.read_only and not grants.read_only_session:
                log.warning(
                    "web.session_settings_unsupported",
                    detail="the server or a pooler ignored default_transaction_read_only:"
                    " read-only rests on the dashboard's routes alone",
                )
            state.checked = True
    return state.client


async def _open_client(state: State) -> AsyncClient:
    """A pool with the dashboard's session settings; without them behind a pooler refusing them."""
    try:
        return await AsyncClient.from_dsn(
            web_dsn(state.dsn, state.read_only),
            min_size=1,
            max_size=4,
            retry=WEB_RETRY,
            connect_timeout=5.0,
        )
    except (psycopg.Error, PgQueueError) as exc:
        if "unsupported startup parameter" not in str(exc):
            raise
    log.warning(
        "web.session_settings_unsupported",
        detail="the connection refused startup options (a pooler?): no statement timeout,"
        " and read-only rests on the dashboard's routes alone",
    )
    return await AsyncClient.from_dsn(
        resolve_dsn(state.dsn), min_size=1, max_size=4, retry=WEB_RETRY, connect_timeout=5.0
    )


def check_grants(grants: queries.Grants, allow_owner: bool) -> None:
    """Refuse a role that cannot operate pgqueue, or holds more than it should (unless allowed)."""
    if (grants.superuser or grants.owner) and not allow_owner:
        what = "a superuser" if grants.superuser else "the owner of the pgqueue schema"
        raise RefusedRole(
            f"role {grants.role!r} is {what}: run the dashboard as a role that holds"
            " pgqueue_operator and nothing more (docs/dashboard.md), or pass --allow-owner"
        )
    if not (grants.operator or grants.superuser or grants.owner):
        raise RefusedRole(
            f"role {grants.role!r} lacks pgqueue_operator: GRANT pgqueue_operator TO {grants.role}"
        )
