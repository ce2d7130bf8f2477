"""Reads and acks plan right on a table that was never analyzed, however it grows.

The generic plans of pgqueue's functions are made once per session, at their
first call: here on a tiny table that was never analyzed. The table then
grows by tens of thousands of sends, leases and acks (dead rows and index
entries no VACUUM or ANALYZE removes), and the same session reads and acks
again under auto_explain, whose plans arrive as notices. Every plan must still
find messages by their key (a probe of each of its halves, 0027; or a lane
index, or ctid), and a read or an ack of 10 messages must touch a few hundred
buffers, not the tens of thousands the queue's index entries take.
"""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest

QUEUE = "plans"
EXTEND = "SELECT * FROM pgqueue.extend_leases(%s, %s::bigint[], %s::integer[], 30)"
READ = "SELECT msg_id, read_ct, enqueued_at FROM pgqueue.read(%s, 30, 10)"
# the worker's ack: fenced by enqueued_at (0021)
ACK = "SELECT * FROM pgqueue.delete(%s, %s::bigint[], %s::timestamptz[])"


def churn(dsn: str, n: int) -> None:
    """n messages sent, leased and acked, then 2,000 left visible: dead rows, no ANALYZE."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(n // 1000):
            conn.execute(
                "SELECT pgqueue.send_batch(%s, array_fill('{\"x\": 1}'::jsonb, ARRAY[1000]))",
                (QUEUE,),
            )
            ids = [
                r[0]
                for r in conn.execute("SELECT msg_id FROM pgqueue.read(%s, 30, 1000)", (QUEUE,))
            ]
            conn.execute("SELECT pgqueue.delete(%s, %s::bigint[])", (QUEUE, ids))
        conn.execute(
            "SELECT pgqueue.send_batch(%s, array_fill('{\"x\": 1}'::jsonb, ARRAY[2000]))", (QUEUE,)
        )
        analyzed = conn.execute(
            "SELECT last_analyze, last_autoanalyze FROM pg_stat_user_tables"
            " WHERE relid = 'pgqueue.message'::regclass"
        ).fetchone()
        assert analyzed == (None, None), "the table must never have been analyzed"


KEY_HALVES = ("message_fresh_idx", "message_rest_idx")


def assert_found_by_key(plan: str) -> None:
    """No scan of every message: bitmaps only as one probe of each half of the key, by id."""
    assert "Seq Scan on message" not in plan, plan
    for index, cond in re.findall(r"Bitmap Index Scan on (\w+).*\n\s+Index Cond: \((.*)\)", plan):
        assert index in KEY_HALVES and "msg_id" in cond and "queue_id" in cond, plan
    heaps = plan.count("Bitmap Heap Scan on message")
    assert plan.count("BitmapOr") >= heaps, plan
    # an index scan of a half of the key names both of its columns
    for index, cond in re.findall(r"Index Scan using (\w+).*\n\s+Index Cond: \((.*)\)", plan):
        if index in KEY_HALVES:
            assert "msg_id" in cond and "queue_id" in cond, plan


def explained(
    conn: psycopg.Connection[Any], statement: str, params: tuple[Any, ...]
) -> tuple[Any, list[str]]:
    """Run a statement under auto_explain (plans as notices); its rows and every plan."""
    plans: list[str] = []
    conn.add_notice_handler(lambda d: plans.append(d.message_primary or ""))
    conn.execute(
        "SET auto_explain.log_min_duration = 0; SET auto_explain.log_nested_statements = on;"
        " SET auto_explain.log_analyze = on; SET auto_explain.log_buffers = on;"
        " SET auto_explain.log_level = notice"
    )
    rows = conn.execute(statement, params).fetchall()
    conn.execute("SET auto_explain.log_min_duration = -1")
    return rows, [p for p in plans if "plan:" in p]


def load_auto_explain(conn: psycopg.Connection[Any]) -> None:
    """Load auto_explain into the session, or skip the test where the server cannot."""
    try:
        conn.execute("LOAD 'auto_explain'")
    except psycopg.Error:
        pytest.skip("needs auto_explain and a superuser to load it")


def push_sweep_back(conn: psycopg.Connection[Any]) -> None:
    """Make the queue's next late sweep due a minute from now."""
    (queue_id,) = conn.execute(
        "SELECT queue_id FROM pgqueue.queue WHERE queue_name = %s", (QUEUE,)
    ).fetchone()  # type: ignore[misc]
    conn.execute(
        f"SELECT setval('pgqueue.lane_{queue_id}_sweep',"
        " pgqueue._ts_us(clock_timestamp() + interval '1 minute'))"
    )


def executed_buffers(plans: list[str]) -> int:
    """Buffers the statements inside a call touched while executing, planning left out.

    The plan of a statement that calls a pgqueue function also counts the
    planning of the statements inside that function, which after a cache reset
    (other sessions' DDL, as a parallel suite does) rereads the catalogs:
    hundreds of buffers that say nothing of the plans. Only the statements that
    call none are summed; each one's count is its executor's alone.
    """
    total = 0
    for plan in plans:
        node = re.search(r"^\S.*\(cost=", plan, re.MULTILINE)
        text = plan[: node.start()] if node else plan
        if re.search(r"pgqueue\.\w+\(", text):
            continue
        hits = re.search(r"Buffers: shared hit=(\d+)(?: read=(\d+))?", plan)
        if hits:
            total += int(hits.group(1)) + int(hits.group(2) or 0)
    return total


def test_reads_and_acks_find_messages_by_key_on_a_table_never_analyzed(
    dsn: str, server_dsn: str
) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        load_auto_explain(conn)
        conn.execute("SELECT pgqueue.create_queue(%s)", (QUEUE,))
        conn.execute("SELECT pgqueue.send(%s, '1')", (QUEUE,))
        # first calls: the generic plans are made now, on a tiny table
        rows = conn.execute(READ, (QUEUE,))
        ids, cts, ats = map(list, zip(*rows.fetchall(), strict=True))
        conn.execute(EXTEND, (QUEUE, ids, cts))
        conn.execute(ACK, (QUEUE, ids, ats))
        churn(dsn, 30_000)
        # between two late sweeps, as nearly every read is: a sweep reads each
        # lane from its safe floor, once a second, and is not what this measures
        push_sweep_back(conn)
        rows, read_plans = explained(conn, READ, (QUEUE,))
        ids, cts, ats = map(list, zip(*rows, strict=True))
        assert len(ids) == 10
        extended, beat_plans = explained(conn, EXTEND, (QUEUE, ids, cts))
        assert sorted(extended) == sorted((i, True) for i in ids)
        acked, ack_plans = explained(conn, ACK, (QUEUE, ids, ats))
        assert sorted(acked) == sorted((i,) for i in ids)
    for plan in read_plans + beat_plans + ack_plans:
        assert_found_by_key(plan)
    assert any("Tid Scan on message" in p for p in read_plans), "the lease finds its rows by ctid"
    assert any("Tid Scan on message" in p for p in ack_plans), "the ack finds its rows by ctid"
    assert any("Tid Scan on message" in p for p in beat_plans), "the heartbeat finds them by ctid"
    # 30,000 messages' worth of dead index entries and rows sit in the queue
    assert executed_buffers(read_plans) < 400, executed_buffers(read_plans)
    assert executed_buffers(ack_plans) < 300
    assert executed_buffers(beat_plans) < 300


def test_one_message_reads_and_acks_find_messages_by_key_on_a_table_never_analyzed(
    dsn: str,
) -> None:
    """The one-message path (0025) and the one-statement acks, planned on a tiny table."""
    read_one = "SELECT msg_id FROM pgqueue.read(%s, 30, 1)"
    with psycopg.connect(dsn, autocommit=True) as conn:
        load_auto_explain(conn)
        conn.execute("SELECT pgqueue.create_queue(%s)", (QUEUE,))
        conn.execute("SELECT pgqueue.send_batch(%s, array_fill('1'::jsonb, ARRAY[3]))", (QUEUE,))
        # first calls: the generic plans are made now, on a tiny table
        (first,) = conn.execute(read_one, (QUEUE,)).fetchone()  # type: ignore[misc]
        conn.execute("SELECT pgqueue.delete(%s, %s::bigint)", (QUEUE, first))
        (second,) = conn.execute(read_one, (QUEUE,)).fetchone()  # type: ignore[misc]
        conn.execute("SELECT pgqueue.archive(%s, %s::bigint)", (QUEUE, second))
        conn.execute("SELECT * FROM pgqueue.pop(%s)", (QUEUE,))
        churn(dsn, 30_000)
        # between two late sweeps, as nearly every read is
        push_sweep_back(conn)
        plans: dict[str, list[str]] = {}
        rows, plans["read"] = explained(conn, read_one, (QUEUE,))
        (msg_id,) = rows[0]
        _, plans["delete"] = explained(
            conn, "SELECT pgqueue.delete(%s, %s::bigint)", (QUEUE, msg_id)
        )
        rows, plans["read again"] = explained(conn, read_one, (QUEUE,))
        (msg_id,) = rows[0]
        _, plans["archive"] = explained(
            conn, "SELECT pgqueue.archive(%s, %s::bigint)", (QUEUE, msg_id)
        )
        _, plans["pop"] = explained(conn, "SELECT * FROM pgqueue.pop(%s)", (QUEUE,))
    for name, found in plans.items():
        assert not any("pgqueue._take(" in p for p in found), f"{name} ran a round of _take"
        for plan in found:
            assert_found_by_key(plan)
        # 30,000 messages' worth of dead index entries and rows sit in the queue:
        # a scan through them is thousands of buffers; a probe by key about a
        # hundred, more when a parallel suite's sessions leave catalog work (151 once)
        assert executed_buffers(found) < 400, f"{name}: {executed_buffers(found)} buffers"
    for name in ("read", "read again", "pop"):
        assert any("message_fresh_idx" in p for p in plans[name]), plans[name]
        assert any("message_timed_idx" in p for p in plans[name]), plans[name]
    for name in ("read", "read again", "pop"):
        assert any("Tid Scan on message" in p for p in plans[name]), f"{name}: not by ctid"
    for name in ("delete", "archive"):
        assert any("BitmapOr" in p for p in plans[name]), plans[name]
