"""Everything a worker asks of the database, in one narrow interface over a Client.

No duty of the worker reaches into the client's pool or runs SQL of its own:
they call these methods, and each is one call of the SQL API (retried on a
dead connection by the client, except inside a handler's transaction).
Lease changes are fenced by the read_ct of the read that leased the
message; acks are not (docs/sql.md, "Leases: fenced, and acks not").
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import psycopg

from pgqueue._calls import barrier as _barrier
from pgqueue._calls import queue as _queue
from pgqueue._calls import workers as _workers
from pgqueue._client import Client
from pgqueue._connection import Connection
from pgqueue._errors import PgQueueError
from pgqueue.types import Message

# What a database call of the runtime may raise: pgqueue's own errors, and a
# database error pgqueue does not translate (a deadlock still failing after its
# retries, say). The runtime logs them and goes on; it must not die of them.
DB_ERRORS = (PgQueueError, psycopg.Error)


class WorkerDb:
    """The database as a worker sees it."""

    def __init__(self, client: Client, ack: str = "delete") -> None:
        """Over `client`; plain messages are acked by `ack` ("delete" or "archive")."""
        self.client = client
        self.ack_mode = ack

    def max_attempts(self) -> dict[str, int]:
        """Every queue, with its max_attempts."""
        return {q.queue_name: q.max_attempts for q in self.client.list_queues()}

    def read(self, queue: str, vt: int, qty: int) -> list[Message]:
        """Lease up to qty messages for vt seconds."""
        return self.client.read(queue, vt=vt, qty=qty)

    def extend_many(self, queue: str, msgs: Sequence[Message], vt: int) -> dict[int, bool]:
        """Extend our leases of one queue by vt s: id -> extended, or False if its row was busy.

        Never waits for a row lock (an ack of ours still running holds one); a
        lease another reader holds now, or a message gone, is absent.
        """
        return self.client.run(
            _queue.extend_leases(queue, [(m.msg_id, m.read_ct) for m in msgs], vt)
        )

    def release_many(self, queue: str, msgs: Sequence[Message]) -> set[int]:
        """Make these messages of one queue visible now; the ids whose lease was still ours."""
        leases = [(m.msg_id, m.read_ct) for m in msgs]
        ids: list[int] = self.client.run(_queue.set_vt_leases(queue, leases, 0))
        return set(ids)

    def nack(self, msg: Message, delay: int, error: str) -> str | None:
        """Give a failed attempt back: "retry", "poisoned" (its last), or None (lease lost)."""
        return self.client.nack(
            msg.queue, msg.msg_id, read_ct=msg.read_ct, delay=delay, error=error
        )

    def poison(self, msg: Message, reason: str) -> bool:
        """Poison the message now; False when our lease was taken over."""
        return self.client.poison(msg.queue, msg.msg_id, reason, read_ct=msg.read_ct)

    def ack(
        self,
        queue: str,
        member: bool,
        msg_ids: Sequence[int],
        enqueued_ats: Sequence[datetime],
        results: Sequence[Any],
        conn: Connection | None = None,
        traceparents: Sequence[str | None] | None = None,
    ) -> None:
        """Ack messages of one queue in one statement: members are completed with their results.

        Each message is fenced by its enqueued_at: an id handed out again
        after a failover to an asynchronous standby is left alone. A member's
        traceparent (the run that completed it, when traced) is kept for its
        callback's span links.
        """
        if member:
            call = _barrier.complete_members(
                queue,
                msg_ids,
                ["succeeded"] * len(msg_ids),
                results,
                None,
                traceparents,
                enqueued_ats,
            )
            self.client.run(call, conn)
        else:
            self.client.run(_queue.ack_fenced(queue, self.ack_mode, msg_ids, enqueued_ats), conn)

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """A connection in a transaction, for a transactional handler and its ack."""
        with self.client.connection() as conn, conn.transaction():
            yield conn

    def hold(self, queue: str, msgs: Sequence[Message], conn: Connection) -> bool:
        """Lock our leases until conn's transaction ends; False if one was taken over."""
        held = self.client.run(
            _queue.hold_leases(queue, [(m.msg_id, m.read_ct) for m in msgs]), conn
        )
        return len(held) == len(msgs)

    def barrier_links(self, barrier_id: str, qty: int) -> list[tuple[int, int, str]]:
        """The runs that completed the barrier's members, at most qty: (index, msg_id, tp)."""
        return self.client.run(_barrier.barrier_links(barrier_id, qty))

    def expire_barriers(self) -> int:
        """Fire the callbacks of overdue barriers."""
        return self.client.expire_barriers()

    def heartbeat(
        self,
        worker_id: uuid.UUID,
        host: str,
        pid: int,
        queues: Sequence[str],
        concurrency: int,
        in_flight: int,
        stopping: bool,
        tallies: _workers.Tallies,
    ) -> dict[str, bool]:
        """Upsert the worker's registry row, adding its tallies; its queues -> paused."""
        return self.client.run(
            _workers.worker_heartbeat(
                worker_id, host, pid, queues, concurrency, in_flight, stopping, tallies
            )
        )

    def deregister(self, worker_id: uuid.UUID) -> bool:
        """Remove the worker's registry row; False if it had none."""
        return self.client.run(_workers.worker_deregister(worker_id))

    def conninfo(self) -> str:
        """The connection string of the client, for a connection of the worker's own (LISTEN)."""
        return self.client.conninfo()
