"""The worker's wake-ups: LISTEN/NOTIFY on a connection of its own; polling when it cannot.

A send to a queue the worker knows is paused does not wake it (pauses.py);
the resume of that queue does (its notification's payload is 'resumed').
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import psycopg

from pgqueue._calls import queue as _queue
from pgqueue._connection import Connection, execute
from pgqueue._worker.pauses import Pauses

# The payload of resume_queue's notification (a send's is empty).
RESUMED = "resumed"
# An idle worker whose LISTEN connection failed tries a new one within this
# many seconds (jittered, so the workers of a fleet do not reconnect at once).
RECONNECT_WITHIN = 1.0


class Listener:
    """Waits for a send to one of the queues, or for the poll interval, whichever comes first."""

    def __init__(
        self,
        conninfo: str,
        queues: tuple[str, ...],
        stopping: threading.Event,
        log: Any,
        pauses: Pauses | None = None,
    ) -> None:
        """Wake-ups for these queues over a connection to `conninfo` (opened when first idle)."""
        self.conninfo = conninfo
        self.queues = queues
        self.pauses = pauses
        self.channels = {_queue.channel(q): q for q in queues}
        self.stopping = stopping
        self.log = log
        self.conn: Connection | None = None
        self.registered = False

    def idle(self, timeout: float) -> None:
        """Declare ourselves waiting (first call) or wait for a send (later calls)."""
        try:
            if self.conn is None:
                self.conn = psycopg.connect(self.conninfo, autocommit=True, connect_timeout=5)
            if not self.registered:
                for q in self.queues:
                    execute(self.conn, _queue.listen(q))
                self.registered = True
                return  # the caller reads once more: a send before listen() went unannounced
            if self._read_only():
                # Demoted under us with its socket left open (a cloud endpoint
                # that flips roles): no send reaches this node any more, and
                # waiting on it would cost every wake-up a poll interval.
                self.close()
                self.log.warning("listen.reconnecting", error="the server turned read-only")
                return
            # In slices, so a stop request is answered within a second.
            deadline = time.monotonic() + timeout
            while not self.stopping.is_set() and (left := deadline - time.monotonic()) > 0:
                for note in self.conn.notifies(timeout=min(left, 1.0), stop_after=1):
                    if self._wakes(note.channel, note.payload):
                        return
        except psycopg.Error as exc:
            # Whatever broke it (a restart, a failover, a standby that cannot
            # LISTEN: 25006), a new connection is tried within a second, not a
            # poll interval: wake-ups are what an idle worker lives on. It goes
            # through registered=False, so the caller reads once more and finds
            # sends made meanwhile (the waiter table is UNLOGGED: a new primary
            # has none of our rows, so registering again is required).
            self.close()
            retry_in = min(timeout, RECONNECT_WITHIN) * random.uniform(0.5, 1.0)
            self.log.warning(
                "listen.reconnecting", error=str(exc).strip(), retry_in=round(retry_in, 3)
            )
            self.stopping.wait(retry_in)

    def _read_only(self) -> bool:
        """Whether the listening connection's server now refuses writes (one round trip).

        Asked before each wait, once per poll interval at most: a session
        learns of a demotion only through a statement.
        """
        if self.conn is None:
            return False
        row = self.conn.execute("SHOW transaction_read_only").fetchone()
        return row is not None and row[0] == "on"

    def _wakes(self, channel: str, payload: str) -> bool:
        """Whether a notification is worth a read: not a send to a queue that is paused."""
        queue = self.channels.get(channel)
        if queue is None or self.pauses is None:
            return True
        if payload == RESUMED:
            self.pauses.resumed(queue)
            return True
        return not self.pauses.paused(queue)

    def busy(self) -> None:
        """Stop waiting: sends to busy queues should not pay for a NOTIFY."""
        if self.registered and self.conn is not None:
            try:
                for q in self.queues:
                    execute(self.conn, _queue.unlisten(q))
            except psycopg.Error:
                # Dead, or on a server turned read-only (a standby cannot
                # UNLISTEN): the next idle() connects anew.
                self.close()
        self.registered = False

    def close(self) -> None:
        """Drop the connection (its waiter rows go with the session)."""
        if self.conn is not None:
            self.conn.close()
        self.conn = None
        self.registered = False
