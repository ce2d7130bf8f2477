"""The worker's acks: finished messages acked in batches from threads of their own.

Batching turns one commit per message into one per batch (measured: the
per-message acks held one worker at about 1.3k msg/s). A message whose handler
finished waits at most `interval` for its ack; if the process dies in between,
it comes back after its vt, as at-least-once allows. Acks are idempotent, so
each statement is retried on a fresh connection when the connection died.
One that still fails because the server is away (or out of disk) is tried
again a second later, its messages' leases kept alive meanwhile; one that
fails otherwise leaves its messages to come back after their vt.

A slow ack must not hold every lease hostage: batches are bounded
(MAX_BATCH), THREADS of them run at once, and a message waiting for its ack
keeps its lease alive (the leases duty extends it like a running one's). At
shutdown the acker is given what is left of the grace, not more.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, ClassVar

from pgqueue._calls import encode_json
from pgqueue._connection import Connection
from pgqueue._errors import ConnectionLost, InvalidMessage, StorageError
from pgqueue._log import logs_at
from pgqueue._retry import is_dead_connection
from pgqueue._worker.clock import Clock
from pgqueue._worker.counting import Counts
from pgqueue._worker.db import DB_ERRORS, WorkerDb
from pgqueue._worker.inflight import InFlight, Task, message_log
from pgqueue.types import Message

if TYPE_CHECKING:
    from pgqueue._metrics import WorkerMetrics
    from pgqueue._tracing import Tracing
    from pgqueue._worker.registry import Tally

Done = tuple[Task, Any]  # a finished task and its handler's result


def is_member(msg: Message) -> bool:
    """The message is a barrier member: its ack completes the member."""
    return msg.member_index is not None and msg.barrier_id is not None


class Acker:
    """Acks finished messages, one statement per queue and kind, from THREADS threads."""

    THREADS: ClassVar[int] = 2
    MAX_BATCH: ClassVar[int] = 500
    RETRY_PAUSE: ClassVar[float] = 1.0  # between tries of an ack that failed for an outage

    def __init__(
        self,
        db: WorkerDb,
        inflight: InFlight,
        clock: Clock,
        log: Any,
        interval: float = 0.01,
        metrics: WorkerMetrics | None = None,
        tracing: Tracing | None = None,
        tally: Tally | None = None,
    ) -> None:
        """An acker that waits `interval` for a batch to gather; start() starts its threads.

        Each message acked counts in `tally` (the registry's), when given.
        """
        self.db = db
        self.count = Counts(metrics, tally)
        self.tracing = tracing
        self.inflight = inflight
        self.clock = clock
        self.log = log
        self.interval = interval
        self.handled = 0
        # One message's debug line costs a bound logger; none is made unless DEBUG is on.
        self._debug = logs_at(log, logging.DEBUG)
        self._pending: list[Done] = []
        self._cond = threading.Condition()
        self._stopped = False
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Start acking."""
        self._threads = [
            threading.Thread(target=self._run, name=f"pgqueue-acker-{i}", daemon=True)
            for i in range(self.THREADS)
        ]
        for t in self._threads:
            t.start()

    def add(self, items: list[Done]) -> None:
        """Ack these within about `interval`; their leases are kept alive until then."""
        self.inflight.awaiting_ack([t for t, _ in items])
        with self._cond:
            self._pending.extend(items)
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._stopped:
                    self._cond.wait()
                if self._stopped and not self._pending:
                    return
            time.sleep(self.interval)  # let a batch gather
            with self._cond:
                batch = self._pending[: self.MAX_BATCH]
                del self._pending[: self.MAX_BATCH]
                if self._pending:
                    self._cond.notify()  # more than a batch: another thread takes the rest
            if batch:
                self.flush(batch)

    def stop(self, timeout: float) -> int:
        """Ack what is pending within `timeout` seconds, then stop; how many were left unacked.

        The threads are daemons: one stuck in a slow ack is not waited for past
        the timeout, and its messages come back after their vt.
        """
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        with self._cond:
            return len(self._pending) + self.inflight.acking()

    def flush(self, batch: list[Done]) -> None:
        """Ack a batch of finished messages: one statement per queue and kind."""
        groups: dict[tuple[str, bool], list[Done]] = {}
        for task, result in batch:
            groups.setdefault((task.msg.queue, is_member(task.msg)), []).append((task, result))
        for (queue, member), items in groups.items():
            try:
                self.ack(queue, member, items)
            except DB_ERRORS as exc:
                ids = [t.msg.msg_id for t, _ in items]
                again = self._retry_later(exc)
                self.log.error(
                    "message.ack_failed", queue=queue, msg_ids=ids, error=str(exc), retrying=again
                )
                if again:
                    self._again(items)
                else:
                    self.inflight.acked([t for t, _ in items])
                continue
            self.inflight.acked([t for t, _ in items])
            for task, _ in items:
                self.done(task)

    def _retry_later(self, exc: BaseException) -> bool:
        """Whether an ack that failed so is tried again: the server was away, or out of disk.

        Their messages keep their leases while they wait (the leases duty
        extends them), so a handled message is not run again, nor
        poison-dropped by its next read, because an outage outlasted the
        retry policy. An ack is idempotent and fenced, so trying again is safe.
        """
        if self._stopped:
            return False
        return isinstance(exc, (ConnectionLost, StorageError)) or is_dead_connection(exc)

    def _again(self, items: list[Done]) -> None:
        """Queue failed acks again after a pause (RETRY_PAUSE), unless the acker stops first."""
        with self._cond:
            self._cond.wait_for(lambda: self._stopped, timeout=self.RETRY_PAUSE)
            self._pending[:0] = items
            self._cond.notify()

    def ack(
        self, queue: str, member: bool, items: list[Done], conn: Connection | None = None
    ) -> None:
        """Ack finished messages of one queue and kind in one statement (on conn, if given)."""
        ids = [t.msg.msg_id for t, _ in items]
        stamps = [t.msg.enqueued_at for t, _ in items]
        results = [self._json_or_none(t.msg, r) for t, r in items] if member else []
        if self.tracing is None:
            self.db.ack(queue, member, ids, stamps, results, conn)
            return
        runs = [t.trace for t, _ in items]
        call = "complete_members" if member else self.db.ack_mode
        with self.tracing.settle(queue, call, runs):
            self.db.ack(queue, member, ids, stamps, results, conn, runs if member else None)

    def ack_in(self, conn: Connection, items: list[Done]) -> None:
        """Ack in a handler's transaction, grouped by kind (the handler's writes commit with it)."""
        kinds: dict[bool, list[Done]] = {}
        for task, result in items:
            kinds.setdefault(is_member(task.msg), []).append((task, result))
        for member, group in kinds.items():
            self.ack(group[0][0].msg.queue, member, group, conn)

    def done(self, task: Task) -> None:
        """Count an acked message (and say so at DEBUG)."""
        self.handled += 1
        self.count(task.msg.queue, "acked")
        if self._debug:
            message_log(self.log, task.msg).debug(
                "message.acked", seconds=round(self.clock.now() - task.started, 3)
            )

    def _json_or_none(self, msg: Message, result: Any) -> Any:
        try:
            encode_json(result, "result")
        except InvalidMessage as exc:
            message_log(self.log, msg).warning("message.result_not_json", error=str(exc))
            return None
        return result
