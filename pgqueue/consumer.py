"""The long-running consumer: read batches, run handlers, ack, keep leases alive, stop cleanly."""

from __future__ import annotations

import asyncio
import collections
import inspect
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import psycopg
import structlog

from pgqueue import queue as _queue
from pgqueue.barrier import complete_members
from pgqueue.calls import encode_json
from pgqueue.client import Client, Connection, execute
from pgqueue.errors import InvalidArgument, InvalidMessage, PgQueueError, QueueNotFound
from pgqueue.queue import Message

log = structlog.get_logger("pgqueue")
F = TypeVar("F", bound=Callable[..., Any])


class Poison(Exception):
    """Raised by a handler: never retry this message; poison it with this reason."""


class Retry(Exception):
    """Raised by a handler: try this message again after `delay` seconds (default: backoff)."""

    def __init__(self, reason: str = "", *, delay: int | None = None) -> None:
        """Ask for a retry, optionally after a fixed delay in seconds."""
        super().__init__(reason)
        self.delay = delay


@dataclass(frozen=True, slots=True)
class Handler:
    """A registered handler and how to call it."""

    queue: str
    func: Callable[..., Any]
    transactional: bool
    is_async: bool
    batch: bool = False


class App:
    """A registry of handlers by queue: `@app.handler("queue")`."""

    def __init__(self) -> None:
        """An app with no handlers yet."""
        self.handlers: dict[str, Handler] = {}

    def handler(
        self, queue: str, *, transactional: bool = False, batch: bool = False
    ) -> Callable[[F], F]:
        """Register a function (sync or async) as the handler of a queue.

        A handler gets the Message; its return value is the member result when
        the message is a barrier member. With transactional=True (sync only)
        it gets `(message, conn)` and its writes on `conn` commit in the same
        transaction as the ack: exactly-once effects for database work.

        With batch=True it gets the list of Messages of one read instead (and
        `conn` after it when transactional). They succeed or fail together:
        returning acks them all (None, or a list with one result per message
        for barrier members); raising retries them all, or poisons them all
        with Poison.
        """

        def register(func: F) -> F:
            if queue in self.handlers:
                raise InvalidArgument(f"queue {queue!r} already has a handler")
            is_async = inspect.iscoroutinefunction(func)
            if transactional and is_async:
                raise InvalidArgument("transactional handlers must be sync functions")
            self.handlers[queue] = Handler(queue, func, transactional, is_async, batch)
            return func

        return register


def load_app(path: str) -> App:
    """The App named by "module:attribute", with a clear error when it is not one."""
    import importlib

    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise InvalidArgument(f"expected MODULE:APP (e.g. myproj.tasks:app), got {path!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidArgument(f"cannot import {module_name!r}: {exc}") from exc
    app = getattr(module, attr, None)
    if not isinstance(app, App):
        raise InvalidArgument(f"{path!r} is not a pgqueue.App (got {type(app).__name__})")
    return app


def _env_bool(value: str) -> bool:
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise InvalidArgument(f"expected on/off, got {value!r}")


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """How a worker runs; every field can come from a PGQUEUE_<FIELD> environment variable."""

    queues: tuple[str, ...] = ()
    concurrency: int = 4
    batch: int = 0
    readers: int = 1
    vt: int = 30
    heartbeat_fraction: float = 0.5
    hard_timeout: float = 0.0
    ack: str = "delete"
    poll_interval: float = 1.0
    listen: bool = True
    listen_dsn: str = ""
    shutdown_grace: float = 30.0
    backoff_base: float = 1.0
    backoff_max: float = 300.0
    health_file: str = ""
    sweep_interval: float = 10.0

    def __post_init__(self) -> None:
        problems = []
        if self.concurrency < 1:
            problems.append("concurrency must be >= 1")
        if self.batch < 0:
            problems.append("batch must be >= 0 (0: same as concurrency)")
        if self.readers < 1:
            problems.append("readers must be >= 1")
        if self.vt < 1:
            problems.append("vt must be >= 1 second")
        if not 0 < self.heartbeat_fraction < 1:
            problems.append("heartbeat_fraction must be between 0 and 1")
        if self.ack not in ("delete", "archive"):
            problems.append("ack must be 'delete' or 'archive'")
        for name in ("hard_timeout", "poll_interval", "shutdown_grace", "sweep_interval"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must be >= 0")
        if self.backoff_base <= 0 or self.backoff_max < self.backoff_base:
            problems.append("need 0 < backoff_base <= backoff_max")
        if problems:
            raise InvalidArgument("invalid worker settings: " + "; ".join(problems))

    @property
    def batch_size(self) -> int:
        """Messages read per call."""
        return self.batch or self.concurrency

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> WorkerSettings:
        """Settings from PGQUEUE_* variables, then the explicit overrides (None means unset)."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(f"PGQUEUE_{f.name.upper()}")
            if raw is None or raw == "":
                continue
            try:
                if f.name == "queues":
                    values[f.name] = tuple(q.strip() for q in raw.split(",") if q.strip())
                elif f.type == "bool":
                    values[f.name] = _env_bool(raw)
                elif f.type == "int":
                    values[f.name] = int(raw)
                elif f.type == "float":
                    values[f.name] = float(raw)
                else:
                    values[f.name] = raw
            except ValueError as exc:
                raise InvalidArgument(f"PGQUEUE_{f.name.upper()}={raw!r}: {exc}") from exc
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


@dataclass(eq=False)
class _Task:
    msg: Message
    handler: Handler
    started: float
    lease_until: float
    # Set when the runtime gave the message back (hard timeout, shutdown): the
    # handler's late outcome must then not be acked or nacked.
    abandoned: bool = False  # set once, by one thread; read by the handler thread
    running: bool = False  # its handler has started (it may have waited for a slot)


@dataclass(eq=False)
class _Batch:
    """The messages of one read of a queue whose handler takes them all at once."""

    tasks: list[_Task]  # never empty

    @property
    def handler(self) -> Handler:
        """The queue's handler (every task of a read shares it)."""
        return self.tasks[0].handler


# What a database call of the runtime may raise: pgqueue's own errors, and a
# database error pgqueue does not translate (a deadlock still failing after its
# retries, say). The runtime logs them and goes on; it must not die of them.
_DB_ERRORS = (PgQueueError, psycopg.Error)


def _is_member(msg: Message) -> bool:
    """The message is a barrier member: its ack completes the member."""
    return msg.member_index is not None and msg.barrier_id is not None


class _Listener:
    """LISTEN/NOTIFY wake-ups on a connection of its own; polling when it cannot."""

    def __init__(self, dsn: str, queues: tuple[str, ...], stopping: threading.Event) -> None:
        self.dsn = dsn
        self.queues = queues
        self.stopping = stopping
        self.conn: Connection | None = None
        self.registered = False

    def idle(self, timeout: float) -> None:
        """Declare ourselves waiting (first call) or wait for a send (later calls)."""
        try:
            if self.conn is None:
                self.conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=5)
            if not self.registered:
                for q in self.queues:
                    execute(self.conn, _queue.listen(q))
                self.registered = True
                return  # the caller reads once more: a send before listen() went unannounced
            # In slices, so a stop request is answered within a second.
            deadline = time.monotonic() + timeout
            while not self.stopping.is_set() and (left := deadline - time.monotonic()) > 0:
                if list(self.conn.notifies(timeout=min(left, 1.0), stop_after=1)):
                    return
        except psycopg.Error as exc:
            log.warning("listen.failed", error=str(exc).strip(), fallback="polling")
            self.close()
            self.stopping.wait(timeout)

    def busy(self) -> None:
        """Stop waiting: sends to busy queues should not pay for a NOTIFY."""
        if self.registered and self.conn is not None:
            try:
                for q in self.queues:
                    execute(self.conn, _queue.unlisten(q))
            except psycopg.OperationalError:
                self.close()
        self.registered = False

    def close(self) -> None:
        """Drop the connection (its waiter rows go with the session)."""
        if self.conn is not None:
            self.conn.close()
        self.conn = None
        self.registered = False


class _Acker:
    """Collects finished messages and acks them in batches from a thread of its own.

    Batching turns one commit per message into one per batch (measured: the
    per-message acks held one worker at about 1.3k msg/s). A message whose
    handler finished waits at most `interval` for its ack; if the process dies
    in between, the message comes back after its vt, as at-least-once allows.
    """

    def __init__(self, flush: Callable[[list[tuple[_Task, Any]]], None], interval: float = 0.01):
        self._flush = flush
        self._interval = interval
        self._pending: list[tuple[_Task, Any]] = []
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="pgqueue-acker", daemon=True)
        self._thread.start()

    def add(self, task: _Task, result: Any) -> None:
        self.add_many([(task, result)])

    def add_many(self, items: list[tuple[_Task, Any]]) -> None:
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
            time.sleep(self._interval)  # let a batch gather
            with self._cond:
                batch, self._pending = self._pending, []
            self._flush(batch)

    def stop(self) -> None:
        """Flush what is pending, then end the thread."""
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join()


class Worker:
    """Runs an App's handlers against the queues until stopped; see WorkerSettings."""

    def __init__(self, app: App, client: Client, settings: WorkerSettings | None = None) -> None:
        """A worker over `client`'s pool (which needs concurrency + readers + 1 connections)."""
        self.app = app
        self.client = client
        settings = settings or WorkerSettings()
        queues = settings.queues or tuple(app.handlers)
        missing = [q for q in queues if q not in app.handlers]
        if not queues or missing:
            raise InvalidArgument(
                f"no handler for queue(s) {missing}" if missing else "the app has no handlers"
            )
        self.settings = replace(settings, queues=queues)
        self.log = log.bind(worker=f"{os.getpid()}")
        self._stopping = threading.Event()
        self._forced = threading.Event()
        self._tasks: dict[tuple[str, int], _Task] = {}
        self._tasks_lock = threading.Lock()
        # Handler threads take tasks from a deque (popleft is atomic) and are
        # woken once per read batch, not once per message (measured: an
        # executor submit and a wait over every future per completion cost
        # more than the database did at a few thousand msg/s).
        self._ready: collections.deque[_Task | _Batch] = collections.deque()
        self._ready_cond = threading.Condition()
        self._closing = False
        self._slot = threading.Event()  # set whenever a task finishes
        self._handlers = [
            threading.Thread(target=self._handler_loop, name=f"pgqueue-handler-{i}", daemon=True)
            for i in range(self.settings.concurrency)
        ]
        for t in self._handlers:
            t.start()
        self._loop: asyncio.AbstractEventLoop | None = None
        # A batch handler holds a whole read while it runs: room for one per thread.
        batched = any(app.handlers[q].batch for q in queues)
        self._unit = self.settings.batch_size if batched else 1
        self._last_sweep = 0.0
        self._turn = 0
        self.handled = 0
        self._acker = _Acker(self._flush_acks)

    # -- control ------------------------------------------------------------

    def stop(self, *, force: bool = False) -> None:
        """Stop reading and finish in-flight work (force: give it back at once)."""
        if force:
            self._forced.set()
        self._stopping.set()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        first = not self._stopping.is_set()
        self.log.warning("worker.signal", signal=signal.Signals(signum).name, graceful=first)
        self.stop(force=not first)

    def run(self, *, install_signals: bool = True) -> int:
        """Run until stop() or SIGTERM/SIGINT (a second one stops at once); the exit code."""
        if install_signals and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        s = self.settings
        existing = {q.queue_name for q in self.client.list_queues()}
        missing = [q for q in s.queues if q not in existing]
        if missing:
            raise QueueNotFound(
                f"queue(s) {', '.join(missing)} do not exist; create them first"
                " (Client.create_queue or SELECT pgqueue.create_queue(...)), or pass --queue"
                " for the ones this worker should consume"
            )
        # A read of nothing: a login role that may not read (docs/security.md)
        # fails here with one PermissionDenied, not at every poll from now on.
        for q in s.queues:
            self.client.read(q, vt=s.vt, qty=0)
        self.log.info("worker.started", queues=list(s.queues), concurrency=s.concurrency, vt=s.vt)
        listener = (
            _Listener(s.listen_dsn or self._dsn(), s.queues, self._stopping) if s.listen else None
        )
        # Extra readers overlap their reads with this loop's: while one waits on
        # the database, another's batch is being handled.
        readers = [
            threading.Thread(target=self._reader_loop, name=f"pgqueue-reader-{i}", daemon=True)
            for i in range(1, s.readers)
        ]
        for t in readers:
            t.start()
        try:
            while not self._stopping.is_set():
                self._tick()
                got = self._fill()
                if got:
                    if listener:
                        listener.busy()
                    continue
                if self._in_flight():
                    self._wait_for_a_slot(0.2)
                elif listener:
                    listener.idle(s.poll_interval)
                else:
                    self._stopping.wait(s.poll_interval)
        finally:
            self._stopping.set()
            for t in readers:  # a read in progress registers its tasks before shutdown looks
                t.join()
            if listener:
                listener.close()
            code = self._shutdown()
        return code

    def _reader_loop(self) -> None:
        """An extra reader: fills free capacity; the main loop keeps the wake-ups and ticks."""
        s = self.settings
        while not self._stopping.is_set():
            if self._fill():
                continue
            # No room, or nothing visible: a short pause when busy, a poll when idle.
            self._stopping.wait(0.002 if self._in_flight() else s.poll_interval)

    def _dsn(self) -> str:
        return str(self.client.pool.conninfo)

    # -- the loop -----------------------------------------------------------

    def _tick(self) -> None:
        s = self.settings
        if s.health_file:
            Path(s.health_file).touch()
        self._heartbeat()
        if s.hard_timeout:
            self._release_hung()
        now = time.monotonic()
        if s.sweep_interval and now - self._last_sweep >= s.sweep_interval:
            self._last_sweep = now
            self._quietly("barrier.sweep_failed", self.client.expire_barriers)

    def _in_flight(self) -> int:
        with self._tasks_lock:
            return len(self._tasks)

    def _fill(self) -> int:
        """Read up to the free capacity, round-robin over the queues; how many started."""
        s = self.settings
        started = 0
        # Up to `batch` messages wait locally beyond the `concurrency` running
        # ones (their leases kept alive like the others'), and a read waits
        # until half a batch has room, so reads fetch whole batches instead of
        # the few slots that just freed.
        limit = s.concurrency * self._unit + s.batch_size
        for i in range(len(s.queues)):
            in_flight = self._in_flight()
            free = limit - in_flight
            if self._stopping.is_set() or free <= 0:
                break
            if in_flight > s.concurrency and free < max(1, s.batch_size // 2):
                break
            queue = s.queues[(self._turn + i) % len(s.queues)]
            try:
                msgs = self.client.read(queue, vt=s.vt, qty=min(s.batch_size, free))
            except _DB_ERRORS as exc:
                self.log.error("worker.read_failed", queue=queue, error=str(exc))
                self._stopping.wait(s.poll_interval)
                continue
            read_at = time.monotonic()
            handler = self.app.handlers[queue]
            tasks = [_Task(msg, handler, read_at, read_at + s.vt) for msg in msgs]
            self._start(tasks, _Batch(tasks) if handler.batch and tasks else None)
            started += len(msgs)
        self._turn += 1
        return started

    def _start(self, tasks: list[_Task], batch: _Batch | None) -> None:
        if not tasks:
            return
        with self._tasks_lock:
            for task in tasks:
                self._tasks[(task.msg.queue, task.msg.msg_id)] = task
        if batch is not None:
            self._ready.append(batch)
        else:
            self._ready.extend(tasks)
        with self._ready_cond:
            self._ready_cond.notify(1 if batch is not None else len(tasks))

    def _handler_loop(self) -> None:
        while True:
            try:
                task = self._ready.popleft()
            except IndexError:
                # Checked again under the lock: _start extends before it notifies.
                with self._ready_cond:
                    while not self._ready and not self._closing:
                        self._ready_cond.wait()
                    if not self._ready:
                        return
                continue
            if isinstance(task, _Batch):
                self._process_batch(task)
            elif not task.abandoned:  # given back before it started
                self._process(task)

    def _wait_for_a_slot(self, timeout: float) -> None:
        # A wake-up lost between wait() and clear() costs one more pass of the
        # loop, never a stall: the caller re-reads the task count first.
        self._slot.wait(timeout)
        self._slot.clear()

    def _heartbeat(self) -> None:
        """Extend the lease of every message whose handler has used up part of its vt."""
        s = self.settings
        now = time.monotonic()
        margin = s.vt * (1 - s.heartbeat_fraction)
        with self._tasks_lock:
            due = [t for t in self._tasks.values() if t.lease_until - now <= margin]
        for task in due:
            msg = task.msg
            try:
                extended = self.client.set_vt(msg.queue, msg.msg_id, s.vt)
            except _DB_ERRORS as exc:
                self._msg_log(msg).error("message.heartbeat_failed", error=str(exc))
                continue
            task.lease_until = time.monotonic() + s.vt
            if extended is None:
                self._msg_log(msg).warning("message.lease_lost")
            else:
                self._msg_log(msg).debug("message.heartbeat", vt=s.vt)

    def _release_hung(self) -> None:
        now = time.monotonic()
        with self._tasks_lock:
            hung = [
                t
                for t in self._tasks.values()
                if t.running and now - t.started > self.settings.hard_timeout
            ]
        for task in hung:
            self._msg_log(task.msg).error(
                "handler.hung",
                running_for=round(now - task.started, 1),
                hard_timeout=self.settings.hard_timeout,
            )
            self._give_back(task)

    def _give_back(self, task: _Task) -> None:
        """Make the message visible to other consumers now; ignore the handler's late outcome."""
        task.abandoned = True
        with self._tasks_lock:
            self._tasks.pop((task.msg.queue, task.msg.msg_id), None)
        self._slot.set()
        self._quietly(
            "message.release_failed", self.client.set_vt, task.msg.queue, task.msg.msg_id, 0
        )
        self._msg_log(task.msg).warning("message.released")

    def _quietly(self, event: str, fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
        except _DB_ERRORS as exc:
            self.log.error(event, error=str(exc))

    # -- one message --------------------------------------------------------

    def _msg_log(self, msg: Message) -> Any:
        context: dict[str, Any] = {"queue": msg.queue, "msg_id": msg.msg_id, "read_ct": msg.read_ct}
        if msg.barrier_id is not None:
            context["barrier_id"] = msg.barrier_id
        return self.log.bind(**context)

    def _process(self, task: _Task) -> None:
        msg, handler = task.msg, task.handler
        task.started = time.monotonic()  # the hard timeout counts from here
        task.running = True
        try:
            if handler.transactional:
                self._run_transactional(task)
            else:
                result = self._call(handler, msg)
                if task.abandoned:
                    self._msg_log(msg).warning("message.late_result_ignored")
                    return
                # Its slot frees now; the acker acks it within milliseconds.
                self._acker.add(task, result)
                return
            self._done(task)
        except Poison as exc:
            self._poison(task, exc)
        except Exception as exc:
            # The user's handler failed (any exception is its business, not
            # ours): the message goes back with a backoff; after max_attempts
            # reads the queue itself poison-drops it.
            if not task.abandoned:
                self._nack(task, exc, self._msg_log(msg))
        finally:
            self._forget(task)

    def _poison(self, task: _Task, exc: Poison) -> None:
        """Poison the message at once, as its handler asked (not if given back meanwhile)."""
        if task.abandoned:
            return
        msg = task.msg
        reason = str(exc) or "poisoned by its handler"
        self._quietly("message.poison_failed", self.client.poison, msg.queue, msg.msg_id, reason)
        self._msg_log(msg).warning("message.poisoned", reason=reason)

    def _process_batch(self, batch: _Batch) -> None:
        tasks = [t for t in batch.tasks if not t.abandoned]  # not given back before it started
        handler = batch.handler
        now = time.monotonic()
        for task in tasks:
            task.started = now  # the hard timeout counts from here
            task.running = True
        try:
            if not tasks:
                return
            if handler.transactional:
                self._run_transactional_batch(tasks)
                for task in tasks:
                    self._done(task)
                return
            results = self._call_batch(handler, [t.msg for t in tasks])
            done = [(t, r) for t, r in zip(tasks, results, strict=True) if not t.abandoned]
            if len(done) < len(tasks):
                self.log.warning("message.late_result_ignored", count=len(tasks) - len(done))
            self._acker.add_many(done)
        except Poison as exc:
            for task in tasks:
                self._poison(task, exc)
        except Exception as exc:
            for task in tasks:
                if not task.abandoned:
                    self._nack(task, exc, self._msg_log(task.msg))
        finally:
            for task in batch.tasks:
                self._forget(task)

    def _call_batch(self, handler: Handler, msgs: list[Message]) -> list[Any]:
        """The batch handler's results, one per message (None for each when it returned None)."""
        return self._batch_results(handler, msgs, self._call(handler, msgs))

    @staticmethod
    def _batch_results(handler: Handler, msgs: list[Message], result: Any) -> list[Any]:
        if result is None:
            return [None] * len(msgs)
        if isinstance(result, (list, tuple)) and len(result) == len(msgs):
            return list(result)
        got = f"{len(result)} results" if isinstance(result, (list, tuple)) else repr(result)[:80]
        raise InvalidArgument(
            f"the batch handler of {handler.queue!r} returned {got} for {len(msgs)} messages;"
            " return None or one result per message"
        )

    def _run_transactional_batch(self, tasks: list[_Task]) -> None:
        # As _run_transactional: handler writes and acks commit or roll back together.
        msgs = [t.msg for t in tasks]
        handler = tasks[0].handler
        with self.client.pool.connection() as conn, conn.transaction():
            results = self._batch_results(handler, msgs, handler.func(msgs, conn))
            if any(t.abandoned for t in tasks):
                raise Retry("abandoned by the runtime")
            kinds: dict[bool, list[tuple[_Task, Any]]] = {}
            for task, result in zip(tasks, results, strict=True):
                kinds.setdefault(_is_member(task.msg), []).append((task, result))
            for member, items in kinds.items():
                self._ack_many(handler.queue, member, items, conn)

    def _forget(self, task: _Task) -> None:
        with self._tasks_lock:
            if self._tasks.get((task.msg.queue, task.msg.msg_id)) is task:
                del self._tasks[(task.msg.queue, task.msg.msg_id)]
        self._slot.set()

    def _done(self, task: _Task) -> None:
        self.handled += 1
        self._msg_log(task.msg).debug(
            "message.acked", seconds=round(time.monotonic() - task.started, 3)
        )

    def _flush_acks(self, batch: list[tuple[_Task, Any]]) -> None:
        """Ack a batch of finished messages: one statement per queue and kind.

        Acks are idempotent, so each statement is retried on a fresh connection
        when the connection died; one that still fails leaves its messages to
        come back after their vt (at-least-once), never lost.
        """
        groups: dict[tuple[str, bool], list[tuple[_Task, Any]]] = {}
        for task, result in batch:
            groups.setdefault((task.msg.queue, _is_member(task.msg)), []).append((task, result))
        for (queue, member), items in groups.items():
            try:
                self._ack_many(queue, member, items)
            except _DB_ERRORS as exc:
                ids = [t.msg.msg_id for t, _ in items]
                self.log.error("message.ack_failed", queue=queue, msg_ids=ids, error=str(exc))
                continue
            for task, _ in items:
                self._done(task)

    def _ack_many(
        self,
        queue: str,
        member: bool,
        items: list[tuple[_Task, Any]],
        conn: Connection | None = None,
    ) -> None:
        """Ack finished messages of one queue and kind in one statement (on conn, if given)."""
        ids = [t.msg.msg_id for t, _ in items]
        if member:
            results = [self._json_or_none(t.msg, r) for t, r in items]
            self.client.run(complete_members(queue, ids, ["succeeded"] * len(ids), results), conn)
        elif self.settings.ack == "archive":
            self.client.archive_many(queue, ids, conn=conn)
        else:
            self.client.delete_many(queue, ids, conn=conn)

    def _json_or_none(self, msg: Message, result: Any) -> Any:
        try:
            encode_json(result, "result")
        except InvalidMessage as exc:
            self._msg_log(msg).warning("message.result_not_json", error=str(exc))
            return None
        return result

    def _call(self, handler: Handler, arg: Message | list[Message]) -> Any:
        """The handler's return value: called in this thread, or awaited on the event loop."""
        if not handler.is_async:
            return handler.func(arg)
        return asyncio.run_coroutine_threadsafe(handler.func(arg), self._event_loop()).result()

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._tasks_lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="pgqueue-async", daemon=True).start()
                self._loop = loop
            return self._loop

    def _run_transactional(self, task: _Task) -> None:
        # Not retried on a dead connection: if the commit did not happen, the
        # handler's writes and the ack were rolled back together and the
        # message is simply delivered again after its vt.
        with self.client.pool.connection() as conn, conn.transaction():
            result = task.handler.func(task.msg, conn)
            if task.abandoned:
                raise Retry("abandoned by the runtime")
            self._ack(task.msg, result, conn)

    def _ack(self, msg: Message, result: Any, conn: Connection) -> None:
        """Ack one message inside the caller's (the transactional handler's) transaction."""
        if _is_member(msg):
            call = complete_members(
                msg.queue, [msg.msg_id], ["succeeded"], [self._json_or_none(msg, result)]
            )
            self.client.run(call, conn)
        elif self.settings.ack == "archive":
            self.client.archive(msg.queue, msg.msg_id, conn=conn)
        else:
            self.client.delete(msg.queue, msg.msg_id, conn=conn)

    def _nack(self, task: _Task, exc: Exception, mlog: Any) -> None:
        s = self.settings
        msg = task.msg
        if isinstance(exc, Retry) and exc.delay is not None:
            delay = exc.delay
        else:
            backoff = min(s.backoff_max, s.backoff_base * 2 ** max(msg.read_ct - 1, 0))
            delay = round(backoff * random.uniform(0.5, 1.5))
        error = f"{type(exc).__name__}: {exc}"
        mlog.warning("message.failed", error=error, retry_in=delay)
        try:
            self.client.set_vt(msg.queue, msg.msg_id, max(0, int(delay)), error=error)
        except _DB_ERRORS as nack_exc:
            mlog.error("message.nack_failed", error=str(nack_exc))

    # -- shutdown -----------------------------------------------------------

    def _shutdown(self) -> int:
        s = self.settings
        self.log.info("worker.stopping", in_flight=self._in_flight(), grace=s.shutdown_grace)
        deadline = time.monotonic() + (0 if self._forced.is_set() else s.shutdown_grace)
        while self._in_flight() and time.monotonic() < deadline and not self._forced.is_set():
            self._heartbeat()
            self._wait_for_a_slot(min(0.2, max(deadline - time.monotonic(), 0)))
        with self._tasks_lock:
            unfinished = list(self._tasks.values())
        for task in unfinished:
            self._give_back(task)
        self._acker.stop()
        with self._ready_cond:  # threads stuck in a hung handler are daemons: not waited for
            self._closing = True
            self._ready_cond.notify_all()
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        self.log.info("worker.stopped", handled=self.handled, released=len(unfinished))
        return 130 if self._forced.is_set() else 0
