"""Running a call for a client: on the caller's connection as is, or on the pool with retries.

`Client` and `AsyncClient` are thin facades over this module: how a call
runs (on the caller's connection untouched, or on a pooled one under the
dead-connection retry policy) and how a database error becomes the
`PgQueueError` it means are each written once here. The rest of the
plumbing has a module each: `_execute` (one call on one connection),
`_pool` (opening the pool), `_primary` (read-only servers after a
failover), `_notices` (what the SQL tells by NOTICE).
"""

from __future__ import annotations

import time
from typing import TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from pgqueue._calls import Call
from pgqueue._errors import ConnectionLost, translate

# Re-exported: _worker/ and _cli/poison.py import Connection and execute from
# here, _worker/runner.py connect_refusal. The runners below look execute up
# in this module at each call (tests/client/test_faults.py counts calls so).
from pgqueue._execute import AsyncConnection, execute_async
from pgqueue._execute import Connection as Connection
from pgqueue._execute import execute as execute
from pgqueue._notices import Observers
from pgqueue._pool import connect_refusal as connect_refusal
from pgqueue._primary import drain, drain_async, last_word
from pgqueue._retry import NO_RETRY, RetryPolicy, is_dead_connection, is_read_only_server

T = TypeVar("T")


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
                        drain(pool)
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
                        await drain_async(pool)
                    elif is_dead_connection(exc):
                        await pool.check()
                    raise
    except psycopg.Error as exc:
        raise_translated(last_word(exc, read_only, observers, started), call.name, label, role)
        raise
    raise AssertionError("unreachable: tenacity re-raises the last error")
