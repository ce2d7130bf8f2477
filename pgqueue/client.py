"""The client: a connection pool, the dead-connection retry policy, and the calls over it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar

import psycopg
import structlog
from psycopg_pool import ConnectionPool

from pgqueue import barrier as _barrier
from pgqueue import claims as _claims
from pgqueue import migrate as _migrate
from pgqueue import poison as _poison
from pgqueue import queue as _queue
from pgqueue.barrier import BarrierStatus, MemberFailure, MemberResult
from pgqueue.calls import Call
from pgqueue.claims import Claim, ClaimRecord
from pgqueue.errors import ConnectionLost, InvalidArgument, translate
from pgqueue.poison import ANY_POISON, PoisonFilter, PoisonMessage
from pgqueue.queue import JSON, Message, PeekedMessage, QueueInfo, QueueMetrics
from pgqueue.retry import NO_RETRY, RetryPolicy, is_dead_connection, is_server_not_ready
from pgqueue.settings import (
    UNSET,
    Unset,
    describe_dsn,
    prepare_threshold_from_env,
    require_dsn,
    unreachable,
)

T = TypeVar("T")
log = structlog.get_logger("pgqueue")

Connection = psycopg.Connection[Any]


def execute(conn: Connection, call: Call[T]) -> T:
    """Run one call on the given connection, inside whatever transaction it has."""
    with conn.cursor() as cur:
        cur.execute(call.sql, call.params)
        rows = cur.fetchall() if cur.description is not None else []
    return call.result(rows)


def raise_translated(
    exc: psycopg.Error, what: str, dsn_label: str, role: str | None = None
) -> None:
    """Re-raise a database error as the PgQueueError it means (or as itself).

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


# The NOTICE a read raises for each message it poison-dropped (sql/0008_fences.sql):
# the rows a read returns are only the ones it delivered.
SQLSTATE_POISONED_NOTICE = "PGQ10"


def log_notice(diag: psycopg.errors.Diagnostic) -> None:
    """Log what pgqueue's SQL tells the client by NOTICE: one line per message a read poisoned."""
    if diag.sqlstate != SQLSTATE_POISONED_NOTICE:
        return
    try:
        what = json.loads(diag.message_detail or "")
    except ValueError:
        return
    log.warning(
        "message.poisoned",
        queue=what.get("queue"),
        msg_id=what.get("msg_id"),
        read_ct=what.get("read_ct"),
        reason=what.get("reason"),
        by="read",
    )


def configure_connection(conn: psycopg.Connection[Any]) -> None:
    """What every pooled connection of a Client gets: pgqueue's notices logged."""
    conn.add_notice_handler(log_notice)


def connection_kwargs(connect_timeout: float, prepare_threshold: int | None) -> dict[str, Any]:
    """Connection settings every pgqueue connection uses."""
    return {
        "autocommit": True,
        "connect_timeout": max(1, int(connect_timeout)),
        "prepare_threshold": prepare_threshold,
        "application_name": "pgqueue",
    }


def _probe(dsn: str, label: str, connect_timeout: float, wait_seconds: float) -> str:
    """The login role of a first connection; waits up to wait_seconds for a server not up yet."""
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            with psycopg.connect(dsn, connect_timeout=max(1, int(connect_timeout))) as probe:
                return probe.info.user
        except psycopg.OperationalError as exc:
            left = deadline - time.monotonic()
            if left <= 0 or not is_server_not_ready(exc):
                error = unreachable(label, connect_timeout, exc)
                if wait_seconds > 0 and is_server_not_ready(exc):
                    error = ConnectionLost(f"{error}; waited {wait_seconds:g}s for it")
                raise error from exc
            log.warning(
                "database.waiting",
                dsn=label,
                error=(str(exc).strip().splitlines() or [type(exc).__name__])[-1].strip(),
                gives_up_in=round(left, 1),
            )
            time.sleep(min(1.0, left))


class Client:
    """A thread-safe pgqueue client over a connection pool; every call retries dead connections."""

    def __init__(
        self,
        pool: ConnectionPool[Connection],
        *,
        retry: RetryPolicy | None = None,
        owns_pool: bool = False,
        dsn_label: str = "the database",
        role: str | None = None,
    ) -> None:
        """Wrap an open pool; `owns_pool` makes close() close it too; `role` names its login."""
        self.pool = pool
        self.retry = retry or RetryPolicy()
        self._owns_pool = owns_pool
        self._dsn_label = dsn_label
        self._role = role

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
    ) -> Client:
        """Open a pool on dsn (else $PGQUEUE_DSN / $DATABASE_URL); fails fast if it does not answer.

        With `wait_seconds`, a server that is down or starting is waited for
        that long (each wait logged as `database.waiting`); other errors, such
        as a wrong password, still fail at once. Set prepare_threshold=None
        behind PgBouncer in transaction mode when it is older than 1.21 (it
        cannot keep prepared statements); unset, it comes from
        $PGQUEUE_PREPARE_THRESHOLD (a number, or "off"), else 5.
        """
        if isinstance(prepare_threshold, Unset):
            prepare_threshold = prepare_threshold_from_env()
        resolved = require_dsn(dsn)
        label = describe_dsn(resolved)
        if min_size < 0 or max_size < max(1, min_size):
            raise InvalidArgument(
                f"pool sizes must satisfy 0 <= min_size <= max_size and max_size >= 1,"
                f" got min_size={min_size} max_size={max_size}"
            )
        pool: ConnectionPool[Connection] = ConnectionPool(
            resolved,
            min_size=min_size,
            max_size=max_size,
            kwargs=connection_kwargs(connect_timeout, prepare_threshold),
            configure=configure_connection,
            timeout=max(connect_timeout, 1.0),
            open=False,
            name="pgqueue",
        )
        # Fail fast with one clear line rather than at the first call; and
        # learn the login role, which permission errors name.
        role = _probe(resolved, label, connect_timeout, wait_seconds)
        pool.open(wait=False)
        return cls(pool, retry=retry, owns_pool=True, dsn_label=label, role=role)

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
        """A pooled connection (autocommit) for the caller's own transaction work."""
        with self.pool.connection() as conn:
            yield conn

    def run(self, call: Call[T], conn: Connection | None = None) -> T:
        """Execute a call: on `conn` as is, or on the pool, retried on dead connections only."""
        try:
            if conn is not None:
                # The caller's transaction: retrying here could split it, so never.
                return execute(conn, call)
            policy = self.retry if call.retryable else NO_RETRY
            for attempt in policy.retrying(call.name):
                with attempt:
                    try:
                        with self.pool.connection() as pooled:
                            return execute(pooled, call)
                    except psycopg.OperationalError as exc:
                        if is_dead_connection(exc):
                            # Other idle connections likely died with this one
                            # (server restart, PgBouncer reap): drop them now.
                            self.pool.check()
                        raise
        except psycopg.Error as exc:
            raise_translated(exc, call.name, self._dsn_label, self._role)
            raise
        raise AssertionError("unreachable: tenacity re-raises the last error")

    # -- schema -------------------------------------------------------------

    def migrate(self) -> list[str]:
        """Apply pending migrations (safe to run from many processes at once); names applied."""
        with self.pool.connection() as conn:
            return [m.name for m in _migrate.migrate(conn)]

    # -- queues -------------------------------------------------------------

    def create_queue(
        self, queue: str, *, max_attempts: int = 5, conn: Connection | None = None
    ) -> None:
        """Make sure the queue exists with this max_attempts (in conn's transaction, if given)."""
        self.run(_queue.create_queue(queue, max_attempts), conn)

    def drop_queue(self, queue: str) -> bool:
        """Remove the queue and everything in it; False if it did not exist."""
        return self.run(_queue.drop_queue(queue))

    def list_queues(self) -> list[QueueInfo]:
        """Every queue."""
        return self.run(_queue.list_queues())

    def purge_queue(self, queue: str) -> int:
        """Delete all live messages of the queue; how many."""
        return self.run(_queue.purge_queue(queue))

    def purge_queue_chunk(self, queue: str, *, up_to_msg_id: int, qty: int = 1000) -> int:
        """Delete up to qty live messages with msg_id <= up_to_msg_id; how many (0: done)."""
        return self.run(_queue.purge_queue_chunk(queue, up_to_msg_id, qty))

    # -- sending ------------------------------------------------------------

    def send(
        self,
        queue: str,
        message: JSON,
        *,
        headers: dict[str, Any] | None = None,
        delay: int = 0,
        dedupe_key: str | None = None,
        conn: Connection | None = None,
    ) -> int:
        """Enqueue a message; its msg_id. Durable once this returns.

        Retried on a dead connection: without a dedupe_key that is
        at-least-once (a retry after a lost commit reply sends a second copy);
        with a dedupe_key it is exactly-once. With a dedupe_key the id is this
        call's own message when an earlier attempt of it committed (live or
        consumed since); else the live message that holds the key (single
        flight: nothing new is sent); else the new message's. With `conn`, the
        message commits or rolls back with the caller's transaction and is not
        retried. Header keys starting with `_pg_` are pgqueue's: InvalidArgument.
        """
        return self.run(_queue.send(queue, message, headers, delay, dedupe_key), conn)

    def send_batch(
        self,
        queue: str,
        messages: Sequence[JSON],
        *,
        headers: Sequence[dict[str, Any] | None] | None = None,
        delay: int = 0,
        conn: Connection | None = None,
    ) -> list[int]:
        """Enqueue all messages atomically; their msg_ids in order. At-least-once across retries."""
        return self.run(_queue.send_batch(queue, messages, headers, delay), conn)

    # -- reading ------------------------------------------------------------

    def read(
        self, queue: str, *, vt: int = 30, qty: int = 1, conn: Connection | None = None
    ) -> list[Message]:
        """Claim up to qty messages for vt seconds; nobody else gets them inside that time."""
        return self.run(_queue.read(queue, vt, qty), conn)

    def read_with_poll(
        self,
        queue: str,
        *,
        vt: int = 30,
        qty: int = 1,
        max_poll_seconds: int = 5,
        poll_interval_ms: int = 100,
    ) -> list[Message]:
        """Like read, waiting up to max_poll_seconds for something to arrive."""
        return self.run(_queue.read_with_poll(queue, vt, qty, max_poll_seconds, poll_interval_ms))

    def read_or_wait(
        self, queue: str, *, vt: int = 30, qty: int = 1, max_wait_seconds: float = 5.0
    ) -> list[Message]:
        """Like read, but when the queue is empty wait (LISTEN) up to max_wait_seconds for a send.

        Returns as soon as a send is announced (milliseconds), possibly with
        nothing if another reader took the message first. Behind PgBouncer in
        transaction mode LISTEN cannot work: use read() in a polling loop there.
        """
        got = self.read(queue, vt=vt, qty=qty)
        if got or max_wait_seconds <= 0:
            return got
        try:
            with self.pool.connection() as conn:
                execute(conn, _queue.listen(queue))
                try:
                    # Sent between our first read and the listen: not announced to us.
                    got = execute(conn, _queue.read(queue, vt, qty))
                    if not got:
                        for _ in conn.notifies(timeout=max_wait_seconds, stop_after=1):
                            pass
                finally:
                    execute(conn, _queue.unlisten(queue))
        except psycopg.OperationalError as exc:
            if not is_dead_connection(exc):
                raise
            # The wait is only an optimisation: a dead connection counts as a wake-up.
            log.warning("wait.connection_lost", queue=queue, error=str(exc).strip())
        except psycopg.Error as exc:
            raise_translated(exc, "read_or_wait", self._dsn_label, self._role)
            raise
        return got or self.read(queue, vt=vt, qty=qty)

    def pop(self, queue: str, *, qty: int = 1, conn: Connection | None = None) -> list[Message]:
        """Take and delete up to qty messages at once (at-most-once delivery; never retried)."""
        return self.run(_queue.pop(queue, qty), conn)

    # -- acknowledging ------------------------------------------------------

    def delete(self, queue: str, msg_id: int, *, conn: Connection | None = None) -> bool:
        """Ack by deleting; False if already acked. Idempotent, so retried freely."""
        return self.run(_queue.delete(queue, msg_id), conn)

    def delete_many(
        self, queue: str, msg_ids: Sequence[int], *, conn: Connection | None = None
    ) -> list[int]:
        """Ack many by deleting; the ids that were still live."""
        return self.run(_queue.delete_many(queue, msg_ids), conn)

    def archive(self, queue: str, msg_id: int, *, conn: Connection | None = None) -> bool:
        """Ack by archiving; False if already acked. Idempotent, so retried freely."""
        return self.run(_queue.archive(queue, msg_id), conn)

    def archive_many(
        self, queue: str, msg_ids: Sequence[int], *, conn: Connection | None = None
    ) -> list[int]:
        """Ack many by archiving; the ids that were still live."""
        return self.run(_queue.archive_many(queue, msg_ids), conn)

    def set_vt(
        self,
        queue: str,
        msg_id: int,
        vt: int,
        *,
        read_ct: int | None = None,
        error: str | None = None,
        conn: Connection | None = None,
    ) -> Message | None:
        """Hide the message until vt seconds from now (extend a lease, or nack with a delay).

        Pass the `read_ct` your read returned: then only your lease moves, and
        None means another reader has taken the message over since (or it is
        gone), and nothing changed. Without it, any live message moves (an
        operator's tool). A nack may pass the `error` that made it fail: it is
        kept with the message and quoted in the poison reason if attempts run out.
        """
        return self.run(_queue.set_vt(queue, msg_id, vt, error, read_ct), conn)

    def nack(
        self,
        queue: str,
        msg_id: int,
        *,
        read_ct: int,
        delay: int,
        error: str | None = None,
        conn: Connection | None = None,
    ) -> str | None:
        """Give a failed attempt back: "retry" (visible after delay) or "poisoned" (its last).

        Only the holder of the lease that `read_ct` names can: None when another
        reader has taken the message over since (or it is gone), and nothing
        changed. At read_ct >= max_attempts the message goes to the poison
        table now, with `error` in its reason, instead of at the next read.
        """
        return self.run(_queue.nack(queue, msg_id, read_ct, delay, error), conn)

    def peek(self, queue: str, *, qty: int = 10, after_msg_id: int = 0) -> list[PeekedMessage]:
        """Live messages in msg_id order, visible or not, without claiming or changing them."""
        return self.run(_queue.peek(queue, qty, after_msg_id))

    # -- metrics ------------------------------------------------------------

    def metrics(self, queue: str) -> QueueMetrics:
        """Size and age figures of one queue."""
        return self.run(_queue.metrics(queue))

    def metrics_all(self) -> list[QueueMetrics]:
        """Size and age figures of every queue."""
        return self.run(_queue.metrics_all())

    # -- poison -------------------------------------------------------------

    def poison(
        self,
        queue: str,
        msg_id: int,
        reason: str,
        *,
        read_ct: int | None = None,
        conn: Connection | None = None,
    ) -> bool:
        """Move a message to the poison table now, with a reason; False if already gone.

        With the `read_ct` your read returned, only while your lease is the
        current one (False, and nothing changed, once another reader took it over).
        """
        return self.run(_poison.poison(queue, msg_id, reason, read_ct), conn)

    def poison_list(
        self,
        queue: str | None = None,
        *,
        qty: int = 100,
        since: datetime | None = None,
        reason: str | None = None,
    ) -> list[PoisonMessage]:
        """The latest poison messages, newest first; optionally only since, reason containing."""
        return self.run(_poison.poison_list(queue, qty, since, reason))

    def poison_get(self, queue: str, msg_id: int) -> PoisonMessage | None:
        """One poison message; None if the queue has none with that id."""
        return self.run(_poison.poison_get(queue, msg_id))

    def poison_count(self, queue: str | None = None, where: PoisonFilter = ANY_POISON) -> int:
        """How many poison messages match."""
        return self.run(_poison.poison_count(queue, where))

    def poison_ids(
        self,
        queue: str,
        *,
        after_msg_id: int = 0,
        qty: int = 500,
        where: PoisonFilter = ANY_POISON,
    ) -> list[int]:
        """The next page of matching poison ids above after_msg_id, ascending."""
        return self.run(_poison.poison_ids(queue, after_msg_id, qty, where))

    def poison_requeue(
        self, queue: str, msg_ids: Sequence[int], *, conn: Connection | None = None
    ) -> list[int]:
        """Give poisoned messages a fresh start in their queue; the ids requeued."""
        return self.run(_poison.poison_requeue(queue, msg_ids), conn)

    def poison_purge(
        self, queue: str, msg_ids: Sequence[int] | None = None, *, conn: Connection | None = None
    ) -> int:
        """Delete poisoned messages (all of the queue's when msg_ids is None); how many."""
        return self.run(_poison.poison_purge(queue, msg_ids), conn)

    # -- barriers -----------------------------------------------------------

    def fan_out(
        self,
        queue: str,
        messages: Sequence[JSON],
        *,
        callback_queue: str,
        callback_message: JSON,
        barrier_id: str | None = None,
        headers: dict[str, Any] | None = None,
        deadline_seconds: int | None = None,
        conn: Connection | None = None,
    ) -> str:
        """Send the members and arm a barrier atomically; exactly one callback will follow.

        The barrier id is generated here when not given, so a fan_out retried
        after a lost reply finds its first attempt and sends nothing twice.
        """
        return self.run(
            _barrier.fan_out(
                queue,
                messages,
                callback_queue,
                callback_message,
                barrier_id,
                headers,
                deadline_seconds,
            ),
            conn,
        )

    def complete_member(
        self,
        queue: str,
        msg_id: int,
        *,
        outcome: str = "succeeded",
        result: JSON = None,
        read_ct: int | None = None,
        conn: Connection | None = None,
    ) -> BarrierStatus | None:
        """Ack a member and count it once; its barrier's state after, or None if not a member.

        With `read_ct` (for a failure: it speaks for one attempt) it acts only
        while that read's lease is current; None then also means it did not.
        """
        call = _barrier.complete_members(
            queue, [msg_id], [outcome], [result], None if read_ct is None else [read_ct]
        )
        statuses = self.run(call, conn)
        return statuses[0] if statuses else None

    def complete_members(
        self,
        queue: str,
        msg_ids: Sequence[int],
        *,
        outcomes: Sequence[str] | None = None,
        results: Sequence[JSON] | None = None,
        read_cts: Sequence[int | None] | None = None,
        conn: Connection | None = None,
    ) -> list[BarrierStatus]:
        """Ack and count many members in one transaction; the state of each barrier touched.

        An entry with a read_ct acts only while that read's lease is current.
        """
        return self.run(
            _barrier.complete_members(queue, msg_ids, outcomes, results, read_cts), conn
        )

    def barrier_status(self, barrier_id: str) -> BarrierStatus:
        """The barrier's progress; raises BarrierNotFound for an unknown id."""
        return self.run(_barrier.barrier_status(barrier_id))

    def barrier_results(self, barrier_id: str) -> list[MemberResult]:
        """Each member's outcome and result, for the callback handler."""
        return self.run(_barrier.barrier_results(barrier_id))

    def barrier_failures(self, barrier_id: str, *, qty: int = 100) -> list[MemberFailure]:
        """The members that failed, were poisoned, purged or timed out, with the reason for each."""
        return self.run(_barrier.barrier_failures(barrier_id, qty))

    def list_barriers(self, *, state: str | None = None, qty: int = 100) -> list[BarrierStatus]:
        """The newest barriers, optionally only open, fired or expired ones."""
        return self.run(_barrier.list_barriers(state, qty))

    def expire_barriers(self) -> int:
        """Fire overdue barriers with missing members timed out; safe from every process at once."""
        return self.run(_barrier.expire_barriers())

    # -- single-flight claims -----------------------------------------------

    def claim(self, key: str, *, owner: str | None = None, lease_seconds: int = 30) -> Claim:
        """A context manager holding `key` for one owner at a time, renewing its lease meanwhile.

        `with client.claim("orchestrate:A") as c:` then `c.acquired` says
        whether this caller holds it; `c.finish()` leaves a tombstone so the
        work can never run again; leaving without finish() releases the key.
        """
        return Claim(self, key, owner or _claims.default_owner(), lease_seconds)

    def list_claims(self, *, qty: int = 100) -> list[ClaimRecord]:
        """The most recent claims and tombstones."""
        return self.run(_claims.list_claims(qty))

    def purge_claims(self, *, older_than_seconds: int) -> int:
        """Delete tombstones older than that; how many."""
        return self.run(_claims.purge_claims(older_than_seconds))
