"""The worker's row in the registry (pgqueue.worker): a heartbeat every registry_interval.

A heartbeat says who the worker is (a random id, host, pid, queues,
concurrency), what it holds, whether it is stopping, and what it did since
the last heartbeat that committed: acks, nacks and poisons by queue, the
rates of queue_rates, tallied in memory so the ack path writes nothing more.
It gets back which of its queues are paused (pauses.py). A heartbeat that
fails is logged and changes nothing else: its tallies go into the next one,
and the worker runs on. A stopping worker heartbeats with stopping=true, and
removes its row once its handlers are done; a killed one shows as not alive
15 s after its last heartbeat (the database's clock decides).
"""

from __future__ import annotations

import math
import os
import socket
import threading
import uuid
from typing import Any

from pgqueue._worker.clock import Clock
from pgqueue._worker.db import DB_ERRORS, WorkerDb
from pgqueue._worker.inflight import InFlight
from pgqueue._worker.pauses import Pauses
from pgqueue._worker.settings import WorkerSettings

OUTCOMES = ("acked", "nacked", "poisoned")  # what a heartbeat reports, in its order
_SLOT = {outcome: i for i, outcome in enumerate(OUTCOMES)}


class Tally:
    """Acks, nacks and poisons by queue since the last heartbeat that committed; thread-safe."""

    def __init__(self) -> None:
        """Nothing counted yet."""
        self._lock = threading.Lock()
        self._counts: dict[str, list[int]] = {}

    def count(self, queue: str, outcome: str, n: int = 1) -> None:
        """n messages of the queue had that outcome; only acks, nacks and poisons are kept."""
        slot = _SLOT.get(outcome)
        if slot is None:
            return  # a lost lease or a released prefetch: not a rate the dashboard shows
        with self._lock:
            self._counts.setdefault(queue, [0, 0, 0])[slot] += n

    def read_poisoned(self, queue: str) -> None:
        """A read poison-dropped a message of the queue (the client's observer)."""
        self.count(queue, "poisoned")

    def empty(self) -> bool:
        """Nothing counted since the last take."""
        with self._lock:
            return not self._counts

    def take(self) -> dict[str, tuple[int, int, int]]:
        """Everything counted so far, which is forgotten here (put_back it if not delivered)."""
        with self._lock:
            taken, self._counts = self._counts, {}
        return {q: (a, n, p) for q, (a, n, p) in taken.items()}

    def put_back(self, taken: dict[str, tuple[int, int, int]]) -> None:
        """Counts a heartbeat failed to deliver: the next one carries them."""
        with self._lock:
            for queue, counts in taken.items():
                mine = self._counts.setdefault(queue, [0, 0, 0])
                for i, n in enumerate(counts):
                    mine[i] += n


class Registry:
    """Keeps the worker's row in pgqueue.worker and its queues' paused flags up to date."""

    def __init__(
        self,
        db: WorkerDb,
        settings: WorkerSettings,
        inflight: InFlight,
        pauses: Pauses,
        clock: Clock,
        log: Any,
    ) -> None:
        """The registry duty of one worker (settings.registry_interval > 0)."""
        self.db = db
        self.settings = settings
        self.inflight = inflight
        self.pauses = pauses
        self.clock = clock
        self.log = log
        self.worker_id = uuid.uuid4()
        self.host = socket.gethostname()[:255] or "unknown"
        self.pid = os.getpid()
        self.tally = Tally()
        self.stopping = False
        self._next = -math.inf

    def due_in(self) -> float:
        """Seconds until the next heartbeat is due (0: now)."""
        return max(0.0, self._next - self.clock.now())

    def tick(self) -> None:
        """Heartbeat if one is due."""
        if self.clock.now() >= self._next:
            self.heartbeat()

    def heartbeat(self) -> bool:
        """Upsert the worker's row with what it did since the last one; False if it failed."""
        s = self.settings
        self._next = self.clock.now() + s.registry_interval
        taken = self.tally.take()
        asked = self.clock.now()  # the flags are as of this, or later
        try:
            flags = self.db.heartbeat(
                self.worker_id,
                self.host,
                self.pid,
                s.queues,
                s.concurrency,
                len(self.inflight),
                self.stopping,
                taken,
            )
        except DB_ERRORS as exc:
            self.tally.put_back(taken)
            self.log.warning("registry.heartbeat_failed", error=str(exc).strip())
            return False
        self.pauses.update(flags, as_of=asked)
        return True

    def stop(self) -> None:
        """The worker begins to stop: say so now (its row shows stopping)."""
        self.stopping = True
        self.heartbeat()

    def deregister(self) -> None:
        """The worker's handlers are done: deliver the last tallies, then remove its row."""
        if not self.tally.empty():
            self.heartbeat()  # the acks of the last handlers count too
        try:
            self.db.deregister(self.worker_id)
        except DB_ERRORS as exc:
            self.log.warning(
                "registry.deregister_failed",
                error=str(exc).strip(),
                advice="its row shows as not alive in 15 s and is removed in 10 minutes",
            )
