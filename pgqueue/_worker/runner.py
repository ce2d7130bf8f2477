"""Worker: the coordinator of a worker's duties, and its life: start, signals, the loop, shutdown.

The duties each own their state (pgqueue/_worker/): the table of messages in
flight, the reader, the dispatcher and its handler threads, the acker, the
leases, the listener, the paused queues, the registry. The Worker builds them,
starts their threads in run(), ticks them from its loop, and stops them in order.
"""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from pgqueue import _tracing
from pgqueue._client import Client
from pgqueue._connection import connect_refusal
from pgqueue._errors import ConnectionLost, InvalidArgument, QueueNotFound
from pgqueue._log import get_logger
from pgqueue._words import one_or_many, queue_names
from pgqueue._worker.acker import Acker
from pgqueue._worker.app import App
from pgqueue._worker.clock import Clock, SystemClock
from pgqueue._worker.db import DB_ERRORS, WorkerDb
from pgqueue._worker.dispatch import Dispatcher
from pgqueue._worker.inflight import InFlight
from pgqueue._worker.leases import Leases
from pgqueue._worker.listener import Listener
from pgqueue._worker.pauses import Pauses
from pgqueue._worker.reader import Reader
from pgqueue._worker.registry import Registry
from pgqueue._worker.settings import WorkerSettings

if TYPE_CHECKING:
    from pgqueue._metrics import WorkerMetrics

# How often at most the loop looks at every held message (heartbeats, hard
# timeouts, the health file); leases need extending seconds ahead, not sooner.
DUTY_INTERVAL = 0.05

log = get_logger()


class Worker:
    """Runs an App's handlers against the queues until stopped; see WorkerSettings."""

    def __init__(
        self,
        app: App,
        client: Client,
        settings: WorkerSettings | None = None,
        *,
        clock: Clock | None = None,
        tracer_provider: Any = None,
    ) -> None:
        """A worker over `client`'s pool (which needs settings.pool_size connections).

        It traces its runs (docs/observability.md) through `tracer_provider`,
        else the client's, else the global one, once an OpenTelemetry SDK is set.
        """
        settings = settings or WorkerSettings()
        queues = app.consumed(settings.queues)
        self.app = app
        self.settings = s = replace(settings, queues=queues)
        self.clock = clock or SystemClock()
        self.log = log.bind(worker=f"{os.getpid()}")
        self.db = WorkerDb(client, s.ack)
        self._stopping = threading.Event()
        self._forced = threading.Event()
        self.inflight = InFlight(s.concurrency)
        self.metrics = m = _metrics(s, client, self.db, self.inflight)
        if tracer_provider is None and client.tracing is not None:
            tracer_provider = client.tracing.provider
        self.tracing = t = _tracing.resolve(tracer_provider, s.trace_links)
        self.pauses = Pauses(s.queues, s.poll_interval, self.clock, self.log)
        self.registry = (
            Registry(self.db, s, self.inflight, self.pauses, self.clock, self.log)
            if s.registry_interval
            else None
        )
        tally = self.registry.tally if self.registry is not None else None
        self.leases = Leases(self.db, self.inflight, s, self.clock, self.log, m, tally)
        self.acker = Acker(
            self.db, self.inflight, self.clock, self.log, metrics=m, tracing=t, tally=tally
        )
        self.dispatcher = Dispatcher(
            s.concurrency,
            self.db,
            self.inflight,
            self.leases,
            self.acker,
            self._stopping,
            self.clock,
            self.log,
            m,
            t,
        )
        self.reader = Reader(
            app,
            s,
            self.db,
            self.inflight,
            self.dispatcher,
            self._stopping,
            self.clock,
            self.log,
            self.pauses,
        )
        self._last_sweep = -float("inf")
        self._last_duties = -float("inf")

    @property
    def handled(self) -> int:
        """How many messages this worker has acked."""
        return self.acker.handled

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
        """Run until stop() or SIGTERM/SIGINT/SIGHUP (a second one stops at once); the exit code."""
        if install_signals and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
            # A closed terminal or session (SIGHUP) would kill the process where
            # it stands, its leases waiting out their vt and its row left behind;
            # under nohup, which ignores it, it stays ignored.
            if signal.getsignal(signal.SIGHUP) is signal.SIG_DFL:
                signal.signal(signal.SIGHUP, self._on_signal)
        s = self.settings
        if self.metrics is not None:
            # Served from the start: a worker waiting for its database is
            # scraped as up 0, not missing.
            try:
                self.metrics.serve(s.metrics_port, s.metrics_host)
            except BaseException:
                self._close_metrics()
                raise
        self._hear(True)  # from the first read on: which queues are paused
        try:
            self._check_queues()
        except BaseException:
            self._hear(False)
            self._close_metrics()
            raise
        if self.metrics is not None:
            self.metrics.up.set(1)
        self.log.info("worker.started", queues=list(s.queues), concurrency=s.concurrency, vt=s.vt)
        if self.registry is not None:
            self.registry.heartbeat()
        listener = (
            Listener(
                s.listen_dsn or self.db.conninfo(), s.queues, self._stopping, self.log, self.pauses
            )
            if s.listen
            else None
        )
        self.acker.start()
        self.dispatcher.start()
        self.reader.start()
        try:
            while not self._stopping.is_set():
                self._tick()
                if self.reader.fill():
                    if listener:
                        listener.busy()
                    continue
                if len(self.inflight) or self.inflight.acking():
                    # busy: a slot or an ack frees soon (not the idle wait on LISTEN)
                    self._wait_for_a_slot(0.2)
                elif listener:
                    listener.idle(self._idle_wait())
                else:
                    self._stopping.wait(self._idle_wait())
        finally:
            self._stopping.set()
            self.reader.join()  # a read in progress holds its tasks before shutdown looks
            if listener:
                listener.close()
            if self.metrics is not None:
                self.metrics.up.set(0)
            try:
                code = self._shutdown()
            finally:
                self._hear(False)
                self._close_metrics()
        return code

    def _idle_wait(self) -> float:
        """How long an idle worker waits: the poll interval, cut short by a registry heartbeat."""
        if self.registry is None:
            return self.settings.poll_interval
        # Not below DUTY_INTERVAL: _tick runs the heartbeat no sooner, and a
        # shorter wait would only turn the loop (and read) for nothing.
        return min(self.settings.poll_interval, max(self.registry.due_in(), DUTY_INTERVAL))

    def _hear(self, on: bool) -> None:
        """Start (or stop) hearing from the client which reads met a paused queue or poisoned."""
        observers = self.db.client.observers
        hooks: list[tuple[list[Any], Any]] = [(observers.read_paused, self.pauses.read_paused)]
        if self.registry is not None:
            hooks.append((observers.read_poisoned, self.registry.tally.read_poisoned))
        for subscribers, hook in hooks:
            if on:
                subscribers.append(hook)
            elif hook in subscribers:
                subscribers.remove(hook)

    def _close_metrics(self) -> None:
        """Stop serving /metrics and stop hearing the client's events."""
        m = self.metrics
        if m is None:
            return
        observers = self.db.client.observers
        for hooks, hook in (
            (observers.retried, m.retried),
            (observers.read_poisoned, m.read_poisoned),
        ):
            if hook in hooks:
                hooks.remove(hook)
        m.close()

    def _check_queues(self) -> None:
        """Wait for the database (up to startup_timeout); refuse queues that are missing.

        A worker often starts before its database (a container, a restart):
        refused connections and a server starting or shutting down are waited
        out, each wait logged; any other error, such as a database that does
        not exist, is raised at once. A read of
        nothing then makes a login role that may not read (docs/security.md)
        fail here with one PermissionDenied, not at every poll from now on.
        """
        s = self.settings
        deadline = self.clock.now() + s.startup_timeout
        while True:
            try:
                self.leases.max_attempts = self.db.max_attempts()
                break
            except ConnectionLost as exc:
                # The pool only says it could not connect in time: one fresh
                # connection tells a server that is down (wait) from one that
                # answered and refused, e.g. no such database (never waited out).
                refused = connect_refusal(self.db.conninfo())
                if refused is not None:
                    raise refused from exc
                left = deadline - self.clock.now()
                if left <= 0 or self._stopping.is_set():
                    raise ConnectionLost(
                        f"{exc}; gave up after waiting {s.startup_timeout:g}s"
                        " (PGQUEUE_STARTUP_TIMEOUT)"
                    ) from exc
                self.log.warning(
                    "worker.waiting_for_database", error=exc.what, gives_up_in=round(left, 1)
                )
                self._stopping.wait(min(1.0, left))
        missing = [q for q in s.queues if q not in self.leases.max_attempts]
        if missing:
            exists = one_or_many(missing, "does not exist", "do not exist")
            raise QueueNotFound(
                f"{queue_names(missing)} {exists}; create {one_or_many(missing, 'it', 'them')}"
                " first (`pgqueue queue create NAME`, Client.create_queue or SELECT"
                " pgqueue.create_queue(...)), or pass --queue for the ones this worker should"
                " consume"
            )
        for q in s.queues:
            self.db.read(q, s.vt, 0)

    def _tick(self) -> None:
        s = self.settings
        now = self.clock.now()
        # The loop turns once per read or finished message; the duties that look
        # at every held message run at most every DUTY_INTERVAL (scanning a few
        # hundred held messages per completion cost an eighth of the worker's CPU).
        if now - self._last_duties < DUTY_INTERVAL:
            return
        self._last_duties = now
        if s.health_file and self.inflight.healthy_threads() > 0:
            # Not touched while every handler thread is stuck: probes see it age.
            Path(s.health_file).touch()
        self.leases.heartbeat()
        if self.registry is not None:
            self.registry.tick()
        if s.hard_timeout:
            self.leases.release_hung()
        if s.sweep_interval and now - self._last_sweep >= s.sweep_interval:
            self._last_sweep = now
            try:
                self.db.expire_barriers()
            except DB_ERRORS as exc:
                self.log.error("barrier.sweep_failed", error=str(exc))

    def _wait_for_a_slot(self, timeout: float) -> None:
        # A wake-up lost between wait() and clear() costs one more pass of the
        # loop, never a stall: the caller counts the tasks again first.
        self.inflight.changed.wait(timeout)
        self.inflight.changed.clear()

    def _shutdown(self) -> int:
        s = self.settings
        self.log.info("worker.stopping", in_flight=len(self.inflight), grace=s.shutdown_grace)
        if self.registry is not None:
            self.registry.stop()
        # Nothing starts once stopping (InFlight.begin): what waits locally goes back now.
        released = self.leases.give_back_waiting("the worker is stopping")
        deadline = self.clock.now() + (0 if self._forced.is_set() else s.shutdown_grace)
        while len(self.inflight) and self.clock.now() < deadline and not self._forced.is_set():
            self.leases.heartbeat()
            if self.registry is not None:
                self.registry.tick()
            self._wait_for_a_slot(min(0.2, max(deadline - self.clock.now(), 0)))
        released += self.leases.give_back_all("still running when the worker stopped")
        # what is left of the grace (a second at least) for the acks in flight
        unacked = self.acker.stop(max(1.0, deadline - self.clock.now()))
        if unacked:
            self.log.warning(
                "worker.acks_unfinished", count=unacked, advice="they come back after their vt"
            )
        self.dispatcher.close()
        if self.registry is not None:
            self.registry.deregister()
        self.log.info("worker.stopped", handled=self.handled, released=released)
        return 130 if self._forced.is_set() else 0


def _metrics(
    settings: WorkerSettings, client: Client, db: WorkerDb, inflight: InFlight
) -> WorkerMetrics | None:
    """The worker's metrics when settings.metrics_port is set (else None: nothing is imported).

    They hear the retries and a read's poison drops of `client` through its
    observers (subscribed here; Worker.run unsubscribes them when it ends).
    """
    if not settings.metrics_port:
        return None
    try:
        from pgqueue._metrics import WorkerMetrics
    except ImportError as exc:
        raise InvalidArgument(
            f"metrics_port={settings.metrics_port} needs prometheus_client:"
            " pip install 'pgqueue-py[prometheus]'"
        ) from exc
    metrics = WorkerMetrics(settings.queues)
    metrics.watch(inflight.by_queue, inflight.acking)
    client.observers.retried.append(metrics.retried)
    client.observers.read_poisoned.append(metrics.read_poisoned)
    return metrics
