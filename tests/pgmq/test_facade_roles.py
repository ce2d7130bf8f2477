"""The pgmq facade under pgqueue's one role model, as real login roles meet it.

Before, the facade granted pgqueue_operator every function of schema pgmq and
let pgqueue_consumer read the queue views: an operator-only login could read,
ack a barrier's member (firing its barrier) and pop a callback, and a consumer
could peek at every payload. Each test logs in as a role of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from support.roles import as_user

from pgqueue import Client
from pgqueue._pgmq import install
from pgqueue._roles import CONSUMER, OPERATOR, PRODUCER


@pytest.fixture
def facade(dsn: str, client: Client) -> str:
    with psycopg.connect(dsn, autocommit=True) as owner:
        install(owner)
    for q in ("work", "done"):
        client.create_queue(q)
    return dsn


def denied(conn: psycopg.Connection[Any], statement: str, *args: Any) -> bool:
    try:
        conn.execute(statement, args)
    except psycopg.errors.InsufficientPrivilege:
        return True
    return False


def test_an_operator_administers_and_peeks_but_never_reads_acks_or_pops(
    facade: str, client: Client, make_login: Callable[..., str]
) -> None:
    bid = client.fan_out("work", [1, 2], callback_queue="done", callback_message={})
    member = client.barrier_results(bid)[0].msg_id
    client.complete_member("work", client.barrier_results(bid)[1].msg_id)
    client.expire_barriers()
    operator = make_login("operator", OPERATOR)
    with psycopg.connect(as_user(facade, operator), autocommit=True) as conn:
        assert denied(conn, "SELECT * FROM pgmq.read('work', 30, 5)")
        assert denied(conn, "SELECT pgmq.delete('work', %s::bigint)", member)
        assert denied(conn, "SELECT pgmq.archive('work', %s::bigint)", member)
        assert denied(conn, "SELECT * FROM pgmq.pop('done')")
        assert denied(conn, "SELECT * FROM pgmq.set_vt('work', %s::bigint, 0)", member)
        # what an operator is for: administration and looking
        conn.execute("SELECT pgmq.create('made_here')")
        peeked = conn.execute("SELECT msg_id FROM pgmq.q_work ORDER BY msg_id").fetchall()
        assert peeked == [(member,)]
        assert conn.execute("SELECT count(*) FROM pgmq.metrics_all()").fetchone() == (3,)
    status = client.barrier_status(bid)
    assert (status.state, status.remaining) == ("open", 1)  # the member was not acked


def test_a_consumer_reads_and_acks_but_may_not_peek_through_the_views(
    facade: str, client: Client, make_login: Callable[..., str]
) -> None:
    client.send("work", {"secret": 1})
    consumer = make_login("consumer", CONSUMER)
    with psycopg.connect(as_user(facade, consumer), autocommit=True) as conn:
        for view in ("pgmq.q_work", "pgmq.a_work", "pgmq.queue_name_map", "pgmq.topic_bindings"):
            assert denied(conn, f"SELECT * FROM {view}"), view
        assert conn.execute("SELECT queue_name FROM pgmq.meta ORDER BY 1").fetchall() == [
            ("done",),
            ("work",),
        ]
        [(msg_id,)] = conn.execute("SELECT msg_id FROM pgmq.read('work', 30, 5)").fetchall()
        assert conn.execute("SELECT pgmq.delete('work', %s::bigint)", (msg_id,)).fetchone() == (
            True,
        )
        assert denied(conn, "SELECT pgmq.create('mine')")


def test_a_producer_sends_and_nothing_else(
    facade: str, client: Client, make_login: Callable[..., str]
) -> None:
    producer = make_login("producer", PRODUCER)
    with psycopg.connect(as_user(facade, producer), autocommit=True) as conn:
        conn.execute("SELECT pgmq.send('work', '{}')")
        for statement in (
            "SELECT * FROM pgmq.read('work', 30, 1)",
            "SELECT * FROM pgmq.q_work",
            "SELECT * FROM pgmq.meta",
            "SELECT * FROM pgmq.list_queues()",
            "SELECT pgmq.purge_queue('work')",
        ):
            assert denied(conn, statement), statement
    assert client.metrics("work").queue_length == 1
