"""Moving a lease as calls: set_vt, and the worker's batch hold, set and extend of its leases.

A lease named by (msg_id, read_ct) moves only while it is current: one another
reader has taken over since, or one gone, is left alone (set_vt without a
read_ct moves the message whoever holds it).
"""

from __future__ import annotations

from collections.abc import Sequence

from pgqueue._calls import Call, column, int32, seconds
from pgqueue._calls.read import RECORD, first_message
from pgqueue.types import Duration, Message


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
            f"SELECT {RECORD} FROM pgqueue.set_vt(%s, %s, %s, %s::text, %s)",
            (queue, msg_id, seconds("vt", vt), error, int32("read_ct", read_ct)),
            first_message(queue),
        )
    if error is None:
        return Call(
            "set_vt",
            f"SELECT {RECORD} FROM pgqueue.set_vt(%s, %s, %s)",
            (queue, msg_id, seconds("vt", vt)),
            first_message(queue),
        )
    return Call(
        "set_vt",
        f"SELECT {RECORD} FROM pgqueue.set_vt(%s, %s, %s, %s::text)",
        (queue, msg_id, seconds("vt", vt), error),
        first_message(queue),
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
