"""The worker registry and the per-minute rates (sql/schema/workers.sql), as raw SQL."""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from pgqueue import Client, InvalidArgument

HEARTBEAT = (
    "SELECT queue_name, paused FROM pgqueue.worker_heartbeat(%(worker_id)s, %(host)s, %(pid)s,"
    " %(queues)s::text[], %(concurrency)s, %(in_flight)s, %(started_at)s::timestamptz,"
    " %(stopping)s, %(tally_queues)s::text[], %(acked)s::bigint[], %(nacked)s::bigint[],"
    " %(poisoned)s::bigint[])"
)


def heartbeat(sql: Any, **given: Any) -> list[tuple[str, bool]]:
    """One heartbeat of a worker on queue jobs (fields overridden by `given`); its answer."""
    args: dict[str, Any] = {
        "worker_id": uuid.uuid4(),
        "host": "h1",
        "pid": 42,
        "queues": ["jobs"],
        "concurrency": 4,
        "in_flight": 0,
        "started_at": None,
        "stopping": False,
        "tally_queues": [],
        "acked": [],
        "nacked": [],
        "poisoned": [],
    }
    args.update(given)
    return sql.execute(HEARTBEAT, args).fetchall()


def early_in_a_minute(sql: Any) -> datetime:
    """Wait, if need be, until the database's minute has at least 15 s to go; that minute."""
    seconds = sql.execute("SELECT extract(second FROM clock_timestamp())").fetchone()[0]
    if seconds > 45:
        time.sleep(60.2 - float(seconds))
    return sql.execute("SELECT date_trunc('minute', clock_timestamp())").fetchone()[0]


def minute_rows(sql: Any) -> list[tuple[Any, ...]]:
    return sql.execute(
        "SELECT q.queue_name, m.sent_total, m.acked, m.nacked, m.poisoned"
        "  FROM pgqueue.queue_minute m JOIN pgqueue.queue q USING (queue_id)"
        " ORDER BY q.queue_name, m.minute"
    ).fetchall()


@pytest.mark.parametrize(
    ("given", "state", "message"),
    [
        ({"worker_id": None}, "22004", "worker_id must not be NULL"),
        ({"host": None}, "22004", "host must not be NULL"),
        ({"pid": None}, "22004", "pid must not be NULL"),
        ({"queues": None}, "22004", "queues must not be NULL"),
        ({"concurrency": None}, "22004", "concurrency must not be NULL"),
        ({"in_flight": None}, "22004", "in_flight must not be NULL"),
        ({"stopping": None}, "22004", "stopping must not be NULL"),
        ({"tally_queues": None}, "22004", "tally_queues must not be NULL"),
        ({"acked": None}, "22004", "acked must not be NULL"),
        ({"nacked": None}, "22004", "nacked must not be NULL"),
        ({"poisoned": None}, "22004", "poisoned must not be NULL"),
        ({"host": ""}, "22023", "host must be 1 to 255 characters, got 0"),
        ({"host": "h" * 256}, "22023", "host must be 1 to 255 characters, got 256"),
        ({"pid": 0}, "22023", "pid must be >= 1, got 0"),
        ({"concurrency": 0}, "22023", "concurrency must be >= 1, got 0"),
        ({"in_flight": -1}, "22023", "in_flight must be >= 0, got -1"),
        ({"queues": ["jobs", None]}, "22004", "queues[2] is NULL"),
        (
            {"tally_queues": ["jobs"], "acked": [1], "nacked": [], "poisoned": [0]},
            "22023",
            "tally_queues, acked, nacked and poisoned have 1, 1, 0 and 1 elements",
        ),
        (
            {"tally_queues": ["jobs"], "acked": [None], "nacked": [0], "poisoned": [0]},
            "22004",
            "tally_queues, acked, nacked and poisoned must not hold NULLs",
        ),
        (
            {"tally_queues": [None], "acked": [1], "nacked": [0], "poisoned": [0]},
            "22004",
            "tally_queues, acked, nacked and poisoned must not hold NULLs",
        ),
        (
            {"tally_queues": ["jobs"], "acked": [1], "nacked": [-1], "poisoned": [0]},
            "22023",
            "acked, nacked and poisoned must be >= 0",
        ),
    ],
)
def test_a_heartbeat_refuses_bad_input_and_changes_nothing(
    sql: Any, queue: str, given: dict[str, Any], state: str, message: str
) -> None:
    with pytest.raises(psycopg.Error) as caught:
        heartbeat(sql, **given)
    assert (caught.value.sqlstate, caught.value.diag.message_primary) == (state, message)
    assert sql.execute("SELECT count(*) FROM pgqueue.worker").fetchone() == (0,)
    assert minute_rows(sql) == []


def test_a_heartbeat_upserts_the_row_and_returns_its_queues_paused_flags(
    sql: Any, client: Client
) -> None:
    for q in ("a", "b", "c"):
        client.create_queue(q)
    client.pause_queue("b")
    me = uuid.uuid4()
    got = heartbeat(sql, worker_id=me, queues=["c", "b", "a", "gone"], in_flight=2)
    assert got == [("a", False), ("b", True), ("c", False)]  # by name; no row for "gone"
    first = sql.execute("SELECT started_at, last_seen_at FROM pgqueue.worker").fetchone()
    assert first[0] == first[1]  # NULL started_at: the first heartbeat's time
    heartbeat(sql, worker_id=me, queues=["a"], in_flight=3, stopping=True, host="h2")
    row = sql.execute(
        "SELECT host, queues, in_flight, stopping, started_at, last_seen_at FROM pgqueue.worker"
    ).fetchone()
    assert row[:4] == ("h2", ["a"], 3, True)
    assert row[4] == first[0] and row[5] > first[1]  # started_at kept, last seen now
    assert sql.execute("SELECT pgqueue.worker_deregister(%s)", (me,)).fetchone() == (True,)
    assert sql.execute("SELECT pgqueue.worker_deregister(%s)", (me,)).fetchone() == (False,)
    assert sql.execute("SELECT count(*) FROM pgqueue.worker").fetchone() == (0,)


def test_list_workers_says_alive_for_15_seconds_after_the_last_heartbeat(
    sql: Any, queue: str, client: Client
) -> None:
    old, new = uuid.uuid4(), uuid.uuid4()
    heartbeat(sql, worker_id=old, started_at=datetime.now().astimezone() - timedelta(hours=1))
    heartbeat(sql, worker_id=new, pid=43)
    listed = client.list_workers()
    assert [w.worker_id for w in listed] == [new, old]  # newest started first
    assert all(w.alive and not w.stopping for w in listed)
    assert (listed[0].host, listed[0].pid, listed[0].queues, listed[0].concurrency) == (
        "h1",
        43,
        ["jobs"],
        4,
    )
    # The database's clock decides: 14 s since the last heartbeat is alive, 16 s is not.
    sql.execute(
        "UPDATE pgqueue.worker SET last_seen_at = clock_timestamp() - interval '14 seconds'"
        " WHERE worker_id = %s",
        (new,),
    )
    sql.execute(
        "UPDATE pgqueue.worker SET last_seen_at = clock_timestamp() - interval '16 seconds'"
        " WHERE worker_id = %s",
        (old,),
    )
    assert {w.worker_id: w.alive for w in client.list_workers()} == {new: True, old: False}
    heartbeat(sql, worker_id=old)
    assert all(w.alive for w in client.list_workers())


def test_a_heartbeat_prunes_rows_unseen_for_10_minutes(sql: Any, queue: str) -> None:
    stale, quiet = uuid.uuid4(), uuid.uuid4()
    heartbeat(sql, worker_id=stale)
    heartbeat(sql, worker_id=quiet)
    sql.execute(
        "UPDATE pgqueue.worker SET last_seen_at = clock_timestamp() - CASE worker_id"
        " WHEN %s THEN interval '11 minutes' ELSE interval '9 minutes' END",
        (stale,),
    )
    heartbeat(sql)
    left = {r[0] for r in sql.execute("SELECT worker_id FROM pgqueue.worker").fetchall()}
    assert stale not in left and quiet in left and len(left) == 2


def test_with_no_heartbeat_left_a_row_unseen_for_10_minutes_is_not_listed(
    sql: Any, queue: str, client: Client
) -> None:
    """The last worker killed: no heartbeat prunes its row, and it was listed as lost forever."""
    killed, lost = uuid.uuid4(), uuid.uuid4()
    heartbeat(sql, worker_id=killed)
    heartbeat(sql, worker_id=lost)
    sql.execute(
        "UPDATE pgqueue.worker SET last_seen_at = clock_timestamp() - CASE worker_id"
        " WHEN %s THEN interval '11 minutes' ELSE interval '9 minutes' END",
        (killed,),
    )
    [listed] = client.list_workers()
    assert listed.worker_id == lost and not listed.alive
    # the row waits for the next heartbeat to prune it; only the listing moved
    assert sql.execute("SELECT count(*) FROM pgqueue.worker").fetchone() == (2,)


def test_tallies_add_up_in_this_minutes_row_of_each_queue(sql: Any, client: Client) -> None:
    for q in ("a", "b"):
        client.create_queue(q)
    early_in_a_minute(sql)
    heartbeat(
        sql,
        tally_queues=["a", "b", "a", "gone"],
        acked=[3, 0, 2, 9],
        nacked=[1, 0, 0, 9],
        poisoned=[0, 0, 1, 9],
    )
    heartbeat(sql, tally_queues=["a"], acked=[10], nacked=[0], poisoned=[0])
    # sent_total: the first heartbeat sampled both queues (nothing sent yet)
    assert minute_rows(sql) == [("a", 0, 15, 1, 1), ("b", 0, 0, 0, 0)]


def test_the_first_sampler_of_a_minute_wins_and_a_heartbeat_samples_once_a_minute(
    sql: Any, client: Client
) -> None:
    client.create_queue("a")
    client.create_queue("b")
    early_in_a_minute(sql)
    client.send_batch("a", [1, 2, 3])
    assert client.sample_rates() == 2
    client.send_batch("a", [4, 5])
    assert client.sample_rates() == 0  # this minute's sample stays the first one
    assert minute_rows(sql) == [("a", 3, 0, 0, 0), ("b", 0, 0, 0, 0)]
    # A heartbeat does not sample again within the minute (not even rows deleted since) ...
    sql.execute("DELETE FROM pgqueue.queue_minute")
    heartbeat(sql)
    assert minute_rows(sql) == []
    # ... but does in a minute not sampled yet.
    sql.execute("SELECT setval('pgqueue.rates_sampled_minute', 1)")
    heartbeat(sql)
    assert minute_rows(sql) == [("a", 5, 0, 0, 0), ("b", 0, 0, 0, 0)]


def test_the_sampler_prunes_rows_older_than_two_hours(sql: Any, client: Client) -> None:
    client.create_queue("a")
    early_in_a_minute(sql)
    sql.execute(
        "INSERT INTO pgqueue.queue_minute (queue_id, minute, sent_total)"
        " SELECT q.queue_id, date_trunc('minute', clock_timestamp()) - make_interval(mins => m), 0"
        "   FROM pgqueue.queue q, (VALUES (119), (121), (500)) v (m)"
    )
    client.sample_rates()
    left = sql.execute(
        "SELECT (date_trunc('minute', clock_timestamp()) - minute) FROM pgqueue.queue_minute"
        " ORDER BY minute"
    ).fetchall()
    assert [r[0] for r in left] == [timedelta(minutes=119), timedelta(0)]


def test_queue_rates_are_differences_of_samples_and_the_reported_tallies(
    sql: Any, client: Client
) -> None:
    for q in ("a", "b", "c"):
        client.create_queue(q)
    # created before the window: the samples say where a's sequence stood
    sql.execute("UPDATE pgqueue.queue SET created_at = created_at - interval '1 hour'")
    now = early_in_a_minute(sql)
    client.send_batch("a", list(range(25)))  # a's sequence: 25
    # a: samples 4 and 3 minutes ago and now; none 2 minutes ago; tallies 3 minutes ago
    sql.execute(
        "INSERT INTO pgqueue.queue_minute (queue_id, minute, sent_total, acked, nacked, poisoned)"
        " SELECT queue_id, %s::timestamptz - make_interval(mins => m), s, ak, nk, pk"
        "   FROM pgqueue.queue, (VALUES (4, 10, 0, 0, 0), (3, 14, 5, 1, 2), (0, 20, 0, 0, 0))"
        "        v (m, s, ak, nk, pk)"
        "  WHERE queue_name = 'a'",
        (now,),
    )
    rates = client.queue_rates(["a", "c", "nope"], minutes=5)
    assert [(r.queue_name, int((now - r.minute).total_seconds() // 60)) for r in rates] == [
        ("a", 4),
        ("a", 3),
        ("a", 2),
        ("a", 1),
        ("a", 0),
        ("c", 4),
        ("c", 3),
        ("c", 2),
        ("c", 1),
        ("c", 0),
    ]
    a = [(r.sent, r.acked, r.nacked, r.poisoned) for r in rates[:5]]
    # 4 min ago: 14 - 10; 3 min ago: up to the next known sample, this minute's
    # 20 (none 2 and 1 min ago); this minute: 25 sent now - 20
    assert a == [(4, 0, 0, 0), (6, 5, 1, 2), (None, 0, 0, 0), (None, 0, 0, 0), (5, 0, 0, 0)]
    assert all(r.sent is None and r.acked == 0 for r in rates[5:])  # c: never sampled
    everything = client.queue_rates(minutes=1)
    assert [(r.queue_name, r.minute) for r in everything] == [("a", now), ("b", now), ("c", now)]
    with pytest.raises(InvalidArgument, match="minutes must be 1 to 120, got 121"):
        client.queue_rates(minutes=121)
    with pytest.raises(InvalidArgument, match="minutes must be 1 to 120, got 0"):
        client.queue_rates(minutes=0)
    with pytest.raises(InvalidArgument, match="queues must be a list of queue names"):
        client.queue_rates("a")


def test_queue_rates_reads_a_range_of_the_primary_key_per_queue_on_a_table_never_analyzed(
    dsn: str,
) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        try:
            conn.execute("LOAD 'auto_explain'")
        except psycopg.Error:
            pytest.skip("needs auto_explain and a superuser to load it")
        conn.execute("SELECT pgqueue.create_queue('q' || g) FROM generate_series(1, 100) g")
        # created before the samples below
        conn.execute("UPDATE pgqueue.queue SET created_at = now() - interval '3 hours'")
        conn.execute(
            "INSERT INTO pgqueue.queue_minute (queue_id, minute, sent_total)"
            " SELECT q.queue_id, date_trunc('minute', clock_timestamp())"
            "        - make_interval(mins => m), 1000 - m"
            "   FROM pgqueue.queue q, generate_series(0, 119) m"
        )
        plans: list[str] = []
        conn.add_notice_handler(lambda d: plans.append(d.message_primary or ""))
        conn.execute(
            "SET auto_explain.log_min_duration = 0; SET auto_explain.log_nested_statements = on;"
            " SET auto_explain.log_level = notice"
        )
        rows = conn.execute("SELECT sent FROM pgqueue.queue_rates(ARRAY['q7', 'q9'], 60)")
        sent = [r[0] for r in rows.fetchall()]
        assert sent[:59] == sent[60:119] == [1] * 59  # (the current minute: the sequence now)
    plan = next(p for p in plans if "queue_minute" in p)
    assert "Index Scan using queue_minute_pkey on queue_minute" in plan, plan
    assert "Seq Scan on queue_minute" not in plan, plan


def test_dropping_a_queue_drops_its_rates(sql: Any, client: Client) -> None:
    client.create_queue("a")
    client.create_queue("b")
    heartbeat(sql, tally_queues=["a", "b"], acked=[1, 1], nacked=[0, 0], poisoned=[0, 0])
    assert client.drop_queue("a")
    assert [r[0] for r in minute_rows(sql)] == ["b"]
