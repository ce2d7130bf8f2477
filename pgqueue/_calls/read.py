"""Claiming messages as calls: read (a lease), read_with_poll, pop, and LISTEN for new ones.

A message comes back as the database printed it and is decoded here, one
document at a time, so one this Python cannot decode is told apart (Leased)
instead of failing the whole read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pgqueue._calls import Call, Row, decode_json, int32, nothing, scalar, seconds
from pgqueue.types import Duration, Message, Undecodable

# The documents come as the database prints them and are decoded here, one
# by one (decode_json): a document this Python cannot decode is told apart
# instead of failing the whole read (docs/reliability.md).
RECORD = "msg_id, read_ct, enqueued_at, vt, message::text, headers::text"


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


def first_message(queue: str) -> Any:
    """The reader of a result of at most one message row: the Message, or None for no row."""

    def read(rows: list[Row]) -> Message | None:
        return _message(queue, rows[0]) if rows else None

    return read


def read(queue: str, vt: Duration, qty: int) -> Call[Leased]:
    """Lease up to qty visible messages, hidden from other readers for vt seconds."""
    return Call(
        "read",
        f"SELECT {RECORD} FROM pgqueue.read(%s, %s, %s)",
        (queue, seconds("vt", vt), int32("qty", qty)),
        _leased(queue),
    )


def read_with_poll(
    queue: str, vt: Duration, qty: int, max_poll_seconds: Duration = 5, poll_interval_ms: int = 100
) -> Call[Leased]:
    """Like read, but waits up to max_poll_seconds for a message to become visible."""
    return Call(
        "read_with_poll",
        f"SELECT {RECORD} FROM pgqueue.read_with_poll(%s, %s, %s, %s, %s)",
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
        f"SELECT {RECORD} FROM pgqueue.pop(%s, %s)",
        (queue, int32("qty", qty)),
        _leased(queue),
        retryable=False,
    )


def channel(queue: str) -> str:
    """The LISTEN channel on which sends announce new messages while someone waits."""
    return f"pgqueue_{queue}"


def listen(queue: str) -> Call[str]:
    """LISTEN on the queue's channel and declare this session waiting, so sends notify it."""
    return Call("listen", "SELECT pgqueue.listen(%s)", (queue,), scalar)


def unlisten(queue: str) -> Call[None]:
    """Stop waiting on the queue: sends stop paying for a notification on our behalf."""
    return Call("unlisten", "SELECT pgqueue.unlisten(%s)", (queue,), nothing)
