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
