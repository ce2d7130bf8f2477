"""The connection plumbing both clients share: pools, running a call, retries, errors, notices.

`Client` and `AsyncClient` are thin facades over this module: what a pool
looks like, how a call runs (on the caller's connection as is, or on the pool
with the dead-connection retry policy), how a database error becomes a
`PgQueueError` and what the SQL tells by NOTICE are each written once here.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psycopg
import structlog
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from pgqueue._calls import Call
from pgqueue._errors import ConnectionLost, InvalidArgument, translate
from pgqueue._retry import NO_RETRY, RetryPolicy, is_dead_connection, is_server_not_ready
from pgqueue._settings import (
    Unset,
    connect_failed,
    describe_dsn,
    prepare_threshold_from_env,
    require_dsn,
)

T = TypeVar("T")
log = structlog.get_logger("pgqueue")

Connection = psycopg.Connection[Any]
AsyncConnection = psycopg.AsyncConnection[Any]


def execute(conn: Connection, call: Call[T]) -> T:
    """Run one call on the given connection, inside whatever transaction it has."""
    with conn.cursor() as cur:
        cur.execute(call.sql, call.params)
        rows = cur.fetchall() if cur.description is not None else []
    return call.result(rows)


async def execute_async(conn: AsyncConnection, call: Call[T]) -> T:
    """Run one call on the given async connection, inside whatever transaction it has."""
    async with conn.cursor() as cur:
        await cur.execute(call.sql, call.params)
        rows = await cur.fetchall() if cur.description is not None else []
    return call.result(rows)


def raise_translated(
    exc: psycopg.Error, what: str, dsn_label: str, role: str | None = None
) -> None:
    """Re-raise a database error as the PgQueueError it means (or return to re-raise it as is).

    `role`, the login role of the connection, is named in a permission error.
    """
    if is_dead_connection(exc):
        raise ConnectionLost(
            f"{what}: lost the connection to {dsn_label} and could not get a working one"
            f" back ({str(exc).strip() or type(exc).__name__}); check that the server is up"
            " and reachable, then call again"
        ) from exc
    mapped = translate(exc, role)
    if mapped is not None:
        raise mapped from exc


# The NOTICE a read raises for each message it poison-dropped: the rows a read
# returns are only the ones it delivered.
SQLSTATE_POISONED_NOTICE = "PGQ10"
# The NOTICE a read of a paused queue raises: it returned nothing for that reason.
SQLSTATE_PAUSED_NOTICE = "PGQ11"


@dataclass(eq=False)
class Observers:
    """Who hears what a client's calls meet beside their results (a worker's metrics do).

    Callbacks run on the thread of the call (or the connection's notice
    handler); they must be quick and must not raise.
    """

    # the queue, once per message a read poison-dropped (reported by NOTICE)
    read_poisoned: list[Callable[[str], None]] = field(default_factory=list)
    # the call's name, once per retry on a fresh connection
    retried: list[Callable[[str], None]] = field(default_factory=list)
    # the queue, once per read that found it paused (reported by NOTICE)
    read_paused: list[Callable[[str], None]] = field(default_factory=list)

    def retry(self, what: str) -> None:
        """Tell every retry observer."""
        for callback in self.retried:
            callback(what)


def log_notice(diag: psycopg.errors.Diagnostic) -> str | None:
    """Log what pgqueue's SQL tells the client by NOTICE: one line per message a read poisoned.

    Returns the poisoned message's queue (None for any other notice).
    """
    if diag.sqlstate != SQLSTATE_POISONED_NOTICE:
        return None
    try:
        what = json.loads(diag.message_detail or "")
    except ValueError:
        return None
    log.warning(
        "message.poisoned",
        queue=what.get("queue"),
        msg_id=what.get("msg_id"),
        read_ct=what.get("read_ct"),
        reason=what.get("reason"),
        by="read",
    )
    queue = what.get("queue")
    return queue if isinstance(queue, str) else None


def paused_notice(diag: psycopg.errors.Diagnostic) -> str | None:
    """The queue a read found paused, when this is that NOTICE (else None); logged at DEBUG.

    Not above DEBUG: a worker reads its paused queues again every poll interval.
    """
    if diag.sqlstate != SQLSTATE_PAUSED_NOTICE:
        return None
    try:
        what = json.loads(diag.message_detail or "")
    except ValueError:
        return None
    queue = what.get("queue") if isinstance(what, dict) else None
    if not isinstance(queue, str):
        return None
    log.debug("read.paused", queue=queue, paused_by=what.get("paused_by"))
    return queue


def notice_handler(observers: Observers) -> Callable[[psycopg.errors.Diagnostic], None]:
    """What every pooled connection gets: notices logged, poison drops and pauses observed."""

    def handle(diag: psycopg.errors.Diagnostic) -> None:
        paused = paused_notice(diag)
        if paused is not None:
            for callback in observers.read_paused:
                callback(paused)
            return
        queue = log_notice(diag)
        if queue is not None:
            for callback in observers.read_poisoned:
                callback(queue)

    return handle


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
        resolved = require_dsn(dsn, dsn_source)
        if min_size < 0 or max_size < max(1, min_size):
            raise InvalidArgument(
                f"pool sizes must satisfy 0 <= min_size <= max_size and max_size >= 1,"
                f" got min_size={min_size} max_size={max_size}"
            )
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


def run_on_pool(
    pool: ConnectionPool[Connection],
    call: Call[T],
    retry: RetryPolicy,
    label: str,
    role: str | None,
    conn: Connection | None = None,
    observers: Observers | None = None,
) -> T:
    """Execute a call: on `conn` as is, or on the pool, retried on dead connections only."""
    try:
        if conn is not None:
            # The caller's transaction: retrying here could split it, so never.
            return execute(conn, call)
        policy = retry if call.retryable else NO_RETRY
        on_retry = observers.retry if observers is not None else None
        for attempt in policy.retrying(call.name, on_retry):
            with attempt:
                try:
                    with pool.connection() as pooled:
                        return execute(pooled, call)
                except psycopg.OperationalError as exc:
                    if is_dead_connection(exc):
                        # Other idle connections likely died with this one
                        # (server restart, PgBouncer reap): drop them now.
                        pool.check()
                    raise
    except psycopg.Error as exc:
        raise_translated(exc, call.name, label, role)
        raise
    raise AssertionError("unreachable: tenacity re-raises the last error")


async def run_on_async_pool(
    pool: AsyncConnectionPool[AsyncConnection],
    call: Call[T],
    retry: RetryPolicy,
    label: str,
    role: str | None,
    conn: AsyncConnection | None = None,
    observers: Observers | None = None,
) -> T:
    """The asyncio twin of run_on_pool."""
    try:
        if conn is not None:
            return await execute_async(conn, call)
        policy = retry if call.retryable else NO_RETRY
        on_retry = observers.retry if observers is not None else None
        async for attempt in policy.async_retrying(call.name, on_retry):
            with attempt:
                try:
                    async with pool.connection() as pooled:
                        return await execute_async(pooled, call)
                except psycopg.OperationalError as exc:
                    if is_dead_connection(exc):
                        await pool.check()
                    raise
    except psycopg.Error as exc:
        raise_translated(exc, call.name, label, role)
        raise
    raise AssertionError("unreachable: tenacity re-raises the last error")
