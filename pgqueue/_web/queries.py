"""The dashboard's reads and checks, as calls any pgqueue client runs."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pgqueue._calls import Call, Row


@dataclass(frozen=True, slots=True)
class QueueRow:
    """One queue on the overview: its counts, its age and whether it is paused."""

    name: str
    visible: int
    leased: int
    delayed: int
    oldest_visible_age: float | None
    poison: int
    barriers_open: int
    sent_total: int
    paused: bool


def _queue_rows(rows: list[Row]) -> list[QueueRow]:
    return [QueueRow(*r) for r in rows]


OVERVIEW: Call[list[QueueRow]] = Call(
    "exporter_metrics",
    "SELECT queue_name, visible, leased, delayed, oldest_visible_age_seconds, poison,"
    " barriers_open, sent_total, paused FROM pgqueue.exporter_metrics()",
    (),
    _queue_rows,
)


def rates(names: list[str], minutes: int) -> Call[dict[str, tuple[list[int | None], list[int]]]]:
    """Each named queue's sent and acked per minute, oldest first, one row per queue."""
    return Call(
        "queue_rates",
        "SELECT queue_name, array_agg(sent ORDER BY minute), array_agg(acked ORDER BY minute)"
        " FROM pgqueue.queue_rates(%s::text[], %s) GROUP BY queue_name",
        (names, minutes),
        lambda rows: {r[0]: (r[1], r[2]) for r in rows},
    )


@dataclass(frozen=True, slots=True)
class PoisonRow:
    """A poison message as a page lists it: its payload cut short; capped marks a scan's end."""

    queue: str
    queue_id: int
    msg_id: int
    read_ct: int | None
    enqueued_at: datetime | None
    poisoned_at: datetime
    reason: str | None
    message: str | None
    message_chars: int | None
    headers: dict[str, Any] | None
    capped: bool


def poison_page(
    queue: str | None,
    qty: int,
    after: datetime | None,
    before: datetime | None,
    reason: str | None,
    cursor: tuple[datetime, int, int] | None,
    scan_limit: int,
) -> Call[list[PoisonRow]]:
    """One keyset page of poison messages, newest first."""
    at, qid, mid = cursor if cursor is not None else (None, None, None)
    return Call(
        "poison_page",
        "SELECT queue, queue_id, msg_id, read_ct, enqueued_at, poisoned_at, reason, message,"
        " message_chars, NULL::jsonb, capped"
        " FROM pgqueue.poison_page(%s::text, %s::integer, %s::timestamptz,"
        " %s::timestamptz, %s::text, %s::timestamptz, %s::integer, %s::bigint, %s::integer)",
        (queue, qty, after, before, reason, at, qid, mid, scan_limit),
        lambda rows: [PoisonRow(*r) for r in rows],
    )


def barrier_outcomes(barrier_id: str) -> Call[dict[str, int]]:
    """A barrier's members counted by outcome ('pending' for none yet)."""
    return Call(
        "barrier_outcomes",
        "SELECT * FROM pgqueue.barrier_outcomes(%s)",
        (barrier_id,),
        lambda rows: {r[0]: r[1] for r in rows},
    )


@dataclass(frozen=True, slots=True)
class PendingMember:
    """A member a barrier still waits on, and its live message when there is one."""

    member_index: int
    queue: str
    msg_id: int
    read_ct: int | None
    enqueued_at: datetime | None
    vt: datetime | None
    last_error: str | None


def barrier_pending(barrier_id: str, qty: int) -> Call[list[PendingMember]]:
    """The first qty members the barrier waits on."""
    return Call(
        "barrier_pending",
        "SELECT * FROM pgqueue.barrier_pending(%s, %s)",
        (barrier_id, qty),
        lambda rows: [PendingMember(*r) for r in rows],
    )


def barrier_page(
    state: str | None, qty: int, cursor: tuple[datetime, str] | None
) -> Call[list[Row]]:
    """One keyset page of barriers, newest first, as barrier_status rows."""
    at, bid = cursor if cursor is not None else (None, None)
    return Call(
        "list_barriers",
        "SELECT * FROM pgqueue.list_barriers(%s::text, %s::integer, %s::timestamptz, %s::text)",
        (state, qty, at, bid),
        lambda rows: rows,
    )


NOW: Call[datetime] = Call("now", "SELECT clock_timestamp()", (), lambda rows: rows[0][0])


@dataclass(frozen=True, slots=True)
class ShownMessage:
    """A live message as the queue page shows it: its payload as text, cut short in SQL."""

    msg_id: int
    read_ct: int
    enqueued_at: datetime
    vt: datetime
    preview: str
    last_error: str | None

    def state(self, now: datetime) -> str:
        """visible, leased (read and hidden) or delayed (hidden, never read)."""
        if self.vt <= now:
            return "visible"
        return "leased" if self.read_ct > 0 else "delayed"


def peek_shown(queue: str, qty: int, after: int) -> Call[list[ShownMessage]]:
    """A page of live messages; payloads never parsed here (any depth, any size)."""
    return Call(
        "peek",
        "SELECT msg_id, read_ct, enqueued_at, vt, left(message::text, 300), last_error"
        " FROM pgqueue.peek(%s, %s, %s)",
        (queue, qty, after),
        lambda rows: [ShownMessage(*r) for r in rows],
    )


@dataclass(frozen=True, slots=True)
class ShownPoison:
    """A poison message as its page shows it: payload and headers as indented text."""

    queue_name: str
    msg_id: int
    read_ct: int
    enqueued_at: datetime
    poisoned_at: datetime
    reason: str
    payload: str
    payload_chars: int
    headers: str | None
    headers_chars: int | None


def poison_shown(queue: str, msg_id: int, limit: int) -> Call[ShownPoison | None]:
    """One poison message, its JSON indented and cut at limit characters by the database."""
    return Call(
        "poison_get",
        "SELECT queue_name, msg_id, read_ct, enqueued_at, poisoned_at, reason,"
        " left(jsonb_pretty(message), %s), length(jsonb_pretty(message)),"
        " left(jsonb_pretty(headers), %s), length(jsonb_pretty(headers))"
        " FROM pgqueue.poison_get(%s, %s)",
        (limit, limit, queue, msg_id),
        lambda rows: ShownPoison(*rows[0]) if rows else None,
    )


@dataclass(frozen=True, slots=True)
class ShownFailure:
    """A failed member of a barrier, with its one-line reason (its result left in SQL)."""

    member_index: int
    msg_id: int
    outcome: str
    reason: str
    completed_at: datetime | None


def failures_shown(barrier_id: str, qty: int) -> Call[list[ShownFailure]]:
    """The first qty failed members, by index."""
    return Call(
        "barrier_failures",
        "SELECT member_index, msg_id, outcome, left(reason, 1000), completed_at"
        " FROM pgqueue.barrier_failures(%s, %s)",
        (barrier_id, qty),
        lambda rows: [ShownFailure(*r) for r in rows],
    )


@dataclass(frozen=True, slots=True)
class Grants:
    """What the dashboard's login role is: superuser, schema owner, operator."""

    role: str
    superuser: bool
    owner: bool
    operator: bool
    read_only_session: bool  # default_transaction_read_only took effect


GRANTS: Call[Grants] = Call(
    "grants",
    "SELECT current_user::text, r.rolsuper,"
    " EXISTS (SELECT 1 FROM pg_namespace n WHERE n.nspname = 'pgqueue'"
    "         AND pg_has_role(current_user, n.nspowner, 'USAGE')),"
    " EXISTS (SELECT 1 FROM pg_roles o WHERE o.rolname = 'pgqueue_operator'"
    "         AND pg_has_role(current_user, o.oid, 'USAGE')),"
    " current_setting('default_transaction_read_only') = 'on'"
    " FROM pg_roles r WHERE r.rolname = current_user",
    (),
    lambda rows: Grants(*rows[0]),
)
