"""A stateful hypothesis test: the queue against an in-memory model of the contract.

Time: every delay and vt is a multiple of 100 s and "advancing the clock" moves
every vt back by that much, so the model's integer clock and the server's real
clock order messages the same way (the real time an example takes is far below
100 s). Messages whose vt is set by the same statement tie, and the server
breaks ties by msg_id, as does the model.

FIFO groups: a message sent with a group is deliverable only while it is the
lowest live msg_id of its group; everything else in the model is unchanged,
so every rule (expiry, nack, poison drops, requeue) runs over groups too.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
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

from pgqueue._calls import poison as p
from pgqueue._calls import queue as q
from pgqueue._execute import execute

QUEUE = "model"
MAX_ATTEMPTS = 3
SECONDS = st.sampled_from([0, 100, 300])
KEYS = st.sampled_from(["a", "b", None, None])
GROUPS = st.sampled_from(["x", "y", None, None])


@dataclass
class Live:
    msg_id: int
    payload: int
    read_ct: int
    visible_at: int
    set_by: int
    dedupe_key: str | None
    group: str | None = None

    def order(self) -> tuple[int, int, int]:
        return (self.visible_at, self.set_by, self.msg_id)


class QueueModel(RuleBasedStateMachine):
    conn: psycopg.Connection[Any]

    def __init__(self) -> None:
        super().__init__()
        self.call = lambda c: execute(self.conn, c)
        self.conn.execute("SELECT pgqueue.drop_queue(%s)", (QUEUE,))
        self.call(q.create_queue(QUEUE, MAX_ATTEMPTS))
        self.now = 0
        self.ops = itertools.count()
        self.live: dict[int, Live] = {}
        self.poisoned: dict[int, Live] = {}
        self.next_id = 1
        self.known: list[int] = []
        # every lease a read handed out, current or long stale: (msg_id, read_ct)
        self.leases: list[tuple[int, int]] = []

    def _visible(self) -> list[Live]:
        # a grouped message is deliverable only as the head (lowest live id) of its group
        heads = {}
        for m in sorted(self.live.values(), key=lambda m: m.msg_id):
            heads.setdefault(m.group, m.msg_id)
        return sorted(
            (
                m
                for m in self.live.values()
                if m.visible_at <= self.now and (m.group is None or heads[m.group] == m.msg_id)
            ),
            key=Live.order,
        )

    def _new(
        self, payload: int, delay: int, key: str | None, op: int, group: str | None = None
    ) -> Live:
        m = Live(self.next_id, payload, 0, self.now + delay, op, key, group)
        self.next_id += 1
        self.live[m.msg_id] = m
        self.known.append(m.msg_id)
        return m

    @rule(payload=st.integers(0, 1000), delay=SECONDS, key=KEYS, group=GROUPS)
    def send(self, payload: int, delay: int, key: str | None, group: str | None) -> None:
        got = self.call(q.send(QUEUE, payload, None, delay, key, None, group))
        holder = next((m for m in self.live.values() if key and m.dedupe_key == key), None)
        if holder is None:
            holder = self._new(payload, delay, key, next(self.ops), group)
        assert got == holder.msg_id

    @rule(payloads=st.lists(st.tuples(st.integers(0, 1000), GROUPS), max_size=4), delay=SECONDS)
    def send_batch(self, payloads: list[tuple[int, str | None]], delay: int) -> None:
        got = self.call(
            q.send_batch(
                QUEUE, [x for x, _ in payloads], None, delay, None, [g for _, g in payloads]
            )
        )
        op = next(self.ops)
        assert got == [self._new(x, delay, None, op, g).msg_id for x, g in payloads]

    def _take(self, qty: int, vt: int, remove: bool) -> list[tuple[int, int, int]]:
        # One claim statement per round; a round that poisoned something is
        # followed by another for the places the poisoned rows left.
        delivered: list[tuple[int, int, int]] = []
        while True:
            op = next(self.ops)
            dropped = 0
            handed = {d[0] for d in delivered}
            candidates = [m for m in self._visible() if m.msg_id not in handed]
            leased = candidates[: qty - len(delivered)]
            this_round = []
            for m in leased:
                if m.read_ct >= MAX_ATTEMPTS:
                    self.poisoned[m.msg_id] = self.live.pop(m.msg_id)
                    dropped += 1
                    continue
                m.read_ct += 1
                m.visible_at, m.set_by = self.now + vt, op
                if remove:
                    del self.live[m.msg_id]
                this_round.append((m.msg_id, m.read_ct, m.payload))
            delivered += sorted(this_round)
            if dropped == 0 or len(delivered) >= qty:
                return delivered

    @rule(qty=st.integers(0, 5), vt=SECONDS)
    def read(self, qty: int, vt: int) -> None:
        waiting, poisoned = len(self._visible()), len(self.poisoned)
        got = self.call(q.read(QUEUE, vt, qty)).messages
        assert [(m.msg_id, m.read_ct, m.message) for m in got] == self._take(qty, vt, False)
        self.leases += [(m.msg_id, m.read_ct) for m in got]
        dropped = len(self.poisoned) - poisoned
        # (more, when a dropped group head let its group's next message out)
        assert len(got) >= min(qty, waiting - dropped), "a claim came back short with work waiting"
        assert len({m.msg_id for m in got}) == len(got), "one read handed a message out twice"

    @rule(qty=st.integers(1, 3))
    def pop(self, qty: int) -> None:
        got = self.call(q.pop(QUEUE, qty)).messages
        assert [(m.msg_id, m.read_ct, m.message) for m in got] == self._take(qty, 0, True)

    @precondition(lambda self: self.known)
    @rule(data=st.data(), archive=st.booleans())
    def ack(self, data: st.DataObject, archive: bool) -> None:
        msg_id = data.draw(st.sampled_from(self.known))
        call = q.archive if archive else q.delete
        assert self.call(call(QUEUE, msg_id)) is (self.live.pop(msg_id, None) is not None)

    @precondition(lambda self: self.known)
    @rule(data=st.data(), vt=SECONDS)
    def set_vt(self, data: st.DataObject, vt: int) -> None:
        msg_id = data.draw(st.sampled_from(self.known))
        got = self.call(q.set_vt(QUEUE, msg_id, vt))
        m = self.live.get(msg_id)
        assert (got is not None) is (m is not None)
        if m is not None:
            m.visible_at, m.set_by = self.now + vt, next(self.ops)

    def _holds(self, lease: tuple[int, int]) -> Live | None:
        """The live message whose current lease this is; None for a stale or gone one."""
        m = self.live.get(lease[0])
        return m if m is not None and m.read_ct == lease[1] else None

    @precondition(lambda self: self.leases)
    @rule(data=st.data(), vt=SECONDS)
    def fenced_set_vt(self, data: st.DataObject, vt: int) -> None:
        msg_id, read_ct = lease = data.draw(st.sampled_from(self.leases))
        m = self._holds(lease)
        got = self.call(q.set_vt(QUEUE, msg_id, vt, None, read_ct))
        assert (got is not None) is (m is not None), "only the current lease moves"
        if m is not None:
            m.visible_at, m.set_by = self.now + vt, next(self.ops)

    @precondition(lambda self: self.leases)
    @rule(data=st.data(), delay=SECONDS)
    def nack(self, data: st.DataObject, delay: int) -> None:
        msg_id, read_ct = lease = data.draw(st.sampled_from(self.leases))
        m = self._holds(lease)
        got = self.call(q.nack(QUEUE, msg_id, read_ct, delay, "model error"))
        if m is None:
            assert got is None, "a stale nack changes nothing"
        elif read_ct >= MAX_ATTEMPTS:
            assert got == "poisoned"
            self.poisoned[msg_id] = self.live.pop(msg_id)
        else:
            assert got == "retry"
            m.visible_at, m.set_by = self.now + delay, next(self.ops)

    @precondition(lambda self: self.leases)
    @rule(data=st.data())
    def fenced_poison(self, data: st.DataObject) -> None:
        msg_id, read_ct = lease = data.draw(st.sampled_from(self.leases))
        m = self._holds(lease)
        assert self.call(p.poison(QUEUE, msg_id, "holder says so", read_ct)) is (m is not None)
        if m is not None:
            self.poisoned[msg_id] = self.live.pop(msg_id)

    @precondition(lambda self: self.known)
    @rule(data=st.data())
    def poison(self, data: st.DataObject) -> None:
        msg_id = data.draw(st.sampled_from(self.known))
        moved = self.call(p.poison(QUEUE, msg_id, "model says so"))
        assert moved is (msg_id in self.live)
        if moved:
            self.poisoned[msg_id] = self.live.pop(msg_id)

    @precondition(lambda self: self.poisoned)
    @rule(data=st.data())
    def requeue(self, data: st.DataObject) -> None:
        msg_id = data.draw(st.sampled_from(sorted(self.poisoned)))
        # back under a new id: no lease of its earlier life names it
        assert self.call(p.poison_requeue(QUEUE, [msg_id])) == [self.next_id]
        m = self.poisoned.pop(msg_id)
        if m.dedupe_key and any(x.dedupe_key == m.dedupe_key for x in self.live.values()):
            m.dedupe_key = None
        m.msg_id, m.read_ct, m.visible_at, m.set_by = self.next_id, 0, self.now, next(self.ops)
        self.next_id += 1
        self.live[m.msg_id] = m
        self.known.append(m.msg_id)

    @rule(seconds=st.sampled_from([100, 200, 300]))
    def advance(self, seconds: int) -> None:
        self.conn.execute(
            "UPDATE pgqueue.message SET vt = vt - make_interval(secs => %s)", (seconds,)
        )
        self.now += seconds

    @invariant()
    def counts_match(self) -> None:
        m = self.call(q.metrics(QUEUE))
        assert m.queue_length == len(self.live)
        # visible: not hidden by a vt (a group's waiting messages count too)
        assert m.visible_length == sum(1 for x in self.live.values() if x.visible_at <= self.now)
        assert m.poison_length == len(self.poisoned)
        assert m.total_messages == self.next_id - 1


def test_queue_behaves_like_its_model(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        QueueModel.conn = conn
        run_state_machine_as_test(
            QueueModel,
            settings=stateful_settings(150, 50),
        )
