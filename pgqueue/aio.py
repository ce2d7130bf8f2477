"""The asyncio client for producers: the same calls and retry policy over an async pool."""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Any, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool

from pgqueue import barrier as _barrier
from pgqueue import queue as _queue
from pgqueue.calls import Call
from pgqueue.client import connection_kwargs, log_notice, raise_translated
from pgqueue.queue import JSON, Message, QueueMetrics
from pgqueue.retry import NO_RETRY, RetryPolicy, is_dead_connection
from pgqueue.settings import describe_dsn, require_dsn, unreachable

T = TypeVar("T")
AsyncConnection = psycopg.AsyncConnection[Any]


async def execute_async(conn: AsyncConnection, call: Call[T]) -> T:
    """Run one call on the given async connection, inside whatever transaction it has."""
    async with conn.cursor() as cur:
        await cur.execute(call.sql, call.params)
        rows = await cur.fetchall() if cur.description is not None else []
    return call.result(rows)


async def _configure(conn: AsyncConnection) -> None:
    """What every pooled connection gets: pgqueue's notices logged (a read's poison drops)."""
    conn.add_notice_handler(log_notice)


class AsyncClient:
    """An asyncio pgqueue client over an async pool; every call retries dead connections."""

    def __init__(
        self,
        pool: AsyncConnectionPool[AsyncConnection],
        *,
        retry: RetryPolicy | None = None,
        owns_pool: bool = False,
        dsn_label: str = "the database",
        role: str | None = None,
    ) -> None:
        """Wrap an open async pool; `owns_pool` makes close() close it too; `role`: its login."""
        self.pool = pool
        self.retry = retry or RetryPolicy()
        self._owns_pool = owns_pool
        self._dsn_label = dsn_label
        self._role = role

    @classmethod
    async def from_dsn(
        cls,
        dsn: str | None = None,
        *,
        min_size: int = 1,
        max_size: int = 10,
        connect_timeout: float = 5.0,
        prepare_threshold: int | None = 5,
        retry: RetryPolicy | None = None,
    ) -> AsyncClient:
        """Open an async pool on dsn (else $PGQUEUE_DSN / $DATABASE_URL); fails fast if down."""
        resolved = require_dsn(dsn)
        label = describe_dsn(resolved)
        pool: AsyncConnectionPool[AsyncConnection] = AsyncConnectionPool(
            resolved,
            min_size=min_size,
            max_size=max_size,
            kwargs=connection_kwargs(connect_timeout, prepare_threshold),
            configure=_configure,
            timeout=max(connect_timeout, 1.0),
            open=False,
            name="pgqueue-async",
        )
        try:
            conn = await psycopg.AsyncConnection.connect(
                resolved, connect_timeout=max(1, int(connect_timeout))
            )
            role = conn.info.user
            await conn.close()
        except psycopg.OperationalError as exc:
            raise unreachable(label, connect_timeout, exc) from exc
        await pool.open(wait=False)
        return cls(pool, retry=retry, owns_pool=True, dsn_label=label, role=role)

    async def close(self) -> None:
        """Close the pool if this client opened it."""
        if self._owns_pool:
            await self.pool.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def run(self, call: Call[T], conn: AsyncConnection | None = None) -> T:
        """Execute a call: on `conn` as is, or on the pool, retried on dead connections only."""
        try:
            if conn is not None:
                return await execute_async(conn, call)
            policy = self.retry if call.retryable else NO_RETRY
            async for attempt in policy.async_retrying(call.name):
                with attempt:
                    try:
                        async with self.pool.connection() as pooled:
                            return await execute_async(pooled, call)
                    except psycopg.OperationalError as exc:
                        if is_dead_connection(exc):
                            await self.pool.check()
                        raise
        except psycopg.Error as exc:
            raise_translated(exc, call.name, self._dsn_label, self._role)
            raise
        raise AssertionError("unreachable: tenacity re-raises the last error")

    async def create_queue(self, queue: str, *, max_attempts: int = 5) -> None:
        """Make sure the queue exists with this max_attempts."""
        await self.run(_queue.create_queue(queue, max_attempts))

    async def send(
        self,
        queue: str,
        message: JSON,
        *,
        headers: dict[str, Any] | None = None,
        delay: int = 0,
        dedupe_key: str | None = None,
        conn: AsyncConnection | None = None,
    ) -> int:
        """Enqueue a message; its msg_id (same retry guarantees as Client.send)."""
        return await self.run(_queue.send(queue, message, headers, delay, dedupe_key), conn)

    async def send_batch(
        self,
        queue: str,
        messages: Sequence[JSON],
        *,
        headers: Sequence[dict[str, Any] | None] | None = None,
        delay: int = 0,
        conn: AsyncConnection | None = None,
    ) -> list[int]:
        """Enqueue all messages atomically; their msg_ids in order."""
        return await self.run(_queue.send_batch(queue, messages, headers, delay), conn)

    async def fan_out(
        self,
        queue: str,
        messages: Sequence[JSON],
        *,
        callback_queue: str,
        callback_message: JSON,
        barrier_id: str | None = None,
        headers: dict[str, Any] | None = None,
        deadline_seconds: int | None = None,
        conn: AsyncConnection | None = None,
    ) -> str:
        """Send the members and arm a barrier atomically (same guarantees as Client.fan_out)."""
        call = _barrier.fan_out(
            queue, messages, callback_queue, callback_message, barrier_id, headers, deadline_seconds
        )
        return await self.run(call, conn)

    async def read(self, queue: str, *, vt: int = 30, qty: int = 1) -> list[Message]:
        """Claim up to qty messages for vt seconds."""
        return await self.run(_queue.read(queue, vt, qty))

    async def delete(self, queue: str, msg_id: int) -> bool:
        """Ack by deleting; False if already acked."""
        return await self.run(_queue.delete(queue, msg_id))

    async def metrics(self, queue: str) -> QueueMetrics:
        """Size and age figures of one queue."""
        return await self.run(_queue.metrics(queue))
