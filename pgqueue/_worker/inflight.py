"""The table of messages a worker holds: waiting for a handler, running, or given back.

Every change of a task's state happens here, under one lock, so a message is
started by a handler or given back by the worker, never both; and so a
handler thread held by a hung handler is counted until that handler returns.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from pgqueue._worker.app import Handler
from pgqueue.types import Message


@dataclass(eq=False)
class Task:
    """One message held by the worker."""

    msg: Message
    handler: Handler
    started: float  # when its handler started (until then: when it was read)
    lease_until: float  # when its lease runs out, as far as the worker knows
    # Set when the runtime gave the message back (hard timeout, shutdown, a
    # wait too long): the handler's late outcome is then neither acked nor nacked.
    abandoned: bool = False
    running: bool = False  # its handler has started
    # A fenced call found the lease taken over by another reader: no more
    # heartbeats, and no nack, release or poison of the other reader's lease.
    lease_lost: bool = False
    batch: Batch | None = None  # the batch it runs in, for a batch handler
    read_at: float = 0.0  # when the read that leased it started (claim latency)
    trace: str | None = None  # the traceparent of its run, when traced and sampled

    @property
    def unit(self) -> Task | Batch:
        """What one handler thread runs: this task, or its whole batch."""
        return self.batch if self.batch is not None else self


@dataclass(eq=False)
class Batch:
    """The messages of one read of a queue whose handler takes them all at once."""

    tasks: list[Task]  # never empty

    @property
    def handler(self) -> Handler:
        """The queue's handler (every task of a read shares it)."""
        return self.tasks[0].handler


class InFlight:
    """The tasks of a worker by (queue, msg_id), and the handler threads hung handlers hold."""

    def __init__(self, concurrency: int) -> None:
        """An empty table for a worker with that many handler threads."""
        self.concurrency = concurrency
        self._tasks: dict[tuple[str, int], Task] = {}
        self._stuck: set[Task | Batch] = set()
        # Finished messages whose ack is on its way: their leases are kept
        # alive like the running ones', so a slow ack cannot let them expire.
        self._acking: dict[tuple[str, int], Task] = {}
        self._lock = threading.Lock()
        self.changed = threading.Event()  # set whenever a task leaves
        self.finished = 0  # handlers returned (or tasks dropped unstarted), ever

    def __len__(self) -> int:
        with self._lock:
            return len(self._tasks)

    def healthy_threads(self) -> int:
        """Handler threads not held by a handler whose message was given back as hung."""
        with self._lock:
            return self.concurrency - len(self._stuck)

    def add(self, tasks: list[Task]) -> None:
        """Hold these newly read messages."""
        with self._lock:
            for task in tasks:
                self._tasks[(task.msg.queue, task.msg.msg_id)] = task

    def begin(
        self, tasks: list[Task], stopping: threading.Event, now: float
    ) -> tuple[list[Task], list[Task]]:
        """Mark tasks started: (started, expired); none start once the worker is stopping.

        A task whose lease ran out while it waited (the process was stalled:
        SIGSTOP, a frozen container, a swap storm) does not start: another
        reader may hold the message by now. It is marked abandoned and
        returned as expired, to be given back (fenced) by the caller.
        """
        with self._lock:
            if stopping.is_set():
                return [], []
            live = [t for t in tasks if not t.abandoned]
            expired = [t for t in live if t.lease_until <= now]
            started = [t for t in live if t.lease_until > now]
            for task in expired:
                task.abandoned = True
            for task in started:
                task.started = now  # the hard timeout counts from here
                task.running = True
        return started, expired

    def forget(self, task: Task) -> bool:
        """The task's handler returned (or it never started): drop it; True if its thread was held.

        A thread held by a handler given back as hung is free again.
        """
        with self._lock:
            if self._tasks.get((task.msg.queue, task.msg.msg_id)) is task:
                del self._tasks[(task.msg.queue, task.msg.msg_id)]
            recovered = task.unit in self._stuck
            self._stuck.discard(task.unit)
            self.finished += 1
        self.changed.set()
        return recovered

    def by_queue(self) -> dict[str, int]:
        """How many messages are held, by queue (waiting for a handler or running)."""
        counts: dict[str, int] = {}
        with self._lock:
            for queue, _ in self._tasks:
                counts[queue] = counts.get(queue, 0) + 1
        return counts

    def awaiting_ack(self, tasks: list[Task]) -> None:
        """These finished messages wait for their ack: keep their leases alive until acked()."""
        with self._lock:
            for task in tasks:
                self._acking[(task.msg.queue, task.msg.msg_id)] = task

    def acked(self, tasks: list[Task]) -> None:
        """These messages are acked (or their ack was given up): stop keeping their leases."""
        with self._lock:
            for task in tasks:
                if self._acking.get((task.msg.queue, task.msg.msg_id)) is task:
                    del self._acking[(task.msg.queue, task.msg.msg_id)]
        self.changed.set()  # a reader held back by acks may read again

    def acking(self) -> int:
        """How many finished messages wait for their ack."""
        with self._lock:
            return len(self._acking)

    def drop(self, task: Task) -> None:
        """Stop holding a message given back (its handler, if any, may still run)."""
        with self._lock:
            self._tasks.pop((task.msg.queue, task.msg.msg_id), None)
        self.changed.set()

    def mark_lease_lost(self, task: Task) -> bool:
        """Record that our lease was taken over; True the first time, while we still hold it."""
        with self._lock:
            if task.lease_lost:
                return False
            task.lease_lost = True
            key = (task.msg.queue, task.msg.msg_id)
            return self._tasks.get(key) is task or self._acking.get(key) is task

    def due(self, now: float, margin: float) -> tuple[list[Task], list[Task]]:
        """Leases running out within `margin`: (running ones to extend, waiting ones abandoned).

        A message still waiting for a handler when its lease would need
        extending has waited too long: it is marked abandoned, to be given back.
        """
        with self._lock:
            held = [*self._tasks.values(), *self._acking.values()]
            due = [t for t in held if not t.lease_lost and t.lease_until - now <= margin]
            running = [t for t in due if t.running]
            waiting = [t for t in due if not t.running]
            for task in waiting:
                task.abandoned = True
        return running, waiting

    def hung(self, now: float, hard_timeout: float) -> list[Task]:
        """Running tasks past the hard timeout, marked abandoned; their threads count as held."""
        with self._lock:
            hung = [t for t in self._tasks.values() if t.running and now - t.started > hard_timeout]
            for task in hung:
                task.abandoned = True
                self._stuck.add(task.unit)
        return hung

    def abandon_waiting(self) -> list[Task]:
        """Every task that has not started, marked abandoned (to be given back)."""
        with self._lock:
            waiting = [t for t in self._tasks.values() if not t.running and not t.abandoned]
            for task in waiting:
                task.abandoned = True
        return waiting

    def abandon_all(self) -> list[Task]:
        """Every task still held, marked abandoned (to be given back)."""
        with self._lock:
            left = list(self._tasks.values())
            for task in left:
                task.abandoned = True
        return left


def by_queue(tasks: list[Task]) -> dict[str, list[Task]]:
    """The tasks grouped by their message's queue, in order (one statement per queue)."""
    groups: dict[str, list[Task]] = {}
    for task in tasks:
        groups.setdefault(task.msg.queue, []).append(task)
    return groups


def message_log(log: Any, msg: Message) -> Any:
    """The worker's logger bound to one message: queue, msg_id, read_ct (and barrier_id)."""
    context: dict[str, Any] = {"queue": msg.queue, "msg_id": msg.msg_id, "read_ct": msg.read_ct}
    if msg.barrier_id is not None:
        context["barrier_id"] = msg.barrier_id
    return log.bind(**context)
