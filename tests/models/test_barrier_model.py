"""A stateful hypothesis test of barriers against a model: arm (sealed, or open to take
members until sealed) under a failure policy, complete in any order, complete twice, poison
on purpose or by exhausting reads, add members, seal, expire by deadline."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from support.db import stateful_settings

from pgqueue._calls import barrier as b
from pgqueue._calls import poison as p
from pgqueue._calls import queue as q
from pgqueue._execute import execute

MAX_ATTEMPTS = 2


@dataclass
class Barrier:
    barrier_id: str
    members: list[int]  # msg_ids by member index
    has_deadline: bool
    policy: str = "wait_all"
    max_failures: int | None = None
    sealed: bool = True
    outcomes: dict[int, str] = field(default_factory=dict)  # as each member row records it
    state: str = "open"
    outcome: str | None = None
    # the counts, frozen when it fires (a late completion is recorded, not counted)
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0

    @property
    def remaining(self) -> int:
        return len(self.members) - self.succeeded - self.failed - self.cancelled

    @property
    def tolerated(self) -> int:
        return self.max_failures if self.policy == "max_failures" and self.max_failures else 0

    @property
    def breached(self) -> bool:
        return self.policy != "wait_all" and self.failed > self.tolerated


class BarrierModel(RuleBasedStateMachine):
    conn: psycopg.Connection[Any]

    def __init__(self) -> None:
        super().__init__()
        self.call = lambda c: execute(self.conn, c)
        self.conn.execute("DELETE FROM pgqueue.barrier_member")
        self.conn.execute("DELETE FROM pgqueue.barrier_addition")
        self.conn.execute("DELETE FROM pgqueue.barrier")
        for name in ("work", "cb"):
            self.conn.execute("SELECT pgqueue.drop_queue(%s)", (name,))
        self.call(q.create_queue("work", MAX_ATTEMPTS))
        self.call(q.create_queue("cb", 5))
        self.barriers: list[Barrier] = []
        self.live: dict[int, int] = {}  # member msg_id -> read_ct
        self.member_of: dict[int, Barrier] = {}

    def _fire_if_due(self, bar: Barrier) -> None:
        if bar.state != "open" or not bar.sealed:
            return
        if bar.remaining and bar.breached:
            # cancels every pending member not under a live lease: the model's
            # reads lease for 0 s, so every live one
            for msg_id in bar.members:
                if msg_id not in bar.outcomes and msg_id in self.live:
                    del self.live[msg_id]
                    bar.outcomes[msg_id] = "cancelled"
                    bar.cancelled += 1
        elif bar.remaining:
            return
        bar.state = "fired"
        bar.outcome = "failed" if bar.failed > bar.tolerated else "succeeded"

    def _count(self, msg_id: int, outcome: str) -> None:
        self._count_many([(msg_id, outcome)])

    def _count_many(self, ended: list[tuple[int, str]]) -> None:
        """Members that ended in one statement: all counted, then their barriers fire if due."""
        touched: list[Barrier] = []
        for msg_id, outcome in ended:
            bar = self.member_of[msg_id]
            if msg_id in bar.outcomes:
                continue
            bar.outcomes[msg_id] = outcome
            if bar.state == "open":
                if outcome == "succeeded":
                    bar.succeeded += 1
                else:
                    bar.failed += 1
                touched.append(bar)
        for bar in touched:
            self._fire_if_due(bar)

    @rule(
        n=st.integers(0, 4),
        deadline=st.booleans(),
        policy=st.sampled_from([("wait_all", None), ("fail_fast", None), ("max_failures", 1)]),
        sealed=st.booleans(),
    )
    def arm(self, n: int, deadline: bool, policy: tuple[str, int | None], sealed: bool) -> None:
        bid = f"b{len(self.barriers)}"
        name, limit = policy
        args: dict[str, Any] = {
            "policy": name if limit is None else None,
            "max_failures": limit,
        }
        if sealed:
            call = b.fan_out(
                "work",
                list(range(n)),
                "cb",
                {"bid": bid},
                bid,
                None,
                100 if deadline else None,
                **args,
            )
        else:
            call = b.open_barrier(
                "work",
                "cb",
                {"bid": bid},
                bid,
                None,
                100 if deadline else None,
                list(range(n)),
                **args,
            )
        assert self.call(call) == bid
        ids = [r.msg_id for r in self.call(b.barrier_results(bid))]
        bar = Barrier(bid, ids, deadline, name, limit, sealed)
        self.barriers.append(bar)
        self._track(bar, ids)
        self._fire_if_due(bar)

    def _track(self, bar: Barrier, ids: list[int]) -> None:
        for i in ids:
            self.live[i] = 0
            self.member_of[i] = bar

    @precondition(lambda self: self.barriers)
    @rule(data=st.data(), n=st.integers(1, 3))
    def add(self, data: st.DataObject, n: int) -> None:
        bar = data.draw(st.sampled_from(self.barriers))
        if bar.state != "open" or bar.sealed:
            with pytest.raises(psycopg.Error, match="no more members can be added"):
                self.call(b.add_members(bar.barrier_id, list(range(n))))
            return
        ids = self.call(b.add_members(bar.barrier_id, list(range(n))))
        assert len(ids) == n
        bar.members.extend(ids)
        self._track(bar, ids)

    @precondition(lambda self: self.barriers)
    @rule(data=st.data())
    def seal(self, data: st.DataObject) -> None:
        bar = data.draw(st.sampled_from(self.barriers))
        self.call(b.seal(bar.barrier_id))
        if bar.state == "open":
            bar.sealed = True
            self._fire_if_due(bar)

    def _member(self, data: st.DataObject) -> int:
        bars = [x for x in self.barriers if x.members]
        bar = data.draw(st.sampled_from(bars))
        return int(data.draw(st.sampled_from(bar.members)))

    @precondition(lambda self: any(x.members for x in self.barriers))
    @rule(data=st.data(), outcome=st.sampled_from(["succeeded", "failed"]))
    def complete(self, data: st.DataObject, outcome: str) -> None:
        msg_id = self._member(data)
        self.call(b.complete_members("work", [msg_id], [outcome], [None]))
        if msg_id in self.live:
            del self.live[msg_id]
            self._count(msg_id, outcome)

    @precondition(lambda self: any(x.members for x in self.barriers))
    @rule(data=st.data())
    def poison(self, data: st.DataObject) -> None:
        msg_id = self._member(data)
        moved = self.call(p.poison("work", msg_id, "model"))
        assert moved is (msg_id in self.live)
        if moved:
            del self.live[msg_id]
            self._count(msg_id, "poisoned")

    @rule()
    def read_everything(self) -> None:
        # vt=0: every live member is a candidate; exhausted ones are poison-dropped
        # (in one statement, counted together), which may cancel others first
        got = {m.msg_id: m.read_ct for m in self.call(q.read("work", 0, 100)).messages}
        exhausted = [i for i, read_ct in self.live.items() if read_ct >= MAX_ATTEMPTS]
        for msg_id in exhausted:
            del self.live[msg_id]
        self._count_many([(i, "poisoned") for i in exhausted])
        expected = {}
        for msg_id, read_ct in self.live.items():
            self.live[msg_id] = expected[msg_id] = read_ct + 1
        assert got == expected

    @rule()
    def expire(self) -> None:
        self.conn.execute("UPDATE pgqueue.barrier SET deadline = deadline - interval '200 seconds'")
        expired = self.call(b.expire_barriers())
        due = [x for x in self.barriers if x.state == "open" and x.has_deadline]
        for bar in due:
            for msg_id in bar.members:
                if msg_id not in bar.outcomes:
                    bar.outcomes[msg_id] = "timed_out"
                    bar.failed += 1
            bar.state, bar.outcome = "expired", "timed_out"
        assert expired == len(due)

    @invariant()
    def barriers_match(self) -> None:
        for bar in self.barriers:
            s = self.call(b.barrier_status(bar.barrier_id))
            assert (s.state, s.outcome, s.sealed, s.total) == (
                bar.state,
                bar.outcome,
                bar.sealed,
                len(bar.members),
            )
            assert (s.remaining, s.succeeded, s.failed, s.cancelled) == (
                bar.remaining,
                bar.succeeded,
                bar.failed,
                bar.cancelled,
            )
            recorded = [r.outcome for r in self.call(b.barrier_results(bar.barrier_id))]
            assert recorded == [bar.outcomes.get(m) for m in bar.members]

    @invariant()
    def one_callback_per_resolved_barrier(self) -> None:
        rows = self.conn.execute(
            "SELECT headers->'_pg_callback'->>'barrier_id', count(*),"
            " min(headers->'_pg_callback'->>'state') FROM pgqueue.message"
            " WHERE queue_id = (SELECT queue_id FROM pgqueue.queue WHERE queue_name = 'cb')"
            " GROUP BY 1"
        ).fetchall()
        resolved = {x.barrier_id: (1, x.outcome) for x in self.barriers if x.state != "open"}
        assert {r[0]: (r[1], r[2]) for r in rows} == resolved


def test_barriers_behave_like_their_model(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        BarrierModel.conn = conn
        run_state_machine_as_test(
            BarrierModel,
            settings=stateful_settings(100, 40),
        )
