"""The values pgqueue hands out: messages, metrics, barrier and poison records.

Every one is a frozen dataclass, built from a row of the SQL API; nothing here
talks to the database.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeAlias
from uuid import UUID

JSON = Any
"""A JSON value as Python holds it: dict, list, str, int, float, bool or None."""

Duration: TypeAlias = int | float | timedelta
"""A duration in whole seconds: an int, a float with no fraction, or a timedelta."""

# The one header rule (docs/security.md, "What a handler may trust"): every
# key pgqueue writes starts with RESERVED_PREFIX, and no caller may write
# such a key (every entry that takes headers refuses it, in SQL). So what a
# handler reads from these keys was written by pgqueue, and the properties of
# Message read nothing else; a key without the prefix is its producer's.
RESERVED_PREFIX = "_pg_"
TRANSPORT_MARKER = "_pg_transport"  # true on a callback: a barrier's or a workflow's
CALLBACK = "_pg_callback"  # a callback's record: {"kind": "barrier" | "workflow", ...}
MEMBER = "_pg_member"  # on a barrier member: {"barrier_id", "index"}
STEP = "_pg_step"  # on a workflow step's message: {"workflow_id", "step"}


@dataclass(frozen=True, slots=True)
class Callback:
    """What a barrier's or a workflow's firing wrote on its callback; nothing a producer can write.

    kind is "barrier" or "workflow". A barrier's: barrier_id, state
    (succeeded, failed or timed_out), total and the counts, outcomes (the
    count of every outcome). A workflow's: workflow_id, state (succeeded,
    failed or cancelled) and steps (every step's state).
    """

    kind: str
    state: str
    barrier_id: str | None = None
    workflow_id: str | None = None
    total: int | None = None
    succeeded: int | None = None
    failed: int | None = None
    cancelled: int | None = None
    outcomes: dict[str, int] | None = None
    steps: dict[str, str] | None = None


def _record(headers: object, key: str) -> dict[str, Any]:
    value = headers.get(key) if isinstance(headers, dict) else None
    return value if isinstance(value, dict) else {}


def _text(record: dict[str, Any], key: str) -> str | None:
    value = record.get(key)
    return value if isinstance(value, str) else None


def _int(record: dict[str, Any], key: str) -> int | None:
    value = record.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True, slots=True)
class Message:
    """A message as delivered: hidden from other readers until `vt`.

    Its properties (barrier_id, member_index, workflow_id, step,
    is_callback, callback) read only the keys pgqueue writes, which no
    producer can: a handler may trust them. Any other header is its
    producer's to write.
    """

    queue: str
    msg_id: int
    read_ct: int
    enqueued_at: datetime
    vt: datetime
    message: JSON
    headers: dict[str, Any] | None

    @property
    def caller_headers(self) -> dict[str, Any]:
        """Its producer's headers, without pgqueue's `_pg_` keys: safe to pass on to a send."""
        if not isinstance(self.headers, dict):
            return {}
        return {k: v for k, v in self.headers.items() if not k.startswith(RESERVED_PREFIX)}

    @property
    def barrier_id(self) -> str | None:
        """The barrier this message is a member of, or the barrier callback it is; else None."""
        member = _text(_record(self.headers, MEMBER), "barrier_id")
        if member is not None:
            return member
        callback = _record(self.headers, CALLBACK) if self.is_callback else {}
        return _text(callback, "barrier_id") if callback.get("kind") == "barrier" else None

    @property
    def member_index(self) -> int | None:
        """This member's position in its fan-out (0-based); None if not a member."""
        return _int(_record(self.headers, MEMBER), "index")

    @property
    def workflow_id(self) -> str | None:
        """The workflow this message is a step of, or the final callback of; else None."""
        step = _text(_record(self.headers, STEP), "workflow_id")
        if step is not None:
            return step
        callback = _record(self.headers, CALLBACK) if self.is_callback else {}
        return _text(callback, "workflow_id") if callback.get("kind") == "workflow" else None

    @property
    def step(self) -> str | None:
        """The workflow step this message belongs to; None if not a step's."""
        return _text(_record(self.headers, STEP), "step")

    @property
    def is_callback(self) -> bool:
        """True when a barrier's or a workflow's firing sent this message (the transport marker)."""
        return isinstance(self.headers, dict) and self.headers.get(TRANSPORT_MARKER) is True

    @property
    def callback(self) -> Callback | None:
        """What the firing wrote on this callback; None for a message that is not a callback."""
        record = _record(self.headers, CALLBACK) if self.is_callback else {}
        kind, state = _text(record, "kind"), _text(record, "state")
        if kind is None or state is None:
            return None
        outcomes, steps = record.get("outcomes"), record.get("steps")
        return Callback(
            kind=kind,
            state=state,
            barrier_id=_text(record, "barrier_id"),
            workflow_id=_text(record, "workflow_id"),
            total=_int(record, "total"),
            succeeded=_int(record, "succeeded"),
            failed=_int(record, "failed"),
            cancelled=_int(record, "cancelled"),
            outcomes=outcomes if isinstance(outcomes, dict) else None,
            steps=steps if isinstance(steps, dict) else None,
        )


@dataclass(frozen=True, slots=True)
class Undecodable:
    """A stored JSON document this Python cannot decode: the start of its text, and why.

    Shown by the operator's views (peek, the poison table) in place of the
    document; a read never hands one out (it poisons the message instead).
    """

    text: str  # the first characters of the document as the database prints it
    chars: int  # the length of its whole text
    error: str  # what the decoder said


@dataclass(frozen=True, slots=True)
class KeyedSend:
    """A send under a dedupe key: the message that holds the key, and whether this call sent it."""

    msg_id: int
    sent: bool  # False: an unfinished message someone else sent holds the key; nothing was sent


@dataclass(frozen=True, slots=True)
class PeekedMessage:
    """A live message as seen by an operator: looked at, not leased."""

    queue: str
    msg_id: int
    read_ct: int
    enqueued_at: datetime
    vt: datetime
    message: JSON
    headers: dict[str, Any] | None
    dedupe_key: str | None
    last_error: str | None

    def state(self, now: datetime) -> str:
        """visible (a read would take it), in_flight (leased to a consumer) or delayed."""
        if self.vt <= now:
            return "visible"
        return "in_flight" if self.read_ct > 0 else "delayed"


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """A queue and its settings; paused_at is set while it is paused (reads get nothing)."""

    queue_name: str
    max_attempts: int
    created_at: datetime
    paused_at: datetime | None = None
    paused_by: str | None = None  # who paused it, when the pause said

    @property
    def paused(self) -> bool:
        """The queue is paused: reads hand out nothing until it is resumed."""
        return self.paused_at is not None


@dataclass(frozen=True, slots=True)
class QueueMetrics:
    """A snapshot of one queue's size and age, as of `scrape_time`."""

    queue_name: str
    queue_length: int
    visible_length: int
    oldest_msg_age_sec: int | None
    newest_msg_age_sec: int | None
    total_messages: int
    poison_length: int
    scrape_time: datetime


@dataclass(frozen=True, slots=True)
class BarrierStatus:
    """A barrier's progress; `state` is open, fired or expired; `outcome` how it ended."""

    barrier_id: str
    queue_name: str | None
    callback_queue: str | None
    total: int
    succeeded: int
    failed: int
    remaining: int
    state: str
    created_at: datetime
    fired_at: datetime | None
    callback_msg_id: int | None
    deadline: datetime | None
    policy: str = "wait_all"  # wait_all, fail_fast or max_failures
    max_failures: int | None = None
    max_failure_ratio: float | None = None
    cancelled: int = 0  # members cancelled when it failed early
    sealed: bool = True  # False: an open barrier still taking members
    outcome: str | None = None  # succeeded, failed or timed_out once fired


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a workflow: a message, or a fan-out (`messages`), sent once its dependencies end.

    `on_dependency_failure`: "cancel" (the default: a failed or cancelled
    dependency cancels this step and, in turn, its own dependents) or "run"
    (it runs anyway, e.g. a cleanup step). A fan-out step takes a failure
    policy as fan_out does.
    """

    name: str
    queue: str
    message: Any = None
    messages: list[Any] | None = None
    depends_on: tuple[str, ...] = ()
    headers: dict[str, Any] | None = None
    policy: str | None = None
    max_failures: int | None = None
    max_failure_ratio: float | None = None
    on_dependency_failure: str = "cancel"


@dataclass(frozen=True, slots=True)
class WorkflowStatus:
    """A workflow's progress: its state and its steps counted by state."""

    workflow_id: str
    state: str  # running, succeeded, failed or cancelled
    sealed: bool
    steps: int
    steps_left: int
    waiting: int
    enqueued: int
    succeeded: int
    failed: int
    cancelled: int
    callback_queue: str | None
    callback_msg_id: int | None
    created_at: datetime
    finished_at: datetime | None


@dataclass(frozen=True, slots=True)
class StepStatus:
    """One step of a workflow: its state, dependencies and its members' counts once sent."""

    step: str
    queue_name: str | None
    state: str  # waiting, enqueued, succeeded, failed or cancelled
    depends_on: list[str]
    on_dependency_failure: str
    barrier_id: str | None
    total: int | None
    succeeded: int | None
    failed: int | None
    cancelled: int | None
    remaining: int | None
    enqueued_at: datetime | None
    finished_at: datetime | None


@dataclass(frozen=True, slots=True)
class MemberResult:
    """How one member of a barrier ended (outcome None while it is pending)."""

    member_index: int
    msg_id: int
    outcome: str | None
    result: Any
    completed_at: datetime | None


@dataclass(frozen=True, slots=True)
class MemberFailure:
    """A member that did not succeed, and why (one line an operator can read)."""

    member_index: int
    msg_id: int
    outcome: str
    reason: str
    result: Any
    completed_at: datetime | None


@dataclass(frozen=True, slots=True)
class PoisonMessage:
    """A message that will not be delivered again until an operator requeues it."""

    queue_name: str
    msg_id: int
    read_ct: int
    enqueued_at: datetime
    poisoned_at: datetime
    reason: str
    message: Any
    headers: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class PoisonFilter:
    """Which poison messages of a queue a bulk operation touches: poisoned in [after, before)."""

    after: datetime | None = None
    before: datetime | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class ClaimRecord:
    """A claim as stored: held (with a lease) or finished (a tombstone)."""

    key: str
    owner: str
    state: str
    lease_until: datetime | None
    claimed_at: datetime
    finished_at: datetime | None


ANY_POISON = PoisonFilter()


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A worker as its last heartbeat registered it; alive when that was at most 15 s ago."""

    worker_id: UUID
    host: str
    pid: int
    queues: list[str]
    concurrency: int
    in_flight: int
    started_at: datetime
    last_seen_at: datetime  # the database's clock
    stopping: bool  # it is shutting down, finishing what it holds
    alive: bool


@dataclass(frozen=True, slots=True)
class QueueMinute:
    """What happened to a queue in one minute (the current one: so far).

    sent is None where a sample of the queue's sequence is missing; acked,
    nacked and poisoned count what pgqueue workers reported (0 without a report).
    """

    queue_name: str
    minute: datetime
    sent: int | None
    acked: int
    nacked: int
    poisoned: int
