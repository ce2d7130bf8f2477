"""What every mixin of a client needs from its core: run a call, lend a connection."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import TypeVar

import psycopg

from pgqueue._calls import Call
from pgqueue._connection import AsyncConnection, Connection

T = TypeVar("T")


class SyncRunner:
    """A blocking client's core (Client provides these)."""

    def run(self, call: Call[T], conn: Connection | None = None) -> T:
        """Execute a call: on `conn` as is, or on the pool, retried on dead connections only."""
        raise NotImplementedError

    def connection(self) -> AbstractContextManager[Connection]:
        """A pooled connection (autocommit) for the caller's own transaction work."""
        raise NotImplementedError

    def _raise(self, exc: psycopg.Error, what: str) -> None:
        """Raise the PgQueueError a database error means, or return to re-raise it as is."""
        raise NotImplementedError


class AsyncRunner:
    """An asyncio client's core (AsyncClient provides these)."""

    async def run(self, call: Call[T], conn: AsyncConnection | None = None) -> T:
        """Execute a call: on `conn` as is, or on the pool, retried on dead connections only."""
        raise NotImplementedError

    def connection(self) -> AbstractAsyncContextManager[AsyncConnection]:
        """A pooled connection (autocommit) for the caller's own transaction work."""
        raise NotImplementedError

    def _raise(self, exc: psycopg.Error, what: str) -> None:
        """Raise the PgQueueError a database error means, or return to re-raise it as is."""
        raise NotImplementedError
