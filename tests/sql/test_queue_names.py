"""Queue names (0025): a name that is not a pgqueue name stands for the queue a PGMQ client means.

pgqueue names are 1 to 48 lowercase letters, digits and underscores, not
starting with a digit. Any other name can never be a pgqueue queue's, so every
function that finds a queue by name takes it as the pgmq facade's clients
mean it (pgqueue._queue_name_for, docs/pgmq.md): lowercased, or mapped. A name
that stands for no queue is PGQ01, naming the name as it was given.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest


def sqlstate(conn: psycopg.Connection[Any], statement: str, *params: Any) -> tuple[str, str]:
    """The SQLSTATE and message a statement fails with."""
    with pytest.raises(psycopg.Error) as caught:
        conn.execute(statement, params)
    return caught.value.sqlstate or "", caught.value.diag.message_primary or ""


def test_a_name_in_capitals_or_with_other_characters_finds_the_queue_it_maps_to(
    sql: psycopg.Connection[Any],
) -> None:
    sql.execute("SELECT pgqueue.create_queue('orders')")
    (mapped,) = sql.execute("SELECT pgqueue._queue_name_for('Orders.EU')").fetchone()  # type: ignore[misc]
    assert mapped != "orders.eu" and mapped.startswith("orders_eu_")
    sql.execute("SELECT pgqueue.create_queue(%s)", (mapped,))
    for given, queue in (("ORDERS", "orders"), ("Orders.EU", mapped), ("orders.eu", mapped)):
        (msg_id,) = sql.execute("SELECT pgqueue.send(%s, '1')", (given,)).fetchone()  # type: ignore[misc]
        row = sql.execute(
            "SELECT q.queue_name FROM pgqueue.message m JOIN pgqueue.queue q USING (queue_id)"
            " WHERE m.msg_id = %s AND q.queue_name = %s",
            (msg_id, queue),
        ).fetchone()
        assert row == (queue,), given
        got = sql.execute("SELECT msg_id FROM pgqueue.read(%s, 30, 1)", (given,)).fetchall()
        assert got == [(msg_id,)], given
        assert sql.execute("SELECT pgqueue.delete(%s, %s::bigint)", (given, msg_id)).fetchone() == (
            True,
        )
        assert sql.execute("SELECT pgqueue.delete(%s, %s::bigint)", (given, msg_id)).fetchone() == (
            False,
        )
    (msg_id,) = sql.execute("SELECT pgqueue.send('Orders.EU', '2')").fetchone()  # type: ignore[misc]
    assert sql.execute("SELECT msg_id FROM pgqueue.pop('ORDERS.EU')").fetchall() == [(msg_id,)]
    (msg_id,) = sql.execute("SELECT pgqueue.send('Orders.EU', '3')").fetchone()  # type: ignore[misc]
    assert sql.execute("SELECT pgqueue.archive('Orders.EU', %s::bigint)", (msg_id,)).fetchone() == (
        True,
    )
    assert sql.execute("SELECT queue_length FROM pgqueue.metrics('Orders.EU')").fetchone() == (0,)


@pytest.mark.parametrize("name", ["nope", "Nope", "no-such.queue", "1st", "x" * 60])
def test_a_name_that_stands_for_no_queue_is_pgq01_naming_it_as_given(
    sql: psycopg.Connection[Any], name: str
) -> None:
    for statement in (
        "SELECT pgqueue.send(%s, '1')",
        "SELECT * FROM pgqueue.read(%s, 30, 1)",
        "SELECT * FROM pgqueue.pop(%s)",
        "SELECT pgqueue.delete(%s, 1::bigint)",
        "SELECT pgqueue.archive(%s, 1::bigint)",
    ):
        state, message = sqlstate(sql, statement, name)
        assert state == "PGQ01", statement
        assert message == f'queue "{name}" does not exist', statement


def test_a_pgqueue_name_is_never_mapped(sql: psycopg.Connection[Any]) -> None:
    names = ["a", "orders_eu", "_x", "q" * 48]
    got = sql.execute(
        "SELECT n, pgqueue._queue_name_for(n) FROM unnest(%s::text[]) n", (names,)
    ).fetchall()
    assert got == [(n, n) for n in names]


def test_pause_and_resume_by_a_mapped_name_pause_and_resume_its_queue(
    sql: psycopg.Connection[Any],
) -> None:
    """Before the fix pause_queue('ORDERS') said false ("already paused") and paused nothing."""
    sql.execute("SELECT pgqueue.create_queue('orders')")
    sql.execute("SELECT pgqueue.send('orders', '1')")
    assert sql.execute("SELECT pgqueue.pause_queue('ORDERS', 'ops')").fetchone() == (True,)
    assert sql.execute("SELECT pgqueue.pause_queue('Orders')").fetchone() == (False,)
    assert sql.execute(
        "SELECT paused_by FROM pgqueue.queue WHERE queue_name = 'orders' AND paused_at IS NOT NULL"
    ).fetchone() == ("ops",)
    assert sql.execute("SELECT msg_id FROM pgqueue.read('ORDERS', 30, 1)").fetchall() == []
    assert sql.execute("SELECT pgqueue.resume_queue('ORDERS')").fetchone() == (True,)
    assert sql.execute("SELECT pgqueue.resume_queue('ORDERS')").fetchone() == (False,)
    assert sql.execute(
        "SELECT paused_at FROM pgqueue.queue WHERE queue_name = 'orders'"
    ).fetchone() == (None,)
    assert len(sql.execute("SELECT msg_id FROM pgqueue.read('ORDERS', 30, 1)").fetchall()) == 1
    for call in ("pause_queue", "resume_queue"):
        assert sqlstate(sql, f"SELECT pgqueue.{call}('Nope')") == (
            "PGQ01",
            'queue "Nope" does not exist',
        )


def test_send_keyed_by_a_mapped_name_says_it_sent(sql: psycopg.Connection[Any]) -> None:
    """Before the fix it inserted the message and said sent=false (someone else's key)."""
    sql.execute("SELECT pgqueue.create_queue('orders')")
    first = sql.execute("SELECT * FROM pgqueue.send_keyed('ORDERS', '1', 'k1')").fetchone()
    again = sql.execute("SELECT * FROM pgqueue.send_keyed('orders', '2', 'k1')").fetchone()
    assert first is not None and first[1] is True
    assert again == (first[0], False)
    assert sql.execute("SELECT count(*) FROM pgqueue.message").fetchone() == (1,)


def test_drop_queue_by_a_mapped_name_drops_its_queue(sql: psycopg.Connection[Any]) -> None:
    """Before the fix drop_queue('ORDERS') said false while purge_queue('ORDERS') purged."""
    sql.execute("SELECT pgqueue.create_queue('orders')")
    sql.execute("SELECT pgqueue.send('orders', '1')")
    assert sql.execute("SELECT pgqueue.drop_queue('ORDERS')").fetchone() == (True,)
    assert sql.execute("SELECT count(*) FROM pgqueue.queue").fetchone() == (0,)
    assert sql.execute("SELECT pgqueue.drop_queue('ORDERS')").fetchone() == (False,)


def test_a_worker_on_a_mapped_name_is_told_its_pause_and_its_tallies_count(
    sql: psycopg.Connection[Any],
) -> None:
    """The heartbeat answers with the names as the worker gave them; tallies reach the queue."""
    sql.execute("SELECT pgqueue.create_queue('orders')")
    sql.execute("SELECT pgqueue.create_queue('jobs')")
    sql.execute("SELECT pgqueue.pause_queue('orders')")
    beat = sql.execute(
        "SELECT queue_name, paused FROM pgqueue.worker_heartbeat(gen_random_uuid(), 'h', 1,"
        " ARRAY['ORDERS', 'jobs', 'Nope'], 4, 0, NULL, false, ARRAY['ORDERS', 'Jobs'],"
        " ARRAY[3, 2]::bigint[], ARRAY[1, 0]::bigint[], ARRAY[0, 0]::bigint[])"
    ).fetchall()
    assert beat == [("ORDERS", True), ("jobs", False)]
    tallies = sql.execute(
        "SELECT q.queue_name, m.acked, m.nacked FROM pgqueue.queue_minute m"
        " JOIN pgqueue.queue q USING (queue_id) ORDER BY 1"
    ).fetchall()
    assert tallies == [("jobs", 2, 0), ("orders", 3, 1)]
    rates = sql.execute(
        "SELECT DISTINCT queue_name FROM pgqueue.queue_rates(ARRAY['ORDERS'], 2)"
    ).fetchall()
    assert rates == [("orders",)]


def test_pause_and_resume_of_no_queue_are_pgq01_also_once_their_plans_are_generic(
    sql: psycopg.Connection[Any],
) -> None:
    """A generic plan that tested paused_at first never looked the name up: false, not PGQ01."""
    for name in ("a", "b", "c"):
        sql.execute("SELECT pgqueue.create_queue(%s)", (name,))
    sql.execute("ANALYZE pgqueue.queue")
    for _ in range(8):  # the session's plans of resume_queue become generic
        assert sql.execute("SELECT pgqueue.resume_queue('a')").fetchone() == (False,)
    for name in ("nope", "NOPE"):
        assert sqlstate(sql, "SELECT pgqueue.resume_queue(%s)", name)[0] == "PGQ01", name
    for name in ("a", "b", "c"):
        sql.execute("SELECT pgqueue.pause_queue(%s)", (name,))
    for _ in range(8):
        assert sql.execute("SELECT pgqueue.pause_queue('a')").fetchone() == (False,)
    for name in ("nope", "NOPE"):
        assert sqlstate(sql, "SELECT pgqueue.pause_queue(%s)", name)[0] == "PGQ01", name
    assert sql.execute("SELECT pgqueue.pause_queue('B')").fetchone() == (False,)
    assert sql.execute("SELECT pgqueue.resume_queue('B')").fetchone() == (True,)
