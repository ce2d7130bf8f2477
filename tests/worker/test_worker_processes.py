"""Worker processes under real faults: SIGTERM, SIGKILL, a second SIGINT, a server restart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

import psycopg
from support import worker_app
from support.db import migrated_database, restart_server, wait_until, with_dbname
from support.processes import TESTS, count, prepare

from pgqueue import Client


def test_sigterm_acks_finished_work_releases_the_rest_and_exits_0(dsn: str, spawn: Any) -> None:
    with prepare(dsn) as client:
        quick = client.send_batch("jobs", [{"sleep": 1}, {"sleep": 1}])
        slow = client.send("jobs", {"sleep": 60})
        # a grace that the two 1 s handlers end in on a loaded machine; the 60 s one never
        w = spawn(dsn, "--concurrency", "3", "--shutdown-grace", "8", "--vt", "60")
        wait_until(lambda: count(dsn, "start") == 3)
        w.signal(signal.SIGTERM)
        assert w.wait() == 0
        assert count(dsn, "done") == 2
        assert client.delete_many("jobs", quick) == []  # already acked
        [again] = client.read("jobs", vt=60, qty=5)  # released: visible at once
        assert again.msg_id == slow
        assert '"event": "worker.stopped"' in w.log.read_text()


def test_second_sigint_stops_at_once_and_loses_nothing(dsn: str, spawn: Any) -> None:
    with prepare(dsn) as client:
        slow = client.send("jobs", {"sleep": 60})
        w = spawn(dsn, "--shutdown-grace", "60", "--vt", "60")
        wait_until(lambda: count(dsn, "start") == 1)
        w.signal(signal.SIGINT)
        # the first is taken (a graceful stop begun) before the second is sent: two
        # signals close together may be handled as one on a loaded machine
        wait_until(lambda: bool(w.events("worker.signal")))
        started = time.monotonic()
        w.signal(signal.SIGINT)
        assert w.wait(60) == 130
        # at once, not after the 60 s grace and handler: a bound far above what load adds
        assert time.monotonic() - started < 30
        [again] = client.read("jobs", vt=60, qty=5)
        assert again.msg_id == slow


def test_sigkilled_worker_message_is_redelivered_after_vt_and_done_once(
    dsn: str, spawn: Any
) -> None:
    with prepare(dsn) as client:
        # held at a gate until A is dead: A cannot finish it first on a slow machine
        msg_id = client.send("jobs", {"gate": "open"})
        a = spawn(dsn, "--vt", "2")
        wait_until(lambda: count(dsn, "start") == 1)
        a.p.kill()
        a.wait()
        worker_app.open_gate(dsn, "open")
        b = spawn(dsn, "--vt", "2")
        wait_until(lambda: count(dsn, "done") == 1, timeout=120)
        with psycopg.connect(dsn) as conn:
            pids = conn.execute(
                "SELECT DISTINCT pid FROM handled WHERE msg_id = %s", (msg_id,)
            ).fetchall()
        assert len(pids) == 2, "the second worker took over the message"
        wait_until(lambda: client.metrics("jobs").queue_length == 0)
        b.signal(signal.SIGTERM)
        assert b.wait() == 0


def test_workers_ride_out_a_server_restart_and_the_barrier_fires_once(
    private_server: Any, spawn: Any
) -> None:
    dsn = private_server.get_uri()
    db = f"restart_{os.getpid()}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {db}")
        admin.execute(f"CREATE DATABASE {db}")
    target = with_dbname(dsn, db)
    with Client.from_dsn(target) as c:
        c.migrate()
    with prepare(target) as client:
        bid = client.fan_out(
            "jobs",
            [{"sleep": 0.02} for _ in range(300)],
            callback_queue="callbacks",
            callback_message={},
        )
        workers = [spawn(target, "--concurrency", "4", "--vt", "5") for _ in range(2)]
        wait_until(lambda: count(target, "done") > 30)
        restart_server(private_server)
        wait_until(lambda: count(target, "callback") >= 1, timeout=120)
        # a second callback would be a message on `callbacks`: once the queue is empty
        # it has been handled (counted below) or was never sent; no pause to guess
        wait_until(lambda: client.metrics("callbacks").queue_length == 0)
        s = client.barrier_status(bid)
        assert s.state == "fired" and s.succeeded + s.failed == 300
        assert count(target, "callback") == 1
        assert client.metrics("jobs").queue_length == 0
        for w in workers:
            w.signal(signal.SIGTERM)
            assert w.wait() == 0


def test_worker_with_a_bad_app_path_says_so_in_one_line(dsn: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pgqueue", "worker", "no_such_module:app", "--dsn", dsn],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2  # a bad argument: a usage error
    assert result.stderr.strip().splitlines() == [
        "pgqueue: error: Invalid value for 'MODULE:APP': no module named 'no_such_module' on the"
        " Python path (the current directory, PYTHONPATH and the installed packages)"
        " (see `python -m pgqueue worker --help`)"
    ]


def test_worker_for_queues_that_do_not_exist_fails_fast(dsn: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(TESTS))
    result = subprocess.run(
        [sys.executable, "-m", "pgqueue", "worker", "support.worker_app:app", "--dsn", dsn],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(
        "pgqueue: error: queues 'jobs', 'async_jobs', 'tx', 'callbacks', 'batch_jobs',"
        " 'async_batch', 'tx_batch', 'tx_effects' do not exist"
    )


def test_a_worker_started_while_the_server_is_down_waits_for_it(
    own_cluster: Any, spawn: Any
) -> None:
    with own_cluster() as cluster:
        target = migrated_database(cluster.dsn)
        prepare(target).close()
        cluster.stop()
        w = spawn(target, "--startup-timeout", "60")
        # down until the worker has said it waits (its start-up alone can take
        # seconds on a loaded machine: a fixed sleep let the server come back first)
        wait_until(lambda: w.events("database.waiting"))
        time.sleep(1)
        assert w.p.poll() is None, w.log.read_text()
        cluster.start()
        with Client.from_dsn(target) as client:
            client.send("jobs", {"n": 1})
            wait_until(lambda: count(target, "done") == 1, timeout=120)
        w.signal(signal.SIGTERM)
        assert w.wait() == 0


def test_a_worker_gives_up_on_a_server_that_stays_down_after_its_startup_timeout(
    own_cluster: Any, spawn: Any
) -> None:
    with own_cluster() as cluster:
        target = migrated_database(cluster.dsn)
        cluster.stop()
        started = time.monotonic()
        w = spawn(target, "--startup-timeout", "3")
        assert w.wait(120) == 1
        # gave up at its 3 s (plus a loaded machine's start-up), not the default 60 s
        assert 3 <= time.monotonic() - started < 50
        errors = [line for line in w.log.read_text().splitlines() if "pgqueue: error" in line]
        assert len(errors) == 1 and "attempts in 3." in errors[0], errors
        assert "Traceback" not in w.log.read_text()


def test_sighup_from_a_closed_session_stops_like_sigterm_and_deregisters(
    dsn: str, spawn: Any
) -> None:
    """A terminal that closes sends SIGHUP: the worker used to die where it stood,
    its lease waiting out its vt and its row listed as lost."""
    with prepare(dsn) as client:
        slow = client.send("jobs", {"sleep": 60})
        w = spawn(dsn, "--shutdown-grace", "1", "--vt", "60")
        wait_until(lambda: count(dsn, "start") == 1)
        wait_until(lambda: len(client.list_workers()) == 1)
        w.signal(signal.SIGHUP)
        assert w.wait() == 0
        assert client.list_workers() == []
        [again] = client.read("jobs", vt=60, qty=5)  # given back, not waiting out 60 s
        assert again.msg_id == slow
        [said] = w.events("worker.signal")
        assert said["signal"] == "SIGHUP" and said["graceful"] is True


def test_under_nohup_sighup_stays_ignored(dsn: str, tmp_path: Any) -> None:
    with prepare(dsn) as client:
        env = dict(os.environ, PGQUEUE_DSN=dsn, PYTHONPATH=str(TESTS), PGQUEUE_LOG_FORMAT="json")
        log = (tmp_path / "nohup.log").open("wb")
        p = subprocess.Popen(
            [
                "nohup",
                sys.executable,
                "-m",
                "pgqueue",
                "worker",
                "support.worker_app:app",
                "--queue",
                "jobs",
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_until(lambda: len(client.list_workers()) == 1)
            p.send_signal(signal.SIGHUP)
            time.sleep(1.0)
            assert p.poll() is None, "a nohup'd worker stopped on SIGHUP"
            client.send("jobs", {"n": 1})
            wait_until(lambda: count(dsn, "done") == 1)
        finally:
            p.terminate()
            p.wait(30)
            log.close()
