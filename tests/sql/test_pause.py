"""Pausing a queue, as raw SQL: reads hand out nothing (with one NOTICE); all else goes on."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from support.db import run_threads

from pgqueue import Client, QueueNotFound


def one(sql: Any, query: str, *params: Any) -> Any:
    return sql.execute(query, params).fetchone()[0]


@dataclass(frozen=True)
class Notice:
    sqlstate: str | None
    message: str
    detail: str


@pytest.fixture
def notices(sql: psycopg.Connection[Any]) -> list[Notice]:
    """The NOTICEs the `sql` connection gets from now on (a Diagnostic dies with its handler)."""
    got: list[Notice] = []
    sql.add_notice_handler(
        lambda d: got.append(Notice(d.sqlstate, d.message_primary or "", d.message_detail or ""))
    )
    return got


def paused_notices(got: list[Notice]) -> list[dict[str, Any]]:
    return [json.loads(n.detail) for n in got if n.sqlstate == "PGQ11"]


def test_reads_of_a_paused_queue_return_nothing_with_one_notice_each(
    sql: Any, queue: str, notices: list[Notice]
) -> None:
    sql.execute("SELECT pgqueue.send_batch('jobs', ARRAY['1','2','3']::jsonb[])")
    assert one(sql, "SELECT pgqueue.pause_queue('jobs', 'alice')") is True
    started = time.monotonic()
    for statement in (
        "SELECT * FROM pgqueue.read('jobs', 30, 10)",
        "SELECT * FROM pgqueue.read_with_poll('jobs', 30, 10, 120, 100)",
        "SELECT * FROM pgqueue.pop('jobs', 10)",
    ):
        assert sql.execute(statement).fetchall() == []
    # read_with_poll did not wait out its 120 s: a bound far above what load adds
    assert time.monotonic() - started < 60
    seen = paused_notices(notices)
    assert [(n["queue"], n["paused_by"]) for n in seen] == [("jobs", "alice")] * 3
    text = next(n.message for n in notices if n.sqlstate == "PGQ11")
    assert "queue jobs is paused" in text and "pgqueue queue resume jobs" in text
    # nothing was leased or counted: every message is still unread
    assert sql.execute("SELECT read_ct FROM pgqueue.message").fetchall() == [(0,), (0,), (0,)]


def test_sends_acks_nacks_and_lease_changes_go_on_while_paused(sql: Any, queue: str) -> None:
    sql.execute("SELECT pgqueue.send_batch('jobs', ARRAY['1','2','3']::jsonb[])")
    leased = sql.execute("SELECT msg_id, read_ct FROM pgqueue.read('jobs', 30, 3)").fetchall()
    one(sql, "SELECT pgqueue.pause_queue('jobs')")
    sent = one(sql, "SELECT pgqueue.send('jobs', '4')")
    (a, _), (b, rb), (c, rc) = leased
    assert one(sql, "SELECT pgqueue.delete('jobs', %s::bigint)", a) is True
    assert one(sql, "SELECT pgqueue.nack('jobs', %s, %s, 0, 'later')", b, rb) == "retry"
    assert sql.execute(
        "SELECT msg_id FROM pgqueue.set_vt('jobs', %s::bigint, 60, NULL::text, %s)", (c, rc)
    ).fetchall() == [(c,)]
    live = sql.execute("SELECT msg_id FROM pgqueue.message ORDER BY msg_id").fetchall()
    assert [r[0] for r in live] == [b, c, sent]
    assert sql.execute("SELECT * FROM pgqueue.read('jobs', 30, 10)").fetchall() == []
    one(sql, "SELECT pgqueue.resume_queue('jobs')")
    got = sql.execute("SELECT msg_id FROM pgqueue.read('jobs', 30, 10) ORDER BY 1").fetchall()
    assert [r[0] for r in got] == [b, sent]  # c is still leased for a minute


def test_pausing_or_resuming_twice_changes_nothing_the_second_time(sql: Any, queue: str) -> None:
    assert one(sql, "SELECT pgqueue.resume_queue('jobs')") is False
    assert one(sql, "SELECT pgqueue.pause_queue('jobs', 'alice')") is True
    first = sql.execute("SELECT paused_at, paused_by FROM pgqueue.list_queues()").fetchone()
    assert one(sql, "SELECT pgqueue.pause_queue('jobs', 'bob')") is False
    again = sql.execute("SELECT paused_at, paused_by FROM pgqueue.list_queues()").fetchone()
    assert again == first and first[1] == "alice"  # the first pause's time and actor stay
    assert one(sql, "SELECT paused FROM pgqueue.exporter_metrics()") is True
    assert one(sql, "SELECT pgqueue.resume_queue('jobs')") is True
    assert one(sql, "SELECT pgqueue.resume_queue('jobs')") is False
    assert sql.execute("SELECT paused_at, paused_by FROM pgqueue.list_queues()").fetchone() == (
        None,
        None,
    )
    assert one(sql, "SELECT paused FROM pgqueue.exporter_metrics()") is False


def test_of_concurrent_pauses_exactly_one_reports_the_change(dsn: str, queue: str) -> None:
    conns = [psycopg.connect(dsn, autocommit=True) for _ in range(8)]
    results: list[bool] = []
    try:
        for flip in ("pause_queue('jobs', 'x')", "resume_queue('jobs')") * 3:
            results.clear()
            statement = f"SELECT pgqueue.{flip}"
            run_threads(8, lambda i, s=statement: results.append(one(conns[i], s)))
            assert sorted(results) == [False] * 7 + [True], flip
    finally:
        for c in conns:
            c.close()


def test_unknown_queue_and_a_long_actor_are_refused(client: Client) -> None:
    with pytest.raises(QueueNotFound, match='queue "nope" does not exist'):
        client.pause_queue("nope")
    with pytest.raises(QueueNotFound):
        client.resume_queue("nope")
    client.create_queue("jobs")
    with pytest.raises(ValueError, match="actor is 201 characters; at most 200"):
        client.pause_queue("jobs", actor="x" * 201)
    assert client.list_queues()[0].paused is False


def test_resume_wakes_a_listener_with_the_payload_resumed(sql: Any, queue: str, dsn: str) -> None:
    one(sql, "SELECT pgqueue.pause_queue('jobs')")
    with psycopg.connect(dsn, autocommit=True) as listener:
        channel = listener.execute("SELECT pgqueue.listen('jobs')").fetchone()[0]  # type: ignore[index]
        one(sql, "SELECT pgqueue.send('jobs', '1')")  # a send still notifies a waiter
        threading.Timer(0.3, lambda: one(sql, "SELECT pgqueue.resume_queue('jobs')")).start()
        # an outer bound: it ends at the second notification
        got = [(n.channel, n.payload) for n in listener.notifies(timeout=60, stop_after=2)]
    assert got == [(channel, ""), (channel, "resumed")]


def test_a_read_with_poll_waiting_on_a_queue_ends_when_it_is_paused(
    dsn: str, queue: str, sql: Any, notices: list[Notice]
) -> None:
    def pause() -> None:
        with psycopg.connect(dsn, autocommit=True) as other:
            other.execute("SELECT pgqueue.pause_queue('jobs')")

    threading.Timer(0.5, pause).start()
    started = time.monotonic()
    assert (
        sql.execute("SELECT * FROM pgqueue.read_with_poll('jobs', 30, 1, 300, 50)").fetchall() == []
    )
    # ended by the pause (at 0.5 s, later on a loaded machine), not its 300 s
    assert 0.4 < time.monotonic() - started < 60
    assert len(paused_notices(notices)) == 1
    one(sql, "SELECT pgqueue.send('jobs', '1')")
    assert sql.execute("SELECT * FROM pgqueue.read('jobs', 30, 1)").fetchall() == []


def test_list_queues_and_the_exporter_figures_say_which_queue_is_paused(
    client: Client, sql: Any
) -> None:
    client.create_queue("a")
    client.create_queue("b")
    assert client.pause_queue("b", actor="ops") is True
    info = {q.queue_name: q for q in client.list_queues()}
    assert not info["a"].paused and info["a"].paused_at is None and info["a"].paused_by is None
    assert info["b"].paused and info["b"].paused_by == "ops"
    rows = sql.execute("SELECT queue_name, paused FROM pgqueue.exporter_metrics()").fetchall()
    assert rows == [("a", False), ("b", True)]


def test_dropping_a_paused_queue_works(client: Client) -> None:
    client.create_queue("jobs")
    client.send("jobs", {})
    client.pause_queue("jobs")
    assert client.drop_queue("jobs") is True
    assert client.list_queues() == []
