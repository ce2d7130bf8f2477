"""PGMQ's partitioned queues on the facade: what is kept, for how long, as pg_partman keeps it.

A PGMQ queue made by create_partitioned (or whose archive convert_archive_partitioned
converted) loses whole partitions to pg_partman's retention when its maintenance runs.
On the facade the queue is an ordinary pgqueue queue and pgmq.run_maintenance() removes
what that maintenance would drop. The differential tests run the same calls on real
PGMQ with pg_partman (partman's run_maintenance) and on the facade (pgmq's) and compare
what the queue and archive tables hold and what the metrics count; the boundaries are
also checked against a model of pg_partman's rule. Where the facade does more than
PGMQ: a live message past retention is poison-dropped, so a barrier counts it as failed.

The tests that need pg_partman skip on a server without it (`.ci/run` installs Debian's
postgresql-15-partman).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.db import run_threads
from support.roles import as_user

from pgqueue import Client
from pgqueue._pgmq import import_pgmq, install
from pgqueue._roles import CONSUMER, OPERATOR, PRODUCER

ROLES = (PRODUCER, CONSUMER, OPERATOR)

Conn = psycopg.Connection[Any]


def partman(conn: Conn) -> str:
    """pg_partman, created in the database (skips the test on a server without it); its schema."""
    row = conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'pg_partman'").fetchone()
    if row is None:
        pytest.skip("pg_partman is not installed on this server (Debian: postgresql-15-partman)")
    conn.execute("CREATE EXTENSION IF NOT EXISTS pg_partman")
    found = conn.execute(
        "SELECT extnamespace::regnamespace::text FROM pg_extension WHERE extname = 'pg_partman'"
    ).fetchone()
    assert found is not None
    return str(found[0])


@pytest.fixture
def real(real_pgmq_dsn: str) -> Iterator[tuple[Conn, str]]:
    """Real PGMQ with pg_partman; the statement that runs pg_partman's maintenance."""
    with psycopg.connect(real_pgmq_dsn, autocommit=True) as c:
        yield c, f"SELECT {partman(c)}.run_maintenance()"


@pytest.fixture
def facade(facade_dsn: str) -> Iterator[tuple[Conn, str]]:
    """The facade with pg_partman created (PGMQ asks for it); the facade's maintenance."""
    with psycopg.connect(facade_dsn, autocommit=True) as c:
        partman(c)
        yield c, "SELECT pgmq.run_maintenance()"


def ids(conn: Conn, query: str) -> list[int]:
    return [int(r[0]) for r in conn.execute(query).fetchall()]


def snapshot(conn: Conn, queue: str) -> tuple[list[int], list[int], tuple[Any, ...]]:
    """What PGMQ's tables hold of a queue, and what its metrics count."""
    live = ids(conn, f"SELECT msg_id FROM pgmq.q_{queue} ORDER BY msg_id")
    archived = ids(conn, f"SELECT msg_id FROM pgmq.a_{queue} ORDER BY msg_id")
    metrics = conn.execute(
        "SELECT queue_length, total_messages, default_partition_length FROM pgmq.metrics(%s)",
        (queue,),
    ).fetchone()
    assert metrics is not None
    return live, archived, tuple(metrics)


def play(conn: Conn, maintain: str, steps: list[str]) -> list[Any]:
    """Run the steps ('maintain' runs the side's maintenance and takes a snapshot)."""
    seen = []
    for step in steps:
        if step == "maintain":
            conn.execute(maintain)
            seen.append(snapshot(conn, "n"))
        else:
            conn.execute(step)
    return seen


BY_ID = [
    "SELECT pgmq.create_partitioned('n', '10', '20')",
    "SELECT pgmq.send_batch('n', array_fill('{}'::jsonb, ARRAY[35]))",
    "SELECT pgmq.archive('n', ARRAY[1, 2, 3, 11, 12, 25]::bigint[])",
    "maintain",
    # the highest id rises: partitions [10, 20) and then [20, 30) fall behind
    "SELECT pgmq.send_batch('n', array_fill('{}'::jsonb, ARRAY[13]))",
    "SELECT pgmq.archive('n', ARRAY[41, 42, 47]::bigint[])",
    "maintain",
    # deleting the newest lowers the live table's highest id: nothing more goes
    "SELECT pgmq.delete('n', ARRAY[46, 48]::bigint[])",
    "maintain",
    "SELECT pgmq.send_batch('n', array_fill('{}'::jsonb, ARRAY[1]))",
    "maintain",
]


def test_retention_by_msg_id_keeps_what_pg_partman_keeps(
    real: tuple[Conn, str], facade: tuple[Conn, str]
) -> None:
    on_real, on_facade = play(*real, BY_ID), play(*facade, BY_ID)
    assert on_facade == on_real
    # the example reaches what it is about: partitions of live and archived rows went
    first, second, *_ = on_real
    assert (first[0][0], second[0][0], second[1][0]) == (10, 20, 25), on_real


def test_retention_by_time_keeps_what_pg_partman_keeps(
    real: tuple[Conn, str], facade: tuple[Conn, str]
) -> None:
    # Minute partitions, a minute kept. Messages are backdated into the partitions three
    # minutes back (past retention whatever the second) and one minute back (kept until
    # the minute turns), so each side runs within one minute: it waits out a turn near.
    def side(conn: Conn, maintain: str, live: str, archived: str) -> Any:
        conn.execute("SELECT pgmq.create_partitioned('n', '1 minute', '1 minute')")
        conn.execute("SELECT pgmq.send_batch('n', array_fill('{}'::jsonb, ARRAY[6]))")
        conn.execute("SELECT pgmq.archive('n', ARRAY[5, 6]::bigint[])")
        while datetime.now(UTC).second > 45:
            threading.Event().wait(1)
        minute = "date_trunc('minute', now())"
        # the database holds this one queue
        conn.execute(
            f"UPDATE {live} SET enqueued_at = {minute} - CASE WHEN msg_id <= 2"
            " THEN interval '150 seconds' ELSE interval '30 seconds' END"
        )
        conn.execute(
            f"UPDATE {archived} SET archived_at = {minute} - CASE WHEN msg_id = 5"
            " THEN interval '150 seconds' ELSE interval '30 seconds' END"
        )
        conn.execute(maintain)
        return snapshot(conn, "n")

    on_real = side(*real, "pgmq.q_n", "pgmq.a_n")
    on_facade = side(*facade, "pgqueue.message", "pgqueue.archive")
    assert on_facade == on_real
    assert on_real[:2] == ([3, 4], [6]), on_real


# -- the boundaries, against a model of pg_partman's rule ------------------------------------


def kept_from_id(max_id: int, step: int, keep: int) -> int:
    """pg_partman: partition [k*step, (k+1)*step) goes when keep <= max - (k+1)*step."""
    k = 0
    while keep <= max_id - (k + 1) * step:
        k += 1
    return k * step


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(max_id=st.integers(0, 5000), step=st.integers(1, 300), keep=st.integers(0, 3000))
def test_the_lowest_id_kept_is_pg_partmans(
    facade_conn: Conn, max_id: int, step: int, keep: int
) -> None:
    row = facade_conn.execute("SELECT pgmq._id_cut(%s, %s, %s)", (max_id, step, keep)).fetchone()
    assert row == (kept_from_id(max_id, step, keep),)


STEPS = [timedelta(seconds=5), timedelta(minutes=1), timedelta(minutes=15), timedelta(hours=2)]


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    step=st.sampled_from(STEPS),
    keep_steps=st.integers(0, 10),
    extra=st.integers(0, 59),
    later=st.integers(0, 10**6),
)
def test_the_oldest_time_kept_is_pg_partmans(
    facade_conn: Conn, step: timedelta, keep_steps: int, extra: int, later: int
) -> None:
    anchor = datetime(2026, 3, 29, 0, 0, tzinfo=UTC)
    keep = step * keep_steps + timedelta(seconds=extra)
    at = anchor + timedelta(seconds=later)
    # pg_partman: the partition starting at s goes when s + step < at - keep; the first
    # partition kept, walking up from well before the anchor
    s = anchor - step * (keep // step + 3)
    while s + step < at - keep:
        s += step
    row = facade_conn.execute(
        "SELECT pgmq._time_cut(%s, %s, %s, %s)", (anchor, step, keep, at)
    ).fetchone()
    assert row == (s,)


@pytest.fixture
def facade_conn(facade_dsn: str) -> Iterator[Conn]:
    with psycopg.connect(facade_dsn, autocommit=True) as c:
        yield c


# -- pgqueue's guarantees, where PGMQ would only delete --------------------------------------


def test_a_barrier_member_past_retention_fails_its_barrier_and_the_callback_fires(
    facade: tuple[Conn, str], facade_dsn: str
) -> None:
    conn, maintain = facade
    conn.execute("SELECT pgmq.create_partitioned('work', '10', '0')")
    conn.execute("SELECT pgmq.create('done')")
    with Client.from_dsn(facade_dsn, max_size=1) as client:
        bid = client.fan_out("work", [1, 2, 3], callback_queue="done", callback_message={})
        conn.execute("SELECT pgmq.send_batch('work', array_fill('{}'::jsonb, ARRAY[20]))")
        conn.execute(maintain)
        status = client.barrier_status(bid)
        assert status.state == "fired", status
        assert {r.outcome for r in client.barrier_results(bid)} == {"poisoned"}
        assert len(client.read("done", vt=30, qty=10)) == 1
        reasons = conn.execute(
            "SELECT DISTINCT reason FROM pgqueue.poison p JOIN pgqueue.queue q USING (queue_id)"
            " WHERE q.queue_name = 'work'"
        ).fetchall()
        assert [r[0][:10] for r in reasons] == ["retention:"]


def test_maintenance_from_many_sessions_removes_each_row_once(
    facade: tuple[Conn, str], facade_dsn: str
) -> None:
    conn, _ = facade
    conn.execute("SELECT pgmq.create_partitioned('n', '100', '0')")
    conn.execute("SELECT pgmq.send_batch('n', array_fill('{}'::jsonb, ARRAY[3000]))")
    conn.execute("SELECT pgmq.archive('n', ARRAY(SELECT generate_series(1, 1000))::bigint[])")
    conn.execute("SELECT pgmq.send('n', '{}')")  # the highest id: 3001
    removed: list[int] = []

    def run(_: int) -> None:
        with psycopg.connect(facade_dsn, autocommit=True) as c:
            while True:
                row = c.execute("SELECT pgmq.run_maintenance('n', 50)").fetchone()
                if row is None or row[0] == 0:
                    return
                removed.append(row[0])

    run_threads(6, run)
    # live ids below 3000 went, poisoned (1,999), and archived ones below 1000 (999)
    assert sum(removed) == 1999 + 999
    assert ids(conn, "SELECT msg_id FROM pgmq.q_n ORDER BY 1") == [3000, 3001]
    assert ids(conn, "SELECT count(*) FROM pgqueue.poison") == [1999]
    assert ids(conn, "SELECT msg_id FROM pgmq.a_n") == [1000]


# -- checks, listings, reinstall, import -----------------------------------------------------


@pytest.mark.parametrize(
    ("interval", "retention", "word"),
    [
        ("0", "10", "partition_interval"),
        ("soon", "10", "partition_interval"),
        ("10", "1 day", "retention_interval"),
        ("1 day", "10 apples", "retention_interval"),
    ],
)
def test_intervals_pg_partman_would_refuse_are_refused_and_nothing_is_made(
    facade: tuple[Conn, str], interval: str, retention: str, word: str
) -> None:
    conn, _ = facade
    with pytest.raises(psycopg.errors.InvalidParameterValue) as refused:
        conn.execute("SELECT pgmq.create_partitioned('x', %s, %s)", (interval, retention))
    assert refused.value.diag.message_primary.startswith(word)  # type: ignore[union-attr]
    assert ids(conn, "SELECT count(*) FROM pgmq.list_queues()") == [0]


def test_partitioned_queues_are_listed_as_pgmq_lists_them_and_survive_a_reinstall(
    facade: tuple[Conn, str],
) -> None:
    conn, _ = facade
    conn.execute("SELECT pgmq.create_partitioned('MixedCase', '1 day', '7 days')")
    conn.execute("SELECT pgmq.create('plain')")
    conn.execute("SELECT pgmq.convert_archive_partitioned('plain', '100', '1000')")
    listed = "SELECT queue_name, is_partitioned FROM pgmq.list_queues() ORDER BY 1"
    assert conn.execute(listed).fetchall() == [("MixedCase", True), ("plain", False)]
    metrics = "SELECT queue_name, default_partition_length FROM pgmq.metrics_all() ORDER BY 1"
    assert conn.execute(metrics).fetchall() == [("MixedCase", 0), ("plain", None)]
    before = conn.execute("SELECT * FROM pgmq.partition_config ORDER BY 1").fetchall()
    install(conn)  # a reinstall keeps the facade's tables' rows
    assert conn.execute("SELECT * FROM pgmq.partition_config ORDER BY 1").fetchall() == before
    assert conn.execute(listed).fetchall() == [("MixedCase", True), ("plain", False)]
    conn.execute("SELECT pgmq.drop_queue('MixedCase')")
    assert ids(conn, "SELECT count(*) FROM pgmq.partition_config") == [1]


def test_an_import_of_partitioned_queues_keeps_their_retention(real: tuple[Conn, str]) -> None:
    conn, maintain = real
    conn.execute("SELECT pgmq.create_partitioned('n', '10', '20')")
    conn.execute("SELECT pgmq.create_partitioned('t', '2 hours', '1 day')")
    conn.execute("SELECT pgmq.create('c')")
    conn.execute("SELECT pgmq.convert_archive_partitioned('c', '1 day', '30 days')")
    schema = maintain.split(".")[0].removeprefix("SELECT ")
    # an operator changed pg_partman's retention after creating the queue
    conn.execute(
        f"UPDATE {schema}.part_config SET retention = '15' WHERE parent_table = 'pgmq.q_n'"
    )
    conn.execute("SELECT pgmq.send_batch('n', array_fill('{}'::jsonb, ARRAY[45]))")
    conn.execute("SELECT pgmq.archive('n', ARRAY[1, 2, 3, 30]::bigint[])")
    # where PGMQ's two-hour partitions of 't' start, from the tables' own bounds
    first_t = conn.execute(
        "SELECT min(substring(pg_get_expr(c.relpartbound, c.oid) FROM 'FROM \\(''([^'']+)''\\)')"
        "           ::timestamptz)"
        "  FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = 'pgmq.q_t'::regclass"
    ).fetchone()
    assert first_t is not None and first_t[0] is not None
    with Client.from_dsn(conn.info.dsn, max_size=1) as client:
        client.migrate()
    with psycopg.connect(conn.info.dsn) as c:
        report = import_pgmq(c)
        c.commit()
    assert {q.queue_name: q.retention for q in report.queues} == {
        "c": "archive: partitions of 1 day, retention 30 days",
        "n": "messages: partitions of 10, retention 15; archive: partitions of 10, retention 20",
        "t": "messages: partitions of 02:00:00, retention 1 day;"
        " archive: partitions of 02:00:00, retention 1 day",
    }
    assert any("pgmq.run_maintenance()" in n for n in report.notes)
    rows = conn.execute(
        "SELECT queue_name, partition_interval, retention_interval, archive_interval,"
        " archive_retention FROM pgmq.partition_config ORDER BY 1"
    ).fetchall()
    assert rows == [
        ("c", None, None, "1 day", "30 days"),
        ("n", "10", "15", "10", "20"),
        ("t", "02:00:00", "1 day", "02:00:00", "1 day"),
    ]
    anchor = conn.execute("SELECT anchor FROM pgmq.partition_config WHERE queue_name = 't'")
    assert anchor.fetchone() == (first_t[0],)
    assert ids(conn, f"SELECT count(*) FROM {schema}.part_config") == [0]
    # what pg_partman would have dropped goes: live ids below 30, archived below 10
    assert conn.execute("SELECT pgmq.run_maintenance()").fetchone() == (29,)
    assert ids(conn, "SELECT msg_id FROM pgmq.q_n ORDER BY 1") == list(range(31, 46))
    assert ids(conn, "SELECT msg_id FROM pgmq.a_n ORDER BY 1") == [30]


def test_maintenance_racing_readers_counts_each_member_once_and_fires_once(
    facade: tuple[Conn, str], facade_dsn: str
) -> None:
    # Readers lease and ack a fan-out's members while maintainers poison-drop the ones
    # past retention (all but the newest partition): each member ends once, acked or
    # poisoned, never both, and the barrier fires once with every member counted.
    conn, _ = facade
    conn.execute("SELECT pgmq.create_partitioned('work', '10', '0')")
    conn.execute("SELECT pgmq.create('done')")
    with Client.from_dsn(facade_dsn, max_size=1) as client:
        bid = client.fan_out("work", list(range(300)), callback_queue="done", callback_message={})
    acked: list[int] = []

    def read(c: Conn) -> None:
        while got := ids(c, "SELECT msg_id FROM pgmq.read('work', 30, 7)"):
            for msg_id in got:
                done = c.execute("SELECT pgmq.delete('work', %s::bigint)", (msg_id,)).fetchone()
                if done == (True,):
                    acked.append(msg_id)

    def maintain(c: Conn) -> None:
        for _ in range(40):
            c.execute("SELECT pgmq.run_maintenance('work', 5)")

    def run(i: int) -> None:  # 4 readers, 2 maintainers
        with psycopg.connect(facade_dsn, autocommit=True) as c:
            (read if i < 4 else maintain)(c)

    run_threads(6, run)
    poisoned = ids(conn, "SELECT msg_id FROM pgqueue.poison ORDER BY 1")
    assert not set(acked) & set(poisoned)
    assert len(acked) + len(poisoned) == 300
    with Client.from_dsn(facade_dsn, max_size=1) as client:
        status = client.barrier_status(bid)
        assert (status.state, status.succeeded, status.failed) == (
            "fired",
            len(acked),
            len(poisoned),
        )
        assert len(client.read("done", vt=30, qty=10)) == 1


def test_only_the_operator_makes_partitioned_queues_and_keeps_them(
    dsn: str, make_login: Callable[..., str]
) -> None:
    # A producer or consumer that could call run_maintenance with its own queue's name
    # would poison-drop what it pleases; none may, nor read the configuration.
    with psycopg.connect(dsn, autocommit=True) as owner:
        install(owner)
        partman(owner)
    logins = {role: make_login(role.removeprefix("pgqueue_"), role) for role in ROLES}
    for role, login in logins.items():
        with psycopg.connect(as_user(dsn, login), autocommit=True) as c:
            allowed = role == OPERATOR
            for statement in (
                "SELECT pgmq.create_partitioned('p', '10', '0')",
                "SELECT pgmq.convert_archive_partitioned('p', '10', '0')",
                "SELECT pgmq.run_maintenance()",
                "SELECT * FROM pgmq.partition_config",
            ):
                try:
                    c.execute(statement)
                    done = True
                except psycopg.errors.InsufficientPrivilege:
                    done = False
                assert done == (allowed and "partition_config" not in statement), (role, statement)
