"""Writes to PGMQ's tables on the facade: the owner's UPDATE, DELETE and INSERT on pgmq.q_<name>.

PGMQ's own tests and its users' scripts write to a queue's table directly
(`UPDATE pgmq.q_jobs SET vt = ...` to make messages visible again, `DELETE
FROM pgmq.a_jobs WHERE archived_at < ...` to trim an archive). On the facade
each such write is the facade's call that does the same (set_vt, delete,
send), so pgqueue's rules hold: read counts and so poison drops, barriers,
the header rule, and the role model (no role writes the views; the owner
does, as only PGMQ's owner writes its tables).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb
from support.roles import as_user

from pgqueue import Client
from pgqueue._pgmq import install
from pgqueue._roles import CONSUMER, OPERATOR

Conn = psycopg.Connection[Any]


@pytest.fixture
def conn(facade_dsn: str) -> Iterator[Conn]:
    """The owner's autocommit connection to a database with the facade."""
    with psycopg.connect(facade_dsn, autocommit=True) as c:
        yield c


@pytest.fixture
def client(facade_dsn: str) -> Iterator[Client]:
    """pgqueue's own client on the same database."""
    with Client.from_dsn(facade_dsn, max_size=2) as c:
        yield c


def ids(conn: Conn, query: str, *params: Any) -> list[int]:
    return [r[0] for r in conn.execute(query, params or None).fetchall()]


def grouped_reads_after_a_reset(dsn: str) -> list[list[int]]:
    """PGMQ's own pattern: read a queue empty, UPDATE its table's vt to the past, read again."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT pgmq.create('w')")
        c.execute(
            "SELECT * FROM pgmq.send_batch('w', %s::jsonb[])", ([Jsonb(i) for i in range(4)],)
        )
        first = ids(c, "SELECT msg_id FROM pgmq.read('w', 30, 10) ORDER BY msg_id")
        hidden = ids(c, "SELECT msg_id FROM pgmq.read('w', 30, 10)")
        c.execute("UPDATE pgmq.q_w SET vt = clock_timestamp() - interval '1 second'")
        again = ids(c, "SELECT msg_id FROM pgmq.read('w', 30, 10) ORDER BY msg_id")
        counts = ids(c, "SELECT read_ct FROM pgmq.q_w ORDER BY msg_id")
        c.execute("DELETE FROM pgmq.q_w WHERE msg_id = %s", (again[0],))
        c.execute("SELECT pgmq.archive('w', %s::bigint)", (again[1],))
        c.execute("DELETE FROM pgmq.a_w")
        left = ids(c, "SELECT msg_id FROM pgmq.q_w ORDER BY msg_id")
        archived = ids(c, "SELECT count(*) FROM pgmq.a_w")
        return [first, hidden, again, counts, left, archived]


def test_pgmqs_writes_to_its_tables_do_on_the_facade_what_they_do_on_pgmq(
    real_pgmq_dsn: str, facade_dsn: str
) -> None:
    real = grouped_reads_after_a_reset(real_pgmq_dsn)
    assert real == [[1, 2, 3, 4], [], [1, 2, 3, 4], [2, 2, 2, 2], [3, 4], [0]]
    assert grouped_reads_after_a_reset(facade_dsn) == real


def test_an_update_of_vt_leaves_the_read_count_so_poison_drops_still_come(
    conn: Conn, client: Client
) -> None:
    conn.execute("SELECT pgqueue.create_queue('p', max_attempts => 2)")
    (mid,) = ids(conn, "SELECT * FROM pgmq.send('p', '{}')")
    for _ in range(2):
        assert ids(conn, "SELECT msg_id FROM pgmq.read('p', 30, 1)") == [mid]
        conn.execute("UPDATE pgmq.q_p SET vt = clock_timestamp() - interval '1 second'")
    assert ids(conn, "SELECT msg_id FROM pgmq.read('p', 30, 1)") == []  # the third read drops it
    poisoned = client.poison_list("p")
    assert [(p.msg_id, p.read_ct) for p in poisoned] == [(mid, 2)]


def test_a_message_is_as_it_was_sent_only_vt_changes(conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('m')")
    (mid,) = ids(conn, """SELECT * FROM pgmq.send('m', '{"a": 1}'::jsonb, '{"h": 1}'::jsonb)""")
    before = conn.execute("SELECT * FROM pgmq.q_m").fetchall()
    for change in (
        "message = '{}'",
        """headers = '{"_pg_transport": "callback"}'""",
        "read_ct = 5",
        "msg_id = 99",
        "enqueued_at = now()",
    ):
        with pytest.raises(psycopg.errors.FeatureNotSupported) as refused:
            conn.execute(f"UPDATE pgmq.q_m SET {change}")
        assert "only vt can be updated" in str(refused.value), change
    with pytest.raises(psycopg.errors.NullValueNotAllowed):
        conn.execute("UPDATE pgmq.q_m SET vt = NULL")
    assert conn.execute("SELECT * FROM pgmq.q_m").fetchall() == before
    # an update that changes nothing, and one of vt, count the rows they touched
    assert conn.execute("UPDATE pgmq.q_m SET vt = vt").rowcount == 1
    assert conn.execute("UPDATE pgmq.q_m SET vt = now() + interval '1 hour'").rowcount == 1
    assert ids(conn, "SELECT msg_id FROM pgmq.read('m', 30, 1)") == []
    assert conn.execute("UPDATE pgmq.q_m SET vt = now() WHERE msg_id = 12345").rowcount == 0
    assert mid == 1


def test_an_insert_is_a_send_through_the_header_rule(conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('i')")
    row = conn.execute(
        """INSERT INTO pgmq.q_i (message, headers, vt)
           VALUES ('{"n": 1}', '{"x-pgmq-group": "g"}', now()) RETURNING msg_id, read_ct"""
    ).fetchone()
    assert row == (1, 0)
    assert conn.execute("SELECT group_key FROM pgqueue.message").fetchone() == ("g",)
    conn.execute("""INSERT INTO pgmq.q_i (message) VALUES ('{"n": 2}')""")  # vt: now
    with pytest.raises(psycopg.errors.InvalidParameterValue):  # a forged callback, refused
        conn.execute(
            """INSERT INTO pgmq.q_i (message, headers) VALUES ('{}', '{"_pg_transport": "x"}')"""
        )
    with pytest.raises(psycopg.errors.FeatureNotSupported) as refused:
        conn.execute("INSERT INTO pgmq.q_i (msg_id, message, vt) VALUES (7, '{}', now())")
    assert "message, headers and vt only" in str(refused.value)
    assert ids(conn, "SELECT msg_id FROM pgmq.read('i', 30, 10) ORDER BY msg_id") == [1, 2]


def test_a_delete_from_the_queue_is_an_ack_that_completes_a_barriers_member(
    conn: Conn, client: Client
) -> None:
    client.create_queue("work")
    client.create_queue("done")
    bid = client.fan_out("work", [1, 2], callback_queue="done", callback_message={})
    assert conn.execute("DELETE FROM pgmq.q_work").rowcount == 2
    assert client.barrier_status(bid).state == "fired"
    assert len(client.read("done", vt=30, qty=10)) == 1


def test_the_archive_only_loses_rows_and_meta_and_throttles_are_read_only(conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('a')")
    conn.execute("SELECT * FROM pgmq.send_batch('a', ARRAY['1', '2']::jsonb[])")
    conn.execute("SELECT pgmq.archive('a', ARRAY[1, 2]::bigint[])")
    for write in (
        "UPDATE pgmq.a_a SET message = '3'",
        "INSERT INTO pgmq.a_a (msg_id, vt, message) VALUES (9, now(), '1')",
    ):
        with pytest.raises(psycopg.errors.FeatureNotSupported):
            conn.execute(write)
    assert conn.execute("DELETE FROM pgmq.a_a WHERE msg_id = 1").rowcount == 1
    assert ids(conn, "SELECT msg_id FROM pgmq.a_a") == [2]
    conn.execute("SELECT pgmq.enable_notify_insert('a', 0)")
    for write in (
        "UPDATE pgmq.meta SET created_at = now()",
        "DELETE FROM pgmq.notify_insert_throttle",
        "UPDATE pgmq.notify_insert_throttle SET throttle_interval_ms = 5",
    ):
        with pytest.raises(psycopg.errors.FeatureNotSupported) as refused:
            conn.execute(write)
        assert "read-only view" in str(refused.value)
    assert conn.execute("SELECT * FROM pgmq.notify_insert_throttle").fetchall() == [
        ("a", 0, conn.execute("SELECT to_timestamp(0)").fetchone()[0])  # type: ignore[index]
    ]


@pytest.fixture
def roles_facade(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as owner:
        install(owner)
        owner.execute("SELECT pgmq.create('r')")
        owner.execute("SELECT * FROM pgmq.send('r', '{}')")
    return dsn


@pytest.mark.parametrize("group", [CONSUMER, OPERATOR])
def test_no_role_writes_the_views(
    roles_facade: str, make_login: Callable[..., str], group: str
) -> None:
    login = make_login("writer", group)
    with psycopg.connect(as_user(roles_facade, login), autocommit=True) as c:
        for write in (
            "UPDATE pgmq.q_r SET vt = now()",
            "DELETE FROM pgmq.q_r",
            "INSERT INTO pgmq.q_r (message) VALUES ('{}')",
            "DELETE FROM pgmq.a_r",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                c.execute(write)
    with psycopg.connect(roles_facade, autocommit=True) as owner:
        assert owner.execute("SELECT count(*), max(read_ct) FROM pgmq.q_r").fetchone() == (1, 0)
