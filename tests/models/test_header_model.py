"""A stateful hypothesis test of the one header rule: whatever a hostile producer sends,
through every entry it may use, no message passes for what pgqueue wrote.

A real `pgqueue_producer` login makes messages every way it can: send, send_batch,
send_keyed, fan_out, open_barrier + add_members + seal, start_workflow (zero to three
steps; none ends at once and calls back), add_steps + seal_workflow, and the pgmq facade's
send, send_batch, send_topic and send_batch_topic; through the Python client, and the
sends and fan-outs through their SQL functions too (with a trace context of their own).
Its headers: keys that mimic pgqueue's records without the prefix (barrier_id, state,
steps, ...), near misses of it (`_PG_callback`, `_pg`, ` _pg_step`), reserved keys, and
values of any JSON shape, dicts shaped like pgqueue's records among them, naming the
barriers and workflows that exist. The owner runs "victims" that call back into
victim_cb: a sealed barrier, an open one, a workflow, one open to grafts; the producer's
fan-outs and workflows call back there too, and graft onto and add members to the
victims. Between the producer's calls a `pgqueue_consumer` login reads every queue and
completes members (succeeded or failed, going by what a handler may trust), reads poison
what is read too often, and the owner expires barriers: barriers and workflows fire for
real.

Checked at each call: it is refused (22023; InvalidArgument from the client) if and only
if a header key it passes starts with `_pg_`, and a refused call changes no row of the
messages, poison, barriers, members, workflows and steps. One exception, as built: the
Python client's sends and fan-outs drop `_pg_traceparent`/`_pg_tracestate` from their
headers (docs/security.md; the SQL and the workflow calls refuse them). A facade topic
send that routes to no queue is refused like one that routes somewhere (it was not
before, though it sent nothing).

Checked after every step, for every live and poisoned message of every queue, and for
every message the consumer is handed: each trusted property of Message (is_callback,
callback, barrier_id, member_index, workflow_id, step) is exactly what pgqueue's own rows
say, or None where they say nothing: a member's from pgqueue.barrier_member and its
barrier (a step's workflow and step); a callback's from the barrier or workflow whose
callback_msg_id it is in that queue (state, counts, steps' states); and caller_headers is
exactly the headers the producer passed for that message (a member's: its fan-out's or
its step's; a callback's: its fan-out's or its workflow's).

A RuleBasedStateMachine rather than @given over a list of operations: add_members, seal,
add_steps and seal_workflow act on what earlier steps made, the forged headers name the
ids made so far, the consumer acts on what it reads, and hypothesis shrinks a failure to
the fewest calls that make a message lie. One rule draws the entry (every entry as
likely; hypothesis leaves some rules out of each example) and then, half the time, lets
the consumer and the owner act. One database for the test; each example starts from
empty queues and no barriers (a replay while shrinking must meet the state it met).

Run time (pytest -q on this file, database setup included; 30 examples of up to 20
steps): 11-16 s on a quiet 2-CPU machine, 26-41 s while a full suite ran beside it. A
failure shrinks for up to hypothesis's five minutes (every replay talks to the database).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, TypeVar

import psycopg
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from support.db import stateful_settings
from support.roles import as_user

from pgqueue import Client, InvalidArgument, Message, Step
from pgqueue._pgmq import install
from pgqueue._roles import CONSUMER, PRODUCER
from pgqueue.types import RESERVED_PREFIX, Callback

T = TypeVar("T")
Headers = dict[str, Any] | None

WORK, STEPS, CB, VICTIM_CB = "work", "steps", "cb", "victim_cb"
QUEUES = (WORK, STEPS, CB, VICTIM_CB)
MEMBER_QUEUES = (WORK, STEPS)
CALLBACK_QUEUES = (CB, VICTIM_CB, WORK)
# The facade's names are pgqueue's own here (plain lowercase names map to themselves).
BINDINGS = {"work.*": WORK, "*.victim": VICTIM_CB}
ROUTES = {"work.a": 1, "x.victim": 1, "work.victim": 2, "nowhere.z": 0}
# Every way a producer makes a message (HeaderModel.enter_<entry>), or acts on a barrier's
# or a workflow's making of them.
ENTRIES = (
    "send",
    "send_batch",
    "send_keyed",
    "fan_out",
    "open_barrier",
    "add_members",
    "seal",
    "start_workflow",
    "add_steps",
    "seal_workflow",
    "pgmq_send",
    "pgmq_send_batch",
    "pgmq_send_topic",
)
# How a producer calls: the Python client, or the SQL function as psql would (with a
# trace context of its own choosing, which pgqueue writes under _pg_traceparent).
HOW = ("api", "sql", "traced")
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

PLAIN_KEYS = [
    "barrier_id",
    "member_index",
    "workflow_id",
    "step",
    "state",
    "total",
    "succeeded",
    "failed",
    "cancelled",
    "outcomes",
    "steps",
    "kind",
    "index",
    "transport",
    "callback",
    "member",
]
NEAR_MISSES = ["_PG_callback", "_pg", "pg_member", " _pg_step", "__pg_transport", "_pg-callback"]
RESERVED_KEYS = [
    "_pg_transport",
    "_pg_callback",
    "_pg_member",
    "_pg_step",
    "_pg_traceparent",
    "_pg_tracestate",
    "_pg_x",
    "_pg_",
]
STATES = ["succeeded", "failed", "timed_out", "cancelled", "open", "running", "enqueued"]

# jsonb takes no NUL; anything else a JSON text can hold, but for a backslash before
# "u0000", which the Python client's encode_json takes for an escaped NUL and refuses.
TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=6).filter(
    lambda t: "\\u0000" not in t
)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(10**18), 10**18)
    | st.floats(-1e9, 1e9, allow_nan=False)
    | TEXT
    | st.sampled_from(RESERVED_KEYS + STATES)
)
KEYS = st.sampled_from(PLAIN_KEYS) | st.sampled_from(NEAR_MISSES) | TEXT
JSON = st.recursive(
    SCALARS,
    lambda kids: (
        st.lists(kids, max_size=3)
        | st.dictionaries(KEYS | st.sampled_from(RESERVED_KEYS), kids, max_size=3)
    ),
    max_leaves=6,
)


def forgeries(
    barrier_ids: list[str], workflow_ids: list[str]
) -> tuple[st.SearchStrategy[Any], st.SearchStrategy[dict[str, Any]]]:
    """Values shaped like pgqueue's records, and headers that copy them into plain keys (a
    victim's callback's, a member's, a step's), naming the barriers and workflows that exist."""
    bid = st.sampled_from(barrier_ids) if barrier_ids else TEXT
    wid = st.sampled_from(workflow_ids) if workflow_ids else TEXT
    count = st.integers(0, 4)
    state = st.sampled_from(STATES)
    step = st.sampled_from(["a", "b", "s0", "s1"])
    barrier = {
        "barrier_id": bid,
        "state": state,
        "total": count,
        "succeeded": count,
        "failed": count,
        "cancelled": count,
        "outcomes": st.dictionaries(state, count, max_size=2),
    }
    workflow = {
        "workflow_id": wid,
        "state": state,
        "steps": st.dictionaries(step, state, max_size=2),
    }
    records = st.one_of(
        st.fixed_dictionaries({"kind": st.just("barrier"), **barrier}),
        st.fixed_dictionaries({"kind": st.just("workflow"), **workflow}),
        st.fixed_dictionaries({"barrier_id": bid, "index": count}),
        st.fixed_dictionaries({"workflow_id": wid, "step": step}),
        st.just(True),
        bid,
        wid,
    )
    mimics = st.fixed_dictionaries(
        {},
        optional={
            **barrier,
            **workflow,
            "kind": st.sampled_from(["barrier", "workflow"]),
            "member_index": count,
            "index": count,
            "step": step,
            "transport": st.just(True),
            "callback": records,
            "member": records,
        },
    )
    return records, mimics


# The Python client drops these two from the headers a send, send_keyed, send_batch,
# fan_out or open_barrier is given (CHANGELOG: "so the headers of a traced message can be
# passed on as they came"), writing the current trace context instead; their other _pg_
# keys, and every _pg_ key through SQL or a workflow, are refused.
TRACE_KEYS = ("_pg_traceparent", "_pg_tracestate")


def untraced(headers: Headers) -> Headers:
    """What the Python client's sends pass on: the headers without the two trace keys."""
    if headers is None:
        return None
    return {k: v for k, v in headers.items() if k not in TRACE_KEYS}


def reserved(headers: list[Headers]) -> bool:
    return any(k.startswith(RESERVED_PREFIX) for h in headers if h for k in h)


def jsonb_text(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


@dataclass
class Ledger:
    """What the producers passed, as each message's caller_headers must show it."""

    plain: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    barrier: dict[str, dict[str, Any]] = field(default_factory=dict)
    workflow: dict[str, dict[str, Any]] = field(default_factory=dict)
    step: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class BarrierRow:
    callback_queue: str
    callback_msg_id: int | None
    outcome: str | None
    total: int
    succeeded: int
    failed: int
    cancelled: int
    workflow_id: str | None
    step: str | None


@dataclass(frozen=True)
class Truth:
    """pgqueue's own rows: who is a member, and which message is whose callback."""

    members: dict[tuple[str, int], tuple[str, int]]  # (queue, msg_id) -> (barrier, index)
    barriers: dict[str, BarrierRow]
    callbacks: dict[tuple[str, int], Callback]  # (queue, msg_id) -> what its firing was

    @classmethod
    def load(cls, owner: psycopg.Connection[Any]) -> Truth:
        members = {
            (q, m): (b, i)
            for q, m, b, i in owner.execute(
                "SELECT q.queue_name, m.msg_id, m.barrier_id, m.member_index"
                " FROM pgqueue.barrier_member m JOIN pgqueue.queue q USING (queue_id)"
            )
        }
        barriers = {
            r[0]: BarrierRow(*r[1:])
            for r in owner.execute(
                "SELECT b.barrier_id, q.queue_name, b.callback_msg_id, b.outcome, b.total,"
                " b.succeeded, b.failed, b.cancelled, b.workflow_id, b.step"
                " FROM pgqueue.barrier b JOIN pgqueue.queue q ON q.queue_id = b.callback_queue_id"
            )
        }
        callbacks = {
            (b.callback_queue, b.callback_msg_id): Callback(
                kind="barrier",
                state=b.outcome or "?",
                barrier_id=bid,
                total=b.total,
                succeeded=b.succeeded,
                failed=b.failed,
                cancelled=b.cancelled,
            )
            for bid, b in barriers.items()
            if b.callback_msg_id is not None
        }
        for wid, queue, msg_id, state, steps in owner.execute(
            "SELECT w.workflow_id, q.queue_name, w.callback_msg_id, w.state,"
            " coalesce((SELECT jsonb_object_agg(s.step, s.state) FROM pgqueue.workflow_step s"
            "           WHERE s.workflow_id = w.workflow_id), '{}')"
            " FROM pgqueue.workflow w JOIN pgqueue.queue q ON q.queue_id = w.callback_queue_id"
            " WHERE w.callback_msg_id IS NOT NULL"
        ):
            assert (queue, msg_id) not in callbacks
            callbacks[(queue, msg_id)] = Callback(
                kind="workflow", state=state, workflow_id=wid, steps=steps
            )
        return cls(members, barriers, callbacks)


def every_message(owner: psycopg.Connection[Any]) -> list[Message]:
    """Every live and poisoned message of every queue, as a handler would be given it."""
    rows = owner.execute(
        "SELECT q.queue_name, m.msg_id, m.read_ct, m.enqueued_at, m.vt, m.message, m.headers"
        " FROM pgqueue.message m JOIN pgqueue.queue q USING (queue_id)"
        " UNION ALL"
        " SELECT q.queue_name, p.msg_id, p.read_ct, p.enqueued_at, p.poisoned_at, p.message,"
        " p.headers FROM pgqueue.poison p JOIN pgqueue.queue q USING (queue_id)"
    ).fetchall()
    return [Message(*r) for r in rows]


def fresh(owner: Client, owner_sql: psycopg.Connection[Any]) -> None:
    """Empty queues, bound as the topic sends expect, and no barrier or workflow."""
    for table in ("workflow", "barrier_member", "barrier_addition", "barrier"):
        owner_sql.execute(f"DELETE FROM pgqueue.{table}")
    for queue in QUEUES:
        owner.drop_queue(queue)
        owner.create_queue(queue, max_attempts=3)
    for pattern, queue in BINDINGS.items():
        owner_sql.execute("SELECT pgmq.bind_topic(%s, %s)", (pattern, queue))


def check(msg: Message, truth: Truth, ledger: Ledger) -> None:
    """Every trusted field of msg is what pgqueue's rows say; its caller_headers what was sent."""
    where = (msg.queue, msg.msg_id)
    said = f"{where} with headers {msg.headers!r}"
    member = truth.members.get(where)
    fired = truth.callbacks.get(where)
    trusted = (msg.is_callback, msg.barrier_id, msg.member_index, msg.workflow_id, msg.step)
    if member is not None:
        bid, index = member
        b = truth.barriers[bid]
        assert trusted == (False, bid, index, b.workflow_id, b.step), said
        assert msg.callback is None, said
        if b.workflow_id is not None:
            assert b.step is not None
            expected = ledger.step[(b.workflow_id, b.step)]
        else:
            expected = ledger.barrier[bid]
    elif fired is not None:
        got = msg.callback
        assert got is not None, f"a callback with no record: {said}"
        if fired.kind == "barrier":
            assert fired.barrier_id is not None
            assert trusted == (True, fired.barrier_id, None, None, None), said
            assert replace(got, outcomes=None) == fired, said
            assert got.outcomes is not None and sum(got.outcomes.values()) == got.total, said
            expected = ledger.barrier[fired.barrier_id]
        else:
            assert fired.workflow_id is not None
            assert trusted == (True, None, None, fired.workflow_id, None), said
            assert got == fired, said
            expected = ledger.workflow[fired.workflow_id]
    else:
        assert trusted == (False, None, None, None, None), f"passes for pgqueue's: {said}"
        assert msg.callback is None, said
        assert where in ledger.plain, f"a message nobody sent: {said}"
        expected = ledger.plain[where]
    assert msg.caller_headers == expected, said


class HeaderModel(RuleBasedStateMachine):
    owner: ClassVar[Client]
    owner_sql: ClassVar[psycopg.Connection[Any]]
    producer: ClassVar[Client]
    producer_sql: ClassVar[psycopg.Connection[Any]]
    consumer: ClassVar[Client]

    def __init__(self) -> None:
        super().__init__()
        fresh(self.owner, self.owner_sql)
        self.ledger = Ledger()
        self.ids = itertools.count()
        victim, victim_open, victim_flow, victim_graft = "vb", "vo", "vw", "vg"
        # The owner's, calling back into victim_cb: a sealed barrier, an open one (till
        # someone seals it), a workflow of two steps, and one open to grafts.
        self.owner.fan_out(
            WORK,
            [1, 2],
            callback_queue=VICTIM_CB,
            callback_message={"album": 1},
            barrier_id=victim,
            headers={"tenant": "victim"},
            deadline_seconds=100,
        )
        self.owner.open_barrier(
            WORK,
            callback_queue=VICTIM_CB,
            callback_message={"album": 1},
            messages=[3],
            barrier_id=victim_open,
            headers={"tenant": "open victim"},
        )
        steps = [
            Step("a", STEPS, {"n": 1}, headers={"app": "a"}),
            Step("b", STEPS, messages=[2, 3], depends_on=("a",)),
        ]
        self.owner.start_workflow(
            victim_flow,
            steps,
            callback_queue=VICTIM_CB,
            callback_message={"flow": 1},
            headers={"app": "victim"},
        )
        self.owner.start_workflow(
            victim_graft,
            [Step("a", WORK, {"n": 2})],
            callback_queue=VICTIM_CB,
            callback_message={"flow": 2},
            headers={"app": "grafted victim"},
            sealed=False,
        )
        self.ledger.barrier[victim] = {"tenant": "victim"}
        self.ledger.barrier[victim_open] = {"tenant": "open victim"}
        self.ledger.workflow[victim_flow] = {"app": "victim"}
        self.ledger.step[(victim_flow, "a")] = {"app": "a"}
        self.ledger.step[(victim_flow, "b")] = {}
        self.ledger.workflow[victim_graft] = {"app": "grafted victim"}
        self.ledger.step[(victim_graft, "a")] = {}
        self.barrier_ids = [victim, victim_open]
        self.workflow_ids = [victim_flow, victim_graft]

    # -- drawing ---------------------------------------------------------------

    def _new_id(self, prefix: str) -> str:
        return f"{prefix}{next(self.ids)}"

    def _headers(self, data: st.DataObject, n: int) -> list[Headers]:
        """n headers, and in about a third of the calls a reserved key in one of them."""
        records, mimics = forgeries(self.barrier_ids, self.workflow_ids)
        values = JSON | records
        anything = st.none() | st.dictionaries(KEYS, values, max_size=3) | mimics
        out: list[Headers] = [data.draw(anything) for _ in range(n)]
        if n and data.draw(st.integers(0, 2), label="hostile") == 0:
            i = data.draw(st.integers(0, n - 1))
            key = data.draw(st.sampled_from(RESERVED_KEYS))
            out[i] = {**(out[i] or {}), key: data.draw(values)}
        return out

    def _bodies(self, data: st.DataObject, low: int, high: int) -> list[Any]:
        return data.draw(st.lists(JSON, min_size=low, max_size=high))

    # -- the rule at every entry ----------------------------------------------

    def _counts(self) -> tuple[int, ...]:
        row = self.owner_sql.execute(
            "SELECT (SELECT count(*) FROM pgqueue.message), (SELECT count(*) FROM pgqueue.poison),"
            " (SELECT count(*) FROM pgqueue.barrier),"
            " (SELECT count(*) FROM pgqueue.barrier_member),"
            " (SELECT count(*) FROM pgqueue.workflow),"
            " (SELECT count(*) FROM pgqueue.workflow_step)"
        ).fetchone()
        assert row is not None
        return tuple(row)

    def _attempt(self, headers: list[Headers], call: Callable[[], T]) -> T | None:
        """call(), refused if and only if a header key is reserved, and then sending nothing."""
        hostile = reserved(headers)
        before = self._counts()
        try:
            result = call()
        except (InvalidArgument, psycopg.errors.InvalidParameterValue) as exc:
            cause = exc.__cause__ if isinstance(exc, InvalidArgument) else exc
            assert isinstance(cause, psycopg.errors.InvalidParameterValue), exc
            assert hostile, f"refused headers with no reserved key {headers!r}: {exc}"
            assert "is reserved" in str(exc), exc
            assert self._counts() == before, "a refused call sent something"
            return None
        assert not hostile, f"took a reserved key: {headers!r}"
        return result

    def _sent(self, queue: str, ids: list[int], headers: list[Headers]) -> None:
        for msg_id, h in zip(ids, headers, strict=True):
            assert (queue, msg_id) not in self.ledger.plain
            self.ledger.plain[(queue, msg_id)] = h or {}

    def _live(self) -> set[tuple[str, int]]:
        return {
            (q, m)
            for q, m in self.owner_sql.execute(
                "SELECT q.queue_name, m.msg_id FROM pgqueue.message m JOIN pgqueue.queue q"
                " USING (queue_id)"
            )
        }

    # -- the producer's entries: each draws its own arguments ---------------------

    def _how(self, data: st.DataObject) -> str:
        return data.draw(st.sampled_from(HOW), label="how")

    def _queue(self, data: st.DataObject, queues: tuple[str, ...] = QUEUES) -> str:
        return data.draw(st.sampled_from(queues), label="queue")

    def enter_send(self, data: st.DataObject) -> None:
        queue, how = self._queue(data), self._how(data)
        [h] = self._headers(data, 1)
        [body] = self._bodies(data, 1, 1)

        def call() -> int:
            if how == "api":
                return self.producer.send(queue, body, headers=h)
            row = self.producer_sql.execute(
                "SELECT pgqueue.send(%s, %s::jsonb, %s::jsonb, traceparent => %s)",
                (queue, json.dumps(body), jsonb_text(h), TRACEPARENT if how == "traced" else None),
            ).fetchone()
            assert row is not None
            return int(row[0])

        sent = untraced(h) if how == "api" else h
        msg_id = self._attempt([sent], call)
        if msg_id is not None:
            self._sent(queue, [msg_id], [sent])

    def enter_send_batch(self, data: st.DataObject) -> None:
        queue = self._queue(data)
        bodies = self._bodies(data, 1, 3)
        hs = self._headers(data, len(bodies))
        sent = [untraced(h) for h in hs]
        ids = self._attempt(sent, lambda: self.producer.send_batch(queue, bodies, headers=hs))
        if ids is not None:
            self._sent(queue, ids, sent)

    def enter_send_keyed(self, data: st.DataObject) -> None:
        queue = self._queue(data)
        key = data.draw(st.sampled_from(["k0", "k1"]), label="dedupe_key")
        [h] = self._headers(data, 1)
        [body] = self._bodies(data, 1, 1)
        sent = untraced(h)
        got = self._attempt(
            [sent], lambda: self.producer.send_keyed(queue, body, dedupe_key=key, headers=h)
        )
        if got is not None and got.sent:
            self._sent(queue, [got.msg_id], [sent])
        elif got is not None:  # held by an earlier send's live message: nothing sent
            assert (queue, got.msg_id) in self.ledger.plain

    def enter_fan_out(self, data: st.DataObject, sealed: bool = True) -> None:
        """A fan-out (of zero members too: it fires at once), or an open barrier."""
        queue, how = self._queue(data, MEMBER_QUEUES), self._how(data)
        callback_queue = self._queue(data, CALLBACK_QUEUES)
        name, limit = data.draw(st.sampled_from([(None, None), ("fail_fast", None), (None, 1)]))
        deadline = data.draw(st.sampled_from([None, 100]), label="deadline")
        bid = self._new_id("pb")
        bodies = self._bodies(data, 0, 3)
        [h] = self._headers(data, 1)
        [callback_message] = self._bodies(data, 1, 1)

        def api() -> str:
            arm = self.producer.fan_out if sealed else self.producer.open_barrier
            return arm(
                queue,
                messages=bodies,
                callback_queue=callback_queue,
                callback_message=callback_message,
                barrier_id=bid,
                headers=h,
                deadline_seconds=deadline,
                policy=name,
                max_failures=limit,
            )

        def sql() -> str:
            row = self.producer_sql.execute(
                f"SELECT pgqueue.{'fan_out' if sealed else 'open_barrier'}(queue_name => %s,"
                " messages => %s::text[]::jsonb[], callback_queue => %s,"
                " callback_message => %s::jsonb, barrier_id => %s, headers => %s::jsonb,"
                " deadline_seconds => %s, policy => %s, max_failures => %s, traceparent => %s)",
                (
                    queue,
                    [json.dumps(b) for b in bodies],
                    callback_queue,
                    json.dumps(callback_message),
                    bid,
                    jsonb_text(h),
                    deadline,
                    name,
                    limit,
                    TRACEPARENT if how == "traced" else None,
                ),
            ).fetchone()
            assert row is not None
            return str(row[0])

        sent = untraced(h) if how == "api" else h
        got = self._attempt([sent], api if how == "api" else sql)
        if got is not None:
            assert got == bid
            self.ledger.barrier[bid] = sent or {}
            self.barrier_ids.append(bid)

    def enter_open_barrier(self, data: st.DataObject) -> None:
        self.enter_fan_out(data, sealed=False)

    def _unsealed_barriers(self) -> list[str]:
        rows = self.owner_sql.execute(
            "SELECT barrier_id FROM pgqueue.barrier WHERE state = 'open' AND NOT sealed"
            " ORDER BY barrier_id"
        )
        return [r[0] for r in rows]

    def enter_add_members(self, data: st.DataObject) -> None:
        """Members for any open barrier, the owner's too: they carry that barrier's headers."""
        open_ = self._unsealed_barriers()
        if open_:
            bid = data.draw(st.sampled_from(open_), label="barrier")
            bodies = self._bodies(data, 1, 3)
            ids = self._attempt([], lambda: self.producer.add_members(bid, bodies))
            assert ids is not None and len(ids) == len(bodies)

    def enter_seal(self, data: st.DataObject) -> None:
        open_ = self._unsealed_barriers()
        if open_:
            self.producer.seal(data.draw(st.sampled_from(open_), label="barrier"))

    def _steps(self, data: st.DataObject, names: list[str], known: list[str]) -> list[Step]:
        """Steps by these names, each depending on some steps before it (or already there)."""
        hs = self._headers(data, len(names))
        steps = []
        for i, (name, h) in enumerate(zip(names, hs, strict=True)):
            earlier = known + names[:i]
            deps = (
                data.draw(st.lists(st.sampled_from(earlier), unique=True, max_size=2))
                if earlier
                else []
            )
            queue = self._queue(data, MEMBER_QUEUES)
            fan = data.draw(st.booleans(), label="fan-out step")
            [body] = self._bodies(data, 1, 1)
            steps.append(
                Step(
                    name,
                    queue,
                    None if fan else body,
                    messages=self._bodies(data, 1, 2) if fan else None,
                    depends_on=tuple(deps),
                    headers=h,
                    on_dependency_failure=data.draw(st.sampled_from(["cancel", "run"])),
                )
            )
        return steps

    def enter_start_workflow(self, data: st.DataObject) -> None:
        """A workflow of 0 to 3 steps (none: sealed, it ends at once and calls back)."""
        wid = self._new_id("pw")
        n = data.draw(st.integers(0, 3), label="steps")
        steps = self._steps(data, [f"s{i}" for i in range(n)], [])
        callback_queue = data.draw(st.sampled_from((*CALLBACK_QUEUES, None)))
        sealed = data.draw(st.sampled_from([True, True, False]), label="sealed")
        [h] = self._headers(data, 1)
        [callback_message] = self._bodies(data, 1, 1)
        got = self._attempt(
            [h, *(s.headers for s in steps)],
            lambda: self.producer.start_workflow(
                wid,
                steps,
                callback_queue=callback_queue,
                callback_message=callback_message,
                headers=h,
                sealed=sealed,
            ),
        )
        if got is not None:
            assert got == wid
            self.ledger.workflow[wid] = h or {}
            for s in steps:
                self.ledger.step[(wid, s.name)] = s.headers or {}
            self.workflow_ids.append(wid)

    def _unsealed_workflows(self) -> list[tuple[str, list[str]]]:
        rows = self.owner_sql.execute(
            "SELECT w.workflow_id, coalesce(array_agg(s.step ORDER BY s.step)"
            "                               FILTER (WHERE s.step IS NOT NULL), '{}')"
            " FROM pgqueue.workflow w LEFT JOIN pgqueue.workflow_step s USING (workflow_id)"
            " WHERE w.state = 'running' AND NOT w.sealed GROUP BY 1 ORDER BY 1"
        )
        return [(w, list(s)) for w, s in rows]

    def enter_add_steps(self, data: st.DataObject) -> None:
        running = self._unsealed_workflows()
        if not running:
            return
        wid, known = data.draw(st.sampled_from(running), label="workflow")
        n = data.draw(st.integers(1, 2), label="steps")
        steps = self._steps(data, [self._new_id("g") for _ in range(n)], known)

        def add() -> bool:
            self.producer.add_steps(wid, steps)
            return True

        if self._attempt([s.headers for s in steps], add):
            for s in steps:
                self.ledger.step[(wid, s.name)] = s.headers or {}

    def enter_seal_workflow(self, data: st.DataObject) -> None:
        running = self._unsealed_workflows()
        if running:
            self.producer.seal_workflow(data.draw(st.sampled_from(running), label="workflow")[0])

    def enter_pgmq_send(self, data: st.DataObject) -> None:
        queue = self._queue(data)
        delay = data.draw(st.booleans(), label="with a delay")
        [h] = self._headers(data, 1)
        [body] = self._bodies(data, 1, 1)
        statement = "SELECT * FROM pgmq.send(%s, %s::jsonb, %s::jsonb" + (", 0)" if delay else ")")
        params = (queue, json.dumps(body), jsonb_text(h))
        ids = self._attempt(
            [h], lambda: [r[0] for r in self.producer_sql.execute(statement, params)]
        )
        if ids is not None:
            self._sent(queue, ids, [h])

    def enter_pgmq_send_batch(self, data: st.DataObject) -> None:
        queue = self._queue(data)
        bodies = self._bodies(data, 1, 3)
        hs = self._headers(data, len(bodies))
        statement = "SELECT * FROM pgmq.send_batch(%s, %s::text[]::jsonb[], %s::text[]::jsonb[])"
        params = (queue, [json.dumps(b) for b in bodies], [jsonb_text(h) for h in hs])
        ids = self._attempt(
            hs, lambda: [r[0] for r in self.producer_sql.execute(statement, params)]
        )
        if ids is not None:
            self._sent(queue, ids, hs)

    def enter_pgmq_send_topic(self, data: st.DataObject) -> None:
        """pgmq.send_topic or send_batch_topic: to one queue, two, or none."""
        key = data.draw(st.sampled_from(sorted(ROUTES)), label="routing key")
        batch = data.draw(st.booleans(), label="batch")
        bodies = self._bodies(data, 1, 2 if batch else 1)
        hs = self._headers(data, len(bodies))
        before = self._live()

        def call() -> int:
            if batch:
                rows = self.producer_sql.execute(
                    "SELECT * FROM pgmq.send_batch_topic(%s, %s::text[]::jsonb[],"
                    " %s::text[]::jsonb[], 0)",
                    (key, [json.dumps(b) for b in bodies], [jsonb_text(h) for h in hs]),
                ).fetchall()
                return len(rows)
            row = self.producer_sql.execute(
                "SELECT pgmq.send_topic(%s, %s::jsonb, %s::jsonb, 0)",
                (key, json.dumps(bodies[0]), jsonb_text(hs[0])),
            ).fetchone()
            assert row is not None
            return int(row[0])

        sent = self._attempt(hs, call)
        if sent is None:
            return
        assert sent == ROUTES[key] * len(bodies)
        new = sorted(self._live() - before)
        assert len(new) == sent  # nothing else sends while the producer does
        for queue in {q for q, _ in new}:
            self._sent(queue, [m for q, m in new if q == queue], hs)

    @rule(data=st.data(), entry=st.sampled_from(ENTRIES), settle=st.booleans())
    def produce(self, data: st.DataObject, entry: str, settle: bool) -> None:
        """One call of the producer through the entry drawn; then maybe the others' turn.

        One rule, so that every entry is as likely, and no example is made of the
        consumer's turns alone (hypothesis leaves some rules out of each example).
        """
        getattr(self, f"enter_{entry}")(data)
        if settle:
            self._settle(data)

    # -- the consumer and the owner ---------------------------------------------

    def _settle(self, data: st.DataObject) -> None:
        """The consumer reads every queue (a 0 s lease: reads repeat until they poison) and
        completes members; then, now and then, the owner expires every barrier past due.

        The consumer goes by what a handler trusts (barrier_id, is_callback), and now and
        then completes a message that is no member at all (that changes nothing).
        """
        for queue in QUEUES:
            got = self.consumer.read(queue, vt=0, qty=10)
            truth = Truth.load(self.owner_sql)
            for msg in got:
                check(msg, truth, self.ledger)  # what the handler is given
            for msg in got:
                outcome = data.draw(st.sampled_from(["succeeded", "failed", None]))
                member = msg.barrier_id is not None and not msg.is_callback
                if outcome is not None and (member or data.draw(st.booleans())):
                    self.consumer.complete_member(
                        queue, msg.msg_id, outcome=outcome, read_ct=msg.read_ct
                    )
        if data.draw(st.booleans(), label="expire"):
            self.owner_sql.execute(
                "UPDATE pgqueue.barrier SET deadline = deadline - interval '200 seconds'"
                " WHERE state = 'open' AND deadline IS NOT NULL"
            )
            self.owner.expire_barriers()

    # -- the property -------------------------------------------------------------

    @invariant()
    def every_message_tells_the_truth(self) -> None:
        truth = Truth.load(self.owner_sql)
        for msg in every_message(self.owner_sql):
            check(msg, truth, self.ledger)


def test_no_producer_makes_a_message_pass_for_what_pgqueue_wrote(
    dsn: str, client: Client, sql: psycopg.Connection[Any], make_login: Callable[..., str]
) -> None:
    install(sql)
    producer = as_user(dsn, make_login("producer", PRODUCER))
    consumer = as_user(dsn, make_login("consumer", CONSUMER))
    with (
        Client.from_dsn(producer, max_size=1) as producer_client,
        psycopg.connect(producer, autocommit=True) as producer_sql,
        Client.from_dsn(consumer, max_size=1) as consumer_client,
    ):
        HeaderModel.owner, HeaderModel.owner_sql = client, sql
        HeaderModel.producer, HeaderModel.producer_sql = producer_client, producer_sql
        HeaderModel.consumer = consumer_client
        run_state_machine_as_test(HeaderModel, settings=stateful_settings(30, 20))
