"""The pgmq facade in SQL (sql/pgmq/10_facade.sql): PGMQ 1.13's functions over pgqueue's queues.

Every function is called in each of its overloads on a real server, each test
in a database of its own. One queue, two APIs: what one API sends, the other
reads; views and queues stay in step whichever API creates or drops them.
The differential tests hold the facade's signatures, types and result columns
against real PGMQ installed from the `pgmq` package's own pgmq.sql.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb
from support.pgmq import queue_views as views

from pgqueue._pgmq import install

# PGMQ's topic functions: another file of the facade (20_topics.sql).
TOPICS = {
    "bind_topic",
    "unbind_topic",
    "send_topic",
    "send_batch_topic",
    "list_topic_bindings",
    "test_routing",
    "validate_routing_key",
    "validate_topic_pattern",
}

Conn = psycopg.Connection[Any]


@pytest.fixture
def facade(facade_dsn: str) -> str:
    """A fresh migrated database of this test's own with the facade installed."""
    return facade_dsn


@pytest.fixture
def conn(facade: str) -> Iterator[Conn]:
    """An autocommit connection to the facade's database."""
    with psycopg.connect(facade, autocommit=True) as c:
        yield c


def rows(conn: Conn, query: str, *params: Any) -> list[tuple[Any, ...]]:
    return conn.execute(query, params or None).fetchall()


def one(conn: Conn, query: str, *params: Any) -> Any:
    row = conn.execute(query, params or None).fetchone()
    assert row is not None
    return row[0]


def sqlstate(conn: Conn, query: str, *params: Any) -> str | None:
    with pytest.raises(psycopg.Error) as err:
        conn.execute(query, params or None)
    return err.value.sqlstate


def notices(conn: Conn) -> list[tuple[str | None, str | None, str]]:
    """(sqlstate, severity, message) of every notice the connection gets from now on."""
    seen: list[tuple[str | None, str | None, str]] = []

    def keep(d: psycopg.errors.Diagnostic) -> None:  # d is valid during the call only
        seen.append((d.sqlstate, d.severity_nonlocalized, d.message_primary or ""))

    conn.add_notice_handler(keep)
    return seen


def sql_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def pgqueue_row(conn: Conn, queue: str, msg_id: int) -> tuple[Any, ...]:
    row = conn.execute(
        "SELECT m.message, m.headers, m.group_key, m.vt - m.enqueued_at FROM pgqueue.message m"
        " JOIN pgqueue.queue q USING (queue_id) WHERE q.queue_name = %s AND m.msg_id = %s",
        (queue, msg_id),
    ).fetchone()
    assert row is not None
    return row


# --- installing ------------------------------------------------------------


def test_install_makes_views_for_existing_queues_and_reinstalls_after_a_drop(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT pgqueue.create_queue('before', 3)")
        c.execute("SELECT pgqueue.send('before', '{\"n\": 1}')")
        install(c)
        assert views(c) == {"q_before", "a_before"}
        assert rows(c, "SELECT msg_id, message FROM pgmq.q_before") == [(1, {"n": 1})]
        c.execute("DROP SCHEMA pgmq CASCADE")
        # the trigger on pgqueue.queue went with the schema: queues still work
        c.execute("SELECT pgqueue.create_queue('between')")
        c.execute("SELECT pgqueue.drop_queue('between')")
        install(c)
        c.execute("SELECT pgmq.create('after')")
        assert views(c) == {"q_before", "a_before", "q_after", "a_after"}
        assert (
            one(
                c,
                "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'pgqueue.queue'::regclass"
                " AND tgname = 'pgmq_views'",
            )
            == 1
        )


# --- queues ------------------------------------------------------------------


def test_every_create_makes_a_pgqueue_queue_that_never_poison_drops(conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('plain')")
    conn.execute("SELECT pgmq.create_non_partitioned('nonpart')")
    conn.execute("SELECT pgmq.create_unlogged('unlogged')")
    got = rows(conn, "SELECT queue_name, max_attempts FROM pgqueue.queue ORDER BY queue_name")
    assert got == [("nonpart", 2147483647), ("plain", 2147483647), ("unlogged", 2147483647)]
    assert rows(conn, "SELECT * FROM pgmq.list_queues()") == [
        (n, False, False, c)
        for n, c in rows(conn, "SELECT queue_name, created_at FROM pgqueue.queue ORDER BY queue_id")
    ]
    conn.execute("SELECT pgmq.create('plain')")  # again: a no-op
    assert one(conn, "SELECT count(*) FROM pgqueue.queue") == 3


def test_create_leaves_an_existing_pgqueue_queue_as_it_is(conn: Conn) -> None:
    conn.execute("SELECT pgqueue.create_queue('jobs', 4)")
    conn.execute("SELECT pgmq.create('jobs')")
    conn.execute("SELECT pgmq.create_unlogged('jobs')")
    assert one(conn, "SELECT max_attempts FROM pgqueue.queue WHERE queue_name = 'jobs'") == 4


def test_mixed_case_names_are_one_lowercase_queue_as_in_pgmq(conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('MyQueue')")
    conn.execute("SELECT pgmq.create('myqueue')")  # the same queue: PGMQ's tables are lowercase
    assert rows(conn, "SELECT queue_name FROM pgqueue.queue") == [("myqueue",)]
    assert rows(conn, "SELECT queue_name FROM pgmq.list_queues()") == [("MyQueue",)]
    assert rows(conn, "SELECT queue_name FROM pgmq.meta") == [("MyQueue",)]
    mid = one(conn, "SELECT * FROM pgmq.send('MyQueue', %s)", Jsonb({"a": 1}))
    assert [r[0] for r in rows(conn, "SELECT * FROM pgmq.read('MYQUEUE', 30, 5)")] == [mid]
    assert one(conn, "SELECT pgmq.format_table_name('MyQueue', 'q')") == "q_myqueue"
    assert views(conn) == {"q_myqueue", "a_myqueue"}
    assert one(conn, "SELECT queue_name FROM pgmq.metrics_all()") == "MyQueue"
    assert one(conn, "SELECT pgmq.drop_queue('myQUEUE')") is True
    assert rows(conn, "SELECT * FROM pgmq.queue_name_map") == []


CELERY_NAMES = [
    "celery@worker-1.example.com.celery.pidbox",
    "3f2a9c1e-aaaa-bbbb-cccc-1234567890ab.reply.cel",
    "celeryev.3f2a9c1e-aaaa-bbbb-cccc-123456789",
    "my-queue",
    "1queue",
    'q"x',
    "Caf\u00e9 Queue",
]


@pytest.mark.parametrize("name", CELERY_NAMES)
def test_a_name_pgqueue_cannot_hold_stands_for_a_queue_derived_from_it(
    conn: Conn, name: str
) -> None:
    conn.execute("SELECT pgmq.validate_queue_name(%s)", (name,))
    conn.execute("SELECT pgmq.create(%s)", (name,))
    conn.execute("SELECT pgmq.create_unlogged(%s)", (name,))  # again: the same queue
    (queue,) = rows(conn, "SELECT queue_name FROM pgqueue.queue")
    assert re.fullmatch(r"[a-z_][a-z0-9_]{0,47}", queue[0])
    assert one(conn, "SELECT pgmq._name(%s)", name.upper()) == queue[0]
    assert rows(conn, "SELECT queue_name FROM pgmq.list_queues()") == [(name,)]
    assert views(conn) == {"q_" + name.lower(), "a_" + name.lower()}
    mid = one(conn, "SELECT * FROM pgmq.send(%s, '{\"n\": 1}')", name)
    assert one(conn, f"SELECT count(*) FROM pgmq.{sql_ident('q_' + name.lower())}") == 1
    assert [r[0] for r in rows(conn, "SELECT * FROM pgmq.read(%s, 30, 1)", name.upper())] == [mid]
    assert one(conn, "SELECT pgmq.archive(%s, %s::bigint)", name, mid) is True
    assert one(conn, f"SELECT count(*) FROM pgmq.{sql_ident('a_' + name.lower())}") == 1
    assert one(conn, "SELECT queue_name FROM pgmq.metrics(%s)", name) == name
    assert one(conn, "SELECT pgmq.drop_queue(%s)", name) is True
    assert views(conn) == set()
    assert rows(conn, "SELECT * FROM pgmq.queue_name_map") == []


def test_distinct_pgmq_names_reach_distinct_queues(conn: Conn) -> None:
    names = ["a.b", "a-b", "a b", "A.B", "a_b"]
    for name in names:
        conn.execute("SELECT pgmq.create(%s)", (name,))
        one(conn, "SELECT * FROM pgmq.send(%s, %s)", name, Jsonb(name))
    # 'A.B' is 'a.b' (PGMQ lowercases); the others are four queues
    assert one(conn, "SELECT count(*) FROM pgqueue.queue") == 4
    for name in ("a-b", "a b", "a_b"):
        assert rows(conn, "SELECT message FROM pgmq.read(%s, 30, 5)", name) == [(name,)]
    got = sorted(r[0] for r in rows(conn, "SELECT message FROM pgmq.read('a.b', 30, 5)"))
    assert got == ["A.B", "a.b"]


def test_racing_creates_of_one_name_make_one_queue(facade: str, conn: Conn) -> None:
    names = ["Race.Q", "race.q", "RACE.Q", "race.Q"] * 2
    barrier = threading.Barrier(len(names))
    errors: list[BaseException] = []

    def create(name: str) -> None:
        try:
            with psycopg.connect(facade, autocommit=True) as c:
                barrier.wait()
                c.execute("SELECT pgmq.create(%s)", (name,))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=create, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert one(conn, "SELECT count(*) FROM pgqueue.queue") == 1
    assert one(conn, "SELECT count(*) FROM pgmq.queue_name_map") == 1
    assert views(conn) == {"q_race.q", "a_race.q"}


BAD_CHARACTERS = "queue name contains invalid characters: $, ;, --, or \\'"
TOO_LONG = "queue name is too long, maximum length is 47 characters"


@pytest.mark.parametrize(
    "name, code, says",
    [
        # PGMQ's refusals, with PGMQ's error
        ("x; DROP TABLE pgqueue.message", "P0001", BAD_CHARACTERS),
        ("a--b", "P0001", BAD_CHARACTERS),
        ("it's", "P0001", BAD_CHARACTERS),
        ("$x", "P0001", BAD_CHARACTERS),
        ("a" * 48, "P0001", TOO_LONG),
        # pgqueue's own: a queue has a name, and its views' names fit in an identifier
        ("", "22023", "invalid queue name"),
        ("\u00e9" * 31, "22023", "invalid queue name"),
    ],
)
def test_a_name_pgmq_refuses_is_refused_clearly(
    conn: Conn, name: str, code: str, says: str
) -> None:
    for fn in ("create", "create_non_partitioned", "create_unlogged"):
        with pytest.raises(psycopg.Error) as err:
            conn.execute(f"SELECT pgmq.{fn}(%s)", (name,))
        assert err.value.sqlstate == code
        assert err.value.diag.message_primary == says or says in str(err.value)
    # PGMQ's validate_queue_name checks the length alone
    if says == TOO_LONG:
        assert sqlstate(conn, "SELECT pgmq.validate_queue_name(%s)", name) == "P0001"
    else:
        conn.execute("SELECT pgmq.validate_queue_name(%s)", (name,))
    assert one(conn, "SELECT count(*) FROM pgqueue.queue") == 0
    assert one(conn, "SELECT count(*) FROM pgmq.queue_name_map") == 0


def test_pgmq_names_and_their_views_survive_a_reinstall(conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('celery@w.pidbox')")
    conn.execute("SELECT pgmq.create('MyQueue')")
    install(conn)  # an upgrade: the facade replaced, its own rows kept
    got = [r[0] for r in rows(conn, "SELECT queue_name FROM pgmq.list_queues()")]
    assert got == ["celery@w.pidbox", "MyQueue"]
    assert views(conn) == {"q_celery@w.pidbox", "a_celery@w.pidbox", "q_myqueue", "a_myqueue"}
    conn.execute("SELECT * FROM pgmq.send('celery@w.pidbox', '{}')")
    assert one(conn, 'SELECT count(*) FROM pgmq."q_celery@w.pidbox"') == 1


def test_validate_queue_name_accepts_what_pgmq_accepts(conn: Conn) -> None:
    for name in ("a", "Orders_2", "_x", "a" * 47, "\u00e9" * 30, "a.b@c d"):
        conn.execute("SELECT pgmq.validate_queue_name(%s)", (name,))
    # a pgqueue queue of 48 characters, too long to create through PGMQ, is reached all the same
    conn.execute("SELECT pgqueue.create_queue(%s)", ("b" * 48,))
    mid = one(conn, "SELECT * FROM pgmq.send(%s, '{}')", "B" * 48)
    assert [r[0] for r in rows(conn, "SELECT * FROM pgmq.pop(%s)", "b" * 48)] == [mid]


def test_format_table_name_is_pgmqs(conn: Conn) -> None:
    assert one(conn, "SELECT pgmq.format_table_name('Jobs', 'a')") == "a_jobs"
    assert sqlstate(conn, "SELECT pgmq.format_table_name('a;b', 'q')") == "P0001"
    assert sqlstate(conn, "SELECT pgmq.format_table_name('a--b', 'q')") == "P0001"


def test_partitioned_queues_fail_as_on_pgmq_without_pg_partman(conn: Conn) -> None:
    # without pg_partman in the database, PGMQ's own error
    for query in (
        "SELECT pgmq.create_partitioned('p')",
        "SELECT pgmq.create_partitioned('p', '1 day', '7 days', 2)",
    ):
        with pytest.raises(psycopg.errors.RaiseException) as raised:
            conn.execute(query)
        assert raised.value.diag.message_primary == "pg_partman is required for partitioned queues"
    # converting an archive: PGMQ's notice for a queue that does not exist, and
    # without pg_partman PGMQ's failure (22004) for one that does
    conn.execute("SELECT pgmq.convert_archive_partitioned('p')")
    conn.execute("SELECT pgmq.create('c')")
    for query in (
        "SELECT pgmq.convert_archive_partitioned('c')",
        "SELECT pgmq.convert_archive_partitioned('c', '10000', '100000', 10)",
    ):
        assert sqlstate(conn, query) == "22004"
    assert one(conn, "SELECT count(*) FROM pgqueue.queue WHERE queue_name = 'p'") == 0


def test_drop_purge_detach_and_fifo_indexes(conn: Conn) -> None:
    seen = notices(conn)
    conn.execute("SELECT pgmq.create('d')")
    conn.execute(
        "SELECT * FROM pgmq.send_batch('d', %s::jsonb[])", ([Jsonb({"i": i}) for i in range(3)],)
    )
    assert one(conn, "SELECT pgmq.purge_queue('d')") == 3
    assert one(conn, "SELECT pgmq.purge_queue('d')") == 0
    conn.execute("SELECT pgmq.detach_archive('d')")
    conn.execute("SELECT pgmq.create_fifo_index('d')")
    conn.execute("SELECT pgmq.create_fifo_indexes_all()")
    assert sqlstate(conn, "SELECT pgmq.create_fifo_index('nope')") == "42P01"
    assert one(conn, "SELECT pgmq.drop_queue('d')") is True
    assert one(conn, "SELECT pgmq.drop_queue('d')") is False
    conn.execute("SELECT pgmq.create('d2')")
    assert one(conn, "SELECT pgmq.drop_queue('d2', false)") is True
    assert one(conn, "SELECT pgmq.drop_queue('d2', true)") is True  # as PGMQ's: always true
    assert any(s == "WARNING" and "detach_archive" in m for _c, s, m in seen)
    assert any(s == "WARNING" and "deprecated" in m and "drop_queue" in m for _c, s, m in seen)
    assert any(s == "NOTICE" and "does not exist" in m for _c, s, m in seen)
    assert one(conn, "SELECT count(*) FROM pgqueue.queue") == 0


def test_acquire_queue_lock_holds_until_commit(facade: str, conn: Conn) -> None:
    with psycopg.connect(facade) as other:
        other.execute("SELECT pgmq.acquire_queue_lock('q')")
        got = one(
            conn,
            "SELECT pg_try_advisory_xact_lock(hashtext('pgmq.queue_q'))",
        )
        assert got is False
        other.rollback()
    assert one(conn, "SELECT pg_try_advisory_xact_lock(hashtext('pgmq.queue_q'))") is True


# --- views ---------------------------------------------------------------------


def test_views_follow_queues_created_and_dropped_through_either_api(conn: Conn) -> None:
    conn.execute("SELECT pgqueue.create_queue('by_pgqueue')")
    conn.execute("SELECT pgmq.create('by_pgmq')")
    assert views(conn) == {"q_by_pgqueue", "a_by_pgqueue", "q_by_pgmq", "a_by_pgmq"}
    assert rows(conn, "SELECT queue_name FROM pgmq.meta ORDER BY 1") == [
        ("by_pgmq",),
        ("by_pgqueue",),
    ]
    conn.execute("SELECT pgmq.drop_queue('by_pgqueue')")
    assert views(conn) == {"q_by_pgmq", "a_by_pgmq"}
    conn.execute("SELECT pgqueue.drop_queue('by_pgmq')")
    assert views(conn) == set()
    assert rows(conn, "SELECT * FROM pgmq.meta") == []


def test_a_rolled_back_create_leaves_no_view(conn: Conn) -> None:
    with pytest.raises(psycopg.errors.RaiseException), conn.transaction():
        conn.execute("SELECT pgmq.create('gone')")
        assert views(conn) == {"q_gone", "a_gone"}
        conn.execute("DO $$ BEGIN RAISE EXCEPTION 'roll back'; END $$")
    assert views(conn) == set()


def test_views_show_live_and_archived_messages_with_pgmqs_columns(conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('v')")
    conn.execute("SELECT pgmq.create('other')")
    conn.execute("SELECT * FROM pgmq.send('other', '{}')")
    ids = [
        r[0]
        for r in rows(conn, "SELECT * FROM pgmq.send_batch('v', %s::jsonb[])", [Jsonb(1), Jsonb(2)])
    ]
    conn.execute("SELECT * FROM pgmq.read('v', 30, 1)")
    conn.execute("SELECT pgmq.archive('v', %s::bigint)", (ids[0],))
    cur = conn.execute("SELECT * FROM pgmq.q_v")
    assert [d.name for d in cur.description or []] == [
        "msg_id", "read_ct", "enqueued_at", "last_read_at", "vt", "message", "headers",
    ]  # fmt: skip
    assert [(r[0], r[1], r[3], r[5]) for r in cur.fetchall()] == [(ids[1], 0, None, 2)]
    cur = conn.execute("SELECT * FROM pgmq.a_v")
    assert [d.name for d in cur.description or []] == [
        "msg_id", "read_ct", "enqueued_at", "last_read_at", "archived_at", "vt", "message",
        "headers",
    ]  # fmt: skip
    (archived,) = cur.fetchall()
    assert archived[0] == ids[0] and archived[1] == 1 and archived[3] is not None
    assert archived[4] is not None and archived[6] == 1


def test_a_hostile_queue_name_reaches_the_views_quoted(conn: Conn) -> None:
    # pgqueue.create_queue refuses such names; an owner's direct insert is the only way in
    name = 'x"; DROP TABLE pgqueue.message; --'
    conn.execute(
        "INSERT INTO pgqueue.queue (queue_id, queue_name, max_attempts, msg_seq)"
        " VALUES (999, %s, 1, 'pgqueue.queue_id_seq')",
        (name,),
    )
    assert views(conn) == {"q_" + name.lower(), "a_" + name.lower()}
    assert one(conn, "SELECT to_regclass('pgqueue.message') IS NOT NULL") is True
    conn.execute("DELETE FROM pgqueue.queue WHERE queue_id = 999")
    assert views(conn) == set()


# --- sending -------------------------------------------------------------------


def test_send_in_all_six_forms(conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('s')")
    msg, hdr = Jsonb({"k": "v"}), Jsonb({"x-pgmq-group": "g", "h": 1})
    soon = one(conn, "SELECT clock_timestamp() + interval '5 seconds'")
    base = "SELECT * FROM pgmq.send(queue_name=>%s, msg=>%s"
    calls = [
        (base + ")", (msg,), None, None, 0),
        (base + ", headers=>%s)", (msg, hdr), hdr.obj, "g", 0),
        (base + ", delay=>%s::integer)", (msg, 7), None, None, 7),
        (base + ", delay=>%s::timestamptz)", (msg, soon), None, None, 5),
        (base + ", headers=>%s, delay=>%s::integer)", (msg, hdr, 3), hdr.obj, "g", 3),
        (base + ", headers=>%s, delay=>%s::timestamptz)", (msg, hdr, soon), hdr.obj, "g", 5),
    ]
    for query, params, headers, group, delay in calls:
        got = rows(conn, query, "s", *params)
        assert len(got) == 1
        message, stored_headers, group_key, hidden = pgqueue_row(conn, "s", got[0][0])
        assert (message, stored_headers, group_key) == ({"k": "v"}, headers, group)
        # a timestamp delay is whole seconds from now, rounded up: never early
        assert hidden == timedelta(seconds=delay)
    # positional forms resolve as in PGMQ
    assert one(conn, "SELECT * FROM pgmq.send('s', '{}'::jsonb, 0)") == 7


def test_a_timestamp_delay_is_rounded_up_and_a_past_one_is_now(conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('t')")
    a = one(conn, "SELECT * FROM pgmq.send('t', '1', clock_timestamp() + interval '1.2 seconds')")
    b = one(conn, "SELECT * FROM pgmq.send('t', '2', clock_timestamp() - interval '1 hour')")
    c = one(conn, "SELECT * FROM pgmq.send('t', '3', 'infinity'::timestamptz)")
    assert pgqueue_row(conn, "t", a)[3] == timedelta(seconds=2)
    assert pgqueue_row(conn, "t", b)[3] == timedelta(0)
    assert pgqueue_row(conn, "t", c)[3] == timedelta(seconds=2147483647)
    assert [r[0] for r in rows(conn, "SELECT * FROM pgmq.read('t', 30, 5)")] == [b]


def test_send_batch_in_all_six_forms(conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('b')")
    msgs = [Jsonb({"i": 1}), Jsonb({"i": 2})]
    hdrs = [Jsonb({"x-pgmq-group": "g1"}), Jsonb({"other": True})]
    soon = one(conn, "SELECT clock_timestamp() + interval '4 seconds'")
    base = "SELECT * FROM pgmq.send_batch(queue_name=>%s, msgs=>%s::jsonb[]"
    calls = [
        (base + ")", (msgs,), None, 0),
        (base + ", headers=>%s::jsonb[])", (msgs, hdrs), hdrs, 0),
        (base + ", delay=>%s::integer)", (msgs, 6), None, 6),
        (base + ", delay=>%s::timestamptz)", (msgs, soon), None, 4),
        (base + ", headers=>%s::jsonb[], delay=>%s::integer)", (msgs, hdrs, 2), hdrs, 2),
        (base + ", headers=>%s::jsonb[], delay=>%s::timestamptz)", (msgs, hdrs, soon), hdrs, 4),
    ]
    for query, params, headers, delay in calls:
        ids = [r[0] for r in rows(conn, query, "b", *params)]
        assert len(ids) == 2 and ids[0] < ids[1]
        for n, mid in enumerate(ids):
            message, stored, group_key, hidden = pgqueue_row(conn, "b", mid)
            assert message == {"i": n + 1}
            assert stored == (headers[n].obj if headers else None)
            assert group_key == ("g1" if headers and n == 0 else None)
            assert hidden == timedelta(seconds=delay)


def test_headers_that_are_not_an_object_are_refused(conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('h')")
    for bad in ("[1]", '"text"', "3", "null"):
        assert sqlstate(conn, "SELECT * FROM pgmq.send('h', '{}', %s::jsonb)", bad) == "22023"
        assert (
            sqlstate(
                conn,
                "SELECT * FROM pgmq.send_batch('h', ARRAY['{}']::jsonb[], ARRAY[%s]::jsonb[])",
                bad,
            )
            == "22023"
        )
    # PGMQ's checks of a batch, with its errors
    assert sqlstate(conn, "SELECT * FROM pgmq.send_batch('h', ARRAY[]::jsonb[])") == "P0001"
    assert (
        sqlstate(
            conn,
            "SELECT * FROM pgmq.send_batch('h', ARRAY['1','2']::jsonb[], ARRAY['{}']::jsonb[])",
        )
        == "P0001"
    )
    assert one(conn, "SELECT count(*) FROM pgqueue.message") == 0


def test_an_unknown_queue_is_pgmqs_error_through_the_facade_and_PGQ01_through_pgqueue(
    conn: Conn,
) -> None:
    for query in (
        "SELECT * FROM pgmq.send('nope', '{}')",
        "SELECT * FROM pgmq.send_batch('nope', ARRAY['{}']::jsonb[])",
        "SELECT * FROM pgmq.read('nope', 30, 1)",
        "SELECT * FROM pgmq.read_with_poll('nope', 30, 1, 1, 10)",
        "SELECT * FROM pgmq.read_grouped('nope', 30, 1)",
        "SELECT * FROM pgmq.pop('nope')",
        "SELECT pgmq.delete('nope', 1::bigint)",
        "SELECT * FROM pgmq.archive('nope', ARRAY[1]::bigint[])",
        "SELECT * FROM pgmq.set_vt('nope', 1::bigint, 5)",
        "SELECT * FROM pgmq.set_vt('nope', ARRAY[1]::bigint[], now())",
        "SELECT * FROM pgmq.metrics('nope')",
        "SELECT pgmq.purge_queue('nope')",
    ):
        with pytest.raises(psycopg.errors.UndefinedTable) as err:
            conn.execute(query)
        assert err.value.diag.message_primary == 'relation "pgmq.q_nope" does not exist', query
    for query in (
        "SELECT pgmq.enable_notify_insert('nope')",
        "SELECT pgmq.update_notify_insert('nope', 5)",
    ):
        with pytest.raises(psycopg.errors.RaiseException) as raised:
            conn.execute(query)
        assert (raised.value.diag.message_primary or "").startswith('Queue "nope" does not exist.')
    # pgqueue's own functions keep pgqueue's error, also inside a caller's function
    for query in (
        "SELECT pgqueue.send('nope', '{}')",
        "SELECT * FROM pgqueue.read('nope', 30, 1)",
        "SELECT pgqueue.metrics('nope')",
    ):
        assert sqlstate(conn, query) == "PGQ01", query


NULL_TIMES = (
    "SELECT * FROM pgmq.send('t', '{}', NULL::integer)",
    "SELECT * FROM pgmq.send('t', '{}', NULL::timestamptz)",
    "SELECT * FROM pgmq.send('t', '{}', '{}'::jsonb, NULL::integer)",
    "SELECT * FROM pgmq.send('t', '{}', '{}'::jsonb, NULL::timestamptz)",
    "SELECT * FROM pgmq.send_batch('t', ARRAY['{}']::jsonb[], NULL::integer)",
    "SELECT * FROM pgmq.send_batch('t', ARRAY['{}']::jsonb[], NULL::timestamptz)",
    "SELECT * FROM pgmq.send_batch('t', ARRAY['{}']::jsonb[], ARRAY['{}']::jsonb[], NULL::integer)",
    "SELECT * FROM pgmq.send_batch('t', ARRAY['{}']::jsonb[], ARRAY['{}']::jsonb[],"
    " NULL::timestamptz)",
    "SELECT * FROM pgmq.read('t', NULL, 1)",
    "SELECT * FROM pgmq.read_with_poll('t', NULL, 1, 1, 10)",
    "SELECT * FROM pgmq.read_grouped('t', NULL, 1)",
    "SELECT * FROM pgmq.read_grouped_rr('t', NULL, 1)",
)


def test_a_null_delay_or_vt_is_refused_as_pgmq_refuses_it(any_pgmq: Conn) -> None:
    """PGMQ fails such a call on its vt column's NOT NULL; the facade says which argument (22004).

    Before, the facade's sends took a NULL delay as 0 and sent at once, and its reads failed
    on the live table's NOT NULL quoting the message.
    """
    conn = any_pgmq
    conn.execute("SELECT pgmq.create('t')")
    (msg_id,) = conn.execute("SELECT * FROM pgmq.send('t', '{}')").fetchone()  # type: ignore[misc]
    facade = one(conn, "SELECT to_regclass('pgqueue.message') IS NOT NULL")
    for query in NULL_TIMES:
        with pytest.raises(psycopg.Error) as caught:
            conn.execute(query)
        if facade:
            assert caught.value.sqlstate == "22004", (query, caught.value)
            message = caught.value.diag.message_primary or ""
            assert re.fullmatch(r"(delay|vt) must not be NULL", message), (query, message)
    assert rows(conn, "SELECT msg_id, read_ct FROM pgmq.q_t") == [(msg_id, 0)]


# --- one queue, two APIs -----------------------------------------------------------


def test_what_one_api_sends_the_other_reads(conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('both')")
    a = one(conn, "SELECT * FROM pgmq.send('both', '{\"from\": \"pgmq\"}', '{\"x\": 1}'::jsonb)")
    got = rows(conn, "SELECT msg_id, read_ct, message, headers FROM pgqueue.read('both', 30, 5)")
    assert got == [(a, 1, {"from": "pgmq"}, {"x": 1})]
    assert one(conn, "SELECT pgqueue.delete('both', %s::bigint)", a) is True
    b = one(conn, "SELECT pgqueue.send('both', '{\"from\": \"pgqueue\"}', group_key => 'g')")
    got = rows(conn, "SELECT msg_id, read_ct, message, headers FROM pgmq.read('both', 30, 5)")
    assert got == [(b, 1, {"from": "pgqueue"}, None)]
    assert one(conn, "SELECT pgmq.delete('both', %s::bigint)", b) is True
    assert one(conn, "SELECT count(*) FROM pgqueue.message") == 0


# --- reading -------------------------------------------------------------------


def test_read_leases_with_last_read_at_and_conditional_filters(conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('r')")
    ids = [
        one(conn, "SELECT * FROM pgmq.send('r', %s)", Jsonb(m))
        for m in ({"kind": "a", "n": 1}, {"kind": "b", "n": 2}, {"kind": "a", "n": 3})
    ]
    got = rows(conn, "SELECT * FROM pgmq.read('r', 30, 10, '{\"kind\": \"a\"}')")
    assert [r[0] for r in got] == [ids[0], ids[2]]
    for _id, read_ct, enqueued_at, last_read_at, vt, _m, _h in got:
        assert read_ct == 1 and last_read_at is not None and last_read_at > enqueued_at
        assert timedelta(seconds=29) < vt - last_read_at <= timedelta(seconds=30)
    # '{}' and NULL filter nothing
    assert [r[0] for r in rows(conn, "SELECT * FROM pgmq.read('r', 30, 10, '{}')")] == [ids[1]]
    conn.execute("SELECT * FROM pgmq.set_vt('r', %s::bigint[], 0)", (ids,))
    assert len(rows(conn, "SELECT * FROM pgmq.read('r', 30, 10, NULL)")) == 3
    conn.execute("SELECT * FROM pgmq.set_vt('r', %s::bigint[], 0)", (ids,))
    assert len(rows(conn, "SELECT * FROM pgmq.read(queue_name=>'r', vt=>30, qty=>2)")) == 2
    # a negative vt is PGMQ's lease that ends in the past: visible again at once
    assert len(rows(conn, "SELECT * FROM pgmq.read('r', -1, 1)")) == 1
    # PGMQ's reads take qty as a LIMIT: a negative one is the server's 2201W
    assert sqlstate(conn, "SELECT * FROM pgmq.read('r', 30, -1)") == "2201W"
    assert sqlstate(conn, "SELECT * FROM pgmq.read('r', 1, -1)") == "2201W"


def test_read_with_poll_waits_for_a_delayed_message_and_gives_up_at_the_deadline(
    conn: Conn,
) -> None:
    conn.execute("SELECT pgmq.create('p')")
    started = time.monotonic()
    assert rows(conn, "SELECT * FROM pgmq.read_with_poll('p', 30, 1, 1, 50)") == []
    # gave up at its 1 s, not PGMQ's default 5 s: the room is for a loaded machine
    assert 0.9 < time.monotonic() - started < 4.5
    mid = one(conn, "SELECT * FROM pgmq.send('p', '{\"a\": 1}', 1)")
    started = time.monotonic()
    got = rows(conn, "SELECT * FROM pgmq.read_with_poll(queue_name=>'p', vt=>30, qty=>5)")
    assert [r[0] for r in got] == [mid]
    # at the message's 1 s, not at the default deadline of 5 s (the room is for load)
    assert time.monotonic() - started < 4.5
    one(conn, "SELECT * FROM pgmq.send('p', '{\"a\": 2}')")
    c = one(conn, "SELECT * FROM pgmq.send('p', '{\"a\": 3}')")
    got = rows(conn, "SELECT * FROM pgmq.read_with_poll('p', 30, 5, 1, 100, '{\"a\": 3}')")
    assert [r[0] for r in got] == [c]
    assert sqlstate(conn, "SELECT * FROM pgmq.read_with_poll('p', 30, 5, -1)") == "22023"


def test_pop_removes_and_returns(conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('pp')")
    ids = [
        r[0]
        for r in rows(
            conn, "SELECT * FROM pgmq.send_batch('pp', %s::jsonb[])", [Jsonb(i) for i in range(3)]
        )
    ]
    conn.execute("SELECT * FROM pgmq.read('pp', 0, 1)")  # read once: read_ct 1, last_read_at set
    first = rows(conn, "SELECT * FROM pgmq.pop('pp')")
    assert len(first) == 1 and first[0][0] in ids
    rest = rows(conn, "SELECT * FROM pgmq.pop(queue_name=>'pp', qty=>5)")
    got = sorted((r[0], r[1], r[3] is not None, r[5]) for r in first + rest)
    # each as it was: PGMQ's pop is not a read
    assert got == [(ids[0], 1, True, 0), (ids[1], 0, False, 1), (ids[2], 0, False, 2)]
    assert one(conn, "SELECT count(*) FROM pgqueue.message") == 0
    assert one(conn, "SELECT count(*) FROM pgqueue.archive") == 0


def test_a_paused_queue_reads_nothing_and_says_so(facade: str, conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('z')")
    mid = one(conn, "SELECT * FROM pgmq.send('z', '{}')")
    conn.execute("SELECT pgqueue.pause_queue('z')")
    seen = notices(conn)
    assert rows(conn, "SELECT * FROM pgmq.read('z', 30, 1)") == []
    assert rows(conn, "SELECT * FROM pgmq.pop('z')") == []
    assert rows(conn, "SELECT * FROM pgmq.read_grouped('z', 30, 1)") == []
    started = time.monotonic()
    assert rows(conn, "SELECT * FROM pgmq.read_with_poll('z', 30, 1, 1, 50)") == []
    assert time.monotonic() - started > 0.9  # waited like on an empty queue, not a busy loop
    assert [n[0] for n in seen] == ["PGQ11"] * 4
    # a resume during the poll ends the wait
    with psycopg.connect(facade, autocommit=True) as other:
        resumer = threading.Timer(0.3, other.execute, ("SELECT pgqueue.resume_queue('z')",))
        resumer.start()
        started = time.monotonic()
        got = rows(conn, "SELECT * FROM pgmq.read_with_poll('z', 30, 1, 120, 50)")
        resumer.join()
    assert [r[0] for r in got] == [mid]
    # at the resume, not its 120 s deadline: a bound far above what load adds
    assert time.monotonic() - started < 60


# --- poison ---------------------------------------------------------------------


def test_a_pgmq_queue_never_poison_drops_a_pgqueue_limit_does(conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('forever')")
    mid = one(conn, "SELECT * FROM pgmq.send('forever', '{}')")
    for n in range(1, 31):
        got = rows(conn, "SELECT msg_id, read_ct FROM pgmq.read('forever', 0, 1)")
        assert got == [(mid, n)]
    conn.execute("SELECT pgqueue.create_queue('limited', 2)")
    conn.execute("SELECT pgmq.create('limited')")  # keeps max_attempts 2
    lim = one(conn, "SELECT * FROM pgmq.send('limited', '{\"x\": 1}')")
    seen = notices(conn)
    assert [r[0] for r in rows(conn, "SELECT * FROM pgmq.read('limited', 0, 1)")] == [lim]
    assert [r[0] for r in rows(conn, "SELECT * FROM pgmq.read('limited', 0, 1)")] == [lim]
    assert rows(conn, "SELECT * FROM pgmq.read('limited', 0, 1)") == []
    assert [n[0] for n in seen] == ["PGQ10"]
    assert rows(
        conn,
        "SELECT p.msg_id, p.message FROM pgqueue.poison p JOIN pgqueue.queue q USING (queue_id)"
        " WHERE q.queue_name = 'limited'",
    ) == [(lim, {"x": 1})]
    assert one(conn, "SELECT count(*) FROM pgmq.q_limited") == 0


# --- acks and leases --------------------------------------------------------------


def test_delete_and_archive_single_and_many(conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('a')")
    ids = [
        r[0]
        for r in rows(
            conn, "SELECT * FROM pgmq.send_batch('a', %s::jsonb[])", [Jsonb(i) for i in range(6)]
        )
    ]
    assert one(conn, "SELECT pgmq.delete('a', %s::bigint)", ids[0]) is True
    assert one(conn, "SELECT pgmq.delete('a', %s::bigint)", ids[0]) is False
    assert (
        sorted(
            r[0]
            for r in rows(
                conn, "SELECT * FROM pgmq.delete('a', %s::bigint[])", [ids[1], ids[2], 999]
            )
        )
        == ids[1:3]
    )
    assert one(conn, "SELECT pgmq.archive('a', %s::bigint)", ids[3]) is True
    assert one(conn, "SELECT pgmq.archive('a', %s::bigint)", ids[3]) is False
    assert (
        sorted(
            r[0]
            for r in rows(
                conn, "SELECT * FROM pgmq.archive('a', %s::bigint[])", [ids[4], ids[5], 999]
            )
        )
        == ids[4:]
    )
    assert [r[0] for r in rows(conn, "SELECT msg_id FROM pgmq.a_a ORDER BY 1")] == ids[3:]
    assert one(conn, "SELECT count(*) FROM pgmq.q_a") == 0


def test_set_vt_in_all_four_forms(conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('vt')")
    ids = [
        r[0]
        for r in rows(
            conn, "SELECT * FROM pgmq.send_batch('vt', %s::jsonb[])", [Jsonb(i) for i in range(3)]
        )
    ]
    leased = {r[0]: r[3] for r in rows(conn, "SELECT * FROM pgmq.read('vt', 30, 3)")}
    got = rows(
        conn,
        "SELECT * FROM pgmq.set_vt(queue_name=>'vt', msg_id=>%s::bigint, vt=>%s::integer)",
        ids[0],
        100,
    )
    assert len(got) == 1 and got[0][0] == ids[0] and got[0][1] == 1
    assert got[0][3] == leased[ids[0]]  # last_read_at is the read's, untouched
    assert (
        timedelta(seconds=99)
        < got[0][4] - one(conn, "SELECT clock_timestamp()")
        <= timedelta(seconds=100)
    )
    at = one(conn, "SELECT clock_timestamp() + interval '1 hour'")
    got = rows(conn, "SELECT * FROM pgmq.set_vt('vt', %s::bigint, %s::timestamptz)", ids[1], at)
    assert [(r[0], r[4]) for r in got] == [(ids[1], at)]
    got = rows(
        conn,
        "SELECT * FROM pgmq.set_vt('vt', %s::bigint[], %s::timestamptz)",
        [ids[2], ids[1], 999],
        at,
    )
    assert sorted(r[0] for r in got) == [ids[1], ids[2]] and {r[4] for r in got} == {at}
    # a vt in the past makes the messages visible at once
    got = rows(conn, "SELECT * FROM pgmq.set_vt('vt', %s::bigint[], %s::integer)", ids, -60)
    assert sorted(r[0] for r in got) == ids
    assert sorted(r[0] for r in rows(conn, "SELECT * FROM pgmq.read('vt', 30, 10)")) == ids
    assert rows(conn, "SELECT * FROM pgmq.set_vt('vt', 999::bigint, 5)") == []
    assert sqlstate(conn, "SELECT * FROM pgmq.set_vt('vt', 1::bigint, NULL::integer)") == "22004"


# --- metrics ----------------------------------------------------------------------


def test_metrics_and_metrics_all(conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('m1')")
    conn.execute("SELECT pgqueue.create_queue('m2')")
    conn.execute(
        "SELECT * FROM pgmq.send_batch('m1', %s::jsonb[])", ([Jsonb(i) for i in range(4)],)
    )
    conn.execute("SELECT * FROM pgmq.send('m1', '{}', 60)")
    conn.execute("SELECT * FROM pgmq.pop('m1', 2)")
    cur = conn.execute("SELECT * FROM pgmq.metrics('m1')")
    assert [d.name for d in cur.description or []] == [
        "queue_name", "queue_length", "newest_msg_age_sec", "oldest_msg_age_sec", "total_messages",
        "scrape_time", "queue_visible_length", "default_partition_length",
    ]  # fmt: skip
    name, length, newest, oldest, total, _at, visible, partition = cur.fetchone() or ()
    assert (name, length, total, visible, partition) == ("m1", 3, 5, 2, None)
    assert newest == 0 and oldest == 0
    got = rows(conn, "SELECT queue_name, queue_length, total_messages FROM pgmq.metrics_all()")
    assert got == [("m1", 3, 5), ("m2", 0, 0)]


# --- notify on insert --------------------------------------------------------------


SENTINEL = "test.sentinel"


def drain(listener: Conn) -> list[str]:
    """The channels notified to `listener` before a sentinel notified now.

    Notifications arrive in commit order: every one that a statement before
    this made comes first. So all of them are in (and "none" is known) when
    the sentinel comes, not guessed from a quiet second a loaded machine fills.
    """
    listener.execute(f'LISTEN "{SENTINEL}"')
    with psycopg.connect(listener.info.dsn, autocommit=True) as other:
        other.execute(f'NOTIFY "{SENTINEL}"')
    got: list[str] = []
    for n in listener.notifies(timeout=60):
        if n.channel == SENTINEL:
            return got
        got.append(n.channel)
    raise AssertionError(f"the sentinel never came (got {got})")


@pytest.fixture(params=["facade", "real"])
def any_pgmq(request: pytest.FixtureRequest) -> Iterator[Conn]:
    """An autocommit connection to the facade, then to real PGMQ: the notify tests run on both."""
    dsn = request.getfixturevalue("facade" if request.param == "facade" else "real_pgmq_dsn")
    with psycopg.connect(str(dsn), autocommit=True) as c:
        yield c


def test_notify_insert_on_pgmqs_own_channel(any_pgmq: Conn) -> None:
    conn = any_pgmq
    conn.execute("SELECT pgmq.create('n')")
    with psycopg.connect(conn.info.dsn, autocommit=True) as listener:
        listener.execute('LISTEN "pgmq.q_n.INSERT"')
        conn.execute("SELECT pgmq.enable_notify_insert('n', 0)")
        conn.execute("SELECT * FROM pgmq.send('n', '{}')")
        conn.execute("SELECT * FROM pgmq.send_batch('n', ARRAY['1', '2']::jsonb[])")
        assert drain(listener) == ["pgmq.q_n.INSERT"] * 2
        assert rows(
            conn, "SELECT queue_name, throttle_interval_ms FROM pgmq.list_notify_insert_throttles()"
        ) == [("n", 0)]
        # throttled: of quick sends, only the first notifies (a minute's throttle: the
        # four are quick on a loaded machine too)
        conn.execute("SELECT pgmq.update_notify_insert('n', 60000)")
        for _ in range(4):
            conn.execute("SELECT * FROM pgmq.send('n', '{}')")
        assert drain(listener) == ["pgmq.q_n.INSERT"]
        (row,) = rows(conn, "SELECT * FROM pgmq.list_notify_insert_throttles()")
        assert row[:2] == ("n", 60000) and row[2].year > 2000
        conn.execute("SELECT pgmq.enable_notify_insert('n')")  # default throttle
        assert rows(
            conn, "SELECT throttle_interval_ms FROM pgmq.list_notify_insert_throttles()"
        ) == [(250,)]
        conn.execute("SELECT pgmq.disable_notify_insert('n')")
        assert rows(conn, "SELECT * FROM pgmq.list_notify_insert_throttles()") == []
        conn.execute("SELECT * FROM pgmq.send('n', '{}')")
        assert drain(listener) == []
        with pytest.raises(psycopg.Error):
            conn.execute("SELECT pgmq.update_notify_insert('n', 10)")  # not enabled
        with pytest.raises(psycopg.Error):
            conn.execute("SELECT pgmq.enable_notify_insert('n', -1)")


def test_notify_reaches_pgmq_listeners_on_sends_through_pgqueue(conn: Conn) -> None:
    conn.execute("SELECT pgqueue.create_queue('pq')")
    conn.execute("SELECT pgmq.enable_notify_insert('pq', 0)")
    with psycopg.connect(conn.info.dsn, autocommit=True) as listener:
        listener.execute('LISTEN "pgmq.q_pq.INSERT"')
        conn.execute("SELECT pgqueue.send('pq', '{}', delay => 5)")
        assert drain(listener) == ["pgmq.q_pq.INSERT"]
    assert sqlstate(conn, "SELECT pgmq.update_notify_insert('pq', -5)") == "P0001"
    conn.execute("SELECT pgmq.disable_notify_insert('pq')")
    assert sqlstate(conn, "SELECT pgmq.update_notify_insert('pq', 5)") == "P0001"


# --- privileges -------------------------------------------------------------------


def roles_exist(conn: Conn) -> bool:
    return bool(one(conn, "SELECT count(*) = 3 FROM pg_roles WHERE rolname LIKE 'pgqueue\\_%'"))


def test_pgqueues_roles_get_their_share_and_public_nothing(conn: Conn) -> None:
    if not roles_exist(conn):
        pytest.skip("pgqueue's roles do not exist on this server")
    conn.execute("SELECT pgmq.create('sec')")

    def may(role: str, fn: str) -> bool:
        return bool(one(conn, "SELECT has_function_privilege(%s, %s, 'EXECUTE')", role, fn))

    producer, consumer, operator = "pgqueue_producer", "pgqueue_consumer", "pgqueue_operator"
    assert may(producer, "pgmq.send(text,jsonb)") and may(producer, "pgmq.send_batch(text,jsonb[])")
    assert not may(producer, "pgmq.read(text,integer,integer,jsonb)")
    assert may(consumer, "pgmq.read(text,integer,integer,jsonb)")
    assert may(consumer, "pgmq.set_vt(text,bigint[],timestamptz)")
    assert may(consumer, "pgmq.archive(text,bigint)")
    assert not may(consumer, "pgmq.create(text)") and not may(consumer, "pgmq.purge_queue(text)")
    assert may(operator, "pgmq.create(text)") and may(operator, "pgmq.drop_queue(text)")
    assert not may(operator, "pgmq._create(text)")
    public = rows(
        conn,
        "SELECT p.oid::regprocedure::text FROM pg_proc p"
        " WHERE p.pronamespace = 'pgmq'::regnamespace"
        " AND has_function_privilege('public', p.oid, 'EXECUTE')",
    )
    assert public == []
    # the queue's views are a peek (the operator's); the queue list is everyone's who reads
    for view, readers in (
        ("pgmq.meta", (consumer, operator)),
        ("pgmq.q_sec", (operator,)),
        ("pgmq.a_sec", (operator,)),
    ):
        for role in (producer, consumer, operator):
            may_read = one(conn, "SELECT has_table_privilege(%s, %s, 'SELECT')", role, view)
            assert may_read is (role in readers), (role, view)
        assert not one(conn, "SELECT has_table_privilege('public', %s, 'SELECT')", view)
    # the operator administers and peeks, and never reads, acks or pops
    for fn in (
        "pgmq.read(text,integer,integer,jsonb)",
        "pgmq.pop(text,integer)",
        "pgmq.delete(text,bigint)",
        "pgmq.archive(text,bigint[])",
        "pgmq.set_vt(text,bigint,integer)",
    ):
        assert not may(operator, fn), fn

    # as each role: a producer sends and may not read; a consumer reads and acks
    conn.execute("SET ROLE pgqueue_producer")
    mid = one(conn, "SELECT * FROM pgmq.send('sec', '{\"r\": 1}')")
    assert sqlstate(conn, "SELECT * FROM pgmq.read('sec', 30, 1)") == "42501"
    conn.execute("RESET ROLE")
    conn.execute("SET ROLE pgqueue_consumer")
    assert [r[0] for r in rows(conn, "SELECT * FROM pgmq.read('sec', 30, 1)")] == [mid]
    assert sqlstate(conn, "SELECT msg_id FROM pgmq.q_sec") == "42501"  # a peek: not a consumer's
    assert one(conn, "SELECT pgmq.archive('sec', %s::bigint)", mid) is True
    assert sqlstate(conn, "SELECT pgmq.drop_queue('sec')") == "42501"
    assert sqlstate(conn, "SELECT count(*) FROM pgqueue.message") == "42501"
    conn.execute("RESET ROLE")
    conn.execute("SET ROLE pgqueue_operator")
    assert [r[0] for r in rows(conn, "SELECT msg_id FROM pgmq.a_sec")] == [mid]
    assert sqlstate(conn, "SELECT * FROM pgmq.read('sec', 30, 1)") == "42501"
    conn.execute("SELECT pgmq.create('made_by_operator')")
    assert views(conn) >= {"q_made_by_operator", "a_made_by_operator"}
    assert one(conn, "SELECT pgmq.drop_queue('made_by_operator')") is True
    conn.execute("RESET ROLE")


# --- against real PGMQ ---------------------------------------------------------------

SIGNATURES = """
    SELECT p.proname, pg_get_function_arguments(p.oid), pg_get_function_result(p.oid)
      FROM pg_proc p
     WHERE p.pronamespace = 'pgmq'::regnamespace AND p.proname NOT LIKE '\\_%'
       AND p.prorettype <> 'trigger'::regtype
"""
TYPES = """
    SELECT t.typname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod)
      FROM pg_type t JOIN pg_attribute a ON a.attrelid = t.typrelid
     WHERE t.typnamespace = 'pgmq'::regnamespace AND t.typtype = 'c' AND a.attnum > 0
       AND t.typname IN ('message_record', 'queue_record', 'metrics_result')
"""
COLUMNS = """
    SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod)
      FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
     WHERE c.relnamespace = 'pgmq'::regnamespace AND c.relname IN ('meta', 'q_same', 'a_same')
       AND a.attnum > 0 AND NOT a.attisdropped
"""


def catalog(dsn: str) -> dict[str, set[tuple[Any, ...]]]:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT pgmq.create('same')")
        return {
            "functions": {r for r in rows(c, SIGNATURES) if r[0] not in TOPICS},
            "types": set(rows(c, TYPES)),
            "columns": set(rows(c, COLUMNS)),
        }


def test_every_pgmq_function_type_and_table_has_pgmqs_exact_shape(
    facade: str, real_pgmq_dsn: str
) -> None:
    real, ours = catalog(real_pgmq_dsn), catalog(facade)
    # the facade's one addition: what keeps partitioned queues (docs/pgmq.md, "Partitioned
    # queues"), where pg_partman's maintenance keeps PGMQ's
    added = {
        (
            "run_maintenance",
            "queue_name text DEFAULT NULL::text, qty integer DEFAULT 10000",
            "bigint",
        )
    }
    for part in ("functions", "types", "columns"):
        assert sorted(real[part] - ours[part]) == [], f"{part} missing or different in the facade"
        extra = ours[part] - real[part] - (added if part == "functions" else set())
        assert sorted(extra) == [], f"{part} only in the facade"
    assert added <= ours["functions"]


CALLS = [
    "SELECT * FROM pgmq.send('same', '{\"a\": 1}', '{\"h\": 1}'::jsonb, 0)",
    "SELECT * FROM pgmq.send_batch('same', ARRAY['{\"b\": 1}', '{\"b\": 2}']::jsonb[])",
    "SELECT * FROM pgmq.read_grouped('same', 30, 1)",
    "SELECT * FROM pgmq.read('same', 30, 1)",
    "SELECT * FROM pgmq.read_with_poll('same', 30, 1, 1, 10)",
    "SELECT * FROM pgmq.set_vt('same', 1::bigint, 0)",
    "SELECT * FROM pgmq.set_vt('same', ARRAY[2]::bigint[], now())",
    "SELECT * FROM pgmq.pop('same')",
    "SELECT pgmq.delete('same', 2::bigint)",
    "SELECT * FROM pgmq.archive('same', ARRAY[3]::bigint[])",
    "SELECT * FROM pgmq.metrics('same')",
    "SELECT * FROM pgmq.metrics_all()",
    "SELECT * FROM pgmq.list_queues()",
    "SELECT * FROM pgmq.list_notify_insert_throttles()",
    "SELECT * FROM pgmq.a_same",
    "SELECT * FROM pgmq.purge_queue('same')",
]


def run_calls(dsn: str) -> list[tuple[list[tuple[str, int]], int]]:
    out = []
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT pgmq.create('same')")
        c.execute("SELECT pgmq.enable_notify_insert('same', 0)")
        for call in CALLS:
            cur = c.execute(call)
            out.append(
                ([(d.name, d.type_code) for d in cur.description or []], len(cur.fetchall()))
            )
    return out


def test_the_same_calls_give_the_same_columns_and_row_counts(
    facade: str, real_pgmq_dsn: str
) -> None:
    real, ours = run_calls(real_pgmq_dsn), run_calls(facade)
    for call, r, f in zip(CALLS, real, ours, strict=True):
        assert f == r, call


def test_message_headers_round_trip_as_pgmq_returns_them(facade: str, real_pgmq_dsn: str) -> None:
    headers = {"x-pgmq-group": "g", "n": [1, 2], "s": "t"}
    got = []
    for target in (real_pgmq_dsn, facade):
        with psycopg.connect(target, autocommit=True) as c:
            c.execute("SELECT pgmq.create('rt')")
            c.execute("SELECT * FROM pgmq.send('rt', %s, %s)", (Jsonb({"m": 1}), Jsonb(headers)))
            (row,) = rows(c, "SELECT msg_id, read_ct, message, headers FROM pgmq.read('rt', 30, 1)")
            got.append(row)
    assert got[0] == got[1] == (1, 1, {"m": 1}, headers)
