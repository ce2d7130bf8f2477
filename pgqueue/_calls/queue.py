"""The queue contract as calls: send, read, ack, leases and metrics over the SQL functions."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pgqueue._calls import (
    JSONB_ELEMENTS,
    JSONB_ELEMENTS_NULLABLE,
    Call,
    Row,
    column,
    decode_json,
    encode_json,
    encode_json_list,
    int32,
    nothing,
    scalar,
    seconds,
    with_trace,
)
from pgqueue._errors import InvalidArgument
from pgqueue._tracing import Trace, without_trace_headers
from pgqueue.types import (
    JSON,
    Duration,
    KeyedSend,
    Message,
    PeekedMessage,
    QueueInfo,
    QueueMetrics,
    Undecodable,
)

# The documents come as the database prints them and are decoded here, one
# by one (decode_json): a document this Python cannot decode is told apart
# instead of failing the whole read (docs/reliability.md).
_RECORD = "msg_id, read_ct, enqueued_at, vt, message::text, headers::text"


def _message(queue: str, row: Row) -> Message:
    msg_id, read_ct, enqueued_at, vt, message, headers = row
    return Message(
        queue, msg_id, read_ct, enqueued_at, vt, decode_json(message), decode_json(headers)
    )


@dataclass(frozen=True, slots=True)
class Leased:
    """What a read handed out: the messages, and the leased ones this Python cannot decode."""

    messages: list[Message]
    undecodable: list[Message]  # their message or headers is an Undecodable: to be poisoned


def undecodable_part(msg: Message) -> tuple[str, Undecodable] | None:
    """("message" | "headers", what the decoder said) for a message it could not decode."""
    if isinstance(msg.message, Undecodable):
        return "message", msg.message
    if isinstance(msg.headers, Undecodable):
        return "headers", msg.headers
    return None


def _leased(queue: str) -> Any:
    def read(rows: list[Row]) -> Leased:
        got = [_message(queue, r) for r in rows]
        bad = [m for m in got if undecodable_part(m) is not None]
        if not bad:
            return Leased(got, [])
        return Leased([m for m in got if undecodable_part(m) is None], bad)

    return read


def _first_message(queue: str) -> Any:
    def read(rows: list[Row]) -> Message | None:
        return _message(queue, rows[0]) if rows else None

    return read


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


def send(
    queue: str,
    message: JSON,
    headers: dict[str, Any] | None = None,
    delay: Duration = 0,
    dedupe_key: str | None = None,
    trace: Trace | None = None,
    group: str | None = None,
) -> Call[int]:
    """Enqueue one message; with a dedupe_key, at most one live message holds that key."""
    # A token only where it buys something: with a dedupe_key, a retry of this
    # call that finds its own earlier attempt already consumed returns that id
    # instead of sending again (exactly-once across the retry).
    token = uuid.uuid4() if dedupe_key is not None else None
    headers = without_trace_headers(headers)
    call = Call(
        "send",
        "SELECT pgqueue.send(%s, %s::jsonb, %s::jsonb, %s, %s, %s)"
        if group is None
        else "SELECT pgqueue.send(%s, %s::jsonb, %s::jsonb, %s, %s, %s, group_key => %s)",
        (
            queue,
            encode_json(message, "message"),
            None if headers is None else encode_json(headers, "headers"),
            seconds("delay", delay),
            dedupe_key,
            token,
            *(() if group is None else (group,)),
        ),
        scalar,
    )
    return with_trace(call, trace)


def send_keyed(
    queue: str,
    message: JSON,
    dedupe_key: str,
    headers: dict[str, Any] | None = None,
    delay: Duration = 0,
    trace: Trace | None = None,
) -> Call[KeyedSend]:
    """Enqueue one message under dedupe_key unless an unfinished one holds it; says which."""
    token = uuid.uuid4()  # one per call: its retries know their own earlier attempt
    headers = without_trace_headers(headers)
    call = Call(
        "send",
        "SELECT msg_id, sent FROM pgqueue.send_keyed(%s, %s::jsonb, %s, %s::jsonb, %s, %s)",
        (
            queue,
            encode_json(message, "message"),
            dedupe_key,
            None if headers is None else encode_json(headers, "headers"),
            seconds("delay", delay),
            token,
        ),
        lambda rows: KeyedSend(int(rows[0][0]), bool(rows[0][1])),
    )
    return with_trace(call, trace)


def send_batch(
    queue: str,
    messages: Sequence[JSON],
    headers: Sequence[dict[str, Any] | None] | None = None,
    delay: Duration = 0,
    trace: Trace | None = None,
    groups: Sequence[str | None] | None = None,
) -> Call[list[int]]:
    """Enqueue many messages in one statement; their ids in input order."""
    if headers is not None and len(headers) != len(messages):
        raise InvalidArgument(
            f"headers has {len(headers)} elements but messages has {len(messages)};"
            " pass one headers value per message, or None for none"
        )
    if groups is not None and len(groups) != len(messages):
        raise InvalidArgument(
            f"groups has {len(groups)} elements but messages has {len(messages)};"
            " pass one group (or None) per message, or None for no groups"
        )
    headers_sql = "NULL::jsonb[]" if headers is None else JSONB_ELEMENTS_NULLABLE
    if headers is not None:
        headers = [without_trace_headers(h) for h in headers]
    call = Call(
        "send_batch",
        f"SELECT * FROM pgqueue.send_batch(%s, {JSONB_ELEMENTS}, {headers_sql}, %s"
        + (")" if groups is None else ", group_keys => %s::text[])"),
        (
            queue,
            encode_json_list(messages, "messages"),
            *(() if headers is None else (encode_json_list(headers, "headers"),)),
            seconds("delay", delay),
            *(() if groups is None else (list(groups),)),
        ),
        column,
    )
    return with_trace(call, trace)


def read(queue: str, vt: Duration, qty: int) -> Call[Leased]:
    """Lease up to qty visible messages, hidden from other readers for vt seconds."""
    return Call(
        "read",
        f"SELECT {_RECORD} FROM pgqueue.read(%s, %s, %s)",
        (queue, seconds("vt", vt), int32("qty", qty)),
        _leased(queue),
    )


def read_with_poll(
    queue: str, vt: Duration, qty: int, max_poll_seconds: Duration = 5, poll_interval_ms: int = 100
) -> Call[Leased]:
    """Like read, but waits up to max_poll_seconds for a message to become visible."""
    return Call(
        "read_with_poll",
        f"SELECT {_RECORD} FROM pgqueue.read_with_poll(%s, %s, %s, %s, %s)",
        (
            queue,
            seconds("vt", vt),
            int32("qty", qty),
            seconds("max_poll_seconds", max_poll_seconds),
            int32("poll_interval_ms", poll_interval_ms),
        ),
        _leased(queue),
    )


def pop(queue: str, qty: int = 1) -> Call[Leased]:
    """Take up to qty visible messages and delete them at once (at-most-once delivery)."""
    return Call(
        "pop",
        f"SELECT {_RECORD} FROM pgqueue.pop(%s, %s)",
        (queue, int32("qty", qty)),
        _leased(queue),
        retryable=False,
    )


def delete(queue: str, msg_id: int) -> Call[bool]:
    """Ack one message; False if it was already gone."""
    return Call("delete", "SELECT pgqueue.delete(%s, %s::bigint)", (queue, msg_id), scalar)


def delete_many(queue: str, msg_ids: Sequence[int]) -> Call[list[int]]:
    """Ack many messages; the ids that were still there."""
    return Call(
        "delete",
        "SELECT * FROM pgqueue.delete(%s, %s::bigint[])",
        (queue, list(msg_ids)),
        column,
    )


def archive(queue: str, msg_id: int) -> Call[bool]:
    """Ack one message by moving it to the archive; False if it was already gone."""
    return Call("archive", "SELECT pgqueue.archive(%s, %s::bigint)", (queue, msg_id), scalar)


def archive_many(queue: str, msg_ids: Sequence[int]) -> Call[list[int]]:
    """Archive many messages; the ids that were still there."""
    return Call(
        "archive",
        "SELECT * FROM pgqueue.archive(%s, %s::bigint[])",
        (queue, list(msg_ids)),
        column,
    )


def ack_fenced(
    queue: str, mode: str, msg_ids: Sequence[int], enqueued_ats: Sequence[datetime]
) -> Call[list[int]]:
    """Ack (by "delete" or "archive") each message only while its id names it; the acked ids.

    A message is named by its msg_id and enqueued_at together: an id handed
    out again after a failover to an asynchronous standby is left alone.
    """
    if mode not in ("delete", "archive"):
        raise ValueError(f"ack mode must be 'delete' or 'archive', got {mode!r}")
    return Call(
        mode,
        f"SELECT * FROM pgqueue.{mode}(%s, %s::bigint[], %s::timestamptz[])",
        (queue, list(msg_ids), list(enqueued_ats)),
        column,
    )


def set_vt(
    queue: str, msg_id: int, vt: Duration, error: str | None = None, read_ct: int | None = None
) -> Call[Message | None]:
    """Make the message visible again vt seconds from now; None if it is gone.

    With `read_ct` (the one the read returned) only the holder of that lease
    moves it: None also when another reader has taken the message over since.
    An `error` is kept with the message (the latest one wins) and quoted in
    the poison reason if the message is poison-dropped later.
    """
    if read_ct is not None:
        return Call(
            "set_vt",
            f"SELECT {_RECORD} FROM pgqueue.set_vt(%s, %s, %s, %s::text, %s)",
            (queue, msg_id, seconds("vt", vt), error, int32("read_ct", read_ct)),
            _first_message(queue),
        )
    if error is None:
        return Call(
            "set_vt",
            f"SELECT {_RECORD} FROM pgqueue.set_vt(%s, %s, %s)",
            (queue, msg_id, seconds("vt", vt)),
            _first_message(queue),
        )
    return Call(
        "set_vt",
        f"SELECT {_RECORD} FROM pgqueue.set_vt(%s, %s, %s, %s::text)",
        (queue, msg_id, seconds("vt", vt), error),
        _first_message(queue),
    )


def nack(
    queue: str, msg_id: int, read_ct: int, delay: Duration, error: str | None = None
) -> Call[str | None]:
    """The holder's nack: "retry" (visible after delay), "poisoned" (its last attempt), or None.

    None: the lease that read_ct names is not the current one, and nothing changed.
    """
    return Call(
        "nack",
        "SELECT pgqueue.nack(%s, %s, %s, %s, %s::text)",
        (queue, msg_id, int32("read_ct", read_ct), seconds("delay", delay), error),
        scalar,
    )


def hold_leases(queue: str, leases: Sequence[tuple[int, int]]) -> Call[list[int]]:
    """Lock until the transaction ends the messages still leased as (msg_id, read_ct); their ids."""
    return Call(
        "hold_leases",
        "SELECT * FROM pgqueue.hold_leases(%s, %s::bigint[], %s::integer[])",
        (queue, [m for m, _ in leases], [r for _, r in leases]),
        column,
    )


def set_vt_leases(queue: str, leases: Sequence[tuple[int, int]], vt: Duration) -> Call[list[int]]:
    """Set vt seconds from now on the messages still leased as (msg_id, read_ct); their ids."""
    return Call(
        "set_vt",
        "SELECT msg_id FROM pgqueue.set_vt(%s, %s::bigint[], %s, %s::integer[])",
        (queue, [m for m, _ in leases], seconds("vt", vt), [r for _, r in leases]),
        column,
    )


def extend_leases(
    queue: str, leases: Sequence[tuple[int, int]], vt: Duration
) -> Call[dict[int, bool]]:
    """Extend the leases still current as (msg_id, read_ct) by vt s, never waiting for a lock.

    msg_id -> True when extended, False when its row is locked by another
    transaction (try again); a lease taken over or gone is absent.
    """
    return Call(
        "extend_leases",
        "SELECT msg_id, extended FROM pgqueue.extend_leases(%s, %s::bigint[], %s::integer[], %s)",
        (queue, [m for m, _ in leases], [r for _, r in leases], seconds("vt", vt)),
        lambda rows: {int(m): bool(e) for m, e in rows},
    )


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


def channel(queue: str) -> str:
    """The LISTEN channel on which sends announce new messages while someone waits."""
    return f"pgqueue_{queue}"


def listen(queue: str) -> Call[str]:
    """LISTEN on the queue's channel and declare this session waiting, so sends notify it."""
    return Call("listen", "SELECT pgqueue.listen(%s)", (queue,), scalar)


def unlisten(queue: str) -> Call[None]:
    """Stop waiting on the queue: sends stop paying for a notification on our behalf."""
    return Call("unlisten", "SELECT pgqueue.unlisten(%s)", (queue,), nothing)
