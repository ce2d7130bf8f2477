"""Two PGMQ names, one pgqueue queue: refused where a queue is created, never merged.

A PGMQ name pgqueue cannot hold as it is stands for a queue derived from it
(pgqueue._queue_name_for: 39 characters of it, then 8 hex digits of its md5),
so two such names can map to one pgqueue queue; a pair is found by trying
about 2^16 names. pgmq.create (every form) and `pgqueue pgmq import` refuse
a name whose queue exists under another name (42P07), changing nothing. The
pairs are found here by the database's own mapping, on real connections.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb
from support.db import run_threads
from support.pgmq import queue_views as views

from pgqueue._migrate import migrate
from pgqueue._pgmq import PgmqImportRefused, import_pgmq, status

Conn = psycopg.Connection[Any]

# 39 characters (all a derived name keeps) with one pgqueue refuses, so every
# name made of it and a number of up to 7 digits (at most 46 characters: PGMQ
# takes 47) maps to this prefix's queue, told apart by the hash alone.
PREFIX = "collide." + "x" * 31
CREATES = ("create", "create_non_partitioned", "create_unlogged")

_found: list[tuple[str, str]] = []


def colliding_names(conn: Conn) -> tuple[str, str]:
    """Two PGMQ names the database maps to one pgqueue queue, by trying names in turn.

    The mapping is IMMUTABLE and the same in every test database: the pair is
    looked for once per test process (about 80,000 names, half a second).
    """
    if not _found:
        seen: dict[str, str] = {}
        step = 20_000
        for start in range(1, 10_000_000, step):
            for name, mapped in conn.execute(
                "SELECT n, pgqueue._queue_name_for(n)"
                " FROM (SELECT %s || i AS n FROM generate_series(%s::int, %s::int) i) s",
                (PREFIX, start, start + step - 1),
            ):
                if mapped in seen:
                    _found.append((seen[mapped], str(name)))
                    break
                seen[mapped] = str(name)
            if _found:
                break
    assert _found, "no two names map to one queue: has pgqueue._queue_name_for changed?"
    return _found[0]


def one(conn: Conn, query: str, *params: Any) -> Any:
    row = conn.execute(query, params or None).fetchone()
    assert row is not None
    return row[0]


def rows(conn: Conn, query: str, *params: Any) -> list[tuple[Any, ...]]:
    return conn.execute(query, params or None).fetchall()


def refusal(conn: Conn, query: str, *params: Any) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as err:
        conn.execute(query, params or None)
    return err.value


@pytest.fixture
def conn(facade_dsn: str) -> Iterator[Conn]:
    """An autocommit connection, as the database owner, to a database with the facade."""
    with psycopg.connect(facade_dsn, autocommit=True) as c:
        yield c


def test_the_two_names_are_distinct_pgmq_queues_that_map_to_one_pgqueue_queue(
    conn: Conn,
) -> None:
    first, second = colliding_names(conn)
    assert first.lower() != second.lower()
    assert one(conn, "SELECT pgmq._name(%s)", first) == one(conn, "SELECT pgmq._name(%s)", second)
    for name in (first, second):
        conn.execute("SELECT pgmq.validate_queue_name(%s)", (name,))


# --- pgmq.create and its forms ---------------------------------------------------------


@pytest.mark.parametrize("fn", CREATES)
def test_a_second_name_for_one_queue_is_refused_by_every_create(conn: Conn, fn: str) -> None:
    first, second = colliding_names(conn)
    queue = one(conn, "SELECT pgmq._name(%s)", first)
    conn.execute("SELECT pgmq.create(%s)", (first,))
    one(conn, "SELECT * FROM pgmq.send(%s, %s)", first, Jsonb({"of": "first"}))
    before = rows(conn, "SELECT queue_id, queue_name, max_attempts, created_at FROM pgqueue.queue")
    for name in (second, second.upper()):
        err = refusal(conn, f"SELECT pgmq.{fn}(%s)", name)
        assert err.sqlstate == "42P07"
        said = err.diag.message_primary or ""
        assert "\n" not in said
        assert f"'{name}'" in said and f"'{queue}'" in said and f"'{first}'" in said
        assert "use another name" in said
    # nothing changed: the first name's queue, its name, its views, its message
    after = rows(conn, "SELECT queue_id, queue_name, max_attempts, created_at FROM pgqueue.queue")
    assert after == before
    assert rows(conn, "SELECT queue_name, pgmq_name FROM pgmq.queue_name_map") == [(queue, first)]
    assert rows(conn, "SELECT queue_name FROM pgmq.list_queues()") == [(first,)]
    assert views(conn) == {"q_" + first.lower(), "a_" + first.lower()}
    assert rows(conn, "SELECT message FROM pgmq.read(%s, 30, 5)", first) == [({"of": "first"},)]


def test_the_name_a_queue_was_created_with_creates_it_again_as_a_no_op(conn: Conn) -> None:
    first, _ = colliding_names(conn)
    conn.execute("SELECT pgmq.create(%s)", (first,))
    for fn in CREATES:
        for name in (first, first.upper(), first.title()):  # PGMQ lowercases: one queue
            conn.execute(f"SELECT pgmq.{fn}(%s)", (name,))
    assert one(conn, "SELECT count(*) FROM pgqueue.queue") == 1
    assert rows(conn, "SELECT pgmq_name FROM pgmq.queue_name_map") == [(first,)]


def test_a_queue_no_name_was_recorded_for_is_claimed_by_the_first_name_and_no_other(
    conn: Conn,
) -> None:
    """pgqueue.create_queue made the queue (or the facade was uninstalled, which takes the
    names with it): the first name created for it claims it and is recorded; the next
    name that maps to it is refused, changing nothing."""
    first, second = colliding_names(conn)
    queue = one(conn, "SELECT pgmq._name(%s)", first)
    conn.execute("SELECT pgqueue.create_queue(%s, 3)", (queue,))
    conn.execute("SELECT pgmq.create(%s)", (first,))
    assert rows(conn, "SELECT * FROM pgmq.queue_name_map") == [(queue, first)]
    for fn in CREATES:
        err = refusal(conn, f"SELECT pgmq.{fn}(%s)", second)
        assert err.sqlstate == "42P07"
        said = err.diag.message_primary or ""
        assert "\n" not in said and f"'{second}'" in said and f"'{first}'" in said
    assert rows(conn, "SELECT queue_name FROM pgmq.list_queues()") == [(first,)]
    assert views(conn) == {"q_" + first.lower(), "a_" + first.lower()}
    assert one(conn, "SELECT max_attempts FROM pgqueue.queue") == 3


def test_a_derived_name_given_as_a_name_is_a_second_name_for_the_queue(conn: Conn) -> None:
    """'a-b' maps to 'a_b_<hash>', which is a pgqueue name, and stands for itself too."""
    derived = one(conn, "SELECT pgmq._name('a-b')")
    assert derived.startswith("a_b_")
    conn.execute("SELECT pgmq.create('a-b')")
    assert refusal(conn, "SELECT pgmq.create(%s)", derived).sqlstate == "42P07"
    assert rows(conn, "SELECT queue_name FROM pgmq.list_queues()") == [("a-b",)]


def test_a_name_recorded_for_a_queue_that_is_gone_names_nothing(conn: Conn) -> None:
    """A row of queue_name_map whose queue does not exist (written by hand) does not make
    the next queue of that pgqueue name show another name."""
    first, second = colliding_names(conn)
    queue = one(conn, "SELECT pgmq._name(%s)", first)
    conn.execute(
        "INSERT INTO pgmq.queue_name_map (queue_name, pgmq_name) VALUES (%s, %s)", (queue, first)
    )
    conn.execute("SELECT pgmq.create(%s)", (second,))
    assert rows(conn, "SELECT queue_name FROM pgmq.list_queues()") == [(second,)]
    assert refusal(conn, "SELECT pgmq.create(%s)", first).sqlstate == "42P07"


def _race_creates(dsn: str, names: list[str]) -> dict[int, str | None]:
    """pgmq.create of each name on its own connection, all at once; each one's SQLSTATE."""
    conns = [psycopg.connect(dsn, autocommit=True) for _ in names]
    outcome: dict[int, str | None] = {}

    def create(i: int) -> None:
        try:
            conns[i].execute("SELECT pgmq.create(%s)", (names[i],))
            outcome[i] = None
        except psycopg.Error as exc:
            outcome[i] = exc.sqlstate

    try:
        run_threads(len(names), create)
    finally:
        for c in conns:
            c.close()
    return outcome


def test_racing_creates_of_two_names_for_one_queue_give_it_to_one_of_them(
    facade_dsn: str, conn: Conn
) -> None:
    first, second = colliding_names(conn)
    queue = one(conn, "SELECT pgmq._name(%s)", first)
    names = [first, second] * 4
    for _ in range(5):
        outcome = _race_creates(facade_dsn, names)
        (winner,) = [r[0] for r in rows(conn, "SELECT pgmq_name FROM pgmq.queue_name_map")]
        assert outcome == {i: None if n == winner else "42P07" for i, n in enumerate(names)}
        assert rows(conn, "SELECT queue_name FROM pgqueue.queue") == [(queue,)]
        assert views(conn) == {"q_" + winner.lower(), "a_" + winner.lower()}
        assert one(conn, "SELECT pgmq.drop_queue(%s)", winner) is True


# --- pgqueue pgmq import -----------------------------------------------------------------


def _pgmq_queues(conn: Conn) -> list[tuple[str, int]]:
    return [
        (str(name), int(n))
        for name, n in rows(conn, "SELECT queue_name, queue_length FROM pgmq.metrics_all()")
    ]


def test_import_refuses_two_pgmq_queues_that_map_to_one_pgqueue_queue(
    real_pgmq_dsn: str,
) -> None:
    with psycopg.connect(real_pgmq_dsn, autocommit=True) as c:
        migrate(c)
        # the import creates its queues in the order of their names: the later is refused
        first, second = sorted(colliding_names(c), key=str.lower)
        for name in (first, second, "jobs"):
            c.execute("SELECT pgmq.create(%s)", (name,))
            c.execute("SELECT * FROM pgmq.send(%s, %s)", (name, Jsonb(name)))
        before = sorted(_pgmq_queues(c))
        for dry_run in (True, False):
            with pytest.raises(PgmqImportRefused) as err:
                import_pgmq(c, dry_run=dry_run)
            said = str(err.value)
            assert f"queue '{second}': the pgmq facade refuses it" in said
            assert f"which holds PGMQ queue '{first}'" in said
            assert said.endswith("nothing was changed")
        assert status(c).real_pgmq == "PGMQ installed as SQL in schema pgmq"
        assert sorted(_pgmq_queues(c)) == before
        assert one(c, "SELECT count(*) FROM pgqueue.queue") == 0


def test_an_imported_name_keeps_its_queue_and_a_colliding_name_is_refused_after(
    real_pgmq_dsn: str,
) -> None:
    with psycopg.connect(real_pgmq_dsn, autocommit=True) as c:
        migrate(c)
        first, second = colliding_names(c)
        c.execute("SELECT pgmq.create(%s)", (first,))
        mid = one(c, "SELECT * FROM pgmq.send(%s, '{\"n\": 1}')", first)
        (moved,) = import_pgmq(c).queues
        assert (moved.pgmq_name, moved.live) == (first, 1)
        c.execute("SELECT pgmq.create(%s)", (first,))  # the client starting again: a no-op
        assert refusal(c, "SELECT pgmq.create(%s)", second).sqlstate == "42P07"
        assert rows(c, "SELECT queue_name FROM pgmq.list_queues()") == [(first,)]
        assert [r[0] for r in rows(c, "SELECT msg_id FROM pgmq.read(%s, 30, 5)", first)] == [mid]
