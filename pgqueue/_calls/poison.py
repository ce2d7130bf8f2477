"""The poison (dead-letter) table as calls: inspect, poison on purpose, requeue, purge."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from pgqueue._calls import Call, Row, column, decode_json, int32, scalar
from pgqueue.types import ANY_POISON, PoisonFilter, PoisonMessage

# The documents as the database prints them, decoded one by one: a message
# this Python cannot decode (the reason it was poisoned, often) is shown as
# an Undecodable rather than failing the listing.
_POISON = (
    "queue_name, msg_id, read_ct, enqueued_at, poisoned_at, reason, message::text, headers::text"
)


def _poison_messages(rows: list[Row]) -> list[PoisonMessage]:
    return [
        PoisonMessage(q, m, r, e, p, why, decode_json(doc), decode_json(h))
        for q, m, r, e, p, why, doc, h in rows
    ]


def poison(queue: str, msg_id: int, reason: str, read_ct: int | None = None) -> Call[bool]:
    """Move a live message to the poison table now; False if it was already gone.

    With `read_ct`, only while that read's lease is the current one (False otherwise).
    """
    if read_ct is None:
        return Call("poison", "SELECT pgqueue.poison(%s, %s, %s)", (queue, msg_id, reason), scalar)
    return Call(
        "poison",
        "SELECT pgqueue.poison(%s, %s, %s, %s::integer)",
        (queue, msg_id, reason, read_ct),
        scalar,
    )


def poison_list(
    queue: str | None = None,
    qty: int = 100,
    since: datetime | None = None,
    reason: str | None = None,
) -> Call[list[PoisonMessage]]:
    """The most recently poisoned messages, of one queue or of all, poisoned since, matching."""
    return Call(
        "poison_list",
        f"SELECT {_POISON} FROM pgqueue.poison_list(%s::text, %s::integer, %s::timestamptz,"
        " %s::text)",
        (queue, int32("qty", qty), since, reason),
        _poison_messages,
    )


def poison_get(queue: str, msg_id: int) -> Call[PoisonMessage | None]:
    """One poison message of the queue; None if there is none with that id."""
    return Call(
        "poison_get",
        f"SELECT {_POISON} FROM pgqueue.poison_get(%s, %s)",
        (queue, msg_id),
        lambda rows: _poison_messages(rows)[0] if rows else None,
    )


def poison_ids(
    queue: str, after_msg_id: int, qty: int, where: PoisonFilter = ANY_POISON
) -> Call[list[int]]:
    """The next qty matching poison ids above after_msg_id, ascending (a keyset page)."""
    return Call(
        "poison_ids",
        "SELECT * FROM pgqueue.poison_ids(%s, %s, %s, %s, %s, %s)",
        (queue, after_msg_id, int32("qty", qty), where.after, where.before, where.reason),
        column,
    )


def poison_count(queue: str | None, where: PoisonFilter = ANY_POISON) -> Call[int]:
    """How many poison messages match (of one queue, or of all when queue is None)."""
    return Call(
        "poison_count",
        "SELECT pgqueue.poison_count(%s, %s, %s, %s)",
        (queue, where.after, where.before, where.reason),
        scalar,
    )


def poison_requeue(queue: str, msg_ids: Sequence[int]) -> Call[list[int]]:
    """Put poisoned messages back in their queue with read_ct 0; the ids moved."""
    return Call(
        "poison_requeue",
        "SELECT * FROM pgqueue.poison_requeue(%s, %s::bigint[])",
        (queue, list(msg_ids)),
        column,
    )


def poison_purge(queue: str, msg_ids: Sequence[int] | None = None) -> Call[int]:
    """Delete poisoned messages of a queue (all when msg_ids is None); the count deleted."""
    return Call(
        "poison_purge",
        "SELECT pgqueue.poison_purge(%s, %s::bigint[])",
        (queue, None if msg_ids is None else list(msg_ids)),
        scalar,
    )
