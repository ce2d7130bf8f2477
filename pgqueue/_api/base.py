"""What every mixin of a client needs from its core: run a call, lend a connection."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any, TypeVar

import psycopg

from pgqueue._adapt import AsyncConnArg, ConnArg
from pgqueue._calls import Call
from pgqueue._execute import AsyncConnection, Connection
from pgqueue._tracing import Trace, Tracing

T = TypeVar("T")


def run_traces(tracing: Tracing | None, n: int) -> list[str | None] | None:
    """What n member completions record as the run that completed them: the current span."""
    return None if tracing is None else [tracing.current_traceparent()] * n


class SyncRunner:
    """A blocking client's core (Client provides these)."""

    tracing: Tracing | None = None  # None: tracing off

    def run(self, call: Call[T], conn: ConnArg | None = None) -> T:
        """Execute a call: on `conn` as is, or on the pool, retried on dead connections only."""
        raise NotImplementedError

    def run_send(
        self,
        queue: str,
        build: Callable[[Trace | None], Call[T]],
        conn: ConnArg | None = None,
        ids: Callable[[T], Sequence[int]] | None = None,
        count: int | None = None,
        attributes: dict[str, Any] | None = None,
    ) -> T:
        """Run a sending call, inside a `send {queue}` span whose context it carries when traced."""
        if self.tracing is None:
            return self.run(build(None), conn)
        with self.tracing.send(queue, count, attributes) as traced:
            result = self.run(build(traced.trace), conn)
            if ids is not None:
                traced.sent(ids(result))
            return result

    def connection(self) -> AbstractContextManager[Connection]:
        """A pooled connection (autocommit) for the caller's own transaction work."""
        raise NotImplementedError

    def _raise(self, exc: psycopg.Error, what: str) -> None:
        """Raise the PgQueueError a database error means, or return to re-raise it as is."""
        raise NotImplementedError


class AsyncRunner:
    """An asyncio client's core (AsyncClient provides these)."""

    tracing: Tracing | None = None  # None: tracing off

    async def run(self, call: Call[T], conn: AsyncConnArg | None = None) -> T:
        """Execute a call: on `conn` as is, or on the pool, retried on dead connections only."""
        raise NotImplementedError

    async def run_send(
        self,
        queue: str,
        build: Callable[[Trace | None], Call[T]],
        conn: AsyncConnArg | None = None,
        ids: Callable[[T], Sequence[int]] | None = None,
        count: int | None = None,
        attributes: dict[str, Any] | None = None,
    ) -> T:
        """Run a sending call, inside a `send {queue}` span whose context it carries when traced."""
        if self.tracing is None:
            return await self.run(build(None), conn)
        with self.tracing.send(queue, count, attributes) as traced:
            result = await self.run(build(traced.trace), conn)
            if ids is not None:
                traced.sent(ids(result))
            return result

    def connection(self) -> AbstractAsyncContextManager[AsyncConnection]:
        """A pooled connection (autocommit) for the caller's own transaction work."""
        raise NotImplementedError

    def _raise(self, exc: psycopg.Error, what: str) -> None:
        """Raise the PgQueueError a database error means, or return to re-raise it as is."""
        raise NotImplementedError
