"""Keeping to the primary: a connection to a read-only server is refused, dropped, and named.

After a failover a pooled connection may point at a standby, and every
write there fails with 25006. The pool's check refuses such a connection
from what the server reported at login (no round trip); after an error a
connection to a read-only server is closed and its idle siblings replaced;
and a call that gave up says it met a read-only server rather than a pool
timeout that says nothing of why (docs/design/failover.md).
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from pgqueue._errors import ConnectionLost
from pgqueue._execute import AsyncConnection, Connection
from pgqueue._notices import Observers
from pgqueue._retry import is_dead_connection, is_read_only_server


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


def drain(pool: ConnectionPool[Connection]) -> None:
    """Replace every connection of the pool (those in use when they come back)."""
    pool.drain()


async def drain_async(pool: AsyncConnectionPool[AsyncConnection]) -> None:
    """The asyncio twin of drain."""
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
        drain(pool)
    elif is_dead_connection(exc):
        conn.close()


async def drop_broken_async(
    pool: AsyncConnectionPool[AsyncConnection], conn: AsyncConnection, exc: BaseException
) -> None:
    """The asyncio twin of drop_broken."""
    exc = _database_error(exc)
    if is_read_only_server(exc):
        await conn.close()
        await drain_async(pool)
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
