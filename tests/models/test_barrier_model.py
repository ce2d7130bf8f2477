"""A stateful hypothesis test of barriers against a model: arm, complete in any order,
complete twice, poison on purpose or by exhausting reads, expire by deadline."""

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

from pgqueue._calls import barrier as b
from pgqueue._calls import poison as p
from pgqueue._calls import queue as q
from pgqueue._connection import execute

MAX_ATTEMPTS = 2


@dataclass
class Barrier:
    barrier_id: str
    members: list[int]  # msg_ids by member index
    has_deadline: bool
    outcomes: dict[int, str] = field(default_factory=dict)
    state: str = "open"

    @property
    def succeeded(self) -> int:
        return sum(o == "succeeded" for o in self.outcomes.values())

    @property
    def remaining(self) -> int:
        return len(self.members) - len(self.outcomes)


class BarrierModel(RuleBasedStateMachine):
    conn: psycopg.Connection[Any]

    def __init__(self) -> None:
        super().__init__()
        self.call = lambda c: execute(self.conn, c)
        for name in ("work", "cb"):
            self.conn.execute("SELECT pgqueue.drop_queue(%s)", (name,))
        self.conn.execute("DELETE FROM pgqueue.barrier_member")
        self.conn.execute("DELETE FROM pgqueue.barrier")
        self.call(q.create_queue("work", MAX_ATTEMPTS))
        self.call(q.create_queue("cb", 5))
        self.barriers: list[Barrier] = []
        self.live: dict[int, int] = {}  # member msg_id -> read_ct
        self.member_of: dict[int, Barrier] = {}

    def _fire_if_done(self, bar: Barrier, state: str = "fired") -> None:
        if bar.state == "open" and bar.remaining == 0:
            bar.state = state

    def _count(self, msg_id: int, outcome: str) -> None:
        bar = self.member_of[msg_id]
        if msg_id not in bar.outcomes:
            bar.outcomes[msg_id] = outcome
            self._fire_if_done(bar)

    @rule(n=st.integers(0, 4), deadline=st.booleans())
    def arm(self, n: int, deadline: bool) -> None:
        bid = f"b{len(self.barriers)}"
        got = self.call(
            b.fan_out(
                "work", list(range(n)), "cb", {"bid": bid}, bid, None, 100 if deadline else None
            )
        )
        assert got == bid
        ids = [r.msg_id for r in self.call(b.barrier_results(bid))]
        bar = Barrier(bid, ids, deadline)
        self.barriers.append(bar)
        for i in ids:
            self.live[i] = 0
            self.member_of[i] = bar
        self._fire_if_done(bar)

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
        got = {m.msg_id: m.read_ct for m in self.call(q.read("work", 0, 100))}
        expected = {}
        for msg_id, read_ct in list(self.live.items()):
            if read_ct >= MAX_ATTEMPTS:
                del self.live[msg_id]
                self._count(msg_id, "poisoned")
            else:
                self.live[msg_id] = expected[msg_id] = read_ct + 1
        assert got == expected

    @rule()
    def expire(self) -> None:
        self.conn.execute("UPDATE pgqueue.barrier SET deadline = deadline - interval '200 seconds'")
        expired = self.call(b.expire_barriers())
        due = [x for x in self.barriers if x.state == "open" and x.has_deadline]
        for bar in due:
            for msg_id in bar.members:
                bar.outcomes.setdefault(msg_id, "timed_out")
            self._fire_if_done(bar, "expired")
        assert expired == len(due)

    @invariant()
    def barriers_match(self) -> None:
        for bar in self.barriers:
            s = self.call(b.barrier_status(bar.barrier_id))
            assert (s.state, s.remaining, s.succeeded, s.failed) == (
                bar.state,
                bar.remaining,
                bar.succeeded,
                len(bar.outcomes) - bar.succeeded,
            )

    @invariant()
    def one_callback_per_resolved_barrier(self) -> None:
        rows = self.conn.execute(
            "SELECT headers->>'barrier_id', count(*) FROM pgqueue.message"
            " WHERE queue_id = (SELECT queue_id FROM pgqueue.queue WHERE queue_name = 'cb')"
            " GROUP BY 1"
        ).fetchall()
        resolved = {x.barrier_id for x in self.barriers if x.state != "open"}
        assert dict(rows) == dict.fromkeys(resolved, 1)


def test_barriers_behave_like_their_model(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        BarrierModel.conn = conn
        run_state_machine_as_test(
            BarrierModel,
            settings=stateful_settings(100, 40),
        )
