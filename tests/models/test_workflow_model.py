"""A stateful hypothesis test of workflows against a model: random DAGs with random
dependency policies and fan-out steps, random outcomes in any order, duplicate
completions, poison, grafting, sealing and cancellation.

After every step the database must agree with the model: every step's state,
every workflow's state, the live messages, one barrier per sent step (sent at
most once) and one final callback per finished workflow.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from support.db import stateful_settings

from pgqueue import Step
from pgqueue._calls import barrier as b
from pgqueue._calls import poison as p
from pgqueue._calls import queue as q
from pgqueue._calls import workflow as wf
from pgqueue._execute import execute

QUEUE, DONE = "wf", "wf_done"


@dataclass
class StepModel:
    deps: tuple[str, ...]
    run_anyway: bool
    members: int  # 1: a message step; 2: a fan-out
    fail_fast: bool
    state: str = "waiting"
    outcomes: dict[int, str] = field(default_factory=dict)  # member msg_id -> outcome
    msg_ids: list[int] = field(default_factory=list)


@dataclass
class WorkflowModel:
    wid: str
    steps: dict[str, StepModel]
    sealed: bool
    cancel_requested: bool = False
    state: str = "running"


class Workflows(RuleBasedStateMachine):
    conn: psycopg.Connection[Any]

    def __init__(self) -> None:
        super().__init__()
        self.call = lambda c: execute(self.conn, c)
        self.conn.execute("DELETE FROM pgqueue.workflow")
        self.conn.execute("DELETE FROM pgqueue.barrier_member")
        self.conn.execute("DELETE FROM pgqueue.barrier")
        for name in (QUEUE, DONE):
            self.conn.execute("SELECT pgqueue.drop_queue(%s)", (name,))
            self.call(q.create_queue(name, 5))
        self.flows: list[WorkflowModel] = []
        self.live: dict[int, tuple[WorkflowModel, str]] = {}  # msg_id -> its step

    # -- the model's rules ------------------------------------------------------

    def _send(self, w: WorkflowModel, name: str) -> None:
        s = w.steps[name]
        s.state = "enqueued"
        [row] = [x for x in self.call(wf.workflow_steps(w.wid)) if x.step == name]
        assert row.barrier_id is not None
        s.msg_ids = [r.msg_id for r in self.call(b.barrier_results(row.barrier_id))]
        assert len(s.msg_ids) == s.members
        for m in s.msg_ids:
            self.live[m] = (w, name)

    def _resolve(self, w: WorkflowModel, ended: list[str]) -> None:
        """Steps ended: their dependents with every dependency ended are sent or cancelled."""
        while ended:
            ended = []
            for name, s in w.steps.items():
                if s.state != "waiting" or any(
                    w.steps[d].state in ("waiting", "enqueued") for d in s.deps
                ):
                    continue
                failed = any(w.steps[d].state != "succeeded" for d in s.deps)
                if failed and not s.run_anyway:
                    s.state = "cancelled"
                    ended.append(name)
                else:
                    self._send(w, name)
        self._finish(w)

    def _finish(self, w: WorkflowModel) -> None:
        if w.state != "running" or not w.sealed:
            return
        if any(s.state in ("waiting", "enqueued") for s in w.steps.values()):
            return
        if w.cancel_requested:
            w.state = "cancelled"
        else:
            ok = all(s.state == "succeeded" for s in w.steps.values())
            w.state = "succeeded" if ok else "failed"

    def _member_ended(self, msg_id: int, outcome: str) -> None:
        w, name = self.live.pop(msg_id)
        s = w.steps[name]
        s.outcomes[msg_id] = outcome
        if s.state != "enqueued":
            return  # cancelled meanwhile: recorded, nothing else
        failed = outcome != "succeeded"
        if failed and s.fail_fast and len(s.outcomes) < s.members:
            for other in s.msg_ids:  # never read in this model: not under a lease
                if other not in s.outcomes and other in self.live:
                    self.live.pop(other)
                    s.outcomes[other] = "cancelled"
        if len(s.outcomes) == s.members:
            ok = all(o == "succeeded" for o in s.outcomes.values())
            s.state = "succeeded" if ok else "failed"
            self._resolve(w, [name])

    # -- rules --------------------------------------------------------------------

    @rule(
        shape=st.lists(
            st.tuples(st.integers(0, 7), st.booleans(), st.booleans(), st.booleans()),
            min_size=1,
            max_size=6,
        ),
        sealed=st.booleans(),
    )
    def start(self, shape: list[tuple[int, bool, bool, bool]], sealed: bool) -> None:
        wid = f"w{len(self.flows)}"
        steps: dict[str, StepModel] = {}
        payload = []
        for i, (dep_bits, run_anyway, fan, fail_fast) in enumerate(shape):
            deps = tuple(f"s{j}" for j in range(i) if dep_bits >> (j % 3) & 1 and j >= i - 3)
            name = f"s{i}"
            steps[name] = StepModel(deps, run_anyway, 2 if fan else 1, fan and fail_fast)
            payload.append(
                Step(
                    name,
                    QUEUE,
                    messages=[1, 2] if fan else None,
                    message=None if fan else i,
                    depends_on=deps,
                    policy="fail_fast" if fan and fail_fast else None,
                    on_dependency_failure="run" if run_anyway else "cancel",
                )
            )
        assert self.call(wf.start_workflow(wid, payload, DONE, {}, None, sealed)) == wid
        w = WorkflowModel(wid, steps, sealed)
        self.flows.append(w)
        for name, s in steps.items():
            if not s.deps:
                self._send(w, name)
        self._finish(w)

    def _in_model_order(self, ids: list[int]) -> list[int]:
        """The ids in the order of the workflow, step and member each one is.

        Not in msg_id order: when one completion makes several steps ready,
        the database enqueues them in an order of its own (the row order of
        an UPDATE ... RETURNING), so the same rules can number the same
        members differently, and a draw by position in msg_id order would
        pick a different member on a replay (hypothesis: "inconsistent data
        generation").
        """
        place = {
            m: (i, name, j)
            for i, w in enumerate(self.flows)
            for name, s in w.steps.items()
            for j, m in enumerate(s.msg_ids)
        }
        return sorted(ids, key=place.__getitem__)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), outcome=st.sampled_from(["succeeded", "succeeded", "failed"]))
    def complete(self, data: st.DataObject, outcome: str) -> None:
        msg_id = data.draw(st.sampled_from(self._in_model_order(list(self.live))))
        self.call(b.complete_members(QUEUE, [msg_id], [outcome], [None]))
        self._member_ended(msg_id, outcome)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def poison(self, data: st.DataObject) -> None:
        msg_id = data.draw(st.sampled_from(self._in_model_order(list(self.live))))
        assert self.call(p.poison(QUEUE, msg_id, "model")) is True
        self._member_ended(msg_id, "poisoned")

    @precondition(lambda self: any(s.outcomes for w in self.flows for s in w.steps.values()))
    @rule(data=st.data())
    def complete_again(self, data: st.DataObject) -> None:
        done = [m for w in self.flows for s in w.steps.values() for m in s.outcomes]
        msg_id = data.draw(st.sampled_from(self._in_model_order(done)))
        self.call(b.complete_members(QUEUE, [msg_id], ["failed"], [None]))  # changes nothing

    @precondition(lambda self: self.flows)
    @rule(data=st.data(), run_anyway=st.booleans())
    def graft(self, data: st.DataObject, run_anyway: bool) -> None:
        w = data.draw(st.sampled_from(self.flows))
        name = f"g{len(w.steps)}"
        deps = tuple(data.draw(st.lists(st.sampled_from(sorted(w.steps)), max_size=2, unique=True)))
        step = Step(
            name,
            QUEUE,
            len(w.steps),
            depends_on=deps,
            on_dependency_failure="run" if run_anyway else "cancel",
        )
        if w.state != "running" or w.sealed:
            try:
                self.call(wf.add_steps(w.wid, [step]))
            except psycopg.Error as exc:
                assert exc.sqlstate == "PGQ04"
            else:
                raise AssertionError("a sealed or finished workflow took a step")
            return
        self.call(wf.add_steps(w.wid, [step]))
        w.steps[name] = StepModel(deps, run_anyway, 1, False)
        self._resolve(w, [name])

    @precondition(lambda self: self.flows)
    @rule(data=st.data())
    def seal(self, data: st.DataObject) -> None:
        w = data.draw(st.sampled_from(self.flows))
        self.call(wf.seal_workflow(w.wid))
        if w.state == "running":
            w.sealed = True
            self._finish(w)

    @precondition(lambda self: self.flows)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        w = data.draw(st.sampled_from(self.flows))
        self.call(wf.cancel_workflow(w.wid))
        if w.state != "running":
            return
        w.cancel_requested, w.sealed = True, True
        for s in w.steps.values():
            if s.state in ("waiting", "enqueued"):
                s.state = "cancelled"
                for m in s.msg_ids:
                    if m in self.live:  # never read: not started
                        self.live.pop(m)
                        s.outcomes[m] = "cancelled"
        self._finish(w)

    # -- invariants -------------------------------------------------------------------

    @invariant()
    def steps_and_workflows_match(self) -> None:
        for w in self.flows:
            got = {s.step: s.state for s in self.call(wf.workflow_steps(w.wid))}
            assert got == {n: s.state for n, s in w.steps.items()}, w.wid
            assert self.call(wf.workflow_status(w.wid)).state == w.state, w.wid

    @invariant()
    def live_messages_match(self) -> None:
        rows = self.conn.execute(
            "SELECT m.msg_id FROM pgqueue.message m JOIN pgqueue.queue x USING (queue_id)"
            " WHERE x.queue_name = %s",
            (QUEUE,),
        ).fetchall()
        assert {r[0] for r in rows} == set(self.live)

    @invariant()
    def each_step_sent_at_most_once(self) -> None:
        dup = self.conn.execute(
            "SELECT workflow_id, step FROM pgqueue.barrier WHERE workflow_id IS NOT NULL"
            " GROUP BY 1, 2 HAVING count(*) > 1"
        ).fetchall()
        assert dup == []

    @invariant()
    def one_final_callback_per_finished_workflow(self) -> None:
        rows = self.conn.execute(
            "SELECT m.headers->'_pg_callback'->>'workflow_id', count(*),"
            " min(m.headers->'_pg_callback'->>'state')"
            " FROM pgqueue.message m JOIN pgqueue.queue x USING (queue_id)"
            " WHERE x.queue_name = %s GROUP BY 1",
            (DONE,),
        ).fetchall()
        finished = {w.wid: (1, w.state) for w in self.flows if w.state != "running"}
        assert {r[0]: (r[1], r[2]) for r in rows} == finished


def test_workflows_behave_like_their_model(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        Workflows.conn = conn
        run_state_machine_as_test(Workflows, settings=stateful_settings(100, 40))
