"""The connection plumbing both clients share: pools, running a call, retries, errors, notices.

`Client` and `AsyncClient` are thin facades over this module: what a pool
looks like, how a call runs (on the caller's connection as is, or on the pool
with the dead-connection retry policy), how a database error becomes a
`PgQueueError` and what the SQL tells by NOTICE are each written once here.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psycopg
from psycopg import pq
from psycopg.adapt import AdaptersMap
from psycopg.rows import tuple_row
from psycopg.types.json import JsonbLoader, JsonLoader
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from pgqueue._calls import Call
from pgqueue._errors import ConnectionLost, InvalidArgument, PgQueueError, translate
from pgqueue._log import get_logger
from pgqueue._retry import (
    NO_RETRY,
    RetryPolicy,
    is_dead_connection,
    is_read_only_server,
    is_server_not_ready,
)
from pgqueue._settings import (
    Unset,
    connect_failed,
    describe_dsn,
    dsn_hosts,
    find_dsn,
    prepare_threshold_from_env,
    require_dsn,
)

JSON_OID = 114
JSONB_OID = 3802
T = TypeVar("T")
log = get_logger()

Connection = psycopg.Connection[Any]
AsyncConnection = psycopg.AsyncConnection[Any]


def _as_psycopg_loads(adapters: AdaptersMap) -> None:
    """JSON loaded as psycopg does it, on a cursor of a connection a framework configured.

    Django and SQLAlchemy load json and jsonb as text on their connections, to
    parse it themselves; pgqueue's calls expect values. Only the cursor's own
    copy of the adapters changes, never the connection's.
    """
    for oid, loader in ((JSONB_OID, JsonbLoader), (JSON_OID, JsonLoader)):
        if adapters.get_loader(oid, pq.Format.TEXT) is not loader:
            adapters.register_loader(oid, loader)


def execute(conn: Connection, call: Call[T]) -> T:
    """Run one call on the given connection, inside whatever transaction it has.

    The cursor is psycopg's own, whatever cursor class or loaders a framework
    set on the connection (a connection from Django or SQLAlchemy).
    """
    with psycopg.Cursor(conn, row_factory=tuple_row) as cur:
        _as_psycopg_loads(cur.adapters)
        cur.execute(call.sql, call.params)
        # In pipeline mode the result has not arrived yet (no description):
        # fetching syncs the pipeline, and raises the call's error here.
        piped = conn.info.pipeline_status != pq.PipelineStatus.OFF
        rows = cur.fetchall() if piped or cur.description is not None else []
    return call.result(rows)


async def execute_async(conn: AsyncConnection, call: Call[T]) -> T:
    """Run one call on the given async connection, inside whatever transaction it has."""
    async with psycopg.AsyncCursor(conn, row_factory=tuple_row) as cur:
        _as_psycopg_loads(cur.adapters)
        await cur.execute(call.sql, call.params)
        piped = conn.info.pipeline_status != pq.PipelineStatus.OFF  # as execute()
        rows = await cur.fetchall() if piped or cur.description is not None else []
    return call.result(rows)


def raise_translated(
    exc: psycopg.Error, what: str, dsn_label: str, role: str | None = None
) -> None:
    """Re-raise a database error as the PgQueueError it means (or return to re-raise it as is).

    `role`, the login role of the connection, is named in a permission error.
    """
    if is_read_only_server(exc):
        raise ConnectionLost(
            f"{what}: reached a read-only server at {dsn_label} (a standby after a failover?)"
            f" and could not get a read-write one ({str(exc).strip() or type(exc).__name__});"
            " list every node in the DSN with target_session_attrs=read-write"
            " (host=a,b port=5432,5432 target_session_attrs=read-write), then call again"
        ) from exc
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
    # when (time.monotonic()) and why the pool last refused a connection to a
    # read-only server: a call that then timed out waiting for one says so
    refused_read_only: tuple[float, str] | None = None

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


def _read_only_reason(conn: Connection | AsyncConnection, asked: bool = False) -> str | None:
    """Why a connection cannot write, from what the server reported at login (no round trip).

    Both parameters are reported by PostgreSQL 14 and later, and again when
    they change (a promotion, a reload); an older server reports neither
    (None, accepted). `asked`: the DSN itself sets default_transaction_read_only
    (a read-only dashboard), so only a hot standby is refused.
    """
    info = conn.info
    if info.parameter_status("in_hot_standby") == "on":
        return "the server is a hot standby"
    if not asked and info.parameter_status("default_transaction_read_only") == "on":
        return "the server's default_transaction_read_only is on"
    return None


# `options` that make every transaction read-only by the client's own choice.
_ASKS_READ_ONLY = re.compile(
    r"(?:-c\s*|--)default_transaction_read_only\s*=\s*(?:on|true|yes|1)\b", re.IGNORECASE
)


def asks_read_only(dsn: str) -> bool:
    """Whether the DSN's own `options` set default_transaction_read_only on."""
    try:
        options = psycopg.conninfo.conninfo_to_dict(dsn).get("options") or ""
    except psycopg.ProgrammingError:
        return False
    return bool(_ASKS_READ_ONLY.search(str(options)))


def _refused(conn: Connection | AsyncConnection, observers: Observers, asked: bool) -> str | None:
    reason = _read_only_reason(conn, asked)
    if reason is not None:
        observers.refused_read_only = (time.monotonic(), reason)
    return reason


def reject_read_only(observers: Observers, asked: bool = False) -> Callable[[Connection], None]:
    """The pool's check: a connection to a read-only server is closed (discarded), not served.

    `asked`: the DSN sets default_transaction_read_only itself (asks_read_only).
    """

    def check(conn: Connection) -> None:
        reason = _refused(conn, observers, asked)
        if reason is not None:
            conn.close()
            raise psycopg.OperationalError(f"connection rejected: {reason}")

    return check


def reject_read_only_async(
    observers: Observers, asked: bool = False
) -> Callable[[AsyncConnection], Awaitable[None]]:
    """The async pool's check, as reject_read_only."""

    async def check(conn: AsyncConnection) -> None:
        reason = _refused(conn, observers, asked)
        if reason is not None:
            await conn.close()
            raise psycopg.OperationalError(f"connection rejected: {reason}")

    return check


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


def _drain(pool: ConnectionPool[Connection]) -> None:
    """Replace every connection of the pool (those in use when they come back)."""
    pool.drain()


async def _drain_async(pool: AsyncConnectionPool[AsyncConnection]) -> None:
    await pool.drain()


def drop_broken(pool: ConnectionPool[Connection], conn: Connection, exc: BaseException) -> None:
    """After an error on a pooled connection: close it if dead or read-only, never give it back.

    A connection to a read-only server is IDLE after its error, so the pool
    would serve it again; and its idle siblings probably point at the same
    node, so they are replaced too. `exc` may be the ConnectionLost that a
    call on the connection raised for such an error.
    """
    exc = _database_error(exc)
    if is_read_only_server(exc):
        conn.close()
        _drain(pool)
    elif is_dead_connection(exc):
        conn.close()


async def drop_broken_async(
    pool: AsyncConnectionPool[AsyncConnection], conn: AsyncConnection, exc: BaseException
) -> None:
    """The asyncio twin of drop_broken."""
    exc = _database_error(exc)
    if is_read_only_server(exc):
        await conn.close()
        await _drain_async(pool)
    elif is_dead_connection(exc):
        await conn.close()


def _database_error(exc: BaseException) -> BaseException:
    """The error itself, or for a ConnectionLost the database error it translated."""
    if isinstance(exc, ConnectionLost) and exc.__cause__ is not None:
        return exc.__cause__
    return exc


def last_word(
    last: psycopg.Error,
    read_only: psycopg.Error | None,
    observers: Observers | None,
    started: float,
) -> psycopg.Error:
    """The error a failed call is reported by: a read-only server it met beats a pool timeout.

    The pool's check refuses connections to a read-only server, so the last
    attempt often ends in a PoolTimeout that says nothing of why.
    """
    if not is_dead_connection(last) or is_read_only_server(last):
        return last
    if read_only is not None:
        return read_only
    refused = observers.refused_read_only if observers is not None else None
    if refused is not None and refused[0] >= started:
        return psycopg.errors.ReadOnlySqlTransaction(
            f"the pool refused every connection it opened: {refused[1]}"
        )
    return last


def _raise_for_callers(exc: psycopg.Error, what: str) -> None:
    """On the caller's own connection, a dead or read-only server is the caller's to handle.

    Nothing was retried (the transaction is the caller's), so the pool's
    words ("could not get a working one back, call again") would mislead.
    """
    if is_read_only_server(exc):
        raise ConnectionLost(
            f"{what}: the connection you passed is to a read-only server (a standby after a"
            f" failover?): {str(exc).strip()}; roll back, and redo the transaction on a"
            " connection to the primary"
        ) from exc
    if is_dead_connection(exc):
        raise ConnectionLost(
            f"{what}: the connection you passed is gone ({str(exc).strip() or type(exc).__name__});"
            " the server rolled back the transaction open on it (in autocommit, this call's"
            " outcome is unknown): redo the work on a new connection"
        ) from exc


def run_on_pool(
    pool: ConnectionPool[Connection],
    call: Call[T],
    retry: RetryPolicy,
    label: str,
    role: str | None,
    conn: Connection | None = None,
    observers: Observers | None = None,
) -> T:
    """Execute a call: on `conn` as is, or on the pool, retried on dead connections only.

    A connection to a read-only server (is_read_only_server) is closed, the
    pool's idle ones are replaced, and the call is retried on a fresh one.
    """
    read_only: psycopg.Error | None = None
    started = time.monotonic()
    try:
        if conn is not None:
            # The caller's transaction: retrying here could split it, so never.
            try:
                return execute(conn, call)
            except psycopg.Error as exc:
                _raise_for_callers(exc, call.name)
                raise
        policy = retry if call.retryable else NO_RETRY
        on_retry = observers.retry if observers is not None else None
        for attempt in policy.retrying(call.name, on_retry):
            with attempt:
                try:
                    with pool.connection() as pooled:
                        try:
                            return execute(pooled, call)
                        except psycopg.Error as exc:
                            if is_read_only_server(exc):
                                # Its status is IDLE: given back as is, the pool
                                # would serve it again. Closed, it is discarded.
                                pooled.close()
                            raise
                except psycopg.Error as exc:
                    if is_read_only_server(exc):
                        read_only = exc
                        # Every idle connection probably points at the same
                        # node (a failover, a flipped endpoint): replace them.
                        _drain(pool)
                    elif is_dead_connection(exc):
                        # Other idle connections likely died with this one
                        # (server restart, PgBouncer reap): drop them now.
                        pool.check()
                    raise
    except psycopg.Error as exc:
        raise_translated(last_word(exc, read_only, observers, started), call.name, label, role)
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
    read_only: psycopg.Error | None = None
    started = time.monotonic()
    try:
        if conn is not None:
            try:
                return await execute_async(conn, call)
            except psycopg.Error as exc:
                _raise_for_callers(exc, call.name)
                raise
        policy = retry if call.retryable else NO_RETRY
        on_retry = observers.retry if observers is not None else None
        async for attempt in policy.async_retrying(call.name, on_retry):
            with attempt:
                try:
                    async with pool.connection() as pooled:
                        try:
                            return await execute_async(pooled, call)
                        except psycopg.Error as exc:
                            if is_read_only_server(exc):
                                await pooled.close()
                            raise
                except psycopg.Error as exc:
                    if is_read_only_server(exc):
                        read_only = exc
                        await _drain_async(pool)
                    elif is_dead_connection(exc):
                        await pool.check()
                    raise
    except psycopg.Error as exc:
        raise_translated(last_word(exc, read_only, observers, started), call.name, label, role)
        raise
    raise AssertionError("unreachable: tenacity re-raises the last error")
