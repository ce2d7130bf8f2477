"""The worker's handler threads: they take read messages in turn and run the App's handlers.

Handler threads take work from a deque (popleft is atomic) and are woken
once per read, not once per message (measured: an executor submit and a wait
over every future per completion cost more than the database did at a few
thousand msg/s). Async handlers run on one event loop thread; batch handlers
get a whole read; transactional ones run in a transaction with their ack.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from typing import TYPE_CHECKING, Any

import psycopg

from pgqueue._errors import ConnectionLost, InvalidArgument
from pgqueue._outcomes import Poison, Retry
from pgqueue._retry import is_dead_connection
from pgqueue._worker.acker import Acker
from pgqueue._worker.app import Handler
from pgqueue._worker.clock import Clock
from pgqueue._worker.db import DB_ERRORS, WorkerDb
from pgqueue._worker.inflight import Batch, InFlight, Task, message_log
from pgqueue._worker.leases import Leases
from pgqueue.types import Message

if TYPE_CHECKING:
    from pgqueue._metrics import WorkerMetrics
    from pgqueue._tracing import ProcessSpan, Tracing

# Why a message that waited locally past its lease goes back instead of starting.
EXPIRED = "its lease ran out while it waited (the worker was stalled)"


class LeaseLost(Exception):
    """Our lease on a message was taken over: roll back what its handler wrote."""


class DatabaseLost(Exception):
    """A transactional run's connection died or reached a read-only server: not the handler's fault.

    Its writes and its ack were rolled back together; the messages go back
    at once, with no nack (no backoff, and no poisoning on a last attempt).
    """


def _lost_database(exc: BaseException) -> bool:
    """Whether a transactional run failed because its connection did (a failover, a restart)."""
    if isinstance(exc, ConnectionLost):  # a call on the run's connection, translated
        return True
    return isinstance(exc, psycopg.Error) and is_dead_connection(exc)


class Dispatcher:
    """Runs handlers on `concurrency` threads; outcomes go to the acker or to the leases."""

    def __init__(
        self,
        concurrency: int,
        db: WorkerDb,
        inflight: InFlight,
        leases: Leases,
        acker: Acker,
        stopping: threading.Event,
        clock: Clock,
        log: Any,
        metrics: WorkerMetrics | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        """Handler threads for one worker; start() starts them."""
        self.concurrency = concurrency
        self.metrics = metrics
        self.tracing = tracing
        self.db = db
        self.inflight = inflight
        self.leases = leases
        self.acker = acker
        self.stopping = stopping
        self.clock = clock
        self.log = log
        self._ready: collections.deque[Task | Batch] = collections.deque()
        self._cond = threading.Condition()
        self._closing = False
        self._threads: list[threading.Thread] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_lock = threading.Lock()

    def start(self) -> None:
        """Start the handler threads."""
        self._threads = [
            threading.Thread(target=self._loop_forever, name=f"pgqueue-handler-{i}", daemon=True)
            for i in range(self.concurrency)
        ]
        for t in self._threads:
            t.start()

    def submit(self, tasks: list[Task], batch: Batch | None) -> None:
        """Hand the tasks of one read to the handler threads (as one unit for a batch handler)."""
        if not tasks:
            return
        self.inflight.add(tasks)
        if batch is not None:
            self._ready.append(batch)
        else:
            self._ready.extend(tasks)
        with self._cond:
            self._cond.notify(1 if batch is not None else len(tasks))

    def close(self) -> None:
        """Let idle handler threads end; threads in a hung handler are daemons, not waited for."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)

    def _loop_forever(self) -> None:
        while True:
            try:
                unit = self._ready.popleft()
            except IndexError:
                # Checked again under the lock: submit extends before it notifies.
                with self._cond:
                    while not self._ready and not self._closing:
                        self._cond.wait()
                    if not self._ready:
                        return
                continue
            if isinstance(unit, Batch):
                self._process_batch(unit)
            else:
                self._process(unit)

    def _forget(self, task: Task) -> None:
        if self.inflight.forget(task):
            self.log.warning(
                "handler.returned_after_release", healthy=self.inflight.healthy_threads()
            )

    # -- one message --------------------------------------------------------

    def _process(self, task: Task) -> None:
        started, expired = self.inflight.begin([task], self.stopping, self.clock.now())
        if expired:
            self.leases.give_back_many(expired, EXPIRED)
        if not started:
            return  # given back, or left for the shutdown to give back
        begun = self._begun(started, self.metrics) if self.metrics is not None else 0.0
        if self.tracing is None:
            self._run_one(task, begun, None)
            return
        links = self._member_links(task.msg, self.tracing.links)
        with self.tracing.process([task.msg], links) as span:
            task.trace = span.traceparent
            if task.msg.is_callback:
                span.note("pgqueue.barrier.links", len(links))
            self._run_one(task, begun, span)

    def _run_one(self, task: Task, begun: float, span: ProcessSpan | None) -> None:
        msg, handler = task.msg, task.handler
        try:
            if handler.transactional:
                self._run_transactional([task], lambda conn: [handler.func(msg, conn)])
            else:
                result = self._call(handler, msg)
                if task.abandoned:
                    message_log(self.log, msg).warning("message.late_result_ignored")
                    return
                # Its slot frees now; the acker acks it within milliseconds.
                self.acker.add([(task, result)])
        except LeaseLost:
            if span is not None:
                span.note("pgqueue.outcome", "lease_lost")
            self.leases.lost(task)  # rolled back: the handler's writes are the new holder's
        except DatabaseLost as exc:
            if span is not None:
                span.failed(exc)
            self._give_back([task], exc)
        except Poison as exc:
            if span is not None:
                span.failed(exc)
            self.leases.poison(task, exc)
        except Exception as exc:
            # The user's handler failed (any exception is its business, not
            # ours): the message goes back with a backoff; its last attempt
            # goes to the poison table.
            if span is not None:
                span.failed(exc)
            self.leases.nack(task, exc)
        finally:
            if self.metrics is not None:
                self.metrics.handler_ran(handler.queue, self.clock.now() - begun)
            self._forget(task)

    def _process_batch(self, batch: Batch) -> None:
        tasks, expired = self.inflight.begin(batch.tasks, self.stopping, self.clock.now())
        if expired:
            self.leases.give_back_many(expired, EXPIRED)
        if not tasks:
            for task in batch.tasks:
                if task.abandoned:
                    self._forget(task)
            return
        begun = self._begun(tasks, self.metrics) if self.metrics is not None else 0.0
        if self.tracing is None:
            self._run_batch(batch, tasks, begun, None)
            return
        with self.tracing.process([t.msg for t in tasks]) as span:
            for task in tasks:
                task.trace = span.traceparent
            self._run_batch(batch, tasks, begun, span)

    def _run_batch(
        self, batch: Batch, tasks: list[Task], begun: float, span: ProcessSpan | None
    ) -> None:
        handler = batch.handler
        msgs = [t.msg for t in tasks]
        try:
            if handler.transactional:
                self._run_transactional(
                    tasks, lambda conn: _batch_results(handler, msgs, handler.func(msgs, conn))
                )
                return
            results = _batch_results(handler, msgs, self._call(handler, msgs))
            done = [(t, r) for t, r in zip(tasks, results, strict=True) if not t.abandoned]
            if len(done) < len(tasks):
                self.log.warning("message.late_result_ignored", count=len(tasks) - len(done))
            self.acker.add(done)
        except LeaseLost:
            if span is not None:
                span.note("pgqueue.outcome", "lease_lost")
            for task in tasks:
                self.leases.lost(task)
        except DatabaseLost as exc:
            if span is not None:
                span.failed(exc)
            self._give_back(tasks, exc)
        except Poison as exc:
            if span is not None:
                span.failed(exc)
            for task in tasks:
                self.leases.poison(task, exc)
        except Exception as exc:
            if span is not None:
                span.failed(exc)
            # one failure, one traceback: on the first line that will be logged
            first = next((t for t in tasks if not (t.abandoned or t.lease_lost)), None)
            for task in tasks:
                self.leases.nack(task, exc, traceback=task is first)
        finally:
            if self.metrics is not None:
                self.metrics.handler_ran(handler.queue, self.clock.now() - begun)
            for task in batch.tasks:
                if task.running or task.abandoned:
                    self._forget(task)

    def _member_links(self, msg: Message, qty: int) -> list[tuple[str, dict[str, Any]]]:
        """A callback's span links: the runs that completed its members (none on a DB error)."""
        if not msg.is_callback or msg.barrier_id is None or qty <= 0:
            return []
        try:
            rows = self.db.barrier_links(msg.barrier_id, qty)
        except DB_ERRORS as exc:  # tracing never fails a message
            message_log(self.log, msg).warning("tracing.links_failed", error=str(exc))
            return []
        return [
            (tp, {"messaging.message.id": str(msg_id), "pgqueue.member_index": index})
            for index, msg_id, tp in rows
        ]

    def _begun(self, started: list[Task], metrics: WorkerMetrics) -> float:
        """The handler's start, observing each task's claim latency (called with metrics on)."""
        now = self.clock.now()
        for task in started:
            metrics.claimed(task.msg, task.read_at, now)
        return now

    def _run_transactional(self, tasks: list[Task], handle: Any) -> None:
        """Run the handler and ack in one transaction: its writes commit once, or not at all.

        Not retried on a dead connection: if the commit did not happen, the
        handler's writes and the ack were rolled back together, and the
        messages are given back now without a nack (DatabaseLost): a failover
        is not the handler's failure. Acks are not fenced (a finished run may ack),
        so the leases are locked first: a run that lost its lease to another
        reader (it stalled past its vt) rolls back instead of committing its
        writes a second time.
        """
        try:
            with self.db.transaction() as conn:
                results = handle(conn)
                if any(t.abandoned for t in tasks):
                    raise Retry("abandoned by the runtime")
                if not self.db.hold(tasks[0].msg.queue, [t.msg for t in tasks], conn):
                    raise LeaseLost
                self.acker.ack_in(conn, list(zip(tasks, results, strict=True)))
        except (psycopg.Error, ConnectionLost) as exc:
            if _lost_database(exc):
                raise DatabaseLost(str(exc).strip() or type(exc).__name__) from exc
            raise
        for task in tasks:
            self.acker.done(task)

    def _give_back(self, tasks: list[Task], exc: DatabaseLost) -> None:
        """Give back the messages of a run whose connection failed (failover), uncounted."""
        live = [t for t in tasks if not t.abandoned and not t.lease_lost]
        self.leases.give_back_many(live, f"the database connection failed: {exc}")

    def _call(self, handler: Handler, arg: Message | list[Message]) -> Any:
        """The handler's return value: called in this thread, or awaited on the event loop."""
        if not handler.is_async:
            return handler.func(arg)
        coro = handler.func(arg)
        if self.tracing is not None:
            coro = self.tracing.in_current_context(coro)  # the run's span, on the loop's thread
        return asyncio.run_coroutine_threadsafe(coro, self._event_loop()).result()

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._loop_lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="pgqueue-async", daemon=True).start()
                self._loop = loop
            return self._loop


def _batch_results(handler: Handler, msgs: list[Message], result: Any) -> list[Any]:
    """The batch handler's results, one per message (None for each when it returned None)."""
    if result is None:
        return [None] * len(msgs)
    if isinstance(result, (list, tuple)) and len(result) == len(msgs):
        return list(result)
    got = f"{len(result)} results" if isinstance(result, (list, tuple)) else repr(result)[:80]
    raise InvalidArgument(
        f"the batch handler of {handler.queue!r} returned {got} for {len(msgs)} messages;"
        " return None or one result per message"
    )
