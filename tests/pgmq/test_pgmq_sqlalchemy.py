"""`pgmq_sqlalchemy` (PyPI) runs unchanged against pgqueue's `pgmq` facade.

pgmq_sqlalchemy is a PGMQ client of its own over SQLAlchemy, with an API of its
own (`send(queue, message, delay)`, `read_batch`, `*_async` twins, a `session=`
and `commit=` on every call). Each scenario runs against real PGMQ and against
the facade, sync (psycopg) and async (asyncpg), and the results must be equal
(tests/support/pgmq_calls.py says what is normalized).

pgmq_sqlalchemy never runs `CREATE EXTENSION pgmq` itself: it needs no switch.
Before a partitioned call it runs `CREATE EXTENSION IF NOT EXISTS pg_partman`.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from support.pgmq_calls import (
    SQLALCHEMY_KINDS,
    Trace,
    assert_same,
    differential,
    run_pgmq_sqlalchemy,
)

kinds = pytest.mark.parametrize("kind", SQLALCHEMY_KINDS)


def both(kind: str, scenario: Any, real_dsn: str, facade_dsn: str) -> tuple[Trace, Trace]:
    """The traces of one scenario with one client kind: real PGMQ and the facade, side by side."""
    return differential(run_pgmq_sqlalchemy, kind, scenario, real_dsn, facade_dsn)


def setup_messages(t: Trace, queue: str, n: int) -> None:
    """Send n messages {"n": 1..n} outside the client (its async send_batch is ambiguous)."""
    t.sql(
        "SELECT pgmq.send_batch(%s, (SELECT array_agg(jsonb_build_object('n', i) ORDER BY i)"
        " FROM generate_series(1, %s) i))",
        (queue, n),
    )


def make_visible(t: Trace, queue: str, msg_id: int) -> None:
    """set_vt(queue, msg_id, 0) outside the client (its async set_vt is ambiguous)."""
    t.sql("SELECT pgmq.set_vt(%s, %s::bigint, 0)", (queue, msg_id))


def queues(q: Any, t: Trace) -> None:
    """create_queue (logged, unlogged), validate_queue_name, list_queues, drop_queue."""
    t.call("create", q.create_queue, "alpha")
    t.call("create again", q.create_queue, "alpha")
    t.call("create unlogged", q.create_queue, "beta", unlogged=True)
    t.call("validate", q.validate_queue_name, "v" * 47)
    t.call("list", lambda: sorted(q.list_queues()))
    t.call("drop", q.drop_queue, "alpha")  # pgmq.drop_queue(name, partitioned): two arguments
    t.call("drop missing", q.drop_queue, "alpha")
    t.call("list after drop", lambda: sorted(q.list_queues()))
    t.call("create after drop", q.create_queue, "alpha")
    t.call("ids restart", q.send, "alpha", {"n": 1})
    t.call("unlogged works", q.send_batch, "beta", [{"n": 1}, {"n": 2}])
    t.call("read unlogged", q.read_batch, "beta", 5)


@kinds
def test_queues(kind: str, real_pgmq_dsn: str, facade_dsn: str) -> None:
    real, facade = both(kind, queues, real_pgmq_dsn, facade_dsn)
    assert_same(real, facade)


def partitioned(q: Any, t: Trace) -> None:
    """The partitioned calls: both run CREATE EXTENSION pg_partman first."""
    t.call("create partitioned", q.create_partitioned_queue, "parts", "10000", "100000")
    t.call("drop partitioned", q.drop_queue, "parts", partitioned=True)
    t.call("list", q.list_queues)


@kinds
def test_partitioned_calls(kind: str, real_pgmq_dsn: str, facade_dsn: str) -> None:
    real, facade = both(kind, partitioned, real_pgmq_dsn, facade_dsn)
    assert_same(real, facade)


def messages(q: Any, t: Trace) -> None:
    """send, send_batch (with delay), read, read_batch, read_with_poll, set_vt, pop."""
    q.create_queue("jobs")
    # With asyncpg, send, send_batch and set_vt leave their last argument untyped, which
    # PGMQ 1.13's overloads make ambiguous (42725): recorded, and the reads get their
    # messages from SQL too.
    t.call("send", q.send, "jobs", {"n": 1})
    t.call("send delay", q.send, "jobs", {"n": 2}, 30)
    t.call("send_batch", q.send_batch, "jobs", [{"n": 3}, {"n": 4}, {"n": 5}])
    t.call("send_batch delay", q.send_batch, "jobs", [{"n": 6}], delay=30)
    t.call("send unicode", q.send, "jobs", {"t": "h\u00e9llo \u2603", "q": "it's"})
    setup_messages(t, "jobs", 4)
    t.call("metrics", q.metrics, "jobs")
    t.call("read", q.read, "jobs")
    t.call("read vt", q.read, "jobs", vt=5)
    t.call("read_batch", q.read_batch, "jobs", 2, vt=10)
    t.call("read_batch rest", q.read_batch, "jobs", 20)
    t.call("read_batch empty", q.read_batch, "jobs", 2)
    t.call("read empty", q.read, "jobs")
    t.call("set_vt", q.set_vt, "jobs", 1, 0)
    t.call("set_vt missing", q.set_vt, "jobs", 99, 0)
    make_visible(t, "jobs", 1)
    make_visible(t, "jobs", 2)
    t.call("read_with_poll", q.read_with_poll, "jobs", vt=30, qty=3, max_poll_seconds=2)
    started = time.monotonic()
    t.call("read_with_poll empty", q.read_with_poll, "jobs", qty=3, max_poll_seconds=1)
    # its 1 s, not the default 5 s (the room is for a loaded machine)
    t.record("poll waited ~1s", 0.9 <= time.monotonic() - started < 4.5)
    make_visible(t, "jobs", 3)
    t.call("pop", q.pop, "jobs")
    t.call("pop empty", q.pop, "jobs")
    t.call("metrics after", q.metrics, "jobs")


@kinds
def test_send_read_pop_set_vt(kind: str, real_pgmq_dsn: str, facade_dsn: str) -> None:
    real, facade = both(kind, messages, real_pgmq_dsn, facade_dsn)
    assert_same(real, facade)


def removing(q: Any, t: Trace) -> None:
    """delete, delete_batch, archive, archive_batch, purge, metrics, metrics_all."""
    t.call("metrics_all none", q.metrics_all)
    q.create_queue("jobs")
    q.create_queue("idle")
    setup_messages(t, "jobs", 8)
    t.call("delete", q.delete, "jobs", 1)
    t.call("delete again", q.delete, "jobs", 1)
    t.call("delete_batch", q.delete_batch, "jobs", [2, 3, 99])
    t.call("archive", q.archive, "jobs", 4)
    t.call("archive again", q.archive, "jobs", 4)
    t.call("archive_batch", q.archive_batch, "jobs", [5, 6, 99])
    t.call("archive table", t.sql, "SELECT msg_id, read_ct, message FROM pgmq.a_jobs ORDER BY 1")
    t.call("metrics", q.metrics, "jobs")
    t.call("metrics_all", lambda: sorted(q.metrics_all(), key=lambda m: m.queue_name))
    t.call("purge", q.purge, "jobs")
    t.call("purge empty", q.purge, "jobs")
    t.call("metrics after purge", q.metrics, "jobs")


@kinds
def test_delete_archive_purge_metrics(kind: str, real_pgmq_dsn: str, facade_dsn: str) -> None:
    real, facade = both(kind, removing, real_pgmq_dsn, facade_dsn)
    assert_same(real, facade)


def refusals(q: Any, t: Trace) -> None:
    """Calls PGMQ refuses: a name too long, a queue that does not exist."""
    t.call("validate too long", q.validate_queue_name, "v" * 48)
    t.call("create too long", q.create_queue, "c" * 48)
    t.call("metrics missing", q.metrics, "missing")
    t.call("delete missing queue", q.delete, "missing", 1)
    t.call("read missing queue", q.read, "missing")
    t.call("pop missing queue", q.pop, "missing")
    t.call("purge missing queue", q.purge, "missing")
    t.call("list", q.list_queues)


@kinds
def test_refusals(kind: str, real_pgmq_dsn: str, facade_dsn: str) -> None:
    """Refused alike, with PGMQ's errors: P0001 for a name too long, 42P01 for a missing
    queue."""
    real, facade = both(kind, refusals, real_pgmq_dsn, facade_dsn)
    too_long = ["validate too long", "create too long"]
    missing = ["metrics missing", "delete missing queue", "read missing queue"]
    missing += ["pop missing queue", "purge missing queue"]
    assert {real[label].sqlstate for label in too_long} == {"P0001"}
    assert {real[label].sqlstate for label in missing} == {"42P01"}
    assert_same(real, facade)


def sessions(kind: str) -> Any:
    """Calls in one session with commit=False: rolled back, nothing; committed, all of them."""

    def scenario(q: Any, t: Trace) -> None:
        q.create_queue("jobs")
        setup_messages(t, "jobs", 4)
        deleted, archived = 1, 2
        for outcome in ("rollback", "commit"):
            session = q.session_maker()
            try:
                if kind == "sync":  # the async send is ambiguous on PGMQ 1.13 (see messages)
                    t.call(
                        f"{outcome}: send",
                        q.send,
                        "jobs",
                        {"o": outcome},
                        session=session,
                        commit=False,
                    )
                t.call(
                    f"{outcome}: delete", q.delete, "jobs", deleted, session=session, commit=False
                )
                t.call(
                    f"{outcome}: archive",
                    q.archive,
                    "jobs",
                    archived,
                    session=session,
                    commit=False,
                )
                t.call(f"{outcome}: read", q.read_batch, "jobs", 1, session=session, commit=False)
                end = getattr(session, outcome)
                if kind == "async":
                    q.run(end())
                else:
                    end()
            finally:
                if kind == "async":
                    q.run(session.close())
                else:
                    session.close()
            t.call(
                f"table after {outcome}",
                t.sql,
                "SELECT msg_id, read_ct FROM pgmq.q_jobs ORDER BY 1",
            )
            t.call(f"after {outcome}", q.read_batch, "jobs", 10, vt=1)
            t.call(f"archive after {outcome}", t.sql, "SELECT msg_id FROM pgmq.a_jobs")
            t.call(f"metrics after {outcome}", q.metrics, "jobs")
            for msg_id in (1, 2, 3, 4, 5):
                make_visible(t, "jobs", msg_id)

    return scenario


@kinds
def test_session_transactions(kind: str, real_pgmq_dsn: str, facade_dsn: str) -> None:
    real, facade = both(kind, sessions(kind), real_pgmq_dsn, facade_dsn)
    assert [r[0] for r in real["table after rollback"]][:4] == [1, 2, 3, 4]  # nothing happened
    assert_same(real, facade)
