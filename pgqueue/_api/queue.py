"""Queues and sending, as methods of Client (QueueApi) and AsyncClient (AsyncQueueApi)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pgqueue._adapt import AsyncConnArg, ConnArg
from pgqueue._api.base import AsyncRunner, SyncRunner
from pgqueue._calls import queue as _queue
from pgqueue.types import JSON, Duration, KeyedSend, PeekedMessage, QueueInfo, QueueMetrics


def _one(msg_id: int) -> list[int]:
    return [msg_id]


def _keyed(sent: KeyedSend) -> list[int]:
    return [sent.msg_id]


class QueueApi(SyncRunner):
    """Queues and sending: the blocking methods."""

    def create_queue(
        self, queue: str, *, max_attempts: int = 5, conn: ConnArg | None = None
    ) -> None:
        """Make sure the queue exists with this max_attempts (in conn's transaction, if given)."""
        self.run(_queue.create_queue(queue, max_attempts), conn)

    def drop_queue(self, queue: str) -> bool:
        """Remove the queue and everything in it; False if it did not exist."""
        return self.run(_queue.drop_queue(queue))

    def list_queues(self) -> list[QueueInfo]:
        """Every queue."""
        return self.run(_queue.list_queues())

    def pause_queue(self, queue: str, *, actor: str | None = None) -> bool:
        """Pause the queue: reads hand out nothing until resumed; False if it was paused already.

        Sends, acks, nacks, lease changes and barrier completions go on as
        ever; `actor` (who paused it) is kept as its paused_by.
        """
        return self.run(_queue.pause_queue(queue, actor))

    def resume_queue(self, queue: str) -> bool:
        """Resume the queue, waking the consumers that wait on it; False if it was not paused."""
        return self.run(_queue.resume_queue(queue))

    def purge_queue(self, queue: str) -> int:
        """Delete all live messages of the queue; how many."""
        return self.run(_queue.purge_queue(queue))

    def purge_queue_chunk(self, queue: str, *, up_to_msg_id: int, qty: int = 1000) -> int:
        """Delete up to qty live messages with msg_id <= up_to_msg_id; how many (0: done)."""
        return self.run(_queue.purge_queue_chunk(queue, up_to_msg_id, qty))

    def send(
        self,
        queue: str,
        message: JSON,
        *,
        headers: dict[str, Any] | None = None,
        delay: Duration = 0,
        dedupe_key: str | None = None,
        group: str | None = None,
        conn: ConnArg | None = None,
    ) -> int:
        """Enqueue a message; its msg_id. Durable once this returns.

        Retried on a dead connection: without a dedupe_key that is
        at-least-once (a retry after a lost commit reply sends a second copy);
        with a dedupe_key it is exactly-once. With a dedupe_key the id is this
        call's own message when an earlier attempt of it committed (live or
        consumed since); else the live message that holds the key (single
        flight: nothing new is sent); else the new message's. With `conn`, the
        message commits or rolls back with the caller's transaction and is not
        retried. Header keys starting with `_pg_` are pgqueue's: InvalidArgument.
        With a `group`, the message is a FIFO group's: a group's messages are
        handed out one at a time, in the order their sends committed.
        """
        return self.run_send(
            queue,
            lambda trace: _queue.send(queue, message, headers, delay, dedupe_key, trace, group),
            conn,
            _one,
        )

    def send_keyed(
        self,
        queue: str,
        message: JSON,
        *,
        dedupe_key: str,
        headers: dict[str, Any] | None = None,
        delay: Duration = 0,
        conn: ConnArg | None = None,
    ) -> KeyedSend:
        """send() with a dedupe_key that also says whether this call sent (sent=False: held).

        The same guarantees as send(..., dedupe_key=...): exactly-once across
        retries; a retry whose first attempt committed reports sent=True.
        """
        return self.run_send(
            queue,
            lambda trace: _queue.send_keyed(queue, message, dedupe_key, headers, delay, trace),
            conn,
            _keyed,
        )

    def send_batch(
        self,
        queue: str,
        messages: Sequence[JSON],
        *,
        headers: Sequence[dict[str, Any] | None] | None = None,
        delay: Duration = 0,
        groups: Sequence[str | None] | None = None,
        conn: ConnArg | None = None,
    ) -> list[int]:
        """Enqueue all messages atomically; their msg_ids in order. At-least-once across retries.

        `groups` gives each message its FIFO group (None: none), as send's `group`.
        """
        return self.run_send(
            queue,
            lambda trace: _queue.send_batch(queue, messages, headers, delay, trace, groups),
            conn,
            count=len(messages),
        )

    def peek(self, queue: str, *, qty: int = 10, after_msg_id: int = 0) -> list[PeekedMessage]:
        """Live messages in msg_id order, visible or not, without leasing or changing them."""
        return self.run(_queue.peek(queue, qty, after_msg_id))

    def metrics(self, queue: str) -> QueueMetrics:
        """Size and age figures of one queue."""
        return self.run(_queue.metrics(queue))

    def metrics_all(self) -> list[QueueMetrics]:
        """Size and age figures of every queue."""
        return self.run(_queue.metrics_all())


class AsyncQueueApi(AsyncRunner):
    """Queues and sending: the asyncio methods, with the same guarantees."""

    async def create_queue(
        self, queue: str, *, max_attempts: int = 5, conn: AsyncConnArg | None = None
    ) -> None:
        """Make sure the queue exists with this max_attempts (in conn's transaction, if given)."""
        await self.run(_queue.create_queue(queue, max_attempts), conn)

    async def drop_queue(self, queue: str) -> bool:
        """Remove the queue and everything in it; False if it did not exist."""
        return await self.run(_queue.drop_queue(queue))

    async def list_queues(self) -> list[QueueInfo]:
        """Every queue."""
        return await self.run(_queue.list_queues())

    async def pause_queue(self, queue: str, *, actor: str | None = None) -> bool:
        """Pause the queue: reads hand out nothing until resumed; False if it was paused already.

        Sends, acks, nacks, lease changes and barrier completions go on as
        ever; `actor` (who paused it) is kept as its paused_by.
        """
        return await self.run(_queue.pause_queue(queue, actor))

    async def resume_queue(self, queue: str) -> bool:
        """Resume the queue, waking the consumers that wait on it; False if it was not paused."""
        return await self.run(_queue.resume_queue(queue))

    async def purge_queue(self, queue: str) -> int:
        """Delete all live messages of the queue; how many."""
        return await self.run(_queue.purge_queue(queue))

    async def purge_queue_chunk(self, queue: str, *, up_to_msg_id: int, qty: int = 1000) -> int:
        """Delete up to qty live messages with msg_id <= up_to_msg_id; how many (0: done)."""
        return await self.run(_queue.purge_queue_chunk(queue, up_to_msg_id, qty))

    async def send(
        self,
        queue: str,
        message: JSON,
        *,
        headers: dict[str, Any] | None = None,
        delay: Duration = 0,
        dedupe_key: str | None = None,
        group: str | None = None,
        conn: AsyncConnArg | None = None,
    ) -> int:
        """Enqueue a message; its msg_id. Durable once this returns.

        Retried on a dead connection: without a dedupe_key that is
        at-least-once (a retry after a lost commit reply sends a second copy);
        with a dedupe_key it is exactly-once. With a dedupe_key the id is this
        call's own message when an earlier attempt of it committed (live or
        consumed since); else the live message that holds the key (single
        flight: nothing new is sent); else the new message's. With `conn`, the
        message commits or rolls back with the caller's transaction and is not
        retried. Header keys starting with `_pg_` are pgqueue's: InvalidArgument.
        With a `group`, the message is a FIFO group's: a group's messages are
        handed out one at a time, in the order their sends committed.
        """
        return await self.run_send(
            queue,
            lambda trace: _queue.send(queue, message, headers, delay, dedupe_key, trace, group),
            conn,
            _one,
        )

    async def send_keyed(
        self,
        queue: str,
        message: JSON,
        *,
        dedupe_key: str,
        headers: dict[str, Any] | None = None,
        delay: Duration = 0,
        conn: AsyncConnArg | None = None,
    ) -> KeyedSend:
        """send() with a dedupe_key that also says whether this call sent (sent=False: held).

        The same guarantees as send(..., dedupe_key=...): exactly-once across
        retries; a retry whose first attempt committed reports sent=True.
        """
        return await self.run_send(
            queue,
            lambda trace: _queue.send_keyed(queue, message, dedupe_key, headers, delay, trace),
            conn,
            _keyed,
        )

    async def send_batch(
        self,
        queue: str,
        messages: Sequence[JSON],
        *,
        headers: Sequence[dict[str, Any] | None] | None = None,
        delay: Duration = 0,
        groups: Sequence[str | None] | None = None,
        conn: AsyncConnArg | None = None,
    ) -> list[int]:
        """Enqueue all messages atomically; their msg_ids in order. At-least-once across retries.

        `groups` gives each message its FIFO group (None: none), as send's `group`.
        """
        return await self.run_send(
            queue,
            lambda trace: _queue.send_batch(queue, messages, headers, delay, trace, groups),
            conn,
            count=len(messages),
        )

    async def peek(
        self, queue: str, *, qty: int = 10, after_msg_id: int = 0
    ) -> list[PeekedMessage]:
        """Live messages in msg_id order, visible or not, without leasing or changing them."""
        return await self.run(_queue.peek(queue, qty, after_msg_id))

    async def metrics(self, queue: str) -> QueueMetrics:
        """Size and age figures of one queue."""
        return await self.run(_queue.metrics(queue))

    async def metrics_all(self) -> list[QueueMetrics]:
        """Size and age figures of every queue."""
        return await self.run(_queue.metrics_all())
