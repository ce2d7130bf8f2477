"""Acks fenced by enqueued_at (0021): an id handed out again is never acked by mistake.

After an asynchronous standby is promoted, the msg_ids of the sends it never
received are handed out again (a sequence's advance is WAL-logged ahead of
the sends that use it). These tests act that out on one server: the lost
send's row is deleted and its queue's sequence set back, so the next send
gets the same msg_id. A reader of the first message then acks it, as the
worker's acker does when it retries across the failover.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Any

import psycopg
import pytest
from support.db import run_threads

from pgqueue import Client

QUEUE = "fenced"
CALLBACKS = "fenced_cb"


@pytest.fixture
def fenced(client: Client) -> Client:
    """A client with the queues created."""
    client.create_queue(QUEUE)
    client.create_queue(CALLBACKS)
    return client


def lose_and_reuse(sql: psycopg.Connection[Any], msg_id: int) -> None:
    """Act out a promoted standby: the send of msg_id never happened, and its id is free again."""
    sql.execute("DELETE FROM pgqueue.message WHERE msg_id = %s", (msg_id,))
    sql.execute(
        "SELECT setval(msg_seq, %s, false) FROM pgqueue.queue WHERE queue_name = %s",
        (msg_id, QUEUE),
    )


def live(sql: psycopg.Connection[Any]) -> list[tuple[int, Any]]:
    """The queue's live messages: (msg_id, payload)."""
    return sql.execute(
        "SELECT m.msg_id, m.message FROM pgqueue.message m JOIN pgqueue.queue q USING (queue_id)"
        " WHERE q.queue_name = %s ORDER BY msg_id",
        (QUEUE,),
    ).fetchall()


@pytest.mark.parametrize("call", ["delete", "archive"])
def test_an_ack_of_a_lost_message_leaves_the_new_message_with_its_id_alone(
    fenced: Client, sql: psycopg.Connection[Any], call: str
) -> None:
    first = fenced.send(QUEUE, {"n": "lost"})
    (held,) = fenced.read(QUEUE, vt=30)
    lose_and_reuse(sql, first)
    again = fenced.send(QUEUE, {"n": "new"})
    assert again == first, "the sequence handed the id out again"

    acked = sql.execute(
        f"SELECT * FROM pgqueue.{call}(%s, %s::bigint[], %s::timestamptz[])",
        (QUEUE, [first], [held.enqueued_at]),
    ).fetchall()
    assert acked == []
    assert live(sql) == [(first, {"n": "new"})]
    # the unfenced ack is what would have happened: it removes the new message
    sql.execute(f"SELECT * FROM pgqueue.{call}(%s, %s::bigint[])", (QUEUE, [first]))
    assert live(sql) == []


@pytest.mark.parametrize("call", ["delete", "archive"])
def test_a_fenced_ack_of_the_message_itself_acks_it_once(
    fenced: Client, sql: psycopg.Connection[Any], call: str
) -> None:
    ids = [fenced.send(QUEUE, {"n": i}) for i in range(3)]
    msgs = fenced.read(QUEUE, vt=30, qty=3)
    stamps = {m.msg_id: m.enqueued_at for m in msgs}
    args = (QUEUE, ids + ids[:1], [stamps[i] for i in ids + ids[:1]])
    first = sql.execute(f"SELECT * FROM pgqueue.{call}(%s, %s::bigint[], %s::timestamptz[])", args)
    assert sorted(r[0] for r in first.fetchall()) == ids
    again = sql.execute(f"SELECT * FROM pgqueue.{call}(%s, %s::bigint[], %s::timestamptz[])", args)
    assert again.fetchall() == []
    assert live(sql) == []
    archived = sql.execute("SELECT count(*) FROM pgqueue.archive").fetchone()
    assert archived == ((3,) if call == "archive" else (0,))


@pytest.mark.parametrize(
    ("ids", "stamps", "sqlstate"),
    [([1, 2], [datetime(2026, 1, 1).astimezone()], "22023"), ([1], None, "22004")],
)
def test_fenced_acks_refuse_ids_and_times_that_do_not_pair(
    fenced: Client,
    sql: psycopg.Connection[Any],
    ids: list[int],
    stamps: list[datetime] | None,
    sqlstate: str,
) -> None:
    for call in ("delete", "archive"):
        with pytest.raises(psycopg.Error) as info, sql.transaction():
            sql.execute(
                f"SELECT * FROM pgqueue.{call}(%s, %s::bigint[], %s::timestamptz[])",
                (QUEUE, ids, stamps),
            )
        assert info.value.sqlstate == sqlstate


def test_a_completion_of_a_lost_member_does_not_count_the_new_member_with_its_id(
    fenced: Client, sql: psycopg.Connection[Any]
) -> None:
    lost_barrier = fenced.fan_out(QUEUE, [{"b": 1}], callback_queue=CALLBACKS, callback_message={})
    (held,) = fenced.read(QUEUE, vt=30)
    # the promoted standby never got the fan-out: neither the member nor its barrier
    sql.execute("DELETE FROM pgqueue.barrier_member WHERE barrier_id = %s", (lost_barrier,))
    sql.execute("DELETE FROM pgqueue.barrier WHERE barrier_id = %s", (lost_barrier,))
    lose_and_reuse(sql, held.msg_id)
    barrier = fenced.fan_out(QUEUE, [{"b": 2}], callback_queue=CALLBACKS, callback_message={})
    assert [m for m, _ in live(sql)] == [held.msg_id]

    statuses = sql.execute(
        "SELECT * FROM pgqueue.complete_members(%s, %s::bigint[],"
        " enqueued_ats => %s::timestamptz[])",
        (QUEUE, [held.msg_id], [held.enqueued_at]),
    ).fetchall()
    assert statuses == []
    assert fenced.barrier_status(barrier).remaining == 1
    assert live(sql) == [(held.msg_id, {"b": 2})]
    # the new member's own reader completes it, fenced by its own time
    (mine,) = fenced.read(QUEUE, vt=30)
    sql.execute(
        "SELECT * FROM pgqueue.complete_members(%s, %s::bigint[],"
        " read_cts => %s::int[], enqueued_ats => %s::timestamptz[])",
        (QUEUE, [mine.msg_id], [mine.read_ct], [mine.enqueued_at]),
    )
    assert fenced.barrier_status(barrier).state == "fired"
    assert len(fenced.read(CALLBACKS, vt=30, qty=5)) == 1


def test_concurrent_fenced_acks_ack_each_message_once(
    fenced: Client, sql: psycopg.Connection[Any], dsn: str
) -> None:
    fenced.send_batch(QUEUE, [{"n": i} for i in range(200)])
    msgs = fenced.read(QUEUE, vt=60, qty=200)
    pairs = [(m.msg_id, m.enqueued_at) for m in msgs]
    acked: Counter[int] = Counter()

    def ack(i: int) -> None:
        mine = pairs[i % 2 :: 2] + pairs[: 40 * (i + 1)]  # overlapping, in different orders
        with psycopg.connect(dsn, autocommit=True) as conn:
            for start in range(0, len(mine), 25):
                chunk = mine[start : start + 25]
                rows = conn.execute(
                    "SELECT * FROM pgqueue.archive(%s, %s::bigint[], %s::timestamptz[])",
                    (QUEUE, [p[0] for p in chunk], [p[1] for p in chunk]),
                ).fetchall()
                acked.update(r[0] for r in rows)

    run_threads(4, ack)
    assert sorted(acked) == sorted(p[0] for p in pairs)
    assert max(acked.values()) == 1
    assert live(sql) == []
