"""The worker's reads: lease as many messages as it can start soon, round-robin over its queues.

Back-pressure: a prefetch of messages waits locally beyond the ones running on
healthy handler threads (a thread held by a hung handler starts nothing), and
a read waits until half a prefetch has room, so reads fetch whole batches
instead of the few slots that just freed. With no healthy thread nothing is
read: a worker leases no more than it can start.

The prefetch is `batch` when set. Unset, it is what the handlers finish in
PREFETCH_SECONDS at the rate they finished lately: enough to keep them busy
through a read's round trip (with 16 handlers of 1 ms, a prefetch of 16 left
them idle a third of the time while the next read was on its way: 10.5k
msg/s, against 13k with 64 or more waiting), and never fewer than the handler
threads. Slow handlers get a small prefetch (a worker whose handlers take a
second holds no more than its concurrency waiting), so a worker does not hoard
leases that another worker would start sooner, and a message waits locally
about PREFETCH_SECONDS at most.

A paused queue is read once a poll interval (pauses.py), not on every turn.
"""

from __future__ import annotations

import threading
from typing import Any

from pgqueue._worker.acker import Acker
from pgqueue._worker.app import App
from pgqueue._worker.clock import Clock
from pgqueue._worker.db import DB_ERRORS, WorkerDb
from pgqueue._worker.dispatch import Dispatcher
from pgqueue._worker.inflight import Batch, InFlight, Task
from pgqueue._worker.pauses import Pauses
from pgqueue._worker.settings import WorkerSettings

# How many finished messages may wait for their acks before the worker stops
# leasing more (a worker leases no more than it can ack): four full ack
# batches, far more than a healthy acker ever has waiting.
ACKS_BEHIND = 4 * Acker.MAX_BATCH

PREFETCH_SECONDS = 0.025  # of work kept waiting locally, at the handlers' recent rate
MAX_PREFETCH = 1000
RATE_WINDOW = 0.5  # seconds over which that rate is measured


class Reader:
    """Fills a worker's free capacity with reads; extra reader threads overlap their reads."""

    def __init__(
        self,
        app: App,
        settings: WorkerSettings,
        db: WorkerDb,
        inflight: InFlight,
        dispatcher: Dispatcher,
        stopping: threading.Event,
        clock: Clock,
        log: Any,
        pauses: Pauses | None = None,
    ) -> None:
        """The reading duty of one worker; start() starts its extra reader threads."""
        self.pauses = pauses or Pauses(settings.queues, settings.poll_interval, clock, log)
        self.app = app
        self.settings = settings
        self.db = db
        self.inflight = inflight
        self.dispatcher = dispatcher
        self.stopping = stopping
        self.clock = clock
        self.log = log
        # A batch handler holds a whole read while it runs: room for one per thread.
        batched = any(app.handlers[q].batch for q in settings.queues)
        self.unit = settings.batch_size if batched else 1
        # Batch handlers get `batch_size` messages a call, so it is also their prefetch.
        self.adaptive = not batched and not settings.batch
        self._prefetch = settings.batch_size
        self._rate_at = clock.now()
        self._rate_finished = 0
        self._turn = 0
        self._threads: list[threading.Thread] = []

    def prefetch(self) -> int:
        """How many messages may wait locally for a handler (beyond those running)."""
        if not self.adaptive:
            return self._prefetch
        now = self.clock.now()
        if now - self._rate_at >= RATE_WINDOW:
            finished = self.inflight.finished
            rate = (finished - self._rate_finished) / (now - self._rate_at)
            self._rate_at, self._rate_finished = now, finished
            wanted = int(rate * PREFETCH_SECONDS)
            self._prefetch = min(MAX_PREFETCH, max(self.settings.concurrency, wanted))
        return self._prefetch

    def room(self) -> int:
        """How many more messages the worker may lease now (0: none until something finishes)."""
        healthy = self.inflight.healthy_threads()
        if healthy <= 0 or self.inflight.acking() > ACKS_BEHIND:
            return 0  # no thread can start more, or the acks fell behind
        prefetch = self.prefetch()
        in_flight = len(self.inflight)
        free = healthy * self.unit + prefetch - in_flight
        if in_flight > healthy and free < max(1, prefetch // 2):
            return 0
        return max(free, 0)

    def fill(self) -> int:
        """Read up to the free capacity, round-robin over the queues; how many were read."""
        s = self.settings
        got = 0
        for i in range(len(s.queues)):
            free = self.room()
            if self.stopping.is_set() or free <= 0:
                break
            queue = s.queues[(self._turn + i) % len(s.queues)]
            token = self.pauses.before_read(queue)
            if token is None:
                continue  # paused, and probed less than a poll interval ago
            # The lease runs from before the read: its end as the worker
            # knows it is never later than the server's vt.
            read_at = self.clock.now()
            try:
                msgs = self.db.read(queue, s.vt, min(self.prefetch(), free))
            except DB_ERRORS as exc:
                self.log.error("worker.read_failed", queue=queue, error=str(exc))
                self.stopping.wait(s.poll_interval)
                continue
            self.pauses.after_read(queue, token)
            handler = self.app.handlers[queue]
            tasks = [Task(msg, handler, read_at, read_at + s.vt, read_at=read_at) for msg in msgs]
            batch = Batch(tasks) if handler.batch and tasks else None
            for task in tasks:
                task.batch = batch
            self.dispatcher.submit(tasks, batch)
            got += len(msgs)
        self._turn += 1
        return got

    def start(self) -> None:
        """Start the extra readers (readers - 1): one reads while another waits on the database."""
        self._threads = [
            threading.Thread(target=self._extra, name=f"pgqueue-reader-{i}", daemon=True)
            for i in range(1, self.settings.readers)
        ]
        for t in self._threads:
            t.start()

    def join(self) -> None:
        """Wait for the extra readers to end (after stopping): what they read is held by then."""
        for t in self._threads:
            t.join()

    def _extra(self) -> None:
        while not self.stopping.is_set():
            if self.fill():
                continue
            # No room, or nothing visible: a short pause when busy, a poll when idle.
            busy = len(self.inflight) or self.inflight.acking()
            self.stopping.wait(0.002 if busy else self.settings.poll_interval)
