"""The queue contract as calls: the queues themselves here; send, read, ack and lease beside.

This module creates, lists, pauses, purges, peeks into and measures queues.
Sending (send.py), claiming (read.py), acking (ack.py) and moving a lease
(lease.py) have a module each, re-exported here: the clients, the worker and
the tests call the whole contract as `_queue.send(...)`, `_queue.read(...)`.
"""

from __future__ import annotations

from pgqueue._calls import Call, Row, decode_json, int32, nothing, scalar
from pgqueue._calls.ack import ack_fenced as ack_fenced
from pgqueue._calls.ack import archive as archive
from pgqueue._calls.ack import archive_many as archive_many
from pgqueue._calls.ack import delete as delete
from pgqueue._calls.ack import delete_many as delete_many
from pgqueue._calls.ack import nack as nack
from pgqueue._calls.lease import extend_leases as extend_leases
from pgqueue._calls.lease import hold_leases as hold_leases
from pgqueue._calls.lease import set_vt as set_vt
from pgqueue._calls.lease import set_vt_leases as set_vt_leases
from pgqueue._calls.read import channel as channel
from pgqueue._calls.read import listen as listen
from pgqueue._calls.read import pop as pop
from pgqueue._calls.read import read as read
from pgqueue._calls.read import read_with_poll as read_with_poll
from pgqueue._calls.read import unlisten as unlisten
from pgqueue._calls.send import send as send
from pgqueue._calls.send import send_batch as send_batch
from pgqueue._calls.send import send_keyed as send_keyed
from pgqueue.types import PeekedMessage, QueueInfo, QueueMetrics


def _metrics(rows: list[Row]) -> list[QueueMetrics]:
    return [QueueMetrics(*r) for r in rows]


def create_queue(queue: str, max_attempts: int = 5) -> Call[None]:
    """Create the queue, or set max_attempts on the existing one."""
    return Call(
        "create_queue",
        "SELECT pgqueue.create_queue(%s, %s)",
        (queue, int32("max_attempts", max_attempts)),
        nothing,
    )


def drop_queue(queue: str) -> Call[bool]:
    """Drop the queue with all its messages, archive and poison rows; False if absent."""
    return Call("drop_queue", "SELECT pgqueue.drop_queue(%s)", (queue,), scalar)


def list_queues() -> Call[list[QueueInfo]]:
    """Every queue, by name."""
    return Call(
        "list_queues",
        "SELECT queue_name, max_attempts, created_at, paused_at, paused_by"
        " FROM pgqueue.list_queues()",
        (),
        lambda rows: [QueueInfo(*r) for r in rows],
    )


def pause_queue(queue: str, actor: str | None = None) -> Call[bool]:
    """Stop reads of the queue handing out messages; True if this call paused it."""
    return Call("pause_queue", "SELECT pgqueue.pause_queue(%s, %s::text)", (queue, actor), scalar)


def resume_queue(queue: str) -> Call[bool]:
    """Let reads of the queue hand out messages again; True if this call resumed it."""
    return Call("resume_queue", "SELECT pgqueue.resume_queue(%s)", (queue,), scalar)


def purge_queue(queue: str) -> Call[int]:
    """Delete every live message of the queue; the count removed."""
    return Call("purge_queue", "SELECT pgqueue.purge_queue(%s)", (queue,), scalar)


def peek(queue: str, qty: int = 10, after_msg_id: int = 0) -> Call[list[PeekedMessage]]:
    """Live messages in msg_id order after after_msg_id, without leasing or changing them."""
    return Call(
        "peek",
        "SELECT msg_id, read_ct, enqueued_at, vt, message::text, headers::text, dedupe_key,"
        " last_error FROM pgqueue.peek(%s, %s, %s)",
        (queue, int32("qty", qty), after_msg_id),
        lambda rows: [
            PeekedMessage(queue, m, r, e, v, decode_json(doc), decode_json(h), k, err)
            for m, r, e, v, doc, h, k, err in rows
        ],
    )


def purge_queue_chunk(queue: str, up_to_msg_id: int, qty: int) -> Call[int]:
    """Delete up to qty live messages with msg_id <= up_to_msg_id, oldest first; how many."""
    return Call(
        "purge_queue_chunk",
        "SELECT pgqueue.purge_queue_chunk(%s, %s, %s)",
        (queue, up_to_msg_id, qty),
        scalar,
    )


def metrics(queue: str) -> Call[QueueMetrics]:
    """Size and age figures of one queue."""
    return Call(
        "metrics",
        "SELECT * FROM pgqueue.metrics(%s)",
        (queue,),
        lambda rows: _metrics(rows)[0],
    )


def metrics_all() -> Call[list[QueueMetrics]]:
    """Size and age figures of every queue."""
    return Call("metrics_all", "SELECT * FROM pgqueue.metrics_all()", (), _metrics)
