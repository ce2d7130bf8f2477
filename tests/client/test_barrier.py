"""Barriers: fan-out, exactly one callback with the transport marker, every way a member ends."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from support.db import expire_all

from pgqueue import (
    TRANSPORT_MARKER,
    BarrierConflict,
    BarrierNotFound,
    Client,
    InvalidArgument,
    Message,
    QueueInUse,
    QueueNotFound,
)
from pgqueue.types import CALLBACK, MEMBER, Callback


@pytest.fixture
def queues(client: Client) -> tuple[str, str]:
    client.create_queue("work", max_attempts=2)
    client.create_queue("callbacks")
    return "work", "callbacks"


def callbacks(client: Client, sql: Any) -> list[Message]:
    expire_all(sql)
    return client.read("callbacks", vt=60, qty=100)


def fan(client: Client, n: int, **kw: Any) -> tuple[str, list[Message]]:
    bid = client.fan_out(
        "work",
        [{"part": i} for i in range(n)],
        callback_queue="callbacks",
        callback_message={"next": "merge"},
        **kw,
    )
    members = client.read("work", vt=60, qty=n + 5)
    return bid, members


def test_fan_out_sends_members_carrying_barrier_id_and_index(client: Client, queues: Any) -> None:
    bid, members = fan(client, 3, headers={"trace": "t-1"})
    assert [(m.message, m.barrier_id, m.member_index) for m in members] == [
        ({"part": i}, bid, i) for i in range(3)
    ]
    assert all(m.headers and m.headers["trace"] == "t-1" for m in members)
    s = client.barrier_status(bid)
    assert (s.state, s.total, s.remaining, s.succeeded, s.failed) == ("open", 3, 3, 0, 0)
    assert (s.queue_name, s.callback_queue, s.callback_msg_id) == ("work", "callbacks", None)


def test_last_completion_fires_exactly_one_callback_with_marker(
    client: Client, queues: Any, sql: Any
) -> None:
    bid, members = fan(client, 3, headers={"trace": "t-1"})
    for m in members[:2]:
        s = client.complete_member("work", m.msg_id, result={"sum": m.message["part"]})
        assert s is not None and s.state == "open"
    assert callbacks(client, sql) == []
    last = client.complete_member("work", members[2].msg_id, outcome="failed", result="boom")
    assert last is not None and (last.state, last.remaining) == ("fired", 0)
    [cb] = callbacks(client, sql)
    assert cb.message == {"next": "merge"}
    assert cb.is_callback and cb.barrier_id == bid and cb.member_index is None
    assert cb.headers == {
        TRANSPORT_MARKER: True,
        CALLBACK: {
            "kind": "barrier",
            "barrier_id": bid,
            "total": 3,
            "succeeded": 2,
            "failed": 1,
            "cancelled": 0,
            "outcomes": {"succeeded": 2, "failed": 1},
            "state": "failed",  # wait_all: it waited for all, and one failed
        },
        "trace": "t-1",  # the fan-out's own headers travel as they are
    }
    assert cb.callback == Callback(
        kind="barrier",
        state="failed",
        barrier_id=bid,
        total=3,
        succeeded=2,
        failed=1,
        cancelled=0,
        outcomes={"succeeded": 2, "failed": 1},
    )
    assert last.outcome == "failed" and last.policy == "wait_all"
    assert last.callback_msg_id == cb.msg_id
    results = client.barrier_results(bid)
    assert [(r.member_index, r.outcome, r.result) for r in results] == [
        (0, "succeeded", {"sum": 0}),
        (1, "succeeded", {"sum": 1}),
        (2, "failed", "boom"),
    ]


def test_second_completion_of_same_member_is_noop(client: Client, queues: Any, sql: Any) -> None:
    bid, members = fan(client, 2)
    first = client.complete_member("work", members[0].msg_id, result=1)
    again = client.complete_member("work", members[0].msg_id, outcome="failed", result=2)
    assert first == again
    client.complete_members("work", [members[1].msg_id] * 3)
    client.complete_member("work", members[1].msg_id)
    assert len(callbacks(client, sql)) == 1
    assert [r.result for r in client.barrier_results(bid)] == [1, None]
    s = client.barrier_status(bid)
    assert (s.succeeded, s.failed) == (2, 0)


def test_complete_members_in_batch_counts_each_once(client: Client, queues: Any, sql: Any) -> None:
    bid, members = fan(client, 4)
    ids = [m.msg_id for m in members]
    statuses = client.complete_members(
        "work",
        ids + ids[:2],
        outcomes=["succeeded", "failed", "succeeded", "failed", "failed", "failed"],
    )
    assert [(x.barrier_id, x.state, x.succeeded, x.failed) for x in statuses] == [
        (bid, "fired", 2, 2)
    ]
    assert len(callbacks(client, sql)) == 1
    assert client.metrics("work").queue_length == 0


def test_poison_dropped_member_counts_as_failed_and_barrier_fires(
    client: Client, queues: Any, sql: Any
) -> None:
    bid, members = fan(client, 2)
    client.complete_member("work", members[0].msg_id)
    # member 1 keeps crashing: read twice (max_attempts=2), the third read drops it
    expire_all(sql)
    client.read("work", vt=60, qty=5)
    expire_all(sql)
    assert client.read("work", vt=60, qty=5) == []
    [cb] = callbacks(client, sql)
    assert cb.callback is not None and (cb.callback.succeeded, cb.callback.failed) == (1, 1)
    r = client.barrier_results(bid)[1]
    assert r.outcome == "poisoned" and "max_attempts exceeded" in r.result["reason"]


def test_member_poisoned_on_purpose_counts_as_failed(client: Client, queues: Any, sql: Any) -> None:
    bid, [m] = fan(client, 1)
    assert client.poison("work", m.msg_id, "schema mismatch")
    assert client.barrier_status(bid).state == "fired"
    assert client.barrier_results(bid)[0].result == {"reason": "schema mismatch"}
    # a requeued poisoned member is a late completion: acked, not counted again
    client.poison_requeue("work", [m.msg_id])
    [again] = client.read("work", vt=60, qty=1)
    client.complete_member("work", again.msg_id)
    assert len(callbacks(client, sql)) == 1
    assert client.barrier_status(bid).failed == 1


@pytest.mark.parametrize(
    ("ack", "outcome"),
    [
        (lambda c, i: c.delete("work", i), "succeeded"),
        (lambda c, i: c.archive("work", i), "succeeded"),
        (lambda c, i: c.purge_queue("work"), "purged"),
    ],
)
def test_every_way_a_member_leaves_counts(
    client: Client, queues: Any, sql: Any, ack: Any, outcome: str
) -> None:
    bid, [m] = fan(client, 1)
    ack(client, m.msg_id)
    assert client.barrier_results(bid)[0].outcome == outcome
    assert len(callbacks(client, sql)) == 1


def test_popped_member_counts_as_succeeded(client: Client, queues: Any, sql: Any) -> None:
    bid = client.fan_out("work", [1], callback_queue="callbacks", callback_message={})
    assert len(client.pop("work")) == 1
    assert client.barrier_status(bid).state == "fired"


def test_empty_fan_out_fires_at_once(client: Client, queues: Any, sql: Any) -> None:
    bid = client.fan_out("work", [], callback_queue="callbacks", callback_message={"n": 0})
    s = client.barrier_status(bid)
    assert (s.state, s.total, s.remaining) == ("fired", 0, 0)
    [cb] = callbacks(client, sql)
    assert cb.callback is not None and cb.callback.total == 0


def test_reused_barrier_id_returns_existing_or_conflicts(
    client: Client, queues: Any, sql: Any
) -> None:
    kw: dict[str, Any] = {"callback_queue": "callbacks", "callback_message": {}, "barrier_id": "b"}
    a = client.fan_out("work", [1, 2], **kw)
    b = client.fan_out("work", [1, 2], **kw)
    assert a == b == "b"
    assert client.metrics("work").queue_length == 2
    with pytest.raises(BarrierConflict, match='barrier "b" already exists'):
        client.fan_out("work", [1], **kw)


@pytest.mark.parametrize(
    "change",
    [
        {"messages": [1, 3]},  # same size, other members
        {"callback_message": {"other": True}},
        {"headers": {"trace": "t-2"}},
        {"deadline_seconds": 60},
        {"callback_queue": "work"},
    ],
)
def test_a_barrier_id_reused_for_another_fan_out_of_the_same_size_is_a_conflict(
    client: Client, queues: Any, change: dict[str, Any]
) -> None:
    request: dict[str, Any] = {
        "messages": [1, 2],
        "callback_queue": "callbacks",
        "callback_message": {"album": 7},
        "barrier_id": "b",
        "headers": {"trace": "t-1"},
        "deadline_seconds": 3600,
    }
    assert client.fan_out("work", **request) == "b"
    assert client.fan_out("work", **request) == "b"  # the same request: a retry
    with pytest.raises(BarrierConflict, match='barrier "b" already exists for another fan-out'):
        client.fan_out("work", **{**request, **change})
    assert client.metrics("work").queue_length == 2  # nothing more was enqueued


def test_a_handler_passes_on_its_members_own_headers_and_never_pgqueues(
    client: Client, queues: Any, sql: Any
) -> None:
    client.fan_out(
        "work", ["parent"], callback_queue="callbacks", callback_message={}, headers={"t": 1}
    )
    [member] = client.read("work", vt=30, qty=1)
    assert member.headers is not None and member.member_index == 0
    # pgqueue's keys on it cannot be sent: nothing of the call is
    with pytest.raises(InvalidArgument, match="_pg_member"):
        client.fan_out(
            "work", [], callback_queue="callbacks", callback_message={}, headers=member.headers
        )
    assert callbacks(client, sql) == []
    # its producer's headers can: the nested fan-out's callback is its own
    assert member.caller_headers == {"t": 1}
    nested = client.fan_out(
        "work", [], callback_queue="callbacks", callback_message={}, headers=member.caller_headers
    )
    [cb] = callbacks(client, sql)
    assert cb.is_callback and cb.barrier_id == nested
    assert cb.member_index is None and MEMBER not in (cb.headers or {})
    assert cb.caller_headers == {"t": 1}


def test_fan_out_in_callers_transaction_rolls_back_whole(
    client: Client, queues: Any, dsn: str
) -> None:
    with psycopg.connect(dsn) as conn:
        bid = client.fan_out(
            "work", [1, 2], callback_queue="callbacks", callback_message={}, conn=conn
        )
        conn.rollback()
    with pytest.raises(BarrierNotFound):
        client.barrier_status(bid)
    assert client.metrics("work").queue_length == 0


def test_fan_out_to_unknown_queue_leaves_nothing(client: Client, queues: Any) -> None:
    with pytest.raises(QueueNotFound):
        client.fan_out("work", [1], callback_queue="nope", callback_message={})
    assert client.list_barriers() == [] and client.metrics("work").queue_length == 0


def test_bad_outcome_is_rejected_and_nothing_is_acked(client: Client, queues: Any) -> None:
    bid, [m] = fan(client, 1)
    with pytest.raises(InvalidArgument, match="outcome must be"):
        client.complete_member("work", m.msg_id, outcome="maybe")
    assert client.barrier_status(bid).remaining == 1
    assert client.metrics("work").queue_length == 1


def test_completing_a_plain_message_acks_it(client: Client, queues: Any) -> None:
    msg_id = client.send("work", "not a member")
    assert client.complete_member("work", msg_id) is None
    assert client.metrics("work").queue_length == 0


def test_unknown_barrier_raises(client: Client, queues: Any) -> None:
    with pytest.raises(BarrierNotFound, match='barrier "zz" does not exist'):
        client.barrier_status("zz")
    with pytest.raises(BarrierNotFound):
        client.barrier_results("zz")


def test_overdue_barrier_expires_with_members_timed_out(
    client: Client, queues: Any, sql: Any
) -> None:
    bid, members = fan(client, 3, deadline_seconds=60)
    client.complete_member("work", members[0].msg_id)
    assert client.expire_barriers() == 0
    sql.execute("UPDATE pgqueue.barrier SET deadline = deadline - interval '2 minutes'")
    assert client.expire_barriers() == 1
    assert client.expire_barriers() == 0
    s = client.barrier_status(bid)
    assert (s.state, s.succeeded, s.failed, s.remaining) == ("expired", 1, 2, 0)
    [cb] = callbacks(client, sql)
    assert cb.callback is not None and cb.callback.state == "timed_out"
    assert cb.callback.outcomes == {"succeeded": 1, "timed_out": 2}
    # a late completion acks its message and changes nothing
    client.complete_member("work", members[1].msg_id)
    assert [r.outcome for r in client.barrier_results(bid)] == [
        "succeeded",
        "timed_out",
        "timed_out",
    ]
    assert client.barrier_status(bid).succeeded == 1


def test_queue_receiving_open_callbacks_cannot_be_dropped(client: Client, queues: Any) -> None:
    bid, [m] = fan(client, 1)
    with pytest.raises(QueueInUse, match="receives the callbacks of 1 open barrier"):
        client.drop_queue("callbacks")
    client.complete_member("work", m.msg_id)
    assert client.drop_queue("callbacks") is True
    assert client.barrier_status(bid).callback_queue is None


def test_nested_fan_out_from_a_callback(client: Client, queues: Any, sql: Any) -> None:
    client.create_queue("final")
    root = client.fan_out("work", [1], callback_queue="callbacks", callback_message={"stage": 1})
    [m] = client.read("work", vt=60, qty=1)
    client.complete_member("work", m.msg_id)
    [cb] = client.read("callbacks", vt=60, qty=1)
    # the callback handler starts a sub-workflow and acks the callback in one transaction
    with client.connection() as conn, conn.transaction():
        sub = client.fan_out(
            "work", [2, 3], callback_queue="final", callback_message={"parent": root}, conn=conn
        )
        client.delete("callbacks", cb.msg_id, conn=conn)
    members = client.read("work", vt=60, qty=5)
    assert {m.barrier_id for m in members} == {sub}
    client.complete_members("work", [m.msg_id for m in members])
    [done] = client.read("final", vt=60, qty=5)
    assert done.message == {"parent": root} and done.barrier_id == sub


def test_list_barriers_by_state(client: Client, queues: Any) -> None:
    open_id, _ = fan(client, 1)
    fired = client.fan_out("work", [], callback_queue="callbacks", callback_message={})
    assert {b.barrier_id for b in client.list_barriers()} == {open_id, fired}
    assert [b.barrier_id for b in client.list_barriers(state="open")] == [open_id]
    assert [b.barrier_id for b in client.list_barriers(state="fired")] == [fired]
    with pytest.raises(InvalidArgument, match="state must be open, fired or expired"):
        client.list_barriers(state="done")


def test_bad_barrier_arguments_are_rejected_whole(client: Client, queues: Any, sql: Any) -> None:
    with pytest.raises(psycopg.Error, match="headers must be a JSON object"):
        sql.execute(
            "SELECT pgqueue.fan_out('work', ARRAY['1']::jsonb[], 'callbacks', '{}', NULL, '[1]')"
        )
    with pytest.raises(psycopg.Error, match="msg_ids must not be NULL"):
        sql.execute("SELECT * FROM pgqueue.complete_members('work', NULL)")
    assert client.list_barriers() == []
