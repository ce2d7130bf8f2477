"""Reads, acks and leases, as methods of Client (LeaseApi) and AsyncClient (AsyncLeaseApi)."""

from __future__ import annotations

from collections.abc import Sequence

import psycopg
import structlog

from pgqueue._adapt import AsyncConnArg, ConnArg
from pgqueue._api.base import AsyncRunner, SyncRunner
from pgqueue._calls import queue as _queue
from pgqueue._connection import execute, execute_async
from pgqueue._retry import is_dead_connection
from pgqueue.types import Message

log = structlog.get_logger("pgqueue")


class LeaseApi(SyncRunner):
    """Reads, acks and leases: the blocking methods."""

    def read(
        self, queue: str, *, vt: int = 30, qty: int = 1, conn: ConnArg | None = None
    ) -> list[Message]:
        """Lease up to qty messages for vt seconds; nobody else gets them inside that time."""
        return self.run(_queue.read(queue, vt, qty), conn)

    def read_with_poll(
        self,
        queue: str,
        *,
        vt: int = 30,
        qty: int = 1,
        max_poll_seconds: int = 5,
        poll_interval_ms: int = 100,
    ) -> list[Message]:
        """Like read, waiting up to max_poll_seconds for something to arrive."""
        return self.run(_queue.read_with_poll(queue, vt, qty, max_poll_seconds, poll_interval_ms))

    def read_or_wait(
        self, queue: str, *, vt: int = 30, qty: int = 1, max_wait_seconds: float = 5.0
    ) -> list[Message]:
        """Like read, but when the queue is empty wait (LISTEN) up to max_wait_seconds for a send.

        Returns as soon as a send is announced (milliseconds), possibly with
        nothing if another reader took the message first. Behind PgBouncer in
        transaction mode LISTEN cannot work: use read() in a polling loop there.
        """
        got = self.read(queue, vt=vt, qty=qty)
        if got or max_wait_seconds <= 0:
            return got
        try:
            with self.connection() as conn:
                execute(conn, _queue.listen(queue))
                try:
                    # Sent between our first read and the listen: not announced to us.
                    got = execute(conn, _queue.read(queue, vt, qty))
                    if not got:
                        for _ in conn.notifies(timeout=max_wait_seconds, stop_after=1):
                            pass
                finally:
                    execute(conn, _queue.unlisten(queue))
        except psycopg.Error as exc:
            if not is_dead_connection(exc):
                self._raise(exc, "read_or_wait")
                raise
            # The wait is only an optimisation: a dead connection, or one to a
            # server turned read-only (a standby cannot LISTEN), counts as a
            # wake-up; the read after it retries on a fresh connection.
            log.warning("wait.connection_lost", queue=queue, error=str(exc).strip())
        return got or self.read(queue, vt=vt, qty=qty)

    def pop(self, queue: str, *, qty: int = 1, conn: ConnArg | None = None) -> list[Message]:
        """Take and delete up to qty messages at once (at-most-once delivery; never retried)."""
        return self.run(_queue.pop(queue, qty), conn)

    def delete(self, queue: str, msg_id: int, *, conn: ConnArg | None = None) -> bool:
        """Ack by deleting; False if already acked. Idempotent, so retried freely."""
        return self.run(_queue.delete(queue, msg_id), conn)

    def delete_many(
        self, queue: str, msg_ids: Sequence[int], *, conn: ConnArg | None = None
    ) -> list[int]:
        """Ack many by deleting; the ids that were still live."""
        return self.run(_queue.delete_many(queue, msg_ids), conn)

    def archive(self, queue: str, msg_id: int, *, conn: ConnArg | None = None) -> bool:
        """Ack by archiving; False if already acked. Idempotent, so retried freely."""
        return self.run(_queue.archive(queue, msg_id), conn)

    def archive_many(
        self, queue: str, msg_ids: Sequence[int], *, conn: ConnArg | None = None
    ) -> list[int]:
        """Ack many by archiving; the ids that were still live."""
        return self.run(_queue.archive_many(queue, msg_ids), conn)

    def set_vt(
        self,
        queue: str,
        msg_id: int,
        vt: int,
        *,
        read_ct: int | None = None,
        error: str | None = None,
        conn: ConnArg | None = None,
    ) -> Message | None:
        """Hide the message until vt seconds from now (extend a lease, or nack with a delay).

        Pass the `read_ct` your read returned: then only your lease moves, and
        None means another reader has taken the message over since (or it is
        gone), and nothing changed. Without it, any live message moves (an
        operator's tool). A nack may pass the `error` that made it fail: it is
        kept with the message and quoted in the poison reason if attempts run out.
        """
        return self.run(_queue.set_vt(queue, msg_id, vt, error, read_ct), conn)

    def nack(
        self,
        queue: str,
        msg_id: int,
        *,
        read_ct: int,
        delay: int,
        error: str | None = None,
        conn: ConnArg | None = None,
    ) -> str | None:
        """Give a failed attempt back: "retry" (visible after delay) or "poisoned" (its last).

        Only the holder of the lease that `read_ct` names can: None when another
        reader has taken the message over since (or it is gone), and nothing
        changed. At read_ct >= max_attempts the message goes to the poison
        table now, with `error` in its reason, instead of at the next read.
        """
        return self.run(_queue.nack(queue, msg_id, read_ct, delay, error), conn)


class AsyncLeaseApi(AsyncRunner):
    """Reads, acks and leases: the asyncio methods, with the same guarantees."""

    async def read(
        self, queue: str, *, vt: int = 30, qty: int = 1, conn: AsyncConnArg | None = None
    ) -> list[Message]:
        """Lease up to qty messages for vt seconds; nobody else gets them inside that time."""
        return await self.run(_queue.read(queue, vt, qty), conn)

    async def read_with_poll(
        self,
        queue: str,
        *,
        vt: int = 30,
        qty: int = 1,
        max_poll_seconds: int = 5,
        poll_interval_ms: int = 100,
    ) -> list[Message]:
        """Like read, waiting up to max_poll_seconds for something to arrive."""
        return await self.run(
            _queue.read_with_poll(queue, vt, qty, max_poll_seconds, poll_interval_ms)
        )

    async def read_or_wait(
        self, queue: str, *, vt: int = 30, qty: int = 1, max_wait_seconds: float = 5.0
    ) -> list[Message]:
        """Like read, but when the queue is empty wait (LISTEN) up to max_wait_seconds for a send.

        Returns as soon as a send is announced (milliseconds), possibly with
        nothing if another reader took the message first. Behind PgBouncer in
        transaction mode LISTEN cannot work: use read() in a polling loop there.
        """
        got = await self.read(queue, vt=vt, qty=qty)
        if got or max_wait_seconds <= 0:
            return got
        try:
            async with self.connection() as conn:
                await execute_async(conn, _queue.listen(queue))
                try:
                    got = await execute_async(conn, _queue.read(queue, vt, qty))
                    if not got:
                        async for _ in conn.notifies(timeout=max_wait_seconds, stop_after=1):
                            pass
                finally:
                    await execute_async(conn, _queue.unlisten(queue))
        except psycopg.Error as exc:
            if not is_dead_connection(exc):
                self._raise(exc, "read_or_wait")
                raise
            log.warning("wait.connection_lost", queue=queue, error=str(exc).strip())
        return got or await self.read(queue, vt=vt, qty=qty)

    async def pop(
        self, queue: str, *, qty: int = 1, conn: AsyncConnArg | None = None
    ) -> list[Message]:
        """Take and delete up to qty messages at once (at-most-once delivery; never retried)."""
        return await self.run(_queue.pop(queue, qty), conn)

    async def delete(self, queue: str, msg_id: int, *, conn: AsyncConnArg | None = None) -> bool:
        """Ack by deleting; False if already acked. Idempotent, so retried freely."""
        return await self.run(_queue.delete(queue, msg_id), conn)

    async def delete_many(
        self, queue: str, msg_ids: Sequence[int], *, conn: AsyncConnArg | None = None
    ) -> list[int]:
        """Ack many by deleting; the ids that were still live."""
        return await self.run(_queue.delete_many(queue, msg_ids), conn)

    async def archive(self, queue: str, msg_id: int, *, conn: AsyncConnArg | None = None) -> bool:
        """Ack by archiving; False if already acked. Idempotent, so retried freely."""
        return await self.run(_queue.archive(queue, msg_id), conn)

    async def archive_many(
        self, queue: str, msg_ids: Sequence[int], *, conn: AsyncConnArg | None = None
    ) -> list[int]:
        """Ack many by archiving; the ids that were still live."""
        return await self.run(_queue.archive_many(queue, msg_ids), conn)

    async def set_vt(
        self,
        queue: str,
        msg_id: int,
        vt: int,
        *,
        read_ct: int | None = None,
        error: str | None = None,
        conn: AsyncConnArg | None = None,
    ) -> Message | None:
        """Hide the message until vt seconds from now (extend a lease, or nack with a delay).

        Pass the `read_ct` your read returned: then only your lease moves, and
        None means another reader has taken the message over since (or it is
        gone), and nothing changed. Without it, any live message moves (an
        operator's tool). A nack may pass the `error` that made it fail: it is
        kept with the message and quoted in the poison reason if attempts run out.
        """
        return await self.run(_queue.set_vt(queue, msg_id, vt, error, read_ct), conn)

    async def nack(
        self,
        queue: str,
        msg_id: int,
        *,
        read_ct: int,
        delay: int,
        error: str | None = None,
        conn: AsyncConnArg | None = None,
    ) -> str | None:
        """Give a failed attempt back: "retry" (visible after delay) or "poisoned" (its last).

        Only the holder of the lease that `read_ct` names can: None when another
        reader has taken the message over since (or it is gone), and nothing
        changed. At read_ct >= max_attempts the message goes to the poison
        table now, with `error` in its reason, instead of at the next read.
        """
        return await self.run(_queue.nack(queue, msg_id, read_ct, delay, error), conn)
