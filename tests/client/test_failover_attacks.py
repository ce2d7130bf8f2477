"""Failover, attacked: worker processes stopped across a promotion, outages past the retry deadline.

What docs/design/failover.md section 3 promises, tried the way an operator's
bad day goes: a `pgqueue worker` SIGSTOPped while the endpoint moves to a
promoted standby, a server read-only for longer than a call's retry deadline,
an idle worker whose LISTEN connection sits on the node that was demoted
without closing its sockets (the Aurora cluster endpoint flip). Each test has
a private primary with a hot standby (support/standby.py); the ones that
promote have a pair of their own.

The handlers of the worker processes record to a file, not to the database
(support/failover_attack_app.py): a record that needs the database would fail
with it and be counted as the handler's failure.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support.db import wait_until
from support.processes import Proc
from support.standby import Pair, SwitchProxy, primary_with_standby

from pgqueue import App, Client, Message, RetryPolicy, Worker, WorkerSettings

pytestmark = pytest.mark.slow

APP = "support.failover_attack_app:app"


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    """A primary and its hot standby, never promoted: tests here only turn the primary read-only."""
    with primary_with_standby() as p:
        yield p


def set_read_only(dsn: str, on: bool) -> None:
    """Turn the whole server read-only (or back) without closing a socket, and wait until it is."""
    value = "on" if on else "off"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("SET default_transaction_read_only = off")
        admin.execute(f"ALTER SYSTEM SET default_transaction_read_only = {value}")
        admin.execute("SELECT pg_reload_conf()")
    # A new session sees it once the postmaster has reloaded; an idle one reloads
    # before it runs its next command.
    wait_until(lambda: _new_session_reads(dsn) == value)
    time.sleep(0.2)  # every other backend reloads a moment later


def _new_session_reads(dsn: str) -> str | None:
    with psycopg.connect(dsn, autocommit=True) as probe:
        return probe.info.parameter_status("default_transaction_read_only")


@pytest.fixture
def read_only(pair: Pair) -> Iterator[Callable[[bool], None]]:
    """flip(on): the module primary's read-only switch; always left off at the end."""

    def flip(on: bool) -> None:
        set_read_only(pair.primary.dsn, on)

    try:
        yield flip
    finally:
        flip(False)


def caught_up(p: Pair) -> None:
    """Wait until the standby has replayed everything the primary wrote so far."""
    with psycopg.connect(p.primary.dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert row is not None
    with psycopg.connect(p.standby.dsn, autocommit=True) as conn:

        def replayed() -> bool:
            got = conn.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (row[0],))
            return bool(got.fetchone() == (True,))

        wait_until(replayed)


def fail_over(p: Pair, proxy: SwitchProxy) -> None:
    """The old primary turns read-only (sockets open); the standby is promoted; endpoint moves."""
    caught_up(p)
    set_read_only(p.primary.dsn, True)
    p.promote()
    proxy.point_at(p.standby_dsn)


def records(path: Path) -> list[dict[str, Any]]:
    """What the worker processes' handlers recorded (failover_attack_app)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def events(path: Path, event: str) -> Counter[int]:
    return Counter(r["msg_id"] for r in records(path) if r["event"] == event)


def listening(dsn: str) -> int:
    """How many live sessions of that server are registered waiters (a worker's LISTEN)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(DISTINCT w.pid) FROM pgqueue.waiter w"
            " JOIN pg_stat_activity a ON a.pid = w.pid"
        ).fetchone()
    return int(row[0]) if row else -1


def spawn_worker(dsn: str, tmp_path: Path, *args: str) -> tuple[Proc, Path]:
    """A `pgqueue worker` running failover_attack_app; its handlers' record file."""
    record = tmp_path / "handled.jsonl"
    proc = Proc(dsn, tmp_path / "worker.log", *args, app=APP, PGQUEUE_ATTACK_LOG=str(record))
    return proc, record


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    """Worker processes to kill at the test's end (a SIGSTOPped one is continued first)."""
    started: list[Proc] = []
    yield started
    for proc in started:
        if proc.p.poll() is None:
            proc.p.send_signal(signal.SIGCONT)
            proc.p.kill()
            proc.p.wait(10)


# -- a worker process through a read-only window --------------------------------------


def test_a_worker_process_rides_out_a_read_only_window_without_a_redelivery_or_a_poison(
    pair: Pair, read_only: Callable[[bool], None], tmp_path: Path, procs: list[Proc]
) -> None:
    with Client.from_dsn(pair.primary_dsn) as client:
        # one attempt each: a read the outage counted, or a lease it let expire, poisons
        client.create_queue("ro_jobs", max_attempts=1)
        # held at a gate until the window is open: the work cannot end before it
        # however slow the machine (the gate is a file: the database is what breaks)
        gate = tmp_path / "gate"
        ids = client.send_batch(
            "ro_jobs", [{"n": i, "sleep": 0.3, "gate": str(gate)} for i in range(60)]
        )
        w, record = spawn_worker(
            pair.primary_dsn,
            tmp_path,
            *("--queue", "ro_jobs", "--concurrency", "4", "--vt", "30"),
            *("--registry-interval", "1"),
        )
        procs.append(w)
        wait_until(lambda: len(events(record, "start")) >= 4)
        read_only(True)
        gate.touch()  # the running handlers finish inside the window: their acks are refused
        time.sleep(4)  # reads, acks, lease extensions and heartbeats all refused (25006)
        assert len(events(record, "done")) < len(ids), "the work ended before the window"
        read_only(False)
        with psycopg.connect(pair.primary_dsn) as conn:
            [[writable_at]] = conn.execute("SELECT now()").fetchall()
        wait_until(lambda: client.metrics("ro_jobs").queue_length == 0, timeout=120)
        metrics = client.metrics("ro_jobs")
        assert metrics.poison_length == 0 and metrics.total_messages == len(ids)
        # the registry heartbeat recovers: the row is seen again after the window
        wait_until(
            lambda: any(
                x.pid == w.p.pid and x.last_seen_at > writable_at for x in client.list_workers()
            ),
        )
    assert w.p.poll() is None, "the worker exited"
    done = events(record, "done")
    assert done == Counter(events(record, "start")) == dict.fromkeys(ids, 1), "lost or run twice"
    assert {r["read_ct"] for r in records(record)} == {1}, "a refused read counted an attempt"
    assert "Traceback" not in w.log.read_text()
    assert w.events("connection.retry"), "the window was not met: nothing tested"
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0


def test_a_handled_message_whose_ack_outlasts_the_retry_deadline_is_acked_not_poisoned(
    pair: Pair, read_only: Callable[[bool], None], captured_logs: list[dict[str, Any]]
) -> None:
    app = App()
    runs: list[tuple[int, int]] = []
    running = threading.Event()
    go_on = threading.Event()

    @app.handler("ack_outage")
    def handle(msg: Message) -> None:
        runs.append((msg.msg_id, msg.read_ct))
        running.set()
        # finishes inside the window (however long the flip took): its ack meets the
        # read-only server
        go_on.wait(120)

    def ack_failed() -> bool:
        return any(e["event"] == "message.ack_failed" for e in captured_logs)

    with Client.from_dsn(pair.primary_dsn) as client:
        client.create_queue("ack_outage", max_attempts=1)
        msg_id = client.send("ack_outage", "handled once")
        # The default deadline is 30 s, an unplanned failover with pg_auto_failover's
        # defaults 30-60 s (failover.md): the same, scaled down.
        short = RetryPolicy(attempts=1000, deadline_seconds=1.5, initial_wait_seconds=0.05)
        # a lease no window below outlasts on a loaded machine: a redelivery would poison
        settings = WorkerSettings(
            queues=("ack_outage",), poll_interval=0.2, vt=60, shutdown_grace=5
        )
        with Client.from_dsn(pair.primary_dsn, max_size=8, retry=short) as wclient:
            worker = Worker(app, wclient, settings)
            t = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
            t.start()
            try:
                assert running.wait(60)
                read_only(True)
                go_on.set()
                # the window lasts until the ack has outlasted its retry deadline
                wait_until(ack_failed)
                read_only(False)
                wait_until(lambda: client.metrics("ack_outage").queue_length == 0)
            finally:
                worker.stop()
                t.join(15)
        assert ack_failed(), "window missed"
        metrics = client.metrics("ack_outage")
        poisoned = [e for e in captured_logs if e["event"] == "message.poisoned"]
        assert metrics.poison_length == 0, f"handled {runs}, then poisoned: {poisoned}"
        assert runs == [(msg_id, 1)]


# -- a worker process across a promotion -----------------------------------------------


def test_a_worker_stopped_across_a_promotion_acks_its_leases_on_the_new_primary(
    tmp_path: Path, procs: list[Proc]
) -> None:
    with primary_with_standby() as p:
        proxy = SwitchProxy(p.primary_dsn)
        try:
            with Client.from_dsn(p.primary_dsn) as client:
                client.create_queue("moved_jobs", max_attempts=1)
                # held at a gate until after the failover: every handler is mid-run
                # through it, however slow the machine
                gate = tmp_path / "gate"
                ids = client.send_batch(
                    "moved_jobs", [{"n": i, "sleep": 0.5, "gate": str(gate)} for i in range(6)]
                )
            w, record = spawn_worker(
                proxy.dsn,
                tmp_path,
                *("--queue", "moved_jobs", "--concurrency", "6", "--vt", "30"),
            )
            procs.append(w)
            wait_until(lambda: len(events(record, "start")) == len(ids))
            w.signal(signal.SIGSTOP)  # every lease held, every handler mid-run
            fail_over(p, proxy)
            w.signal(signal.SIGCONT)
            gate.touch()
            with Client.from_dsn(p.standby_dsn) as promoted:
                # its acks reach the promoted node: its copies of the leased messages go
                wait_until(lambda: promoted.metrics("moved_jobs").queue_length == 0, timeout=120)
                assert promoted.metrics("moved_jobs").poison_length == 0
                # idle now: it listens on the new primary, and a send there wakes it
                wait_until(lambda: listening(p.standby_dsn) >= 1)
                new = promoted.send("moved_jobs", {"n": "after"})
                # its poll (0.2 s) would find it too: this is an outer bound, not a speed claim
                wait_until(lambda: events(record, "done")[new] == 1)
            assert w.p.poll() is None, "the worker exited"
            assert events(record, "start") == events(record, "done")
            assert events(record, "done") == {**dict.fromkeys(ids, 1), new: 1}
            assert new not in ids, "the promoted node handed out a msg_id again"
            w.signal(signal.SIGTERM)
            assert w.wait(30) == 0
        finally:
            proxy.close()


def test_an_idle_worker_moves_its_listen_off_a_node_demoted_with_its_sockets_open(
    tmp_path: Path, procs: list[Proc]
) -> None:
    with primary_with_standby() as p:
        proxy = SwitchProxy(p.primary_dsn)
        try:
            with Client.from_dsn(p.primary_dsn) as client:
                client.create_queue("moved_jobs")
            w, record = spawn_worker(
                proxy.dsn,
                tmp_path,
                # a long poll, as a fleet runs to spare the database: wake-ups are
                # what an idle worker lives on (listener.py)
                *("--queue", "moved_jobs", "--poll-interval", "10", "--registry-interval", "0"),
            )
            procs.append(w)
            wait_until(lambda: listening(p.primary_dsn) == 1)
            fail_over(p, proxy)
            # The listener asks its server whether it still takes writes before
            # each wait: it moves within one poll interval (10 s; the bound is for
            # a loaded machine, and catches one that never moves), and every
            # send after that wakes the worker at once.
            wait_until(lambda: listening(p.standby_dsn) == 1)
            with Client.from_dsn(p.standby_dsn) as promoted:
                started = time.monotonic()
                new = promoted.send("moved_jobs", {"n": "wake"})
                wait_until(lambda: events(record, "done")[new] == 1)
                # a wake-up takes milliseconds, a poll up to 10 s: the room is for load
                assert time.monotonic() - started < 6, "the send woke nobody: found by a poll"
        finally:
            proxy.close()


# -- a producer on the command line ----------------------------------------------------


def pgqueue_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pgqueue", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k not in ("PGQUEUE_DSN", "DATABASE_URL")},
    )


def test_cli_send_of_one_message_to_a_read_only_server_fails_in_one_line_and_writes_nothing(
    pair: Pair, read_only: Callable[[bool], None]
) -> None:
    with Client.from_dsn(pair.primary_dsn) as client:
        client.create_queue("cli_one")
    read_only(True)
    sent = pgqueue_cli("send", "cli_one", '{"n": 1}', "--dsn", pair.primary_dsn)
    read_only(False)
    assert sent.returncode == 1 and "Traceback" not in sent.stderr
    [line] = [x for x in sent.stderr.splitlines() if x.startswith("pgqueue: error:")]
    assert "read-only server" in line and "target_session_attrs=read-write" in line, line
    with Client.from_dsn(pair.primary_dsn) as client:
        assert client.metrics("cli_one").total_messages == 0


def test_cli_send_of_lines_to_a_read_only_server_says_it_is_read_only_and_writes_nothing(
    pair: Pair, read_only: Callable[[bool], None]
) -> None:
    with Client.from_dsn(pair.primary_dsn) as client:
        client.create_queue("cli_lines")
    read_only(True)
    sent = pgqueue_cli(
        "send", "cli_lines", "-", "--dsn", pair.primary_dsn, stdin='{"n": 1}\n{"n": 2}\n'
    )
    read_only(False)
    with Client.from_dsn(pair.primary_dsn) as client:
        assert client.metrics("cli_lines").total_messages == 0, "half the lines were sent"
    assert sent.returncode == 1 and "Traceback" not in sent.stderr, sent.stderr
    [line] = [x for x in sent.stderr.splitlines() if x.startswith("pgqueue: error:")]
    assert "read-only server" in line and "target_session_attrs=read-write" in line, line
