"""AsyncClient: Client's asyncio twin, the same methods (pgqueue._api) over an async pool."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool

from pgqueue import _migrate, _tracing
from pgqueue._adapt import AsyncConnArg, async_psycopg_of
from pgqueue._api.barrier import AsyncBarrierApi
from pgqueue._api.leases import AsyncLeaseApi
from pgqueue._api.poison import AsyncPoisonApi
from pgqueue._api.queue import AsyncQueueApi
from pgqueue._api.single_flight import AsyncSingleFlightApi
from pgqueue._api.workers import AsyncWorkersApi
from pgqueue._api.workflow import AsyncWorkflowApi
from pgqueue._calls import Call
from pgqueue._connection import raise_translated, run_on_async_pool
from pgqueue._execute import AsyncConnection
from pgqueue._notices import Observers
from pgqueue._pool import PoolSpec
from pgqueue._primary import drop_broken_async, last_word
from pgqueue._retry import RetryPolicy
from pgqueue._settings import UNSET, Unset

T = TypeVar("T")


class AsyncClient(
    AsyncQueueApi,
    AsyncLeaseApi,
    AsyncPoisonApi,
    AsyncBarrierApi,
    AsyncSingleFlightApi,
    AsyncWorkflowApi,
    AsyncWorkersApi,
):
    """An asyncio pgqueue client over an async pool; every call retries dead connections."""

    def __init__(
        self,
        pool: AsyncConnectionPool[AsyncConnection],
        *,
        retry: RetryPolicy | None = None,
        owns_pool: bool = False,
        dsn_label: str = "the database",
        role: str | None = None,
        observers: Observers | None = None,
        tracer_provider: Any = None,
    ) -> None:
        """Wrap an open async pool; `owns_pool` makes close() close it too; `role`: its login."""
        self.pool = pool
        self.retry = retry or RetryPolicy()
        self._owns_pool = owns_pool
        self._dsn_label = dsn_label
        self._role = role
        # What its calls meet beside their results (retries, a read's poison
        # drops); a pool built elsewhere reports no notices to it.
        self.observers = observers or Observers()
        # OpenTelemetry, resolved once (docs/observability.md): None is off.
        self.tracing = _tracing.resolve(tracer_provider)

    @classmethod
    async def from_dsn(
        cls,
        dsn: str | None = None,
        *,
        min_size: int = 1,
        max_size: int = 10,
        connect_timeout: float = 5.0,
        prepare_threshold: int | Unset | None = UNSET,
        retry: RetryPolicy | None = None,
        wait_seconds: float = 0.0,
        dsn_source: str | None = None,
        tracer_provider: Any = None,
    ) -> AsyncClient:
        """Open an async pool on dsn (else $PGQUEUE_DSN / $DATABASE_URL), as Client.from_dsn."""
        spec = PoolSpec.resolve(
            dsn, min_size, max_size, connect_timeout, prepare_threshold, dsn_source
        )
        observers = Observers()
        pool = spec.async_pool(observers)
        role = await spec.probe_async(wait_seconds)
        await pool.open(wait=False)
        return cls(
            pool,
            retry=retry,
            owns_pool=True,
            dsn_label=spec.label,
            role=role,
            observers=observers,
            tracer_provider=tracer_provider,
        )

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

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection]:
        """A pooled connection (autocommit) for the caller's own transaction work.

        A connection that dies or turns out to be on a read-only server inside
        the block is closed, not given back to the pool for the next caller.
        """
        started = time.monotonic()
        entered = False
        try:
            async with self.pool.connection() as conn:
                entered = True
                try:
                    yield conn
                except Exception as exc:
                    await drop_broken_async(self.pool, conn, exc)
                    raise
        except psycopg.Error as exc:
            if entered:
                raise
            last = last_word(exc, None, self.observers, started)
            raise_translated(last, "connection", self._dsn_label, self._role)
            raise

    async def run(self, call: Call[T], conn: AsyncConnArg | None = None) -> T:
        """Execute a call: on `conn` as is (no retry, no commit), or on the pool, retried."""
        own = None if conn is None else await async_psycopg_of(conn)
        return await run_on_async_pool(
            self.pool, call, self.retry, self._dsn_label, self._role, own, self.observers
        )

    def _raise(self, exc: psycopg.Error, what: str) -> None:
        raise_translated(exc, what, self._dsn_label, self._role)

    def conninfo(self) -> str:
        """The connection string this client's pool connects with (its password included)."""
        return str(self.pool.conninfo)

    async def migrate(self) -> list[str]:
        """Apply pending migrations (safe to run from many processes at once); names applied."""

        def apply() -> list[str]:
            # The migration runner is blocking: one plain connection, in a thread.
            with psycopg.connect(self.conninfo(), autocommit=True) as conn:
                return [m.name for m in _migrate.migrate(conn)]

        return await asyncio.to_thread(apply)
