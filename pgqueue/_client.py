"""Client: a blocking pgqueue client over a connection pool; its methods live in pgqueue._api."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any, TypeVar

import psycopg
from psycopg_pool import ConnectionPool

from pgqueue import _migrate, _tracing
from pgqueue._adapt import ConnArg, psycopg_of
from pgqueue._api.barrier import BarrierApi
from pgqueue._api.leases import LeaseApi
from pgqueue._api.poison import PoisonApi
from pgqueue._api.queue import QueueApi
from pgqueue._api.single_flight import SingleFlightApi
from pgqueue._api.workers import WorkersApi
from pgqueue._api.workflow import WorkflowApi
from pgqueue._calls import Call
from pgqueue._connection import raise_translated, run_on_pool
from pgqueue._execute import Connection
from pgqueue._notices import Observers
from pgqueue._pool import PoolSpec
from pgqueue._primary import drop_broken, last_word
from pgqueue._retry import RetryPolicy
from pgqueue._settings import UNSET, Unset

T = TypeVar("T")


class Client(QueueApi, LeaseApi, PoisonApi, BarrierApi, SingleFlightApi, WorkflowApi, WorkersApi):
    """A thread-safe pgqueue client over a connection pool; every call retries dead connections."""

    def __init__(
        self,
        pool: ConnectionPool[Connection],
        *,
        retry: RetryPolicy | None = None,
        owns_pool: bool = False,
        dsn_label: str = "the database",
        role: str | None = None,
        observers: Observers | None = None,
        tracer_provider: Any = None,
    ) -> None:
        """Wrap an open pool; `owns_pool` makes close() close it too; `role` names its login."""
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
    def from_dsn(
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
    ) -> Client:
        """Open a pool on dsn (else $PGQUEUE_DSN / $DATABASE_URL); fails fast if it does not answer.

        With `wait_seconds`, a server that is down or starting is waited for
        that long (each wait logged as `database.waiting`); other errors, such
        as a wrong password, still fail at once. Set prepare_threshold=None
        behind PgBouncer in transaction mode when it is older than 1.21 (it
        cannot keep prepared statements); unset, it comes from
        $PGQUEUE_PREPARE_THRESHOLD (a number, or "off"), else 5.

        A DSN that does not parse raises InvalidArgument before anything
        connects. Connection errors name where the DSN came from: "the dsn
        argument", or `dsn_source` when given (the CLI passes "--dsn"),
        PGQUEUE_DSN or DATABASE_URL. With `tracer_provider` its sends are
        traced through that OpenTelemetry provider, else the global one if an
        SDK set it (docs/observability.md).
        """
        spec = PoolSpec.resolve(
            dsn, min_size, max_size, connect_timeout, prepare_threshold, dsn_source
        )
        observers = Observers()
        pool = spec.pool(observers)
        # Fail fast with one clear line rather than at the first call; and
        # learn the login role, which permission errors name.
        role = spec.probe(wait_seconds)
        pool.open(wait=False)
        return cls(
            pool,
            retry=retry,
            owns_pool=True,
            dsn_label=spec.label,
            role=role,
            observers=observers,
            tracer_provider=tracer_provider,
        )

    def close(self) -> None:
        """Close the pool if this client opened it."""
        if self._owns_pool:
            self.pool.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @contextmanager
    def connection(self) -> Iterator[Connection]:
        """A pooled connection (autocommit) for the caller's own transaction work.

        A connection that dies or turns out to be on a read-only server inside
        the block is closed, not given back to the pool for the next caller.
        """
        started = time.monotonic()
        entered = False
        try:
            with self.pool.connection() as conn:
                entered = True
                try:
                    yield conn
                except Exception as exc:
                    drop_broken(self.pool, conn, exc)
                    raise
        except psycopg.Error as exc:
            if entered:
                raise
            # The pool's check refused every connection to a read-only server:
            # say so, not only that the pool timed out.
            last = last_word(exc, None, self.observers, started)
            raise_translated(last, "connection", self._dsn_label, self._role)
            raise

    def run(self, call: Call[T], conn: ConnArg | None = None) -> T:
        """Execute a call: on `conn` as is (no retry, no commit), or on the pool, retried."""
        own = None if conn is None else psycopg_of(conn)
        return run_on_pool(
            self.pool, call, self.retry, self._dsn_label, self._role, own, self.observers
        )

    def _raise(self, exc: psycopg.Error, what: str) -> None:
        raise_translated(exc, what, self._dsn_label, self._role)

    def conninfo(self) -> str:
        """The connection string this client's pool connects with (its password included)."""
        return str(self.pool.conninfo)

    def migrate(self) -> list[str]:
        """Apply pending migrations (safe to run from many processes at once); names applied."""
        with self.pool.connection() as conn:
            return [m.name for m in _migrate.migrate(conn)]
