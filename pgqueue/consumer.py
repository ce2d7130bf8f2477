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
from pgqueue.errors import (
    ConnectionLost,
    InvalidArgument,
    InvalidMessage,
    PgQueueError,
    QueueNotFound,
)
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
    startup_timeout: float = 60.0

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
        for name in (
            "hard_timeout",
            "poll_interval",
            "shutdown_grace",
            "sweep_interval",
            "startup_timeout",
        ):
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
    abandoned: bool = False  # set once, under the tasks lock
    running: bool = False  # its handler has started (set under the tasks lock)
    # A fenced call found the lease taken over by another reader: no more
    # heartbeats, and no nack, release or poison of the other reader's lease.
    lease_lost: bool = False
    batch: _Batch | None = None  # the batch it runs in, for a batch handler

    @property
    def unit(self) -> _Task | _Batch:
        """What one handler thread runs: this task, or its whole batch."""
        return self.batch if self.batch is not None else self


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


class _LeaseLost(Exception):
    """Our lease on a message was taken over: roll back what the handler wrote."""


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
        # Units (a task, or a batch) whose messages were given back while their
        # handler still ran: each holds a handler thread until it returns.
        self._stuck: set[_Task | _Batch] = set()
        self._max_attempts: dict[str, int] = {}
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
        existing = self._wait_for_database()
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

    def _wait_for_database(self) -> set[str]:
        """The existing queues, once the database answers; waits up to startup_timeout for it.

        A worker often starts before its database (a container, a restart):
        refused connections and a server starting or shutting down are waited
        out, each wait logged; any other error is raised at once.
        """
        s = self.settings
        deadline = time.monotonic() + s.startup_timeout
        while True:
            try:
                queues = self.client.list_queues()
            except ConnectionLost as exc:
                left = deadline - time.monotonic()
                if left <= 0 or self._stopping.is_set():
                    raise ConnectionLost(
                        f"{exc}; gave up after waiting {s.startup_timeout:g}s"
                        " (PGQUEUE_STARTUP_TIMEOUT)"
                    ) from exc
                self.log.warning(
                    "worker.waiting_for_database", error=exc.what, gives_up_in=round(left, 1)
                )
                self._stopping.wait(min(1.0, left))
                continue
            self._max_attempts = {q.queue_name: q.max_attempts for q in queues}
            return set(self._max_attempts)

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
        if s.health_file and self._healthy_threads() > 0:
            # Not touched while every handler thread is stuck: probes see it age.
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

    def _healthy_threads(self) -> int:
        """Handler threads not held by a handler whose message was given back as hung."""
        with self._tasks_lock:
            return self.settings.concurrency - len(self._stuck)

    def _fill(self) -> int:
        """Read up to the free capacity, round-robin over the queues; how many started."""
        s = self.settings
        started = 0
        # Up to `batch` messages wait locally beyond the ones running on
        # healthy threads (a thread held by a hung handler starts nothing), and
        # a read waits until half a batch has room, so reads fetch whole
        # batches instead of the few slots that just freed. With no healthy
        # thread, nothing is read: a worker leases no more than it can start.
        healthy = self._healthy_threads()
        limit = healthy * self._unit + s.batch_size if healthy > 0 else 0
        for i in range(len(s.queues)):
            in_flight = self._in_flight()
            free = limit - in_flight
            if self._stopping.is_set() or free <= 0:
                break
            if in_flight > healthy and free < max(1, s.batch_size // 2):
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
            batch = _Batch(tasks) if handler.batch and tasks else None
            for task in tasks:
                task.batch = batch
            self._start(tasks, batch)
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
            else:
                self._process(task)

    def _wait_for_a_slot(self, timeout: float) -> None:
        # A wake-up lost between wait() and clear() costs one more pass of the
        # loop, never a stall: the caller re-reads the task count first.
        self._slot.wait(timeout)
        self._slot.clear()

    def _heartbeat(self) -> None:
        """Extend the leases of running messages that used up part of their vt.

        Only running ones: a message waiting locally whose lease would need
        extending has waited too long for a handler, and is given back so
        another consumer can start it.
        """
        s = self.settings
        now = time.monotonic()
        margin = s.vt * (1 - s.heartbeat_fraction)
        with self._tasks_lock:
            due = [
                t
                for t in self._tasks.values()
                if not t.lease_lost and t.lease_until - now <= margin
            ]
            stale = [t for t in due if not t.running]
            for task in stale:
                task.abandoned = True
        for task in stale:
            self._give_back(task, "waited a lease's worth for a handler")
        for task in due:
            if task in stale:
                continue
            msg = task.msg
            try:
                extended = self.client.set_vt(msg.queue, msg.msg_id, s.vt, read_ct=msg.read_ct)
            except _DB_ERRORS as exc:
                self._msg_log(msg).error("message.heartbeat_failed", error=str(exc))
                continue
            task.lease_until = time.monotonic() + s.vt
            if extended is None:
                self._lease_lost(task)
            else:
                self._msg_log(msg).debug("message.heartbeat", vt=s.vt)

    def _lease_lost(self, task: _Task) -> None:
        """Our lease on the message is gone: say so once, and never touch that lease again."""
        with self._tasks_lock:
            if task.lease_lost:
                return
            task.lease_lost = True
            finished = self._tasks.get((task.msg.queue, task.msg.msg_id)) is not task
        if not finished:  # a heartbeat racing our own ack finds the message gone: no news
            self._msg_log(task.msg).warning("message.lease_lost")

    def _release_hung(self) -> None:
        now = time.monotonic()
        with self._tasks_lock:
            hung = [
                t
                for t in self._tasks.values()
                if t.running and now - t.started > self.settings.hard_timeout
            ]
            for task in hung:
                task.abandoned = True
                # Its thread stays in the handler until it returns: one fewer to start work.
                self._stuck.add(task.unit)
        for task in hung:
            self._msg_log(task.msg).error(
                "handler.hung",
                running_for=round(now - task.started, 1),
                hard_timeout=self.settings.hard_timeout,
            )
            self._give_back(task, "hung")
        if hung and self._healthy_threads() <= 0:
            self.log.error(
                "worker.stuck",
                concurrency=self.settings.concurrency,
                advice="every handler thread is in a hung handler: reading stops until one returns",
            )
            self._give_back_waiting("no handler thread can start it")

    def _give_back_waiting(self, why: str) -> None:
        """Give back every message that waits locally and has not started."""
        with self._tasks_lock:
            waiting = [t for t in self._tasks.values() if not t.running and not t.abandoned]
            for task in waiting:
                task.abandoned = True
        for task in waiting:
            self._give_back(task, why)

    def _give_back(self, task: _Task, why: str) -> None:
        """Make the message visible to other consumers now, if our lease is still the current one.

        The caller has marked the task abandoned (under the tasks lock), so the
        handler's late outcome is neither acked nor nacked.
        """
        with self._tasks_lock:
            self._tasks.pop((task.msg.queue, task.msg.msg_id), None)
        self._slot.set()
        if task.lease_lost:
            return
        msg = task.msg
        try:
            released = self.client.set_vt(msg.queue, msg.msg_id, 0, read_ct=msg.read_ct)
        except _DB_ERRORS as exc:
            self._msg_log(msg).error("message.release_failed", error=str(exc))
            return
        if released is None:
            self._lease_lost(task)
        else:
            self._msg_log(msg).warning("message.released", why=why, started=task.running)

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

    def _begin(self, tasks: list[_Task]) -> list[_Task]:
        """Mark tasks started and return them; none once the worker is stopping.

        Under the tasks lock, so a task either starts here or is given back by
        whoever abandons it (shutdown, a lease that waited too long), never both.
        """
        with self._tasks_lock:
            if self._stopping.is_set():
                return []
            started = [t for t in tasks if not t.abandoned]
            now = time.monotonic()
            for task in started:
                task.started = now  # the hard timeout counts from here
                task.running = True
        return started

    def _process(self, task: _Task) -> None:
        msg, handler = task.msg, task.handler
        if not self._begin([task]):
            return  # given back, or left for the shutdown to give back
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
        except _LeaseLost:
            self._lease_lost(task)  # rolled back: the handler's writes are the new holder's
        except Poison as exc:
            self._poison(task, exc)
        except Exception as exc:
            # The user's handler failed (any exception is its business, not
            # ours): the message goes back with a backoff; its last attempt
            # goes to the poison table.
            if not task.abandoned:
                self._nack(task, exc, self._msg_log(msg))
        finally:
            self._forget(task)

    def _poison(self, task: _Task, exc: Poison) -> None:
        """Poison the message at once, as its handler asked, if our lease is still current."""
        if task.abandoned or task.lease_lost:
            return
        msg = task.msg
        reason = str(exc) or "poisoned by its handler"
        try:
            moved = self.client.poison(msg.queue, msg.msg_id, reason, read_ct=msg.read_ct)
        except _DB_ERRORS as db_exc:
            self._msg_log(msg).error("message.poison_failed", error=str(db_exc))
            return
        if moved:
            self._msg_log(msg).warning("message.poisoned", reason=reason, by="handler")
        else:
            self._lease_lost(task)

    def _process_batch(self, batch: _Batch) -> None:
        tasks = self._begin(batch.tasks)  # not those given back before it started
        if not tasks:
            for task in batch.tasks:
                if task.abandoned:
                    self._forget(task)
            return
        handler = batch.handler
        try:
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
        except _LeaseLost:
            for task in tasks:
                self._lease_lost(task)
        except Poison as exc:
            for task in tasks:
                self._poison(task, exc)
        except Exception as exc:
            for task in tasks:
                if not task.abandoned:
                    self._nack(task, exc, self._msg_log(task.msg))
        finally:
            for task in batch.tasks:
                if task.running or task.abandoned:
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
        with self.client.connection() as conn, conn.transaction():
            results = self._batch_results(handler, msgs, handler.func(msgs, conn))
            if any(t.abandoned for t in tasks):
                raise Retry("abandoned by the runtime")
            self._hold(handler.queue, tasks, conn)
            kinds: dict[bool, list[tuple[_Task, Any]]] = {}
            for task, result in zip(tasks, results, strict=True):
                kinds.setdefault(_is_member(task.msg), []).append((task, result))
            for member, items in kinds.items():
                self._ack_many(handler.queue, member, items, conn)

    def _forget(self, task: _Task) -> None:
        """The handler of this task returned (or never started): drop it, and free its thread."""
        with self._tasks_lock:
            if self._tasks.get((task.msg.queue, task.msg.msg_id)) is task:
                del self._tasks[(task.msg.queue, task.msg.msg_id)]
            # A thread held by a handler given back as hung is free again.
            recovered = task.unit in self._stuck
            self._stuck.discard(task.unit)
        self._slot.set()
        if recovered:
            self.log.warning("handler.returned_after_release", healthy=self._healthy_threads())

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
        with self.client.connection() as conn, conn.transaction():
            result = task.handler.func(task.msg, conn)
            if task.abandoned:
                raise Retry("abandoned by the runtime")
            self._hold(task.msg.queue, [task], conn)
            self._ack(task.msg, result, conn)

    def _hold(self, queue: str, tasks: list[_Task], conn: Connection) -> None:
        """Lock our leases in the handler's transaction, or raise _LeaseLost to roll it back.

        Acks are not fenced (a finished run may ack), so without this a stalled
        run that lost its lease would commit its writes, and the run that took
        over would commit them again. Locked, the messages cannot be read or
        acked by anyone else before we commit: the writes commit exactly once.
        """
        leases = [(t.msg.msg_id, t.msg.read_ct) for t in tasks]
        held: list[int] = self.client.run(_queue.hold_leases(queue, leases), conn)
        if len(held) < len(leases):
            raise _LeaseLost

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
        """Give the failed attempt back with a backoff; its last one goes to the poison table."""
        s = self.settings
        msg = task.msg
        if task.lease_lost:
            return  # the lease is another reader's: its run decides
        if isinstance(exc, Retry) and exc.delay is not None:
            delay = exc.delay
        else:
            backoff = min(s.backoff_max, s.backoff_base * 2 ** max(msg.read_ct - 1, 0))
            delay = round(backoff * random.uniform(0.5, 1.5))
        error = f"{type(exc).__name__}: {exc}"
        try:
            outcome = self.client.nack(
                msg.queue, msg.msg_id, read_ct=msg.read_ct, delay=max(0, int(delay)), error=error
            )
        except _DB_ERRORS as nack_exc:
            mlog.error("message.nack_failed", error=str(nack_exc), handler_error=error)
            return
        if outcome == "retry":
            mlog.warning("message.failed", error=error, retry_in=delay)
        elif outcome == "poisoned":
            mlog.warning(
                "message.poisoned",
                reason="max_attempts exceeded",
                error=error,
                max_attempts=self._max_attempts.get(msg.queue),
                by="nack",
            )
        else:
            mlog.warning("message.failed", error=error)
            self._lease_lost(task)

    # -- shutdown -----------------------------------------------------------

    def _shutdown(self) -> int:
        s = self.settings
        self.log.info("worker.stopping", in_flight=self._in_flight(), grace=s.shutdown_grace)
        # Nothing starts once stopping (see _begin): what waits locally goes back now.
        self._give_back_waiting("the worker is stopping")
        deadline = time.monotonic() + (0 if self._forced.is_set() else s.shutdown_grace)
        while self._in_flight() and time.monotonic() < deadline and not self._forced.is_set():
            self._heartbeat()
            self._wait_for_a_slot(min(0.2, max(deadline - time.monotonic(), 0)))
        with self._tasks_lock:
            unfinished = list(self._tasks.values())
            for task in unfinished:
                task.abandoned = True
        for task in unfinished:
            self._give_back(task, "still running when the worker stopped")
        self._acker.stop()
        with self._ready_cond:  # threads stuck in a hung handler are daemons: not waited for
            self._closing = True
            self._ready_cond.notify_all()
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        self.log.info("worker.stopped", handled=self.handled, released=len(unfinished))
        return 130 if self._forced.is_set() else 0
