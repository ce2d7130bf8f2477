"""Opening a pool: the DSN and settings resolved once, the pool built, the server probed.

Both clients open their pool through `PoolSpec`, so the two cannot drift:
which DSN (else $PGQUEUE_DSN / $DATABASE_URL), which sizes, which connection
settings, what every pooled connection is given (the notice handler, the
read-only check), and how long a first connection waits for a server that
is not up yet.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from pgqueue._errors import ConnectionLost, InvalidArgument, PgQueueError
from pgqueue._execute import AsyncConnection, Connection
from pgqueue._log import get_logger
from pgqueue._notices import Observers, notice_handler
from pgqueue._primary import asks_read_only, reject_read_only, reject_read_only_async
from pgqueue._retry import is_server_not_ready
from pgqueue._settings import (
    Unset,
    connect_failed,
    describe_dsn,
    dsn_hosts,
    find_dsn,
    prepare_threshold_from_env,
    require_dsn,
)

log = get_logger()


def _log_hosts(dsn: str, label: str) -> None:
    """Log a multi-host DSN once, warning when libpq may settle on a standby among its hosts."""
    hosts = dsn_hosts(dsn)
    if len(hosts) < 2:
        return
    try:
        attrs = psycopg.conninfo.conninfo_to_dict(dsn).get("target_session_attrs")
    except psycopg.ProgrammingError:
        return
    if attrs in ("read-write", "primary"):
        log.info("dsn.multi_host", dsn=label, hosts=hosts, target_session_attrs=attrs)
        return
    # Without it libpq keeps the first host that answers, a standby included,
    # and every write there fails with 25006 until the pool drops it.
    log.warning(
        "dsn.multi_host",
        dsn=label,
        hosts=hosts,
        target_session_attrs=attrs or "any",
        advice="add target_session_attrs=read-write so connections go to the primary only",
    )


NO_DSN_GIVEN = (
    "no database given: pass a DSN to from_dsn(), e.g. 'postgresql://user@localhost:5432/dbname',"
    " or set PGQUEUE_DSN (or DATABASE_URL)"
)
"""What Client.from_dsn() and AsyncClient.from_dsn() say when called with no DSN to find."""


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """How both clients open their pool: one place, so the two cannot drift."""

    dsn: str
    label: str
    source: str
    min_size: int
    max_size: int
    connect_timeout: float
    kwargs: dict[str, Any]

    @classmethod
    def resolve(
        cls,
        dsn: str | None,
        min_size: int,
        max_size: int,
        connect_timeout: float,
        prepare_threshold: int | Unset | None,
        dsn_source: str | None = None,
    ) -> PoolSpec:
        """The DSN (else $PGQUEUE_DSN / $DATABASE_URL), checked sizes, and connection settings.

        Unset, prepare_threshold comes from $PGQUEUE_PREPARE_THRESHOLD (a
        number, or "off"), else 5; set it to None behind PgBouncer in
        transaction mode when it is older than 1.21. `dsn_source` names an
        explicit dsn in messages (the CLI's "--dsn"); a malformed DSN raises
        InvalidArgument here, before anything connects.
        """
        if isinstance(prepare_threshold, Unset):
            prepare_threshold = prepare_threshold_from_env()
        if dsn_source is None and find_dsn(dsn) is None:
            # A program has no --dsn to pass: require_dsn's line is the command's
            # (the CLI names its flag as dsn_source), this one is the API's.
            raise PgQueueError(NO_DSN_GIVEN)
        resolved = require_dsn(dsn, dsn_source)
        if min_size < 0 or max_size < max(1, min_size):
            raise InvalidArgument(
                f"pool sizes must satisfy 0 <= min_size <= max_size and max_size >= 1,"
                f" got min_size={min_size} max_size={max_size}"
            )
        _log_hosts(resolved.value, resolved.label)
        kwargs = {
            "autocommit": True,
            "connect_timeout": max(1, int(connect_timeout)),
            "prepare_threshold": prepare_threshold,
            "application_name": "pgqueue",
        }
        return cls(
            resolved.value,
            resolved.label,
            resolved.source,
            min_size,
            max_size,
            connect_timeout,
            kwargs,
        )

    # Back in a second after an outage of any length. The pool's own
    # reconnection backs off exponentially (1, 2, 4, 8 s ...) for up to
    # reconnect_timeout, and while it does, a caller waiting for a connection
    # waits on it: after a 10 s outage the first call got through 4 s after the
    # server was back (the soak's postgres_outage). So a reconnection gives up
    # after a second, and a caller waits a second at most before the retry
    # policy asks again; each new wait starts a new attempt at once.
    POOL_WAIT = 1.0
    RECONNECT_FOR = 1.0

    def pool(self, observers: Observers) -> ConnectionPool[Connection]:
        """A pool for a Client, not opened yet; its connections report to `observers`."""
        handler = notice_handler(observers)

        def configure(conn: Connection) -> None:
            conn.add_notice_handler(handler)

        return ConnectionPool(
            self.dsn,
            min_size=self.min_size,
            max_size=self.max_size,
            kwargs=self.kwargs,
            configure=configure,
            check=reject_read_only(observers, asks_read_only(self.dsn)),
            timeout=self.POOL_WAIT,
            reconnect_timeout=self.RECONNECT_FOR,
            open=False,
            name="pgqueue",
        )

    def async_pool(self, observers: Observers) -> AsyncConnectionPool[AsyncConnection]:
        """A pool for an AsyncClient, not opened yet; its connections report to `observers`."""
        handler = notice_handler(observers)

        async def configure_async(conn: AsyncConnection) -> None:
            conn.add_notice_handler(handler)

        return AsyncConnectionPool(
            self.dsn,
            min_size=self.min_size,
            max_size=self.max_size,
            kwargs=self.kwargs,
            configure=configure_async,
            check=reject_read_only_async(observers, asks_read_only(self.dsn)),
            timeout=self.POOL_WAIT,
            reconnect_timeout=self.RECONNECT_FOR,
            open=False,
            name="pgqueue-async",
        )

    def _waited_out(
        self, exc: psycopg.OperationalError, attempts: int, started: float, left: float
    ) -> bool:
        """Log the wait and say True while waiting may help; else False (the caller raises)."""
        if left <= 0 or not is_server_not_ready(exc):
            return False
        log.warning(
            "database.waiting",
            dsn=self.label,
            error=self._failed(exc, attempts, started).what,
            gives_up_in=round(left, 1),
        )
        return True

    def _failed(
        self, exc: psycopg.OperationalError, attempts: int, started: float
    ) -> ConnectionLost:
        elapsed = time.monotonic() - started
        return connect_failed(self.label, self.source, exc, attempts=attempts, elapsed=elapsed)

    def probe(self, wait_seconds: float) -> str:
        """The login role of a first connection; waits up to wait_seconds for a server not up."""
        started = time.monotonic()
        attempts = 0
        while True:
            attempts += 1
            try:
                with psycopg.connect(self.dsn, connect_timeout=self.kwargs["connect_timeout"]) as c:
                    return c.info.user
            except psycopg.OperationalError as exc:
                left = started + wait_seconds - time.monotonic()
                if not self._waited_out(exc, attempts, started, left):
                    raise self._failed(exc, attempts, started) from exc
                time.sleep(min(1.0, left))

    async def probe_async(self, wait_seconds: float) -> str:
        """The same, from asyncio."""
        started = time.monotonic()
        attempts = 0
        while True:
            attempts += 1
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.dsn, connect_timeout=self.kwargs["connect_timeout"]
                )
                role = conn.info.user
                await conn.close()
                return role
            except psycopg.OperationalError as exc:
                left = started + wait_seconds - time.monotonic()
                if not self._waited_out(exc, attempts, started, left):
                    raise self._failed(exc, attempts, started) from exc
                await asyncio.sleep(min(1.0, left))


def connect_refusal(conninfo: str, connect_timeout: int = 2) -> ConnectionLost | None:
    """One fresh connection: the error when it fails in a way waiting will not fix, else None.

    A pool that cannot connect only says it timed out; this tells a server
    that is down or starting (None: wait for it) from one that answered and
    refused (no such database or role, a password, pg_hba.conf).
    """
    started = time.monotonic()
    try:
        with psycopg.connect(conninfo, connect_timeout=connect_timeout):
            return None
    except psycopg.OperationalError as exc:
        if is_server_not_ready(exc):
            return None
        elapsed = time.monotonic() - started
        return connect_failed(describe_dsn(conninfo), None, exc, attempts=1, elapsed=elapsed)
