"""The dashboard's reads and checks, as calls any pgqueue client runs."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pgqueue._calls import Call, Row

# A payload (or headers) stored in more bytes than this is not read for a
# preview: pg_column_size() reads only the stored size (a TOAST pointer's),
# so a page of huge payloads costs what its rows' other columns cost, not
# their size. pgqueue.poison_page's c_preview_bytes is the same bound.
PREVIEW_BYTES = 16_384
# The one-message page indents (jsonb_pretty) a document stored in at most
# this; a larger one is shown by its size and the CLI command that prints it.
# Stored sizes are after compression: a very repetitive document can be tens
# of times larger as text.
PRETTY_BYTES = 1 << 20


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
    message_bytes: int | None  # as stored; message is None when over PREVIEW_BYTES

    @property
    def too_large(self) -> bool:
        """Whether the payload is stored too large to preview (message is then None)."""
        return self.message_bytes is not None and self.message_bytes > PREVIEW_BYTES


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
        " message_chars, NULL::jsonb, capped, message_bytes"
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


@dataclass(frozen=True, slots=True)
class StepOf:
    """The workflow step a barrier is: its members are the step's messages."""

    workflow_id: str
    step: str


def barrier_steps(barrier_ids: list[str]) -> Call[dict[str, StepOf]]:
    """Which of these barriers are workflow steps, by barrier id; the others are left out."""
    return Call(
        "barrier_steps",
        "SELECT barrier_id, workflow_id, step FROM pgqueue.barrier_steps(%s::text[])",
        (barrier_ids,),
        lambda rows: {r[0]: StepOf(r[1], r[2]) for r in rows},
    )


NOW: Call[datetime] = Call("now", "SELECT clock_timestamp()", (), lambda rows: rows[0][0])


@dataclass(frozen=True, slots=True)
class ShownMessage:
    """A live message as the queue page shows it: its payload as text, cut short in SQL."""

    msg_id: int
    read_ct: int
    enqueued_at: datetime
    vt: datetime
    preview: str | None  # None: stored in more than PREVIEW_BYTES, not read
    message_bytes: int  # as stored
    last_error: str | None

    def state(self, now: datetime) -> str:
        """visible, leased (read and hidden) or delayed (hidden, never read)."""
        if self.vt <= now:
            return "visible"
        return "leased" if self.read_ct > 0 else "delayed"


def peek_shown(queue: str, qty: int, after: int) -> Call[list[ShownMessage]]:
    """A page of live messages; payloads never parsed here, and only small ones read."""
    # peek's rows come back with their TOAST pointers (RETURN QUERY keeps
    # them): the CASE reads a payload only when its stored size is small.
    return Call(
        "peek",
        "SELECT msg_id, read_ct, enqueued_at, vt,"
        " CASE WHEN pg_column_size(message) <= %s THEN left(message::text, 300) END,"
        " pg_column_size(message), last_error"
        " FROM pgqueue.peek(%s, %s, %s)",
        (PREVIEW_BYTES, queue, qty, after),
        lambda rows: [ShownMessage(*r) for r in rows],
    )


@dataclass(frozen=True, slots=True)
class ShownPoison:
    """A poison message as its page shows it: payload and headers as indented text.

    payload (headers) is None when stored in more than PRETTY_BYTES: the page
    gives its size instead. headers_bytes is None for a message without headers.
    """

    queue_name: str
    msg_id: int
    read_ct: int
    enqueued_at: datetime
    poisoned_at: datetime
    reason: str
    payload: str | None
    payload_chars: int | None
    payload_bytes: int
    headers: str | None
    headers_chars: int | None
    headers_bytes: int | None


def poison_shown(queue: str, msg_id: int, limit: int) -> Call[ShownPoison | None]:
    """One poison message, its JSON indented and cut at limit characters by the database.

    Each document is indented at most once, and only when stored in at most PRETTY_BYTES.
    """
    # OFFSET 0 keeps the planner from pulling the subquery up, which would copy
    # jsonb_pretty(...) into both its uses: a detoast and an indent apiece.
    return Call(
        "poison_get",
        "SELECT queue_name, msg_id, read_ct, enqueued_at, poisoned_at, reason,"
        " left(payload, %s), length(payload), payload_bytes,"
        " left(head, %s), length(head), headers_bytes"
        " FROM (SELECT g.*, pg_column_size(g.message) AS payload_bytes,"
        "        pg_column_size(g.headers) AS headers_bytes,"
        "        CASE WHEN pg_column_size(g.message) <= %s THEN jsonb_pretty(g.message) END"
        "          AS payload,"
        "        CASE WHEN pg_column_size(g.headers) <= %s THEN jsonb_pretty(g.headers) END"
        "          AS head"
        "   FROM pgqueue.poison_get(%s, %s) g OFFSET 0) s",
        (limit, limit, PRETTY_BYTES, PRETTY_BYTES, queue, msg_id),
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
