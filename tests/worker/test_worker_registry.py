"""The worker's registry row, its rate tallies, and how it treats a paused queue.

In-process workers for what needs the worker's own view (its logs, its reads
of a paused queue, counted by the PGQ11 notice each one gets), and real
`pgqueue worker` processes for what a signal does to the row.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from support import worker_app
from support.db import wait_until
from support.processes import count, prepare

from pgqueue import Client, Worker, WorkerSettings


@pytest.fixture
def env_dsn(dsn: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("PGQUEUE_DSN", dsn)  # the handlers record through it
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(worker_app.SCHEMA)
    return dsn


@pytest.fixture
def make_worker(env_dsn: str, client: Client) -> Iterator[Callable[..., tuple[Worker, Client]]]:
    """make_worker(**settings): an in-process worker on `jobs` running in a thread; its client."""
    started: list[tuple[Worker, threading.Thread, Client]] = []
    client.create_queue("jobs", max_attempts=3)

    def make(**settings: Any) -> tuple[Worker, Client]:
        base: dict[str, Any] = {
            "queues": ("jobs",),
            "poll_interval": 0.2,
            "registry_interval": 0.2,
            "backoff_base": 0.01,
            "backoff_max": 0.01,
            "shutdown_grace": 5,
        }
        base.update(settings)
        s = WorkerSettings(**base)
        wclient = Client.from_dsn(env_dsn, max_size=s.pool_size)
        w = Worker(worker_app.app, wclient, s)
        t = threading.Thread(target=w.run, kwargs={"install_signals": False}, daemon=True)
        t.start()
        started.append((w, t, wclient))
        return w, wclient

    yield make
    for w, t, c in started:
        w.stop()
        t.join(15)
        c.close()


def done(dsn: str) -> int:
    return count(dsn, "done")


def runs(dsn: str, event: str, msg_id: int) -> int:
    """Events of one message. An earlier test's handler still running in this
    process records into PGQUEUE_DSN, which names this test's database now."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM handled WHERE event = %s AND msg_id = %s", (event, msg_id)
        ).fetchone()
    return int(row[0]) if row else 0


def said_stopping(client: Client) -> bool:
    """The worker's row says stopping; it must not go before it has said so."""
    rows = client.list_workers()
    assert rows, "the row went before it ever said stopping"
    return rows[0].stopping


def early_in_a_minute(client: Client) -> None:
    """Wait, if need be, until the database's minute has at least 15 s to go."""
    from pgqueue._cli._connect import server_now

    seconds = server_now(client).second
    if seconds > 45:
        time.sleep(60.5 - seconds)


def test_a_running_worker_is_listed_alive_and_its_row_goes_when_it_stops(
    make_worker: Any, client: Client, env_dsn: str
) -> None:
    # a grace no loaded machine runs out: the handler ends when the test opens its gate
    w, _ = make_worker(concurrency=3, shutdown_grace=120)
    wait_until(lambda: len(client.list_workers()) == 1)
    [me] = client.list_workers()
    assert (me.worker_id, me.host, me.pid) == (
        w.registry.worker_id,
        socket.gethostname(),
        os.getpid(),
    )
    assert (me.queues, me.concurrency, me.in_flight, me.stopping, me.alive) == (
        ["jobs"],
        3,
        0,
        False,
        True,
    )
    sent = client.send("jobs", {"gate": "running"})
    wait_until(lambda: runs(env_dsn, "start", sent) == 1)
    wait_until(lambda: client.list_workers()[0].in_flight == 1)
    first_seen = client.list_workers()[0].last_seen_at
    wait_until(lambda: client.list_workers()[0].last_seen_at > first_seen)  # it heartbeats
    w.stop()  # graceful: the running handler finishes, the row says stopping meanwhile
    wait_until(lambda: said_stopping(client))
    worker_app.open_gate(env_dsn, "running")
    wait_until(lambda: client.list_workers() == [])
    assert runs(env_dsn, "done", sent) == 1
    assert client.metrics("jobs").queue_length == 0


def test_a_paused_queue_waits_and_runs_at_once_when_resumed(
    make_worker: Any, client: Client, env_dsn: str, captured_logs: list[dict[str, Any]]
) -> None:
    client.pause_queue("jobs")
    client.send_batch("jobs", [{"n": i} for i in range(3)])
    # Polling alone would take up to 600 s to notice the resume: the NOTIFY does it,
    # within a bound that is generous for a loaded machine and far below the poll.
    make_worker(poll_interval=600)
    wait_until(lambda: [e for e in captured_logs if e["event"] == "queue.paused"])
    time.sleep(1.0)
    assert count(env_dsn, "start") == 0
    assert client.resume_queue("jobs")
    wait_until(lambda: done(env_dsn) == 3, timeout=120)
    changes = [(e["event"], e["queue"]) for e in captured_logs if e["event"].startswith("queue.")]
    assert changes == [("queue.paused", "jobs"), ("queue.resumed", "jobs")]


def test_a_pause_and_a_resume_while_running_are_noticed_and_logged_once_each(
    make_worker: Any, client: Client, env_dsn: str, captured_logs: list[dict[str, Any]]
) -> None:
    _, wclient = make_worker()
    notices: list[str] = []  # reads that met the pause (PGQ11)
    first = client.send("jobs", {"n": 1})
    wait_until(lambda: runs(env_dsn, "done", first) == 1)
    client.pause_queue("jobs")
    wclient.observers.read_paused.append(notices.append)
    wait_until(lambda: [e for e in captured_logs if e["event"] == "queue.paused"])
    # A read that began before the pause committed may still be under way (a
    # loaded machine): it saw the queue unpaused, and may hand out what it
    # finds. The worker has one reader, its reads one after another: once a
    # read has met the pause, that earlier one has ended. Then the send that
    # the pause must hold back.
    wait_until(lambda: bool(notices))
    second = client.send("jobs", {"n": 2})
    time.sleep(1.0)  # probes and heartbeats come and go: still paused, logged once
    assert runs(env_dsn, "start", second) == 0
    client.resume_queue("jobs")
    wait_until(lambda: runs(env_dsn, "done", second) == 1)
    changes = [(e["event"], e["queue"]) for e in captured_logs if e["event"].startswith("queue.")]
    assert changes == [("queue.paused", "jobs"), ("queue.resumed", "jobs")]
    levels = {e["event"]: e["log_level"] for e in captured_logs if e["event"].startswith("queue.")}
    assert levels == {"queue.paused": "warning", "queue.resumed": "info"}


def test_a_paused_queue_costs_one_read_a_poll_interval_while_sends_keep_coming(
    make_worker: Any, client: Client, env_dsn: str
) -> None:
    client.pause_queue("jobs")
    _, wclient = make_worker(poll_interval=0.5, registry_interval=5)
    reads: list[float] = []  # each read of a paused queue gets one PGQ11 notice
    wclient.observers.read_paused.append(lambda queue: reads.append(time.monotonic()))
    wait_until(lambda: len(reads) >= 1)
    sends = 0
    start = time.monotonic()
    # every send notifies the waiting worker: 200 of them, over 4 s at least (counts,
    # not a rate: a loaded machine sends slower, and the bound below follows the clock)
    while sends < 200 or time.monotonic() - start < 4:
        client.send("jobs", {"n": sends})
        sends += 1
        time.sleep(0.01)
    elapsed = time.monotonic() - start
    span = [t for t in reads if t >= start]
    # one read per 0.5 s at most, however slow the sends were (a woken worker reading
    # on each send: hundreds); at least two, so it went on probing
    assert 2 <= len(span) <= elapsed / 0.5 + 3, (len(span), elapsed)
    assert count(env_dsn, "start") == 0


def test_rates_count_a_workers_sends_acks_nacks_and_poisons_within_a_heartbeat(
    make_worker: Any, client: Client, env_dsn: str
) -> None:
    client.create_queue("jobs", max_attempts=3)
    early_in_a_minute(client)
    client.sample_rates()  # this minute's sample: before the sends below
    client.send_batch("jobs", [{"n": i} for i in range(10)])
    client.send_batch("jobs", [{"fail_times": 1}, {"fail_times": 1}])  # a nack each, then acked
    client.send("jobs", {"poison": True})
    make_worker()
    wait_until(lambda: client.metrics("jobs").queue_length == 0)

    def totals() -> tuple[int, int, int, int]:
        rows = client.queue_rates(["jobs"], minutes=2)
        return (
            sum(r.sent or 0 for r in rows),
            sum(r.acked for r in rows),
            sum(r.nacked for r in rows),
            sum(r.poisoned for r in rows),
        )

    wait_until(lambda: totals()[1] == 12)
    assert totals() == (13, 12, 2, 1)


def test_a_failed_heartbeat_is_logged_and_its_tallies_arrive_with_the_next(
    make_worker: Any,
    client: Client,
    env_dsn: str,
    sql: psycopg.Connection[Any],
    captured_logs: list[dict[str, Any]],
) -> None:
    make_worker()
    wait_until(lambda: len(client.list_workers()) == 1)
    sql.execute("ALTER FUNCTION pgqueue.worker_heartbeat RENAME TO worker_heartbeat_away")
    try:
        client.send_batch("jobs", [{"n": i} for i in range(5)])
        wait_until(lambda: done(env_dsn) == 5)  # the worker runs on
        wait_until(lambda: [e for e in captured_logs if e["event"] == "registry.heartbeat_failed"])
        assert sum(r.acked for r in client.queue_rates(["jobs"], minutes=2)) == 0
    finally:
        sql.execute("ALTER FUNCTION pgqueue.worker_heartbeat_away RENAME TO worker_heartbeat")
    wait_until(lambda: sum(r.acked for r in client.queue_rates(["jobs"], minutes=2)) == 5)


def test_a_worker_with_the_registry_off_is_not_listed_but_still_honours_a_pause(
    make_worker: Any, client: Client, env_dsn: str
) -> None:
    client.pause_queue("jobs")
    client.send("jobs", {"n": 1})
    make_worker(registry_interval=0)
    time.sleep(1.0)
    assert client.list_workers() == [] and count(env_dsn, "start") == 0
    client.resume_queue("jobs")
    wait_until(lambda: done(env_dsn) == 1)


# -- real processes -----------------------------------------------------------


def test_a_worker_process_is_listed_while_it_runs_and_gone_after_sigterm(
    dsn: str, spawn: Any
) -> None:
    with prepare(dsn) as client:
        client.pause_queue("callbacks")
        w = spawn(dsn, "--registry-interval", "0.5")
        wait_until(lambda: [x.pid for x in client.list_workers()] == [w.p.pid])
        [row] = client.list_workers()
        assert (row.queues, row.alive, row.stopping) == (["jobs", "callbacks"], True, False)
        wait_until(lambda: w.events("queue.paused"))
        assert [e["queue"] for e in w.events("queue.paused")] == ["callbacks"]
        client.resume_queue("callbacks")
        wait_until(lambda: w.events("queue.resumed"))
        client.send("jobs", {"gate": "running"})  # it ends when the test says
        wait_until(lambda: count(dsn, "start") == 1)
        w.signal(signal.SIGTERM)
        wait_until(lambda: said_stopping(client))
        worker_app.open_gate(dsn, "running")
        assert w.wait(120) == 0
        assert client.list_workers() == []
        assert count(dsn, "done") == 1


def test_a_killed_worker_process_stays_listed_as_not_alive(
    dsn: str, spawn: Any, sql: psycopg.Connection[Any]
) -> None:
    with prepare(dsn) as client:
        w = spawn(dsn, "--registry-interval", "0.5")
        wait_until(lambda: len(client.list_workers()) == 1)
        w.signal(signal.SIGKILL)
        w.wait()
        [row] = client.list_workers()
        assert row.alive  # for 15 s after its last heartbeat
        # 15 s later, on the database's clock:
        sql.execute("UPDATE pgqueue.worker SET last_seen_at = last_seen_at - interval '15 seconds'")
        [row] = client.list_workers()
        assert (row.pid, row.alive, row.stopping) == (w.p.pid, False, False)
