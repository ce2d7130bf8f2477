"""Which of a worker's queues are paused: read once a poll interval, never woken by their sends.

A read of a paused queue returns nothing, with a NOTICE (PGQ11) the client
reports here (read_paused). From then on the reader skips that queue but for
one read every poll_interval, a probe that finds a resume nobody announced;
and the listener ignores the notifications of its sends, which go on while
it is paused: waking for each, a worker would read the queue once per send
(measured in tests/worker/test_worker_registry.py). resume_queue wakes the
queue's waiters with the payload 'resumed', and the reader reads it again at
once. The registry's heartbeat reports every queue's flag as well. Each
change, whichever of them saw it first, is logged once: `queue.paused`,
`queue.resumed`.

What is older than the latest change of a queue is ignored: a heartbeat
whose query began before it, and the PGQ11 notice of a read begun before a
resume. Either would otherwise pause a resumed queue again for a whole
poll interval (tests/worker/test_worker_duties.py).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

from pgqueue._worker.clock import Clock


class Pauses:
    """The paused queues of one worker, and when each may be read next; thread-safe."""

    def __init__(self, queues: Iterable[str], poll_interval: float, clock: Clock, log: Any) -> None:
        """Every queue running, until a read, a heartbeat or a notification says otherwise."""
        self.poll_interval = poll_interval
        self.clock = clock
        self.log = log
        self._lock = threading.Lock()
        self._next_probe: dict[str, float] = {}  # paused queue -> when a read may probe it
        # PGQ11 notices by queue: a read that met none while the queue was
        # thought paused proves it runs again.
        self._notices: dict[str, int] = dict.fromkeys(queues, 0)
        self._changed_at: dict[str, float] = {}  # queue -> its latest change seen
        self._read_began: dict[str, float] = {}  # queue -> when its latest read began

    def paused(self, queue: str) -> bool:
        """The queue is thought paused."""
        with self._lock:
            return queue in self._next_probe

    def before_read(self, queue: str) -> int | None:
        """None: skip the queue, paused and not due for a probe; else the token for after_read."""
        now = self.clock.now()
        with self._lock:
            due = self._next_probe.get(queue)
            if due is not None:
                if now < due:
                    return None
                self._next_probe[queue] = now + self.poll_interval  # this read is the probe
            self._read_began[queue] = now
            return self._notices.get(queue, 0)

    def after_read(self, queue: str, token: int) -> None:
        """A read of the queue returned: without a paused NOTICE meanwhile, the queue runs."""
        with self._lock:
            resumed = queue in self._next_probe and self._notices.get(queue, 0) == token
            if resumed:
                del self._next_probe[queue]
        if resumed:
            self.log.info("queue.resumed", queue=queue)

    def read_paused(self, queue: str) -> None:
        """A read found the queue paused (the client's PGQ11 observer); other queues are ignored."""
        now = self.clock.now()
        with self._lock:
            if queue not in self._notices:
                return
            self._notices[queue] += 1
            if self._changed_at.get(queue, float("-inf")) > self._read_began.get(queue, now):
                return  # the read began before a resume: its notice is older
            changed = queue not in self._next_probe
            self._next_probe[queue] = now + self.poll_interval
            self._changed_at[queue] = now
        if changed:
            self.log.warning("queue.paused", queue=queue)

    def resumed(self, queue: str) -> None:
        """The queue was resumed (its notification said so): read it at once."""
        self.update({queue: False}, as_of=self.clock.now())

    def update(self, flags: Mapping[str, bool], as_of: float) -> None:
        """The flags, by queue, as they stood at `as_of` (a heartbeat's start): paused or not."""
        now = self.clock.now()
        changes = []
        with self._lock:
            for queue, paused in flags.items():
                if queue not in self._notices or self._changed_at.get(queue, float("-inf")) > as_of:
                    continue
                self._changed_at[queue] = as_of
                if paused == (queue in self._next_probe):
                    continue
                if paused:
                    self._next_probe[queue] = now + self.poll_interval
                else:
                    del self._next_probe[queue]
                changes.append((queue, paused))
        for queue, paused in changes:
            if paused:
                self.log.warning("queue.paused", queue=queue)
            else:
                self.log.info("queue.resumed", queue=queue)
