"""Reads, acks and leases, as methods of Client (LeaseApi) and AsyncClient (AsyncLeaseApi)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import psycopg

from pgqueue._adapt import AsyncConnArg, ConnArg
from pgqueue._api.base import AsyncRunner, SyncRunner
from pgqueue._calls import Call
from pgqueue._calls import poison as _poison
from pgqueue._calls import queue as _queue
from pgqueue._calls.read import Leased, undecodable_part
from pgqueue._errors import PgQueueError
from pgqueue._execute import execute, execute_async
from pgqueue._log import get_logger
from pgqueue._retry import is_dead_connection
from pgqueue.types import Duration, Message

log = get_logger()


def _undecodable(msg: Message, popped: bool) -> Call[bool] | None:
    """Log a message this Python cannot decode; the fenced poison call for it (None if popped).

    A read leased it: it goes to the poison table alone, now, with the
    decoder's error as its reason (its document stays there whole), and the
    rest of the read is handed out. A pop already deleted it: its text is in
    the log line.
    """
    part, bad = undecodable_part(msg) or ("message", None)
    error = bad.error if bad is not None else "unknown"
    log.error(
        "message.undecodable",
        queue=msg.queue,
        msg_id=msg.msg_id,
        read_ct=msg.read_ct,
        part=part,
        error=error,
        chars=bad.chars if bad is not None else None,
        text=(bad.text if popped else bad.text[:200]) if bad is not None else None,
        action="lost: it was popped" if popped else "poisoned",
    )
    if popped:
        return None
    reason = f"undecodable {part}: Python cannot decode it ({error}); its document is kept here"
    return _poison.poison(msg.queue, msg.msg_id, reason, msg.read_ct)


def handed_out(
    got: Leased, run: Callable[[Call[bool]], bool], popped: bool = False
) -> list[Message]:
    """The messages a read hands out; the ones this Python cannot decode poisoned (by `run`)."""
    for msg in got.undecodable:
        call = _undecodable(msg, popped)
        if call is not None:
            try:
                run(call)
            except PgQueueError as exc:
                # the rest of the read is handed out all the same; this one's
                # lease runs out, and the next read of it tries again
                log.error(
                    "message.undecodable_not_poisoned",
                    queue=msg.queue,
                    msg_id=msg.msg_id,
                    read_ct=msg.read_ct,
                    error=str(exc),
                )
    return got.messages


async def handed_out_async(
    got: Leased, run: Callable[[Call[bool]], Awaitable[bool]], popped: bool = False
) -> list[Message]:
    """handed_out, for an asyncio client."""
    for msg in got.undecodable:
        call = _undecodable(msg, popped)
        if call is not None:
            try:
                await run(call)
            except PgQueueError as exc:
                log.error(
                    "message.undecodable_not_poisoned",
                    queue=msg.queue,
                    msg_id=msg.msg_id,
                    read_ct=msg.read_ct,
                    error=str(exc),
                )
    return got.messages


class LeaseApi(SyncRunner):
    """Reads, acks and leases: the blocking methods."""

    def read(
        self, queue: str, *, vt: Duration = 30, qty: int = 1, conn: ConnArg | None = None
    ) -> list[Message]:
        """Lease up to qty messages for vt seconds; nobody else gets them inside that time.

        A message this Python cannot decode is not handed out: it is poisoned
        now, alone, with the decoder's error as its reason, and logged.
        """
        return handed_out(self.run(_queue.read(queue, vt, qty), conn), lambda c: self.run(c, conn))

    def read_with_poll(
        self,
        queue: str,
        *,
        vt: Duration = 30,
        qty: int = 1,
        max_poll_seconds: Duration = 5,
        poll_interval_ms: int = 100,
    ) -> list[Message]:
        """Like read, waiting up to max_poll_seconds for something to arrive."""
        return handed_out(
            self.run(_queue.read_with_poll(queue, vt, qty, max_poll_seconds, poll_interval_ms)),
            self.run,
        )

    def read_or_wait(
        self, queue: str, *, vt: Duration = 30, qty: int = 1, max_wait_seconds: float = 5.0
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
                    got = handed_out(
                        execute(conn, _queue.read(queue, vt, qty)), lambda c: execute(conn, c)
                    )
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
        """Take and delete up to qty messages at once (at-most-once delivery; never retried).

        A popped message this Python cannot decode is gone: it is left out,
        and logged with its text (message.undecodable).
        """
        return handed_out(self.run(_queue.pop(queue, qty), conn), self.run, popped=True)

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
        vt: Duration,
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
        delay: Duration,
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
        self, queue: str, *, vt: Duration = 30, qty: int = 1, conn: AsyncConnArg | None = None
    ) -> list[Message]:
        """Lease up to qty messages for vt seconds; nobody else gets them inside that time.

        A message this Python cannot decode is not handed out: it is poisoned
        now, alone, with the decoder's error as its reason, and logged.
        """
        return await handed_out_async(
            await self.run(_queue.read(queue, vt, qty), conn), lambda c: self.run(c, conn)
        )

    async def read_with_poll(
        self,
        queue: str,
        *,
        vt: Duration = 30,
        qty: int = 1,
        max_poll_seconds: Duration = 5,
        poll_interval_ms: int = 100,
    ) -> list[Message]:
        """Like read, waiting up to max_poll_seconds for something to arrive."""
        return await handed_out_async(
            await self.run(
                _queue.read_with_poll(queue, vt, qty, max_poll_seconds, poll_interval_ms)
            ),
            self.run,
        )

    async def read_or_wait(
        self, queue: str, *, vt: Duration = 30, qty: int = 1, max_wait_seconds: float = 5.0
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
                    got = await handed_out_async(
                        await execute_async(conn, _queue.read(queue, vt, qty)),
                        lambda c: execute_async(conn, c),
                    )
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
        """Take and delete up to qty messages at once (at-most-once delivery; never retried).

        A popped message this Python cannot decode is gone: it is left out,
        and logged with its text (message.undecodable).
        """
        return await handed_out_async(
            await self.run(_queue.pop(queue, qty), conn), self.run, popped=True
        )

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
        vt: Duration,
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
        delay: Duration,
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
