"""A failover to a server whose clock differs: leases, delays and deadlines.

Every lease, delay and deadline is a timestamp written by the server's clock
and compared with `clock_timestamp()` by the same server. A failover to a node
whose clock is d seconds ahead makes every test `stored <= clock_timestamp()`
come out exactly as if every stored timestamp had moved d seconds back. These
tests make that move with an UPDATE (d ahead: back; d behind: forward) and
check what the design promises (docs/deploy.md, "HA and failover"):

- d ahead, past a lease's remaining time: another reader takes the message
  over (one duplicate execution at most); the old holder's fenced calls fail
  and its unfenced ack still lands once; nothing is lost.
- d ahead, within the remaining time: the next heartbeat gives the lease its
  full length again on the new clock.
- a barrier's deadline moved into the past fires it once as expired; the
  late completions do not fire it again.
- d behind: leases and delays end |d| late, never early.

The read lanes' floors under a clock that stepped back are tested in
test_read_lanes.py (`test_a_clock_that_went_back_...`).
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from pgqueue import Client

QUEUE = "shifted"
CALLBACKS = "shifted_cb"


def shift(sql: psycopg.Connection[Any], seconds: float, *, barriers: bool = False) -> None:
    """Act out a failover onto a clock `seconds` ahead (negative: behind) of the old one."""
    sql.execute(
        "UPDATE pgqueue.message SET vt = vt - make_interval(secs => %s)"
        " WHERE queue_id = (SELECT queue_id FROM pgqueue.queue WHERE queue_name = %s)",
        (seconds, QUEUE),
    )
    if barriers:
        sql.execute(
            "UPDATE pgqueue.barrier SET deadline = deadline - make_interval(secs => %s)"
            " WHERE deadline IS NOT NULL",
            (seconds,),
        )


def seconds_left(sql: psycopg.Connection[Any], msg_id: int) -> float:
    """How long the message stays hidden, by the server's clock."""
    row = sql.execute(
        "SELECT extract(epoch FROM vt - clock_timestamp())::float8 FROM pgqueue.message"
        " WHERE msg_id = %s",
        (msg_id,),
    ).fetchone()
    assert row is not None, f"message {msg_id} is gone"
    return float(row[0])


def extend(sql: psycopg.Connection[Any], msg_id: int, read_ct: int, vt: int) -> list[Any]:
    """The worker's heartbeat: extend_leases for one message."""
    return sql.execute(
        "SELECT msg_id, extended FROM pgqueue.extend_leases(%s, %s::bigint[], %s::int[], %s)",
        (QUEUE, [msg_id], [read_ct], vt),
    ).fetchall()


@pytest.fixture
def shifted(client: Client) -> Client:
    """A client with the two queues created."""
    client.create_queue(QUEUE, max_attempts=5)
    client.create_queue(CALLBACKS)
    return client


@pytest.mark.parametrize("ahead", [31, 600])
def test_a_clock_ahead_past_the_lease_means_one_takeover_fenced_and_nothing_lost(
    shifted: Client, sql: psycopg.Connection[Any], ahead: int
) -> None:
    msg_id = shifted.send(QUEUE, {"n": 1})
    (first,) = shifted.read(QUEUE, vt=30)
    shift(sql, ahead)
    (second,) = shifted.read(QUEUE, vt=30)
    assert second.msg_id == msg_id and second.read_ct == first.read_ct + 1
    # the old holder's heartbeat, nack and extension all fail by read_ct
    assert extend(sql, msg_id, first.read_ct, 30) == []
    assert shifted.nack(QUEUE, msg_id, read_ct=first.read_ct, delay=0) is None
    assert shifted.set_vt(QUEUE, msg_id, 30, read_ct=first.read_ct) is None
    # the new holder keeps a whole lease on the new clock
    assert 25 < seconds_left(sql, msg_id) <= 30
    assert shifted.read(QUEUE, vt=30) == []
    # either holder's ack settles it, once
    assert shifted.delete(QUEUE, msg_id) is True
    assert shifted.delete(QUEUE, msg_id) is False


def test_a_clock_ahead_within_the_lease_is_healed_by_the_next_heartbeat(
    shifted: Client, sql: psycopg.Connection[Any]
) -> None:
    msg_id = shifted.send(QUEUE, {"n": 1})
    (held,) = shifted.read(QUEUE, vt=30)
    shift(sql, 20)
    assert seconds_left(sql, msg_id) < 11, "the shift took 20 s off the lease"
    assert shifted.read(QUEUE, vt=30) == [], "the lease still holds"
    assert extend(sql, msg_id, held.read_ct, 30) == [(msg_id, True)]
    assert 25 < seconds_left(sql, msg_id) <= 30, "the heartbeat gave the whole lease back"
    shift(sql, 20)
    assert shifted.read(QUEUE, vt=30) == [], "no takeover after the heartbeat"


def test_a_clock_behind_makes_leases_and_delays_end_late_never_early(
    shifted: Client, sql: psycopg.Connection[Any]
) -> None:
    leased = shifted.send(QUEUE, {"n": 1})
    (held,) = shifted.read(QUEUE, vt=2)
    delayed = shifted.send(QUEUE, {"n": 2}, delay=2)
    shift(sql, -60)
    assert seconds_left(sql, leased) > 55
    assert seconds_left(sql, delayed) > 55
    assert shifted.read(QUEUE, vt=30, qty=10) == []
    # the holder's fenced calls still work: its lease is its own, only longer
    assert extend(sql, leased, held.read_ct, 30) == [(leased, True)]
    assert shifted.nack(QUEUE, leased, read_ct=held.read_ct, delay=0) == "retry"
    assert [m.msg_id for m in shifted.read(QUEUE, vt=30, qty=10)] == [leased]


def test_a_deadline_moved_into_the_past_fires_its_barrier_once(
    shifted: Client, sql: psycopg.Connection[Any]
) -> None:
    barrier_id = shifted.fan_out(
        QUEUE,
        [{"i": i} for i in range(3)],
        callback_queue=CALLBACKS,
        callback_message={"done": True},
        deadline_seconds=600,
    )
    members = shifted.read(QUEUE, vt=30, qty=3)
    assert len(members) == 3
    shifted.complete_member(QUEUE, members[0].msg_id)
    shift(sql, 601, barriers=True)
    assert shifted.expire_barriers() == 1
    assert shifted.expire_barriers() == 0
    # the members still running finish late: counted, and nothing fires again
    for m in members[1:]:
        shifted.complete_member(QUEUE, m.msg_id)
    status = shifted.barrier_status(barrier_id)
    assert status.state == "expired"
    callbacks = shifted.read(CALLBACKS, vt=30, qty=10)
    assert len(callbacks) == 1
    assert callbacks[0].message == {"done": True}
