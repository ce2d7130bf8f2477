"""PGMQ's own Python client (`pgmq` on PyPI) runs unchanged against pgqueue's `pgmq` facade.

Differential, call by call: every scenario drives the client against real PGMQ
(installed from the same package's pgmq.sql) and against the facade, and the
two runs must return the same things (tests/support/pgmq_calls.py says what is
normalized). Each scenario runs with the four PGMQueue kinds the package ships:
psycopg (sync), asyncpg, SQLAlchemy (sync) and SQLAlchemy (async). The default
run (`pytest`, and so CI) takes two of them, psycopg and SQLAlchemy (async):
between them the package's sync and async operations, both drivers (psycopg,
asyncpg) and both ways of connecting (the client's own pool, a SQLAlchemy
engine). The other two carry the `pgmq_full` marker: `pytest -m pgmq_full
tests/pgmq` runs them by hand, `pytest -m 'not bench' tests/pgmq` all four.

Where the facade differs on purpose (docs/pgmq.md), the test asserts the
documented difference instead of equality: a timestamp delay is rounded up to
whole seconds; grouped reads give at most one message per group per call, and
messages without the header belong to no group; a plain read honours the
`x-pgmq-group` header; an unlogged queue is durable; a partitioned queue or
archive is refused; read_with_poll reads at least once; an unknown queue is
PGQ01 (PGMQ: 42P01) and a bad argument 22023 (PGMQ: P0001). Queues created
through pgmq never poison-drop, as in PGMQ: equal. Any other difference fails.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from support.db import wait_until
from support.pgmq_calls import (
    ASYNC_KINDS,
    PGMQ_KINDS,
    Raised,
    Trace,
    assert_same,
    differential,
    later,
    pgmq_client,
    run_pgmq,
    whole_second_boundary,
)

pytestmark = pytest.mark.filterwarnings("ignore:list_queues\\(\\) now returns:UserWarning")

# The kinds the default run takes (the module's docstring says why these two).
DEFAULT_KINDS = frozenset({"psycopg", "sqlalchemy_async"})
kinds = pytest.mark.parametrize(
    "kind",
    [k if k in DEFAULT_KINDS else pytest.param(k, marks=pytest.mark.pgmq_full) for k in PGMQ_KINDS],
)


def both(kind: str, scenario: Any, real_dsn: str, facade_dsn: str) -> tuple[Trace, Trace]:
    """The traces of one scenario with one client kind: real PGMQ and the facade, side by side."""
    return differential(run_pgmq, kind, scenario, real_dsn, facade_dsn)


def by_name(rows: list[Any]) -> list[Any]:
    """Rows sorted by queue_name (PGMQ lists queues in no stated order)."""
    return sorted(rows, key=lambda r: r.queue_name)


def durable(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """list_queues as the facade gives it: every queue durable (is_unlogged false)."""
    return [{**r, "is_unlogged": False} for r in records]


# -- queues ----------------------------------------------------------------------------------


def queue_lifecycle(q: Any, t: Trace) -> None:
    t.call("create", q.create_queue, "alpha")
    t.call("create again", q.create_queue, "alpha")
    t.call("create unlogged", q.create_queue, "beta", unlogged=True)
    t.call("validate 47 chars", q.validate_queue_name, "v" * 47)
    t.call("list", lambda: by_name(q.list_queues()))
    t.call("send", q.send, "alpha", {"a": 1})
    t.call("drop", q.drop_queue, "alpha")
    t.call("drop missing", q.drop_queue, "alpha")
    t.call("list after drop", lambda: by_name(q.list_queues()))
    t.call("metrics_all after drop", lambda: by_name(q.metrics_all()))
    t.call("create after drop", q.create_queue, "alpha")
    t.call("ids restart", q.send, "alpha", {"a": 2})
    t.call("unlogged queue works", q.send_batch, "beta", [{"b": 1}, {"b": 2}])
    t.call("read unlogged", q.read, "beta", vt=30, qty=5)


@kinds
def test_queue_lifecycle(kind: str, real_pgmq_dsn: str, facade_dsn: str) -> None:
    real, facade = both(kind, queue_lifecycle, real_pgmq_dsn, facade_dsn)
    assert real["list"][1]["is_unlogged"] is True  # the reference really made it unlogged
    assert_same(
        real,
        facade,
        documented={"list": durable, "list after drop": durable},
    )


def partitioned(q: Any, t: Trace) -> None:
    t.call("create partitioned", q.create_partitioned_queue, "parts")
    t.call("create partitioned, time", q.create_partitioned_queue, "parts", "1 day", "7 days")
    t.call("list", lambda: by_name(q.list_queues()))


@kinds
def test_create_partitioned_is_refused_with_a_clear_error(
    kind: str, real_pgmq_dsn: str, facade_dsn: str
) -> None:
    real, facade = both(kind, partitioned, real_pgmq_dsn, facade_dsn)
    # Real PGMQ needs pg_partman for it (not installed here: it raises too); the
    # facade refuses it whatever the server has, and says so.
    for step in ("create partitioned", "create partitioned, time"):
        refusal = facade[step]
        assert type(refusal).__name__ == "Raised", refusal
        assert "partition" in refusal.message.lower(), refusal
        assert type(real[step]).__name__ == "Raised", real[step]
    assert facade["list"] == [] == real["list"]


# -- sending ---------------------------------------------------------------------------------


def sending(q: Any, t: Trace) -> None:
    q.create_queue("jobs")
    t.call("send", q.send, "jobs", {"n": 1})
    t.call("send headers", q.send, "jobs", {"n": 2}, headers={"h": "two", "nested": {"x": [1]}})
    t.call("send delay", q.send, "jobs", {"n": 3}, delay=30)
    t.call("send headers delay", q.send, "jobs", {"n": 4}, headers={"h": 4}, delay=30)
    t.call("send past timestamp", q.send, "jobs", {"n": 5}, delay=later(-60))
    t.call(
        "send headers timestamp",
        q.send,
        "jobs",
        {"n": 6},
        headers={"h": 6},
        delay=whole_second_boundary(30),
    )
    t.call("send tz alias", q.send, "jobs", {"n": 7}, tz=30)
    t.call("send zero delay", q.send, "jobs", {"n": 8}, delay=0)
    t.call("send empty object", q.send, "jobs", {})
    t.call("send null headers", q.send, "jobs", {"n": 10}, headers=None)
    t.call("batch", q.send_batch, "jobs", [{"n": 11}, {"n": 12}])
    t.call("batch headers", q.send_batch, "jobs", [{"n": 13}, {"n": 14}], [{"h": 13}, {"h": 14}])
    t.call("batch delay", q.send_batch, "jobs", [{"n": 15}], delay=30)
    t.call("batch headers delay", q.send_batch, "jobs", [{"n": 16}], [{"h": 16}], delay=30)
    t.call("batch timestamp", q.send_batch, "jobs", [{"n": 17}], delay=whole_second_boundary(30))
    t.call("batch past timestamp", q.send_batch, "jobs", [{"n": 18}], [{"h": 18}], later(-5))
    t.call("batch empty", q.send_batch, "jobs", [])
    t.call("batch headers mismatch", q.send_batch, "jobs", [{"n": 0}], [{"h": 1}, {"h": 2}])
    t.call("metrics", q.metrics, "jobs")
    t.call("read visible", q.read, "jobs", vt=30, qty=50)
    t.call("metrics after read", q.metrics, "jobs")


@kinds
def test_send_and_send_batch(kind: str, real_pgmq_dsn: str, facade_dsn: str) -> None:
    real, facade = both(kind, sending, real_pgmq_dsn, facade_dsn)
    assert_same(real, facade)


def unicode_and_big(q: Any, t: Trace) -> None:
    q.create_queue("jobs")
    body = {"text": "h\u00e9llo \u2603 \U0001f600", "zero": "a\\u0000b", "list": list(range(50))}
    body["big"] = "x" * 200_000
    t.call("send", q.send, "jobs", body, headers={"k\u00e9y": "v\u00e0l", "n": None, "b": True})
    t.call("send array", q.send, "jobs", [1, "two", None])  # PGMQ takes any JSON value
    t.call("send scalar", q.send, "jobs", "just a string")
    t.call("read", q.read, "jobs", vt=30, qty=5)


@kinds
def test_message_bodies_round_trip(kind: str, real_pgmq_dsn: str, facade_dsn: str) -> None:
    real, facade = both(kind, unicode_and_big, real_pgmq_dsn, facade_dsn)
    assert_same(real, facade)


def header_shapes(q: Any, t: Trace) -> None:
    q.create_queue("jobs")
    t.call("empty headers", q.send, "jobs", {"n": 1}, headers={})
    t.call("group header not a string", q.send, "jobs", {"n": 3}, headers={"x-pgmq-group": 7})
    t.call("batch of JSON values", q.send_batch, "jobs", [1, "s", [1], {}])
    t.call("read", q.read, "jobs", vt=30, qty=10)


@kinds
def test_header_and_body_shapes(kind: str, real_pgmq_dsn: str, facade_dsn: str) -> None:
    """PGMQ stores any JSON value as a body, and an empty object as headers."""
    real, facade = both(kind, header_shapes, real_pgmq_dsn, facade_dsn)
    assert_same(real, facade)


def header_refusals(q: Any, t: Trace) -> None:
    q.create_queue("jobs")
    t.call("headers with a _pg_ key", q.send, "jobs", {"n": 1}, headers={"_pg_trace": "x"})
    t.call("headers a list", q.send, "jobs", {"n": 2}, headers=["a", "b"])
    t.call("headers a string", q.send, "jobs", {"n": 3}, headers="h")
    t.call("batch headers a list", q.send_batch, "jobs", [{"n": 4}], headers=[[1]])
    t.call("queue length", lambda: q.metrics("jobs").queue_length)


@kinds
def test_headers_that_are_not_an_object_or_use_pg_keys_are_refused(
    kind: str, real_pgmq_dsn: str, facade_dsn: str
) -> None:
    """PGMQ stores any JSON as headers; the facade wants an object without _pg_ keys (22023,
    nothing sent), as docs/pgmq.md says."""
    real, facade = both(kind, header_refusals, real_pgmq_dsn, facade_dsn)
    refused = {
        label: (lambda r: r if isinstance(r, Raised) else bad_argument(r))  # an error on both stays
        for label in (
            "headers with a _pg_ key",
            "headers a list",
            "headers a string",
            "batch headers a list",
        )
    }
    assert_same(real, facade, documented={**refused, "queue length": lambda _: 0})


def body_none(q: Any, t: Trace) -> None:
    q.create_queue("jobs")
    # None: JSON null through psycopg and asyncpg, SQL NULL through SQLAlchemy
    t.call("body None", q.send, "jobs", None)
    t.call("batch body None", q.send_batch, "jobs", [None, {"n": 2}])
    t.call("read", q.read, "jobs", vt=30, qty=10)


@kinds
def test_a_none_body_reads_back_as_none(kind: str, real_pgmq_dsn: str, facade_dsn: str) -> None:
    """PGMQ stores an SQL NULL body, the facade JSON null: a client reads None from both."""
    real, facade = both(kind, body_none, real_pgmq_dsn, facade_dsn)
    assert_same(real, facade)


def timestamp_delay(q: Any, t: Trace) -> None:
    q.create_queue("jobs")
    at = later(2.5)
    t.call("send at", q.send, "jobs", {"n": 1}, delay=at)
    t.call("batch at", q.send_batch, "jobs", [{"n": 2}], delay=at)
    rows = t.sql("SELECT msg_id, vt FROM pgmq.q_jobs ORDER BY msg_id")
    t.record("vt - requested", [(vt - at).total_seconds() for _, vt in rows])
    t.call("invisible before", q.read, "jobs", vt=30, qty=5)
    time.sleep((at - datetime.now(UTC)).total_seconds() + 1.1)
    t.call("visible after", q.read, "jobs", vt=30, qty=5)


@kinds
def test_timestamp_delay_is_rounded_up_to_whole_seconds(
    kind: str, real_pgmq_dsn: str, facade_dsn: str
) -> None:
    real, facade = both(kind, timestamp_delay, real_pgmq_dsn, facade_dsn)
    assert real["vt - requested"] == [0.0, 0.0]  # PGMQ keeps the timestamp as given
    # The facade: never earlier than asked, less than a second later.
    assert all(0 <= d < 1.0 for d in facade["vt - requested"]), facade["vt - requested"]
    assert_same(real, facade, documented={"vt - requested": lambda _: facade["vt - requested"]})


# -- reading ---------------------------------------------------------------------------------


def send_later(dsn: str, queue: str, body: str, after: float) -> threading.Thread:
    """Send one message from another connection `after` seconds from now."""

    def run() -> None:
        time.sleep(after)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pgmq.send(%s, %s::jsonb)", (queue, body))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def reading(q: Any, t: Trace) -> None:
    q.create_queue("jobs")
    q.send_batch(
        "jobs",
        [{"n": i, "kind": "even" if i % 2 == 0 else "odd"} for i in range(1, 9)],
        [{"i": i} for i in range(1, 9)],
    )
    t.call("read one", q.read, "jobs")
    t.call("read two", q.read, "jobs", vt=5, qty=2)
    t.call("read conditional", q.read, "jobs", vt=10, qty=5, conditional={"kind": "even"})
    t.call("read conditional none", q.read, "jobs", vt=10, qty=5, conditional={"kind": "nope"})
    t.call("read_batch", q.read_batch, "jobs", vt=10, batch_size=2)
    t.call("read one more", q.read, "jobs", vt=10, qty=1)
    t.call("read empty", q.read, "jobs")
    t.call("read empty many", q.read, "jobs", qty=3)
    t.call("read_batch empty", q.read_batch, "jobs")
    t.call("make visible", q.set_vt, "jobs", [1, 2, 3], 0)
    t.call("read again", q.read, "jobs", vt=30, qty=5)
    t.call("make visible again", q.set_vt, "jobs", [1], 0)
    t.call("read_with_poll ready", q.read_with_poll, "jobs", vt=30, qty=5, max_poll_seconds=2)
    started = time.monotonic()
    t.call("read_with_poll empty", q.read_with_poll, "jobs", qty=2, max_poll_seconds=1)
    # its 1 s, not the default 5 s (the room is for a loaded machine)
    t.record("poll waited ~1s", 0.9 <= time.monotonic() - started < 4.5)
    thread = send_later(t.dsn, "jobs", '{"late": true}', 0.5)
    started = time.monotonic()
    t.call("read_with_poll arrival", q.read_with_poll, "jobs", vt=30, max_poll_seconds=120)
    # at the send (0.5 s), not its 120 s deadline: a bound far above what load adds
    t.record("poll returned on arrival", time.monotonic() - started < 60)
    thread.join()
    q.send_batch("jobs", [{"kind": "even", "m": 1}, {"kind": "odd", "m": 2}])
    t.call(
        "read_with_poll conditional",
        q.read_with_poll,
        "jobs",
        vt=30,
        qty=5,
        max_poll_seconds=1,
        poll_interval_ms=50,
        conditional={"kind": "odd"},
    )
    t.call("metrics", q.metrics, "jobs")


@kinds
def test_read_read_batch_read_with_poll(kind: str, real_pgmq_dsn: str, facade_dsn: str) -> None:
    real, facade = both(kind, reading, real_pgmq_dsn, facade_dsn)
    assert_same(real, facade)


def popping_and_vt(q: Any, t: Trace) -> None:
    q.create_queue("jobs")
    q.send_batch("jobs", [{"n": i} for i in range(1, 7)], [{"i": i} for i in range(1, 7)])
    t.call("pop", q.pop, "jobs")
    t.call("pop two", q.pop, "jobs", qty=2)
    t.call("set_vt", q.set_vt, "jobs", 4, 60)
    t.call("set_vt timestamp", q.set_vt, "jobs", 5, whole_second_boundary(120))
    t.call("set_vt negative", q.set_vt, "jobs", 6, -10)
    t.call("pop skips invisible", q.pop, "jobs", qty=5)
    t.call("set_vt batch", q.set_vt, "jobs", [4, 5], 0)
    t.call("set_vt batch timestamp", q.set_vt, "jobs", (4, 5, 99), later(-1))
    t.call("set_vt missing", q.set_vt, "jobs", 99, 10)
    t.call("set_vt batch missing", q.set_vt, "jobs", [98, 99], 10)
    t.call("metrics", q.metrics, "jobs")
    t.call("pop rest", q.pop, "jobs", qty=5)
    t.call("pop empty", q.pop, "jobs")
    t.call("pop empty many", q.pop, "jobs", qty=3)
    q.send("jobs", {"n": 7})
    t.call("read it", q.read, "jobs", vt=30)
    t.call("pop leased", q.pop, "jobs")
    t.call("set_vt leased", q.set_vt, "jobs", 7, 0)
    t.call("pop after set_vt", q.pop, "jobs")


@kinds
def test_pop_and_set_vt(kind: str, real_pgmq_dsn: str, facade_dsn: str) -> None:
    real, facade = both(kind, popping_and_vt, real_pgmq_dsn, facade_dsn)
    assert_same(real, facade)


def edges(q: Any, t: Trace) -> None:
    q.create_queue("jobs")
    q.send_batch("jobs", [{"n": 1}, {"n": 2}])
    t.call("read qty 0", q.read, "jobs", vt=30, qty=0)
    t.call("pop qty 0", q.pop, "jobs", qty=0)
    t.call("read negative qty", q.read, "jobs", vt=30, qty=-1)
    t.call("read_with_poll no wait", q.read_with_poll, "jobs", vt=30, qty=5, max_poll_seconds=0)
    t.call("metrics", q.metrics, "jobs")


@kinds
def test_edge_arguments(kind: str, real_pgmq_dsn: str, facade_dsn: str) -> None:
    """qty 0, a negative qty (documented: 22023 for PGMQ's LIMIT error), no time to poll."""
    real, facade = both(kind, edges, real_pgmq_dsn, facade_dsn)
    assert real["read negative qty"].sqlstate == "2201W"
    # Documented: the facade's read_with_poll always reads once; PGMQ's, given no
    # time, returns before reading.
    assert ids(real["read_with_poll no wait"]) == []
    assert ids(facade["read_with_poll no wait"]) == [1, 2]
    assert_same(
        real,
        facade,
        documented={
            "read_with_poll no wait": lambda _: facade["read_with_poll no wait"],
            "metrics": lambda m: {**m, "queue_visible_length": 0},
        },
    )


def negative_times(q: Any, t: Trace) -> None:
    q.create_queue("delays")
    t.call("send negative delay", q.send, "delays", {"n": 1}, delay=-5)
    t.call("send_batch negative delay", q.send_batch, "delays", [{"n": 2}], delay=-5)
    t.call("read them", q.read, "delays", vt=30, qty=5)
    q.create_queue("vts")
    q.send("vts", {"n": 1})
    t.call("read negative vt", q.read, "vts", vt=-10, qty=1)
    t.call("read it again", q.read, "vts", vt=30, qty=1)


@kinds
def test_negative_delay_and_vt(kind: str, real_pgmq_dsn: str, facade_dsn: str) -> None:
    """PGMQ takes a negative delay or vt as a time in the past (visible at once)."""
    real, facade = both(kind, negative_times, real_pgmq_dsn, facade_dsn)
    assert ids(real["read them"]) == [1, 2] and ids(real["read it again"]) == [1]
    assert_same(real, facade)


def exact_set_vt(q: Any, t: Trace) -> None:
    q.create_queue("jobs")
    q.send_batch("jobs", [{"n": 1}, {"n": 2}])
    at = later(100.25)
    one = q.set_vt("jobs", 1, at)
    t.record("set_vt timestamp kept exactly", one.vt == at)
    many = q.set_vt("jobs", [1, 2], at)
    t.record("set_vt batch timestamp kept exactly", [m.vt == at for m in many])


@kinds
def test_set_vt_timestamp_is_exact(kind: str, real_pgmq_dsn: str, facade_dsn: str) -> None:
    real, facade = both(kind, exact_set_vt, real_pgmq_dsn, facade_dsn)
    assert_same(real, facade)


# -- archive, delete, purge, metrics ---------------------------------------------------------


def archiving(q: Any, t: Trace) -> None:
    q.create_queue("jobs")
    q.send_batch("jobs", [{"n": i} for i in range(1, 9)], [{"i": i} for i in range(1, 9)])
    t.call("read", q.read, "jobs", vt=30, qty=2)
    t.call("archive", q.archive, "jobs", 1)
    t.call("archive again", q.archive, "jobs", 1)
    t.call("archive batch", q.archive_batch, "jobs", [2, 3, 99])
    t.call("archive batch none", q.archive_batch, "jobs", [98, 99])
    t.call("delete", q.delete, "jobs", 4)
    t.call("delete again", q.delete, "jobs", 4)
    t.call("delete archived", q.delete, "jobs", 2)
    t.call("delete batch", q.delete_batch, "jobs", [5, 6, 99])
    t.call("delete batch empty", q.delete_batch, "jobs", [])
    t.call(
        "archive table",
        t.sql,
        "SELECT msg_id, read_ct, message, headers, enqueued_at, last_read_at, archived_at"
        " FROM pgmq.a_jobs ORDER BY msg_id",
    )
    t.call("metrics", q.metrics, "jobs")
    t.call("read rest", q.read, "jobs", vt=30, qty=10)
    t.call("purge", q.purge, "jobs")
    t.call("purge empty", q.purge, "jobs")
    t.call("metrics after purge", q.metrics, "jobs")
    t.call("archive after purge", t.sql, "SELECT msg_id FROM pgmq.a_jobs ORDER BY msg_id")
    t.call("send after purge", q.send, "jobs", {"n": 9})


@kinds
def test_archive_delete_purge(kind: str, real_pgmq_dsn: str, facade_dsn: str) -> None:
    real, facade = both(kind, archiving, real_pgmq_dsn, facade_dsn)
    assert_same(real, facade)


def metrics(q: Any, t: Trace) -> None:
    q.create_queue("busy")
    q.create_queue("idle")
    q.send("busy", {"n": 1})
    time.sleep(3.2)  # the oldest message is older than the newest by three seconds
    q.send("busy", {"n": 2})
    q.send("busy", {"n": 3}, delay=60)
    q.read("busy", vt=30)
    t.call("metrics busy", q.metrics, "busy")
    t.call("metrics idle", q.metrics, "idle")
    t.call("metrics_all", lambda: by_name(q.metrics_all()))
    q.drop_queue("idle")
    t.call("metrics_all after drop", lambda: by_name(q.metrics_all()))


@kinds
def test_metrics_and_metrics_all(kind: str, real_pgmq_dsn: str, facade_dsn: str) -> None:
    real, facade = both(kind, metrics, real_pgmq_dsn, facade_dsn)
    assert_same(real, facade)


def primary(message: str) -> str:
    """An error's first line, without the client's wrapping ('(psycopg.errors.X) ...')."""
    first = message.splitlines()[0] if message else ""
    return first.split(") ", 1)[1] if first.startswith("(") and ") " in first else first


def bad_argument(error: Raised) -> Raised:
    """The facade's error for an argument PGMQ refuses with P0001 (docs/pgmq.md: 22023)."""
    return Raised("22023", "", "")


def missing_queue(q: Any, t: Trace) -> None:
    t.call("send", q.send, "missing", {"n": 1})
    t.call("send_batch", q.send_batch, "missing", [{"n": 1}])
    t.call("read", q.read, "missing")
    t.call("read_with_poll", q.read_with_poll, "missing", max_poll_seconds=1)
    t.call("pop", q.pop, "missing")
    t.call("set_vt", q.set_vt, "missing", 1, 10)
    t.call("delete", q.delete, "missing", 1)
    t.call("delete_batch", q.delete_batch, "missing", [1])
    t.call("archive", q.archive, "missing", 1)
    t.call("archive_batch", q.archive_batch, "missing", [1])
    t.call("purge", q.purge, "missing")
    t.call("metrics", q.metrics, "missing")
    t.call("enable_notify", q.enable_notify, "missing")
    t.call("bind_topic", q.bind_topic, "x.*", "missing")
    t.call("drop", q.drop_queue, "missing")


@kinds
def test_calls_on_a_missing_queue(kind: str, real_pgmq_dsn: str, facade_dsn: str) -> None:
    """Each call on a queue that does not exist fails as on PGMQ: same SQLSTATE, same text."""
    real, facade = both(kind, missing_queue, real_pgmq_dsn, facade_dsn)
    # PGMQ fails with 42P01 (its table is missing; P0001 where it checks first)
    refused = [label for label, value in real.steps if isinstance(value, Raised)]
    assert refused == [label for label, _ in real.steps if label != "drop"]
    for label in refused:
        assert real[label].sqlstate in ("42P01", "P0001"), real[label]
        assert primary(facade[label].message) == primary(real[label].message), label
    assert_same(real, facade)


def bad_arguments(q: Any, t: Trace) -> None:
    q.create_queue("jobs")
    t.call("validate 47 chars", q.validate_queue_name, "v" * 47)
    t.call("validate 48 chars", q.validate_queue_name, "v" * 48)
    t.call("create 48 chars", q.create_queue, "c" * 48)
    t.call("enable_notify negative", q.enable_notify, "jobs", -1)
    t.call("send_topic empty key", q.send_topic, "", {"n": 3})
    t.call("list", lambda: by_name(q.list_queues()))


@kinds
def test_bad_arguments(kind: str, real_pgmq_dsn: str, facade_dsn: str) -> None:
    """Arguments PGMQ refuses are refused with PGMQ's error (P0001, its text), and nothing
    changes."""
    real, facade = both(kind, bad_arguments, real_pgmq_dsn, facade_dsn)
    refused = ["validate 48 chars", "create 48 chars", "enable_notify negative"]
    refused.append("send_topic empty key")
    for label in refused:
        assert real[label].sqlstate == "P0001", real[label]
        assert primary(facade[label].message) == primary(real[label].message), label
    assert_same(real, facade)


def notify_not_enabled(q: Any, t: Trace) -> None:
    q.create_queue("jobs")
    t.call("update_notify not enabled", q.update_notify, "jobs", 10)


@kinds
def test_update_notify_of_a_queue_without_notify(
    kind: str, real_pgmq_dsn: str, facade_dsn: str
) -> None:
    """PGMQ's error: P0001, 'Queue "jobs" does not have notify_insert enabled. ...'."""
    real, facade = both(kind, notify_not_enabled, real_pgmq_dsn, facade_dsn)
    label = "update_notify not enabled"
    assert primary(facade[label].message) == primary(real[label].message)
    assert_same(real, facade)


def poison(q: Any, t: Trace) -> None:
    q.create_queue("jobs")
    q.send("jobs", {"n": 1})
    for i in range(12):  # beyond pgqueue's default max_attempts (5)
        q.set_vt("jobs", 1, 0)
        t.call(f"read {i + 1}", q.read, "jobs", vt=30)
    t.call("metrics", q.metrics, "jobs")


@kinds
def test_queues_created_through_pgmq_never_poison_drop(
    kind: str, real_pgmq_dsn: str, facade_dsn: str
) -> None:
    real, facade = both(kind, poison, real_pgmq_dsn, facade_dsn)
    assert real["read 12"]["read_ct"] == 12
    assert_same(real, facade)


# -- FIFO groups -----------------------------------------------------------------------------


def grp(name: str) -> dict[str, str]:
    return {"x-pgmq-group": name}


def ids(messages: Any) -> list[int]:
    """The msg_ids of a normalized read result."""
    if messages is None:
        return []
    if isinstance(messages, dict):
        return [messages["msg_id"]]
    return [m["msg_id"] for m in messages]


def one_group_each(q: Any, t: Trace) -> None:
    # One message per group: every grouped read gives the same on both sides.
    for read in ("read_grouped", "read_grouped_rr"):
        queue = f"fifo_{read}"
        q.create_queue(queue)
        q.send_batch(queue, [{"g": g} for g in "abc"], [grp(g) for g in "abc"])
        fn = getattr(q, read)
        t.call(f"{read} all heads", fn, queue, vt=30, qty=10)
        t.call(f"{read} nothing left", fn, queue, vt=30, qty=10)
        q.send(queue, {"g": "a2"}, headers=grp("a"))
        t.call(f"{read} group held", fn, queue, vt=30, qty=10)
        q.delete(queue, 1)
        t.call(f"{read} next of group", fn, queue, vt=30, qty=10)
        poll = getattr(q, f"{read}_with_poll")
        t.call(f"{read}_with_poll empty", poll, queue, vt=30, qty=2, max_poll_seconds=1)
        q.delete(queue, 4)
        q.send(queue, {"g": "d"}, headers=grp("d"))
        t.call(f"{read}_with_poll", poll, queue, vt=30, qty=2, max_poll_seconds=2)


@kinds
def test_grouped_reads_one_message_per_group(
    kind: str, real_pgmq_dsn: str, facade_dsn: str
) -> None:
    real, facade = both(kind, one_group_each, real_pgmq_dsn, facade_dsn)
    assert_same(real, facade)


def groups_of_two(q: Any, t: Trace) -> None:
    q.create_queue("sqs")
    # a1 a2 b1 b2 c1: PGMQ's read_grouped fills a batch from the oldest group first.
    q.send_batch(
        "sqs", [{"m": m} for m in ("a1", "a2", "b1", "b2", "c1")], [grp(m[0]) for m in "aabbc"]
    )
    t.call("read_grouped 3", q.read_grouped, "sqs", vt=30, qty=3)
    t.call("read_grouped rest", q.read_grouped, "sqs", vt=30, qty=10)
    q.create_queue("rr")
    q.send_batch(
        "rr", [{"m": m} for m in ("a1", "a2", "b1", "b2", "c1")], [grp(m[0]) for m in "aabbc"]
    )
    # PGMQ's read_grouped_rr takes the heads of all groups, then their second messages...
    t.call("read_grouped_rr 4", q.read_grouped_rr, "rr", vt=30, qty=4)
    t.call("read_grouped_rr rest", q.read_grouped_rr, "rr", vt=30, qty=10)


def first_of_each_group(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The documented facade result of a grouped read: only the head of each group."""
    seen: set[str] = set()
    out = []
    for m in sorted(messages, key=lambda m: m["msg_id"]):
        g = m["headers"]["x-pgmq-group"]
        if g not in seen:
            seen.add(g)
            out.append(m)
    return out


@kinds
def test_grouped_reads_fill_batches_as_pgmq_does(
    kind: str, real_pgmq_dsn: str, facade_dsn: str
) -> None:
    real, facade = both(kind, groups_of_two, real_pgmq_dsn, facade_dsn)
    assert ids(real["read_grouped 3"]) == [1, 2, 3]  # a1 a2 b1
    assert ids(real["read_grouped_rr 4"]) == [1, 3, 5, 2]  # a1 b1 c1, then a2
    assert ids(real["read_grouped rest"]) == [5]
    assert_same(real, facade)


def ungrouped_among_groups(q: Any, t: Trace) -> None:
    q.create_queue("mixed")
    q.send_batch(
        "mixed",
        [{"m": m} for m in ("u1", "a1", "u2", "b1")],
        [{}, grp("a"), {}, grp("b")],
    )
    t.call("read_grouped", q.read_grouped, "mixed", vt=30, qty=10)
    q.set_vt("mixed", [1, 2, 3, 4], 0)
    t.call("read_grouped_rr", q.read_grouped_rr, "mixed", vt=30, qty=10)
    # Only ungrouped messages, one of them in flight: does it hold back the others?
    q.create_queue("plain")
    q.send_batch("plain", [{"m": "u1"}, {"m": "u2"}, {"m": "u3"}])
    for read in ("read_grouped", "read_grouped_rr"):
        t.call(f"{read} first", getattr(q, read), "plain", vt=30, qty=1)
        t.call(f"{read} while it is in flight", getattr(q, read), "plain", vt=30, qty=5)
        q.set_vt("plain", [1, 2, 3], 0)


@kinds
def test_grouped_reads_with_ungrouped_messages(
    kind: str, real_pgmq_dsn: str, facade_dsn: str
) -> None:
    """In PGMQ's grouped reads messages without the header form one shared group; the
    facade's grouped reads do the same."""
    real, facade = both(kind, ungrouped_among_groups, real_pgmq_dsn, facade_dsn)
    assert ids(real["read_grouped_rr"]) == [1, 2, 4, 3]  # u1 a1 b1, then u2 (default group)
    for read in ("read_grouped", "read_grouped_rr"):
        # u1 in flight holds back u2 and u3 in the default group
        assert ids(real[f"{read} while it is in flight"]) == []
    assert_same(real, facade)


def plain_read_of_groups(q: Any, t: Trace) -> None:
    q.create_queue("jobs")
    q.send_batch("jobs", [{"m": m} for m in ("a1", "a2", "b1")], [grp("a"), grp("a"), grp("b")])
    t.call("read", q.read, "jobs", vt=30, qty=10)
    t.call("pop", q.pop, "jobs", qty=10)


@kinds
def test_plain_read_honours_the_group_header(
    kind: str, real_pgmq_dsn: str, facade_dsn: str
) -> None:
    real, facade = both(kind, plain_read_of_groups, real_pgmq_dsn, facade_dsn)
    assert ids(real["read"]) == [1, 2, 3]  # PGMQ's plain read ignores groups
    assert ids(facade["read"]) == [1, 3]  # the facade's does not: a2 waits for a1
    assert_same(
        real,
        facade,
        documented={"read": first_of_each_group, "pop": lambda _: facade["pop"]},
    )
    assert ids(real["pop"]) == [] and ids(facade["pop"]) == []


# -- notify-on-insert ------------------------------------------------------------------------


def listen(q: Any, kind: str, queue: str, dsn: str) -> Any:
    """Start the client's own notification listener on queue; a (received, stop) pair."""
    from pgmq.notify_listener import AsyncNotificationListener, SyncNotificationListener

    received: list[dict[str, Any]] = []
    if kind in ASYNC_KINDS:
        alistener = AsyncNotificationListener(q.client)

        async def on_insert(payload: dict[str, Any]) -> None:
            received.append(payload)

        callback: Any = on_insert  # the listener awaits it, whatever its annotation says
        task = q._loop.create_task(alistener.listen(queue, callback))
        wait_until(lambda: q.run(asyncio.sleep(0.05)) or listening(dsn, queue))

        def astop() -> None:
            q.run(asyncio.sleep(1.2))  # the listener polls its queue once a second
            alistener.stop()
            q.run(task)

        return received, astop
    listener = SyncNotificationListener(q)
    thread = threading.Thread(
        target=listener.listen, args=(queue, received.append), kwargs={"timeout": 30}, daemon=True
    )
    thread.start()
    wait_until(lambda: listening(dsn, queue))

    def stop() -> None:
        time.sleep(0.3)
        listener.stop()
        thread.join(5)

    return received, stop


def listening(dsn: str, queue: str) -> bool:
    """A session of this database has run the client listener's LISTEN on queue's channel."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND query ILIKE %s",
            (f'LISTEN "pgmq.q_{queue}.INSERT"%',),
        ).fetchone()
    return bool(row and row[0])


SENTINEL = {"sentinel": True}


def settle(q: Any, kind: str, dsn: str, received: list[dict[str, Any]]) -> None:
    """Wait until every notification so far has reached the listener, then drop the sentinel.

    A sentinel notified now on the channel comes after all of them (notifications
    arrive in commit order): seen, not guessed from a pause a loaded machine fills.
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_notify('pgmq.q_jobs.INSERT', %s)", (json.dumps(SENTINEL),))

    def arrived() -> bool:
        if kind in ASYNC_KINDS:
            q.run(asyncio.sleep(0.05))  # the listener's task runs on the client's loop
        return SENTINEL in received

    wait_until(arrived)
    received[:] = [p for p in received if p != SENTINEL]


def notifying(kind: str) -> Any:
    def scenario(q: Any, t: Trace) -> None:
        q.create_queue("jobs")
        q.create_queue("other")
        t.call("enable", q.enable_notify, "jobs", throttle_interval_ms=0)
        t.call("enable default throttle", q.enable_notify, "other")
        t.call("list", q.list_notify_throttles)
        received, stop = listen(q, kind, "jobs", t.dsn)
        for i in range(3):
            q.send("jobs", {"n": i})
        q.send_batch("jobs", [{"n": 3}, {"n": 4}])
        q.send("other", {"n": 0})
        settle(q, kind, t.dsn, received)
        t.record("notifications unthrottled", len(received))
        t.call("update", q.update_notify, "jobs", 60_000)
        t.call("list after update", q.list_notify_throttles)
        for i in range(3):
            q.send("jobs", {"n": i})
        settle(q, kind, t.dsn, received)
        t.record("notifications throttled", len(received))
        t.call("list after sends", q.list_notify_throttles)
        t.call("disable", q.disable_notify, "jobs")
        q.send("jobs", {"n": 9})
        settle(q, kind, t.dsn, received)
        stop()
        t.record("notifications after disable", len(received))
        t.record("payloads", received)
        t.call("list after disable", q.list_notify_throttles)

    return scenario


@kinds
def test_notify_insert_and_the_listener(kind: str, real_pgmq_dsn: str, facade_dsn: str) -> None:
    real, facade = both(kind, notifying(kind), real_pgmq_dsn, facade_dsn)
    assert real["notifications unthrottled"] == 4  # three sends, one batch (one transaction)
    assert real["notifications throttled"] == 5
    assert_same(real, facade)


# -- topics ----------------------------------------------------------------------------------


def topics(q: Any, t: Trace) -> None:
    for name in ("orders", "audit", "eu"):
        q.create_queue(name)
    t.call("bind", q.bind_topic, "orders.*", "orders")
    t.call("bind all", q.bind_topic, "#", "audit")
    t.call("bind eu", q.bind_topic, "*.eu.#", "eu")
    t.call("bind twice", q.bind_topic, "orders.*", "orders")
    t.call(
        "bindings", lambda: sorted(q.list_topic_bindings(), key=lambda b: (b.queue_name, b.pattern))
    )
    t.call("bindings of orders", q.list_topic_bindings, "orders")
    t.call("routing", lambda: sorted(q.test_routing("orders.eu"), key=lambda r: r.queue_name))
    t.call("send_topic", q.send_topic, "orders.eu", {"n": 1})
    t.call("send_topic headers delay", q.send_topic, "orders.new", {"n": 2}, {"h": 1}, 0)
    t.call(
        "send_batch_topic",
        lambda: sorted(
            q.send_batch_topic("x.eu.y", [{"n": 4}, {"n": 5}], [{"h": 4}, {"h": 5}]),
            key=lambda r: (r.queue_name, r.msg_id),
        ),
    )
    t.call("send_batch_topic delay", q.send_batch_topic, "orders.x", [{"n": 6}], delay=later(-1))
    for name in ("orders", "audit", "eu"):
        t.call(f"read {name}", q.read, name, vt=30, qty=10)
    t.call("unbind", q.unbind_topic, "orders.*", "orders")
    t.call("unbind again", q.unbind_topic, "orders.*", "orders")
    t.call(
        "bindings after unbind", lambda: sorted(q.list_topic_bindings(), key=lambda b: b.pattern)
    )
    for key in ("orders.new", "a..b", "", "a.*", "a" * 300):
        t.call(f"valid routing key {key[:12]!r}", q.validate_routing_key, key)
    for pattern in ("orders.*", "#", "a.#.b", "a..b", "", "a.b*"):
        t.call(f"valid pattern {pattern!r}", q.validate_topic_pattern, pattern)
    q.drop_queue("eu")
    t.call("bindings after drop", lambda: sorted(q.list_topic_bindings(), key=lambda b: b.pattern))


@kinds
def test_topics(kind: str, real_pgmq_dsn: str, facade_dsn: str) -> None:
    real, facade = both(kind, topics, real_pgmq_dsn, facade_dsn)
    assert_same(real, facade)


# -- maintenance calls -----------------------------------------------------------------------


def maintenance(q: Any, t: Trace) -> None:
    q.create_queue("jobs")
    q.send("jobs", {"n": 1})
    q.archive("jobs", 1)
    t.call("detach_archive", q.detach_archive, "jobs")
    t.call("archive kept", t.sql, "SELECT msg_id FROM pgmq.a_jobs")
    t.call("create_fifo_index", q.create_fifo_index, "jobs")
    t.call("create_fifo_indexes_all", q.create_fifo_indexes_all)
    t.call("convert_archive_partitioned", q.convert_archive_partitioned, "jobs")
    t.call("still works", q.send, "jobs", {"n": 2})


@kinds
def test_maintenance_calls(kind: str, real_pgmq_dsn: str, facade_dsn: str) -> None:
    real, facade = both(kind, maintenance, real_pgmq_dsn, facade_dsn)
    # Without pg_partman, converting an archive fails on PGMQ (22004, where it asks for
    # pg_partman's schema); the facade fails the same way, as PGMQ's clients meet it.
    assert real["convert_archive_partitioned"] == facade["convert_archive_partitioned"]
    assert type(real["convert_archive_partitioned"]).__name__ == "Raised"
    assert_same(real, facade)


# -- transactions ----------------------------------------------------------------------------


class Rollback(Exception):
    """Raised inside a transaction to roll it back."""


def in_transaction(q: Any, kind: str, work: Any, commit: bool) -> None:
    """Run work(conn) in one transaction of the client's own connection: committed, or not."""
    try:
        if kind == "psycopg":
            with q.pool.connection() as conn, conn.transaction():
                work(conn)
                if not commit:
                    raise Rollback
        elif kind == "sqlalchemy":
            with q.engine.begin() as conn:
                work(conn)
                if not commit:
                    raise Rollback
        else:
            client = q.client

            async def run() -> None:
                if kind == "asyncpg":
                    async with client.pool.acquire() as conn, conn.transaction():
                        await work(conn)
                        if not commit:
                            raise Rollback
                else:
                    async with client.engine.begin() as conn:
                        await work(conn)
                        if not commit:
                            raise Rollback

            q.run(run())
    except Rollback:
        pass


QUEUE_TABLE = "SELECT msg_id, read_ct, message FROM pgmq.q_jobs ORDER BY msg_id"


def transactions(kind: str) -> Any:
    def scenario(q: Any, t: Trace) -> None:
        q.create_queue("jobs")
        t.call("send first", q.send, "jobs", {"n": 1})
        c = q.client if kind in ASYNC_KINDS else q
        seen: list[Any] = []

        def sync_work(conn: Any) -> None:
            seen.append(c.send("jobs", {"n": "in tx"}, conn=conn))
            seen.append(c.delete("jobs", 1, conn=conn))
            seen.append(c.read("jobs", vt=30, qty=5, conn=conn))

        async def async_work(conn: Any) -> None:
            seen.append(await c.send("jobs", {"n": "in tx"}, conn=conn))
            seen.append(await c.delete("jobs", 1, conn=conn))
            seen.append(await c.read("jobs", vt=30, qty=5, conn=conn))

        work = async_work if kind in ASYNC_KINDS else sync_work
        in_transaction(q, kind, work, commit=False)
        t.record("inside the rolled back transaction", seen)
        t.call("table after rollback", t.sql, QUEUE_TABLE)
        t.call("metrics after rollback", q.metrics, "jobs")
        t.call("after rollback", q.read, "jobs", vt=30, qty=5)
        q.set_vt("jobs", 1, 0)
        seen.clear()
        in_transaction(q, kind, work, commit=True)
        t.record("inside the committed transaction", seen)
        t.call("table after commit", t.sql, QUEUE_TABLE)
        t.call("after commit", q.read, "jobs", vt=30, qty=5)
        t.call("metrics after commit", q.metrics, "jobs")

    return scenario


@kinds
def test_transaction_helpers(kind: str, real_pgmq_dsn: str, facade_dsn: str) -> None:
    real, facade = both(kind, transactions(kind), real_pgmq_dsn, facade_dsn)
    assert [row[0] for row in real["table after rollback"]] == [1]  # nothing happened
    assert_same(real, facade)


def rolled_back_delete(kind: str) -> Any:
    def scenario(q: Any, t: Trace) -> None:
        c = q.client if kind in ASYNC_KINDS else q
        q.create_queue("jobs")
        msg_id = q.send("jobs", {"n": 1})

        def sync_work(conn: Any) -> None:
            if send_too:
                c.send("jobs", {"n": "in tx"}, conn=conn)
            c.delete("jobs", msg_id, conn=conn)
            c.read("jobs", vt=30, qty=5, conn=conn)

        async def async_work(conn: Any) -> None:
            if send_too:
                await c.send("jobs", {"n": "in tx"}, conn=conn)
            await c.delete("jobs", msg_id, conn=conn)
            await c.read("jobs", vt=30, qty=5, conn=conn)

        # Over two seconds (pgqueue moves its read floors by whole seconds), again and
        # again: a transaction deletes the message (and sends one) and reads, then rolls
        # back; the next read must find the message.
        found = []
        for i in range(8):
            send_too = i % 2 == 1
            in_transaction(q, kind, async_work if kind in ASYNC_KINDS else sync_work, False)
            got = q.read("jobs", vt=30, qty=5)
            found.append([m.msg_id for m in got] == [msg_id])
            q.set_vt("jobs", msg_id, 0)
            time.sleep(0.25)
        t.record("found at once, each time", found)

    return scenario


@kinds
def test_read_at_once_after_a_rolled_back_delete(
    kind: str, real_pgmq_dsn: str, facade_dsn: str
) -> None:
    """A read that found a queue empty inside a transaction that then rolled back must
    not hide the message from the next read (PGMQ returns it at once)."""
    real, facade = both(kind, rolled_back_delete(kind), real_pgmq_dsn, facade_dsn)
    assert all(real["found at once, each time"])
    assert_same(real, facade)


def decorated(kind: str) -> Any:
    """The client's transaction decorators around a user function (send + delete in one go)."""
    from pgmq import (
        async_transaction,
        sqlalchemy_async_transaction,
        sqlalchemy_transaction,
        transaction,
    )

    def scenario(q: Any, t: Trace) -> None:
        q.create_queue("jobs")
        q.send("jobs", {"n": 1})
        c = q.client if kind in ASYNC_KINDS else q
        if kind in ASYNC_KINDS:
            deco = async_transaction if kind == "asyncpg" else sqlalchemy_async_transaction

            async def amove(self: Any, fail: bool, conn: Any = None) -> Any:
                sent = await self.send("jobs", {"n": "moved"}, conn=conn)
                await self.delete("jobs", 1, conn=conn)
                if fail:
                    raise Rollback
                return sent

            move = deco(amove)

            def call(fail: bool) -> Any:
                return q.run(move(c, fail))
        else:
            sdeco = transaction if kind == "psycopg" else sqlalchemy_transaction

            def smove(self: Any, fail: bool, conn: Any = None) -> Any:
                sent = self.send("jobs", {"n": "moved"}, conn=conn)
                self.delete("jobs", 1, conn=conn)
                if fail:
                    raise Rollback
                return sent

            call = sdeco(smove).__get__(c)
        t.call("failing", call, True)
        t.call("after failure", q.read, "jobs", vt=1, qty=5)
        q.set_vt("jobs", 1, 0)
        t.call("succeeding", call, False)
        t.call("after success", q.read, "jobs", vt=1, qty=5)

    return scenario


@kinds
def test_transaction_decorators(kind: str, real_pgmq_dsn: str, facade_dsn: str) -> None:
    real, facade = both(kind, decorated(kind), real_pgmq_dsn, facade_dsn)
    assert_same(real, facade)


# -- start-up --------------------------------------------------------------------------------


def start_up(kind: str, dsn: str, **config: Any) -> Any:
    """What starting a client with config does: None, or the normalized exception."""
    from support.pgmq_calls import raised

    try:
        with pgmq_client(kind, dsn, **config) as q:
            q.create_queue("jobs")
            q.send("jobs", {"n": 1})
            return "started"
    except Exception as exc:
        return raised(exc)


@kinds
def test_init_extension_false_is_the_switch(
    kind: str, real_pgmq_dsn: str, facade_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert start_up(kind, real_pgmq_dsn) == "started" == start_up(kind, facade_dsn)
    # the environment variable instead of the argument
    monkeypatch.setenv("PG_INIT_EXTENSION", "false")
    assert start_up(kind, real_pgmq_dsn, init_extension=None) == "started"
    assert start_up(kind, facade_dsn, init_extension=None) == "started"
