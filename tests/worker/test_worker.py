"""The consumer runtime, in-process: acks, retries, poison, heartbeats, wake-ups, faults."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from support import worker_app
from support.db import terminate_client_backends, wait_until

from pgqueue import Client, InvalidArgument, Worker, WorkerSettings


@pytest.fixture
def env_dsn(dsn: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("PGQUEUE_DSN", dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(worker_app.SCHEMA)
    return dsn


@pytest.fixture
def make_worker(
    env_dsn: str, client: Client
) -> Iterator[Callable[..., tuple[Worker, threading.Thread]]]:
    started: list[tuple[Worker, threading.Thread, Client]] = []
    for q in (
        "jobs",
        "async_jobs",
        "tx",
        "callbacks",
        "batch_jobs",
        "async_batch",
        "tx_batch",
        "tx_effects",
    ):
        client.create_queue(q, max_attempts=3)

    def make(**settings: Any) -> tuple[Worker, threading.Thread]:
        base: dict[str, Any] = {
            "poll_interval": 0.2,
            "vt": 5,
            "backoff_base": 0.01,
            "backoff_max": 0.01,
            "shutdown_grace": 5,
        }
        base.update(settings)
        size = int(base.get("concurrency", 4)) + int(base.get("readers", 1)) + 2
        wclient = Client.from_dsn(env_dsn, max_size=size)
        w = Worker(worker_app.app, wclient, WorkerSettings(**base))
        t = threading.Thread(target=w.run, kwargs={"install_signals": False}, daemon=True)
        t.start()
        started.append((w, t, wclient))
        return w, t

    yield make
    for w, t, c in started:
        w.stop()
        t.join(15)
        c.close()


def events(dsn: str, event: str | None = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        sql = "SELECT queue, msg_id, event, read_ct FROM handled"
        if event:
            return conn.execute(sql + " WHERE event = %s ORDER BY at", (event,)).fetchall()
        return conn.execute(sql + " ORDER BY at").fetchall()


def waiters(dsn: str) -> int:
    """Sessions registered as waiting for a send (a worker's LISTEN)."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM pgqueue.waiter").fetchone()
    return int(row[0]) if row else 0


def test_worker_runs_sync_and_async_handlers_and_acks(
    make_worker: Any, client: Client, env_dsn: str
) -> None:
    client.send_batch("jobs", [{"n": i} for i in range(10)])
    client.send_batch("async_jobs", [{"sleep": 0.1} for _ in range(5)])
    make_worker(queues=("jobs", "async_jobs"))
    wait_until(lambda: len(events(env_dsn, "done")) == 15)
    # acks follow "done" by a few milliseconds (the acker batches them)
    wait_until(lambda: client.metrics("jobs").queue_length == 0)
    wait_until(lambda: client.metrics("async_jobs").queue_length == 0)
    assert len(events(env_dsn, "start")) == 15


def test_barrier_members_are_completed_with_results_and_callback_runs(
    make_worker: Any, client: Client, env_dsn: str
) -> None:
    bid = client.fan_out(
        "jobs", [{"n": i} for i in range(6)], callback_queue="callbacks", callback_message={}
    )
    make_worker()
    wait_until(lambda: len(events(env_dsn, "callback")) == 1)
    s = client.barrier_status(bid)
    assert (s.state, s.succeeded) == ("fired", 6)
    assert [r.result for r in client.barrier_results(bid)] == [{"n": i} for i in range(6)]
    # A second callback would be a second message on `callbacks`: once both queues are
    # empty it has been handled (counted below) or was never sent; no pause to guess.
    wait_until(lambda: client.metrics("callbacks").queue_length == 0)
    wait_until(lambda: client.metrics("jobs").queue_length == 0)
    assert len(events(env_dsn, "callback")) == 1


def test_failure_is_retried_then_succeeds(make_worker: Any, client: Client, env_dsn: str) -> None:
    msg_id = client.send("jobs", {"fail_times": 2})
    make_worker()
    wait_until(lambda: len(events(env_dsn, "done")) == 1)
    assert [e[3] for e in events(env_dsn, "start")] == [1, 2, 3]
    wait_until(lambda: client.metrics("jobs").queue_length == 0)  # acked
    assert client.metrics("jobs").poison_length == 0 and msg_id


def test_always_failing_member_is_poison_dropped_and_barrier_still_fires(
    make_worker: Any, client: Client, env_dsn: str
) -> None:
    bid = client.fan_out(
        "jobs", [{"n": 1}, {"fail_times": 99}], callback_queue="callbacks", callback_message={}
    )
    make_worker()
    wait_until(lambda: len(events(env_dsn, "callback")) == 1)
    s = client.barrier_status(bid)
    assert (s.succeeded, s.failed) == (1, 1)
    [p] = client.poison_list("jobs")
    assert p.read_ct == 3 and "max_attempts exceeded" in p.reason


def test_poison_exception_skips_retries(make_worker: Any, client: Client, env_dsn: str) -> None:
    client.send("jobs", {"poison": True})
    make_worker()
    wait_until(lambda: client.metrics("jobs").poison_length == 1)
    [p] = client.poison_list("jobs")
    assert (p.read_ct, p.reason) == (1, "payload cannot be handled")
    assert len(events(env_dsn, "start")) == 1


def test_transactional_handler_effects_commit_with_the_ack_exactly_once(
    make_worker: Any, client: Client, env_dsn: str
) -> None:
    client.send("tx", {"key": "a", "fail_first": True})
    client.send("tx", {"key": "b"})
    client.send("tx", {"key": "b"})  # a duplicate: the guard skips its effect
    make_worker(queues=("tx",))
    wait_until(lambda: client.metrics("tx").queue_length == 0)
    with psycopg.connect(env_dsn) as conn:
        rows = conn.execute("SELECT key, count(*) FROM effects GROUP BY key ORDER BY key")
        assert rows.fetchall() == [("a", 1), ("b", 1)]
    assert len(events(env_dsn, "done")) == 3


def test_batch_handler_gets_whole_reads_and_acks_them(
    make_worker: Any, client: Client, env_dsn: str
) -> None:
    client.send_batch("batch_jobs", [{"n": i} for i in range(50)])
    worker_app.BATCH_SIZES.clear()
    make_worker(queues=("batch_jobs",), batch=20, concurrency=2)
    wait_until(lambda: client.metrics("batch_jobs").queue_length == 0)
    done = events(env_dsn, "done")
    assert len(done) == 50 and len({e[1] for e in done}) == 50  # each once
    sizes = worker_app.BATCH_SIZES
    assert sum(sizes) == 50 and max(sizes) > 1 and max(sizes) <= 20, sizes


def test_batch_handler_results_complete_barrier_members(
    make_worker: Any, client: Client, env_dsn: str
) -> None:
    bid = client.fan_out(
        "batch_jobs", [{"n": i} for i in range(30)], callback_queue="callbacks", callback_message={}
    )
    make_worker(queues=("batch_jobs", "callbacks"), batch=10)
    wait_until(lambda: len(events(env_dsn, "callback")) == 1)
    s = client.barrier_status(bid)
    assert (s.state, s.succeeded, s.failed) == ("fired", 30, 0)
    assert [r.result for r in client.barrier_results(bid)] == [{"n": i} for i in range(30)]


def test_a_failing_batch_is_retried_whole_and_a_poison_batch_is_poisoned_whole(
    make_worker: Any, client: Client, env_dsn: str
) -> None:
    client.send_batch("batch_jobs", [{"n": 1}, {"fail_times": 1}, {"n": 3}])
    make_worker(queues=("batch_jobs",), batch=10)
    wait_until(lambda: client.metrics("batch_jobs").queue_length == 0)
    # the first read failed whole (no done), the second succeeded whole
    assert sorted(e[3] for e in events(env_dsn, "done")) == [2, 2, 2]
    assert client.metrics("batch_jobs").poison_length == 0

    client.send_batch("batch_jobs", [{"n": 4}, {"poison": True}])
    wait_until(lambda: client.metrics("batch_jobs").poison_length == 2)
    assert {p.reason for p in client.poison_list("batch_jobs")} == {"payload cannot be handled"}


def test_a_batch_handler_returning_the_wrong_number_of_results_is_retried_with_the_reason(
    make_worker: Any, client: Client, env_dsn: str
) -> None:
    client.send_batch("batch_jobs", [{"bad_results": True}, {"n": 2}])
    make_worker(queues=("batch_jobs",), batch=10)
    wait_until(lambda: client.metrics("batch_jobs").poison_length == 2, timeout=120)
    reasons = {p.reason for p in client.poison_list("batch_jobs")}
    assert len(reasons) == 1
    (reason,) = reasons
    assert "returned 1 results for 2 messages" in reason, reason


def test_async_and_transactional_batch_handlers(
    make_worker: Any, client: Client, env_dsn: str
) -> None:
    client.send_batch("async_batch", [{"n": i} for i in range(7)])
    client.send_batch("tx_batch", [{"key": "a", "fail_first": True}, {"key": "b"}])
    make_worker(queues=("async_batch", "tx_batch"), batch=10)
    wait_until(lambda: client.metrics("async_batch").queue_length == 0)
    wait_until(lambda: client.metrics("tx_batch").queue_length == 0)
    assert len(events(env_dsn, "done")) == 7 + 2
    with psycopg.connect(env_dsn) as conn:  # the failed first attempt's writes rolled back
        rows = conn.execute("SELECT key, count(*) FROM effects GROUP BY key ORDER BY key")
        assert rows.fetchall() == [("a", 1), ("b", 1)]


def test_long_handler_is_not_redelivered_while_heartbeats_run(
    make_worker: Any, client: Client, env_dsn: str
) -> None:
    client.send("jobs", {"sleep": 5})
    make_worker(vt=2, concurrency=1)
    wait_until(lambda: len(events(env_dsn, "start")) == 1)
    # another consumer polls the whole time: the lease must never lapse
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline and not events(env_dsn, "done"):
        assert client.read("jobs", vt=2, qty=1) == []
        time.sleep(0.2)
    wait_until(lambda: len(events(env_dsn, "done")) == 1)
    assert len(events(env_dsn, "start")) == 1


def test_idle_worker_wakes_on_notify_not_on_its_poll(
    make_worker: Any, client: Client, env_dsn: str
) -> None:
    make_worker(poll_interval=600)
    # idle, registered as a waiter (its LISTEN), not a pause's guess of when it is
    wait_until(lambda: waiters(env_dsn) >= 1)
    client.send("jobs", {"n": 1})
    # its poll would come after 600 s: a start within this bound (generous for a loaded
    # machine) is the notification's doing
    wait_until(lambda: bool(events(env_dsn, "start")), timeout=120)


def test_ack_lands_when_the_connection_died_during_the_handler(
    make_worker: Any, client: Client, env_dsn: str
) -> None:
    client.send("jobs", {"sleep": 1.5})
    make_worker(listen=False)
    wait_until(lambda: bool(events(env_dsn, "start")))
    # every pgqueue connection is reaped while the handler works
    assert terminate_client_backends(env_dsn) >= 1
    wait_until(lambda: bool(events(env_dsn, "done")))
    wait_until(lambda: client.metrics("jobs").queue_length == 0)
    time.sleep(0.3)
    assert len(events(env_dsn, "start")) == 1, "the message was processed again"


def test_database_errors_pgqueue_does_not_translate_do_not_stop_the_worker(
    env_dsn: str, client: Client, captured_logs: list[dict[str, Any]]
) -> None:
    """Reads cancelled by a statement timeout while the queue table is locked: the
    worker logs them and goes on, then handles what was sent meanwhile."""
    client.create_queue("jobs", max_attempts=3)
    wclient = Client.from_dsn(env_dsn + " options='-c statement_timeout=100'", max_size=7)
    worker = Worker(
        worker_app.app, wclient, WorkerSettings(queues=("jobs",), poll_interval=0.05, listen=False)
    )
    t = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
    t.start()
    try:
        # running (registered) before the lock: its start-up is not what is tested here
        wait_until(lambda: len(client.list_workers()) == 1)
        with psycopg.connect(env_dsn) as locker:
            locker.execute("LOCK TABLE pgqueue.message IN ACCESS EXCLUSIVE MODE")
            # every read meanwhile is cancelled: held until one was, and was logged
            wait_until(lambda: any(e["event"] == "worker.read_failed" for e in captured_logs))
            assert t.is_alive()
        client.send("jobs", {"n": 1})
        wait_until(lambda: len(events(env_dsn, "done")) == 1)
        assert t.is_alive()
    finally:
        worker.stop()
        t.join(15)
        wclient.close()


def test_hung_handler_is_reported_and_its_message_released(
    make_worker: Any, client: Client, env_dsn: str
) -> None:
    msg_id = client.send("jobs", {"sleep": 4})
    make_worker(hard_timeout=1, vt=600, concurrency=1)
    wait_until(lambda: bool(events(env_dsn, "start")))
    # released long before its 600 s vt ran out: visible again after ~1 s (a bound
    # generous for a loaded machine, far below the vt it guards against)
    wait_until(lambda: len(events(env_dsn, "start")) >= 2, timeout=120)
    assert all(e[1] == msg_id for e in events(env_dsn, "start"))


def test_stop_finishes_in_flight_work_and_releases_the_rest(
    make_worker: Any, client: Client, env_dsn: str
) -> None:
    quick = client.send("jobs", {"sleep": 0.5})
    slow = client.send("jobs", {"sleep": 30})
    # a grace that a loaded machine's 0.5 s handler still finishes in; the slow one never
    worker, thread = make_worker(shutdown_grace=6, concurrency=2)
    wait_until(lambda: len(events(env_dsn, "start")) == 2)
    worker.stop()
    thread.join(60)
    assert not thread.is_alive()
    assert client.set_vt("jobs", quick, 0) is None  # finished and acked
    [again] = client.read("jobs", vt=30, qty=5)  # released: visible at once
    assert again.msg_id == slow


def test_extra_readers_hand_out_every_message_once(
    make_worker: Any, client: Client, env_dsn: str
) -> None:
    client.send_batch("jobs", [{"n": i} for i in range(300)])
    # a vt no loaded machine outlasts: a second read would then be a double hand-out
    make_worker(queues=("jobs",), readers=3, batch=20, concurrency=4, vt=300)
    wait_until(lambda: client.metrics("jobs").queue_length == 0, timeout=120)
    done = events(env_dsn, "done")
    assert len(done) == 300 and len({e[1] for e in done}) == 300
    assert all(e[3] == 1 for e in done)  # nobody's lease ran out: each read once


def test_bad_settings_and_apps_are_refused(client: Client) -> None:
    with pytest.raises(InvalidArgument, match="concurrency must be >= 1"):
        WorkerSettings(concurrency=0)
    with pytest.raises(InvalidArgument, match="readers must be >= 1"):
        WorkerSettings(readers=0)
    assert WorkerSettings.from_env({"PGQUEUE_READERS": "3"}).readers == 3
    with pytest.raises(InvalidArgument, match="no handler for queue"):
        Worker(worker_app.app, client, WorkerSettings(queues=("nope",)))
    s = WorkerSettings.from_env(
        {"PGQUEUE_CONCURRENCY": "8", "PGQUEUE_QUEUES": "a,b", "PGQUEUE_LISTEN": "off"}, vt=9
    )
    assert (s.concurrency, s.queues, s.listen, s.vt) == (8, ("a", "b"), False, 9)
    with pytest.raises(InvalidArgument, match="PGQUEUE_VT"):
        WorkerSettings.from_env({"PGQUEUE_VT": "soon"})
