"""Ending a lease as calls: ack by delete or archive (one, many, fenced), or nack it.

A message already gone (for nack, a lease no longer current) is reported in
the result (False, None, or absent from the ids), never as an error.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from pgqueue._calls import Call, column, int32, scalar, seconds
from pgqueue.types import Duration


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
