"""Failure policies (fail_fast, max_failures) and open barriers that grow until sealed.

Every promise is checked on the real server; the races run on real
concurrent connections, many times over.
"""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from support.db import run_threads

from pgqueue import BarrierConflict, BarrierNotFound, Client, InvalidArgument, Message
from pgqueue._calls import barrier as _barrier


@pytest.fixture
def queues(client: Client) -> None:
    client.create_queue("work", max_attempts=2)
    client.create_queue("callbacks")


def callbacks(sql: Any) -> list[tuple[Any, ...]]:
    """Every callback message, visible or not: (msg_id, what its firing wrote)."""
    return sql.execute(
        "SELECT m.msg_id, m.headers -> '_pg_callback' FROM pgqueue.message m"
        " JOIN pgqueue.queue q USING (queue_id)"
        " WHERE q.queue_name = 'callbacks' ORDER BY m.msg_id"
    ).fetchall()


def live_members(sql: Any, bid: str) -> list[int]:
    return [
        r[0]
        for r in sql.execute(
            "SELECT msg_id FROM pgqueue.message WHERE member_of = %s ORDER BY msg_id", (bid,)
        )
    ]


def outcomes(client: Client, bid: str) -> list[str | None]:
    return [r.outcome for r in client.barrier_results(bid)]


def test_fail_fast_fires_at_the_first_failure_and_cancels_what_has_not_started(
    client: Client, queues: None, sql: Any
) -> None:
    bid = client.fan_out(
        "work", list(range(5)), callback_queue="callbacks", callback_message={}, policy="fail_fast"
    )
    running, failing = client.read("work", vt=60, qty=2)  # two started; three never read
    status = client.complete_member("work", failing.msg_id, outcome="failed", result="boom")
    assert status is not None
    assert (status.state, status.outcome, status.failed, status.cancelled) == (
        "fired",
        "failed",
        1,
        3,
    )
    assert status.remaining == 1  # the running one: it finishes
    assert live_members(sql, bid) == [running.msg_id]
    assert outcomes(client, bid) == [None, "failed", "cancelled", "cancelled", "cancelled"]
    [(_, headers)] = callbacks(sql)
    assert headers["state"] == "failed"
    assert (headers["failed"], headers["cancelled"], headers["succeeded"]) == (1, 3, 0)
    assert headers["outcomes"] == {"failed": 1, "cancelled": 3, "pending": 1}
    # the running member's late completion is recorded, and changes no counts
    late = client.complete_member("work", running.msg_id, result="late")
    assert late is not None and (late.succeeded, late.failed, late.remaining) == (0, 1, 1)
    assert outcomes(client, bid)[0] == "succeeded"
    assert len(callbacks(sql)) == 1
    assert client.metrics("work").queue_length == 0


def test_a_member_waiting_out_a_retry_backoff_is_not_cancelled_but_a_visible_one_is(
    client: Client, queues: None, sql: Any
) -> None:
    bid = client.fan_out(
        "work", [1, 2, 3], callback_queue="callbacks", callback_message={}, policy="fail_fast"
    )
    backoff, visible, failing = client.read("work", vt=60, qty=3)
    assert client.nack("work", backoff.msg_id, read_ct=1, delay=60, error="x") == "retry"
    client.set_vt("work", visible.msg_id, 0)  # its lease given back: not running
    client.complete_member("work", failing.msg_id, outcome="failed")
    assert outcomes(client, bid) == [None, "cancelled", "failed"]
    assert live_members(sql, bid) == [backoff.msg_id]


def test_a_poisoned_member_counts_as_a_failure_for_the_policy(
    client: Client, queues: None, sql: Any
) -> None:
    bid = client.fan_out(
        "work", [1, 2], callback_queue="callbacks", callback_message={}, policy="fail_fast"
    )
    [first] = client.read("work", vt=60, qty=1)
    assert client.poison("work", first.msg_id, "bad input")
    s = client.barrier_status(bid)
    assert (s.outcome, s.failed, s.cancelled, s.remaining) == ("failed", 1, 1, 0)
    assert outcomes(client, bid) == ["poisoned", "cancelled"]


@pytest.mark.parametrize(
    ("limits", "failures", "expected"),
    [
        ({"max_failures": 2}, 2, ("succeeded", 0)),
        ({"max_failures": 2}, 3, ("failed", 2)),
        ({"max_failure_ratio": 0.3}, 3, ("succeeded", 0)),  # 0.3 of 10: 3 tolerated
        ({"max_failure_ratio": 0.3}, 4, ("failed", 1)),
        ({"max_failures": 1, "max_failure_ratio": 0.5}, 2, ("failed", 3)),  # the lower wins
    ],
)
def test_max_failures_tolerates_that_many_then_fires_as_failed(
    client: Client,
    queues: None,
    sql: Any,
    limits: dict[str, Any],
    failures: int,
    expected: tuple[str, int],
) -> None:
    bid = client.fan_out(
        "work", list(range(10)), callback_queue="callbacks", callback_message={}, **limits
    )
    members = client.read("work", vt=60, qty=10)
    ran = members[: 10 - expected[1]]  # the ones that end before the barrier fires
    for i, m in enumerate(ran):
        client.complete_member("work", m.msg_id, outcome="failed" if i < failures else "succeeded")
    s = client.barrier_status(bid)
    assert s.policy == "max_failures"
    assert (s.state, s.outcome, s.cancelled) == ("fired", expected[0], 0)
    [(_, headers)] = callbacks(sql)
    assert headers["state"] == expected[0]


def test_a_failure_under_max_failures_that_is_breached_cancels_the_rest(
    client: Client, queues: None, sql: Any
) -> None:
    bid = client.fan_out(
        "work", list(range(6)), callback_queue="callbacks", callback_message={}, max_failures=1
    )
    a, b = client.read("work", vt=60, qty=2)
    client.complete_member("work", a.msg_id, outcome="failed")
    assert client.barrier_status(bid).state == "open"  # one tolerated
    client.complete_member("work", b.msg_id, outcome="failed")
    s = client.barrier_status(bid)
    assert (s.outcome, s.failed, s.cancelled, s.remaining) == ("failed", 2, 4, 0)


def test_bad_policies_are_refused_and_nothing_is_sent(
    client: Client, queues: None, sql: Any, dsn: str
) -> None:
    fan = {"callback_queue": "callbacks", "callback_message": {}}
    with pytest.raises(InvalidArgument, match="policy must be one of"):
        client.fan_out("work", [1], policy="some", **fan)
    with pytest.raises(InvalidArgument, match="go with the policy max_failures"):
        client.fan_out("work", [1], policy="fail_fast", max_failures=2, **fan)
    with pytest.raises(InvalidArgument, match="max_failures must be >= 0"):
        client.fan_out("work", [1], max_failures=-1, **fan)
    with pytest.raises(InvalidArgument, match="max_failure_ratio"):
        client.fan_out("work", [1], max_failure_ratio=1.0, **fan)
    with (
        psycopg.connect(dsn, autocommit=True) as raw,
        pytest.raises(psycopg.errors.InvalidParameterValue, match="needs one"),
    ):
        raw.execute(
            "SELECT pgqueue.fan_out('work', ARRAY['1'::jsonb], 'callbacks', '{}',"
            " policy => 'max_failures')"
        )
    assert client.metrics("work").queue_length == 0
    assert client.list_barriers() == []


def test_the_same_fan_out_with_another_policy_is_a_conflict_not_a_retry(
    client: Client, queues: None
) -> None:
    fan = {"callback_queue": "callbacks", "callback_message": {}, "barrier_id": "b"}
    client.fan_out("work", [1], **fan)
    assert client.fan_out("work", [1], **fan) == "b"  # a retry
    with pytest.raises(BarrierConflict):
        client.fan_out("work", [1], policy="fail_fast", **fan)


def test_failures_racing_on_many_connections_fire_fail_fast_once(
    client: Client, queues: None, sql: Any, dsn: str
) -> None:
    """Every member fails at the same instant on its own connection, 20 times over."""
    n = 8
    clients = [Client.from_dsn(dsn, max_size=1) for _ in range(n)]
    try:
        for round_ in range(20):
            bid = client.fan_out(
                "work",
                list(range(n)),
                callback_queue="callbacks",
                callback_message={"round": round_},
                policy="fail_fast",
            )
            members = client.read("work", vt=60, qty=n)

            def fail(i: int, members: list[Message] = members) -> None:
                clients[i].complete_member("work", members[i].msg_id, outcome="failed")

            run_threads(n, fail)
            s = client.barrier_status(bid)
            assert s.state == "fired" and s.outcome == "failed"
            assert s.failed + s.cancelled + s.remaining == n
            assert outcomes(client, bid).count("failed") == n  # every failure recorded
            assert s.cancelled == 0  # all were running: nothing to cancel
        assert len(callbacks(sql)) == 20
    finally:
        for c in clients:
            c.close()


# -- open barriers ---------------------------------------------------------------


def test_an_open_barrier_fires_only_once_sealed_counting_every_member_added(
    client: Client, queues: None, sql: Any
) -> None:
    bid = client.open_barrier(
        "work", callback_queue="callbacks", callback_message={"crawl": 1}, messages=["root"]
    )
    [root] = client.read("work", vt=60, qty=5)
    found = client.add_members(bid, ["a", "b"])  # the root page found two more
    client.complete_member("work", root.msg_id)
    for m in client.read("work", vt=60, qty=5):
        client.complete_member("work", m.msg_id)
    s = client.barrier_status(bid)
    assert (s.state, s.sealed, s.total, s.remaining) == ("open", False, 3, 0)
    assert callbacks(sql) == []  # every member done, but not sealed: no callback
    sealed = client.seal(bid)
    assert (sealed.state, sealed.outcome, sealed.total, sealed.succeeded) == (
        "fired",
        "succeeded",
        3,
        3,
    )
    assert client.seal(bid).callback_msg_id == sealed.callback_msg_id  # sealing again: nothing
    assert len(callbacks(sql)) == 1
    assert [r.msg_id for r in client.barrier_results(bid)] == [root.msg_id, *found]
    with pytest.raises(BarrierConflict, match="fired"):
        client.add_members(bid, ["late"])


def test_adding_to_a_sealed_barrier_is_a_conflict_and_adds_nothing(
    client: Client, queues: None
) -> None:
    bid = client.open_barrier("work", callback_queue="callbacks", callback_message={})
    client.add_members(bid, [1])
    client.seal(bid)
    with pytest.raises(BarrierConflict, match="sealed"):
        client.add_members(bid, [2])
    assert client.barrier_status(bid).total == 1
    assert client.metrics("work").queue_length == 1
    with pytest.raises(BarrierNotFound):
        client.add_members("nope", [1])
    with pytest.raises(BarrierNotFound):
        client.seal("nope")


def test_members_added_in_a_rolled_back_transaction_are_not_added(
    client: Client, queues: None
) -> None:
    bid = client.open_barrier("work", callback_queue="callbacks", callback_message={})
    with client.connection() as conn, pytest.raises(RuntimeError), conn.transaction():
        client.add_members(bid, [1, 2], conn=conn)
        raise RuntimeError("the handler failed")
    assert client.barrier_status(bid).total == 0
    assert client.metrics("work").queue_length == 0


def test_a_retried_add_returns_its_members_and_adds_nothing(client: Client, queues: None) -> None:
    bid = client.open_barrier("work", callback_queue="callbacks", callback_message={})
    call = _barrier.add_members(bid, ["x", "y"])
    first = client.run(call)
    assert client.run(call) == first  # the same call again (a retry after a lost reply)
    assert client.barrier_status(bid).total == 2


def test_an_unsealed_barrier_past_its_deadline_fires_as_timed_out(
    client: Client, queues: None, sql: Any
) -> None:
    bid = client.open_barrier(
        "work", callback_queue="callbacks", callback_message={}, messages=[1], deadline_seconds=0
    )
    assert client.expire_barriers() == 1
    s = client.barrier_status(bid)
    assert (s.state, s.outcome, s.sealed) == ("expired", "timed_out", False)
    [(_, headers)] = callbacks(sql)
    assert headers["state"] == "timed_out"
    with pytest.raises(BarrierConflict):
        client.add_members(bid, [2])


def test_the_last_completion_an_add_and_a_seal_racing_fire_once_counting_what_came_before(
    client: Client, queues: None, sql: Any, dsn: str
) -> None:
    """Three sessions at the same instant, 30 times: complete the last member, add, seal."""
    clients = [Client.from_dsn(dsn, max_size=1) for _ in range(3)]
    try:
        for round_ in range(30):
            bid = client.open_barrier(
                "work", callback_queue="callbacks", callback_message={}, messages=[round_]
            )
            [member] = client.read("work", vt=60, qty=1)
            added: list[int] = []
            refused: list[BaseException] = []
            lock = threading.Lock()

            def act(
                i: int,
                bid: str = bid,
                member: Message = member,
                added: list[int] = added,
                refused: list[BaseException] = refused,
                lock: threading.Lock = lock,
            ) -> None:
                if i == 0:
                    clients[0].complete_member("work", member.msg_id)
                elif i == 1:
                    try:
                        ids = clients[1].add_members(bid, ["more"])
                    except BarrierConflict as exc:
                        with lock:
                            refused.append(exc)
                    else:
                        with lock:
                            added.extend(ids)
                else:
                    clients[2].seal(bid)

            run_threads(3, act)
            s = client.barrier_status(bid)
            assert s.total == 1 + len(added)
            assert len(added) + len(refused) == 1
            if added:  # added before the seal: the barrier waits for it
                assert (s.state, s.remaining) == ("open", 1)
                [extra] = client.read("work", vt=60, qty=1)
                client.complete_member("work", extra.msg_id)
                s = client.barrier_status(bid)
            assert (s.state, s.succeeded) == ("fired", s.total)
            fired = [h for _, h in callbacks(sql) if h["barrier_id"] == bid]
            assert len(fired) == 1 and fired[0]["total"] == s.total
    finally:
        for c in clients:
            c.close()


def test_an_open_barrier_broken_before_its_seal_fires_and_cancels_at_the_seal(
    client: Client, queues: None, sql: Any
) -> None:
    bid = client.open_barrier(
        "work", callback_queue="callbacks", callback_message={}, messages=[1, 2], policy="fail_fast"
    )
    [first] = client.read("work", vt=60, qty=1)
    client.complete_member("work", first.msg_id, outcome="failed")
    assert client.barrier_status(bid).state == "open"  # not sealed: never fires
    client.add_members(bid, [3])
    assert callbacks(sql) == []
    s = client.seal(bid)
    assert (s.state, s.outcome, s.failed, s.cancelled, s.total) == ("fired", "failed", 1, 2, 3)
    assert live_members(sql, bid) == []
    [(_, headers)] = callbacks(sql)
    assert headers["state"] == "failed" and headers["total"] == 3
