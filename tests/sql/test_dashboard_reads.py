"""The dashboard's reads: poison and barriers by keyset, a barrier's outcomes and what it awaits."""

from __future__ import annotations

import random
from datetime import datetime
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgqueue import Client

PoisonKey = tuple[datetime, int, int]


def _fill_poison(sql: Any, rows: list[tuple[str, int, int, str]]) -> None:
    """Insert poison rows (queue, msg_id, seconds ago, reason) directly, ties in time included."""
    with sql.cursor() as cur:
        cur.executemany(
            "INSERT INTO pgqueue.poison (queue_id, msg_id, read_ct, enqueued_at, poisoned_at,"
            " reason, message)"
            " SELECT q.queue_id, %s, 3, now() - interval '1 day',"
            " timestamptz '2026-01-01 00:00+00' - make_interval(secs => %s), %s,"
            " jsonb_build_object('n', %s)"
            " FROM pgqueue.queue q WHERE q.queue_name = %s",
            [(m, ago, reason, m, q) for q, m, ago, reason in rows],
        )


def _page_all(
    sql: Any, queue: str | None, reason: str | None, qty: int, scan_limit: int
) -> tuple[list[tuple[str, int]], int]:
    """Every row the pages give, following cursors (capped rows included); and the calls made."""
    out: list[tuple[str, int]] = []
    cursor: PoisonKey | None = None
    calls = 0
    while True:
        calls += 1
        at, qid, mid = cursor or (None, None, None)
        rows = sql.execute(
            "SELECT queue, queue_id, msg_id, poisoned_at, capped FROM pgqueue.poison_page("
            "%s, %s, reason_contains => %s, cursor_poisoned_at => %s, cursor_queue_id => %s,"
            " cursor_msg_id => %s, scan_limit => %s)",
            (queue, qty, reason, at, qid, mid, scan_limit),
        ).fetchall()
        found = [r for r in rows if not r[4]]
        out += [(r[0], r[2]) for r in found]
        if not rows or (len(found) < qty and not rows[-1][4]):
            return out, calls
        last = rows[-1]
        cursor = (last[3], last[1], last[2])
        assert calls < 500, "the pages never end"


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    data=st.lists(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 5), st.booleans()),
        max_size=40,
    ),
    qty=st.integers(1, 7),
    scan_limit=st.integers(1, 9),
    one_queue=st.booleans(),
    filtered=st.booleans(),
)
def test_poison_pages_give_every_match_once_newest_first(
    client: Client,
    sql: Any,
    data: list[tuple[str, int, bool]],
    qty: int,
    scan_limit: int,
    one_queue: bool,
    filtered: bool,
) -> None:
    """Against a model: ties in poisoned_at, a queue filter, a reason filter that hits scan caps."""
    for name in "abc":
        client.create_queue(name)
    sql.execute("DELETE FROM pgqueue.poison")
    rows = [
        (q, i + 1, ago, "needle here" if hit else "other") for i, (q, ago, hit) in enumerate(data)
    ]
    _fill_poison(sql, rows)
    queue = "b" if one_queue else None
    reason = "NEEDLE" if filtered else None
    qids = dict(sql.execute("SELECT queue_name, queue_id FROM pgqueue.queue").fetchall())
    expected = [
        r for r in rows if (queue is None or r[0] == queue) and (reason is None or "needle" in r[3])
    ]
    # newest first = smallest `ago` first; then queue_id and msg_id descending
    expected.sort(key=lambda r: (r[2], -qids[r[0]], -r[1]))
    got, _ = _page_all(sql, queue, reason, qty, scan_limit)
    assert got == [(r[0], r[1]) for r in expected]


def test_a_reason_search_stops_at_its_scan_limit_and_says_where(client: Client, sql: Any) -> None:
    client.create_queue("jobs")
    _fill_poison(sql, [("jobs", i, i, "rare" if i == 90 else "common") for i in range(1, 101)])
    rows = sql.execute(
        "SELECT msg_id, capped, reason, message FROM pgqueue.poison_page('jobs', 10,"
        " reason_contains => 'rare', scan_limit => 30)"
    ).fetchall()
    assert rows == [(30, True, None, None)]  # scanned 1..30 (newest first), no match yet
    got, calls = _page_all(sql, "jobs", "rare", 10, 30)
    assert got == [("jobs", 90)]
    assert calls == 4  # 30 + 30 + 30 (the match at 90) + the rest


def test_a_poison_page_cuts_the_payload_and_says_how_long_it_was(client: Client, sql: Any) -> None:
    client.create_queue("jobs")
    msg_id = client.send("jobs", {"text": "x" * 1000})
    client.poison("jobs", msg_id, "by hand")
    [(message, chars)] = sql.execute(
        "SELECT message, message_chars FROM pgqueue.poison_page('jobs', 5, preview_chars => 40)"
    ).fetchall()
    assert len(message) == 40 and message.startswith('{"text": "xxx')
    assert chars == len('{"text": "' + "x" * 1000 + '"}')


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ("'nope', 5", 'queue "nope" does not exist'),
        ("NULL, -1", "qty must be >= 0"),
        ("NULL, 5, scan_limit => -3", "scan_limit must be >= 0"),
        ("NULL, 5, cursor_poisoned_at => now()", "go together"),
    ],
)
def test_poison_page_refuses_bad_input(sql: Any, args: str, message: str) -> None:
    with pytest.raises(psycopg.Error, match=message):
        sql.execute(f"SELECT * FROM pgqueue.poison_page({args})")


def test_poison_pages_read_the_index_not_the_table(client: Client, sql: Any) -> None:
    """A page of a small queue, or of all, among 20,000 rows reads the index, not the table."""
    for name in ("big", "small"):
        client.create_queue(name)
    sql.execute(
        "INSERT INTO pgqueue.poison (queue_id, msg_id, read_ct, enqueued_at, poisoned_at, reason,"
        " message) SELECT (SELECT queue_id FROM pgqueue.queue WHERE queue_name ="
        " CASE WHEN g % 100 = 0 THEN 'small' ELSE 'big' END), g, 3, now(),"
        " now() - make_interval(secs => g), 'r', jsonb_build_object('pad', repeat('x', 200))"
        " FROM generate_series(1, 20000) g"
    )
    pages = sql.execute("SELECT pg_relation_size('pgqueue.poison') / 8192").fetchone()[0]
    assert pages > 500  # a scan of the table would cost more than the bound below
    for queue in ("small", None):
        sql.execute("SELECT * FROM pgqueue.poison_page(%s, 50)", (queue,))  # plans, then cached
        plan = sql.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT * FROM pgqueue.poison_page(%s, 50)",
            (queue,),
        ).fetchone()[0][0]
        buffers = plan["Plan"]["Shared Hit Blocks"] + plan["Plan"]["Shared Read Blocks"]
        assert buffers < 150, (queue, buffers)


def _barrier(client: Client, sql: Any, bid: str, n: int) -> list[int]:
    client.fan_out(
        "work",
        [{"i": i} for i in range(n)],
        barrier_id=bid,
        callback_queue="done",
        callback_message={"b": bid},
    )
    rows = sql.execute(
        "SELECT msg_id FROM pgqueue.barrier_member WHERE barrier_id = %s ORDER BY member_index",
        (bid,),
    )
    return [r[0] for r in rows]


def test_barrier_outcomes_and_pending_members(client: Client, sql: Any) -> None:
    client.create_queue("work", max_attempts=1)
    client.create_queue("done")
    ids = _barrier(client, sql, "b1", 6)
    client.complete_member("work", ids[0])
    client.complete_member("work", ids[1], outcome="failed", result={"error": "bad"})
    client.poison("work", ids[2], "broken")
    [leased] = [m for m in client.read("work", vt=60, qty=1) if m.msg_id == ids[3]] or [None]
    assert leased is not None
    outcomes = dict(sql.execute("SELECT * FROM pgqueue.barrier_outcomes('b1')").fetchall())
    assert outcomes == {"succeeded": 1, "failed": 1, "poisoned": 1, "pending": 3}
    pending = sql.execute(
        "SELECT member_index, msg_id, read_ct, vt > now() FROM pgqueue.barrier_pending('b1', 10)"
    ).fetchall()
    assert pending == [(3, ids[3], 1, True), (4, ids[4], 0, False), (5, ids[5], 0, False)]
    assert sql.execute(
        "SELECT member_index FROM pgqueue.barrier_pending('b1', 1, after_index => 3)"
    ).fetchall() == [(4,)]
    with pytest.raises(psycopg.Error, match="does not exist"):
        sql.execute("SELECT * FROM pgqueue.barrier_outcomes('nope')")


def test_barrier_pages_give_every_barrier_once_newest_first(client: Client, sql: Any) -> None:
    client.create_queue("work")
    client.create_queue("done")
    for i in range(23):
        _barrier(client, sql, f"b{i:02}", 1)
    # ties in created_at: ordering falls back to barrier_id
    sql.execute("UPDATE pgqueue.barrier SET created_at = '2026-01-01' WHERE barrier_id < 'b10'")
    sql.execute(
        "UPDATE pgqueue.barrier SET state = 'fired', fired_at = now() WHERE barrier_id = 'b05'"
    )
    expected = [
        r[0]
        for r in sql.execute(
            "SELECT barrier_id FROM pgqueue.barrier ORDER BY created_at DESC, barrier_id DESC"
        )
    ]
    got: list[str] = []
    cursor: tuple[Any, Any] = (None, None)
    while True:
        page = sql.execute(
            "SELECT barrier_id, created_at FROM pgqueue.list_barriers(NULL, 5, %s, %s)", cursor
        ).fetchall()
        got += [r[0] for r in page]
        if len(page) < 5:
            break
        cursor = (page[-1][1], page[-1][0])
    assert got == expected
    fired = sql.execute("SELECT barrier_id FROM pgqueue.list_barriers('fired', 5, NULL, NULL)")
    assert [r[0] for r in fired] == ["b05"]


def test_the_dashboard_reads_are_the_operators_only(dsn: str, sql: Any) -> None:
    """A producer or a consumer login cannot page the poison table or a barrier's members."""
    role = f"dash_{random.randrange(10**9)}"
    sql.execute(f"CREATE ROLE {role} LOGIN IN ROLE pgqueue_consumer")
    try:
        conninfo = psycopg.conninfo.make_conninfo(dsn, user=role)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            for call in (
                "pgqueue.poison_page(NULL, 5)",
                "pgqueue.barrier_outcomes('x')",
                "pgqueue.barrier_pending('x')",
                "pgqueue.list_barriers(NULL, 5, NULL, NULL)",
            ):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(f"SELECT * FROM {call}")
    finally:
        sql.execute(f"DROP ROLE {role}")
