"""Worker processes that stall, hang or stop: they never move a lease that is not theirs.

Real processes and real signals: SIGSTOP/SIGCONT freeze a worker past its vt
while another reader takes its message over; a hard timeout leaves every
handler thread hung; a stop signal arrives with messages waiting locally.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import psycopg
from support import worker_app
from support.db import wait_until
from support.processes import count, prepare

from pgqueue import Client


def pids(dsn: str, event: str, msg_ids: list[int] | None = None) -> list[int]:
    """The worker pids that recorded this event (for these messages), in order."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT pid FROM handled WHERE event = %s AND (%s::bigint[] IS NULL"
            " OR msg_id = ANY(%s::bigint[])) ORDER BY at",
            (event, msg_ids, msg_ids),
        ).fetchall()
    return [r[0] for r in rows]


def leased(client: Client) -> int:
    """How many of `jobs`' messages have been read at least once so far."""
    return sum(m.read_ct > 0 for m in client.peek("jobs", qty=100))


def test_a_worker_stopped_past_its_vt_does_not_move_the_new_holders_lease(
    dsn: str, spawn: Any
) -> None:
    with prepare(dsn) as client:
        client.send("jobs", {"sleep": 15})
        a = spawn(dsn, "--vt", "2", "--concurrency", "1", "--shutdown-grace", "0")
        wait_until(lambda: count(dsn, "start") == 1)
        a.signal(signal.SIGSTOP)
        # its lease runs out while it is frozen; another reader takes over (for longer
        # than any loaded machine takes for the rest) as soon as it has
        took: list[Any] = []
        wait_until(lambda: bool(took.extend(client.read("jobs", vt=600, qty=1)) or took))
        [b] = took
        assert b.read_ct == 2
        a.signal(signal.SIGCONT)
        # A's heartbeat came round and found its lease gone: what it did to B's is below
        wait_until(lambda: bool(a.events("message.lease_lost")))
        assert client.read("jobs", vt=30, qty=1) == []  # nobody else inside B's lease
        assert [m.vt for m in client.peek("jobs")] == [b.vt]  # untouched
        a.signal(signal.SIGTERM)  # its shutdown gives back only what it holds
        assert a.wait() == 0
        assert client.read("jobs", vt=30, qty=1) == []
        assert [m.vt for m in client.peek("jobs")] == [b.vt]
        [lost] = a.events("message.lease_lost")
        assert (lost["queue"], lost["msg_id"], lost["read_ct"]) == ("jobs", b.msg_id, 1)


def test_a_transactional_handler_stopped_past_its_vt_rolls_back_and_its_effect_commits_once(
    dsn: str, spawn: Any
) -> None:
    with prepare(dsn, "tx_effects") as client:
        # held at a gate, not for a guessed time: A is stopped inside the handler however
        # slow the machine, and B, once the gate is open, goes through while A is frozen
        client.send("tx_effects", {"key": "k", "gate": "open"})
        args = ("--queue", "tx_effects", "--vt", "2", "--concurrency", "1")
        a = spawn(dsn, *args)
        wait_until(lambda: count(dsn, "start") == 1)
        a.signal(signal.SIGSTOP)  # inside the handler, its write not yet committed
        worker_app.open_gate(dsn, "open")
        b = spawn(dsn, *args)  # takes the message over once A's lease has run out
        wait_until(lambda: client.metrics("tx_effects").queue_length == 0)
        a.signal(signal.SIGCONT)
        wait_until(lambda: count(dsn, "done") == 2)  # A's handler returned too
        wait_until(lambda: bool(a.events("message.lease_lost")))
        with psycopg.connect(dsn) as conn:
            effects = conn.execute("SELECT msg_id FROM effects").fetchall()
        assert len(effects) == 1, "the stalled run's write rolled back; the new holder's stands"
        for w in (a, b):
            w.signal(signal.SIGTERM)
            assert w.wait() == 0


def test_a_worker_whose_handlers_all_hang_gives_back_what_waits_and_stops_leasing(
    dsn: str, spawn: Any, tmp_path: Path
) -> None:
    health = tmp_path / "health"
    with prepare(dsn) as client:
        hung = client.send("jobs", {"sleep": 60})
        quick = client.send_batch("jobs", [{"n": 1}, {"n": 2}])
        a = spawn(
            dsn,
            *("--concurrency", "1", "--batch", "2", "--vt", "3", "--hard-timeout", "1"),
            *("--health-file", str(health)),
        )
        wait_until(lambda: count(dsn, "start") == 1)
        # past the hard timeout: A's only handler thread is hung, and A says so
        wait_until(lambda: bool(a.events("worker.stuck")))
        b = spawn(dsn, "--concurrency", "3", "--vt", "30")
        wait_until(lambda: len(pids(dsn, "done", quick)) == 2)
        touched = health.stat().st_mtime
        time.sleep(1)
        assert set(pids(dsn, "done", quick)) == {b.p.pid}
        assert pids(dsn, "start").count(a.p.pid) == 1  # A started only the hung one
        assert set(pids(dsn, "start", [hung])) <= {a.p.pid, b.p.pid}
        assert health.stat().st_mtime == touched, "a stuck worker stops touching its health file"
        released = {e["msg_id"] for e in a.events("message.released")}
        assert hung in released
        a.p.kill()


def test_after_a_stop_signal_no_message_waiting_locally_starts(dsn: str, spawn: Any) -> None:
    with prepare(dsn) as client:
        # the handlers end when the test opens their gate, after the signal: none of them
        # can finish (and free a thread for the other two) on a slow machine's schedule
        client.send_batch("jobs", [{"gate": "open"}] * 4)
        w = spawn(dsn, "--concurrency", "2", "--batch", "2", "--vt", "300")
        wait_until(lambda: count(dsn, "start") == 2)
        wait_until(lambda: leased(client) == 4)  # the next read has fetched the other two
        w.signal(signal.SIGINT)
        wait_until(lambda: bool(w.events("worker.signal")))
        worker_app.open_gate(dsn, "open")
        assert w.wait(120) == 0
        assert (count(dsn, "start"), count(dsn, "done")) == (2, 2)
        again = client.read("jobs", vt=30, qty=10)
        assert [m.read_ct for m in again] == [2, 2]  # leased once, given back at the signal


def test_a_stopping_worker_gives_back_its_whole_prefetch_at_once(dsn: str, spawn: Any) -> None:
    with prepare(dsn) as client:
        client.send_batch("jobs", [{"gate": "open"}] * 40)
        w = spawn(dsn, "--concurrency", "2", "--batch", "30", "--vt", "300")
        wait_until(lambda: count(dsn, "start") == 2)
        # 2 running (until the gate opens), most of a prefetch of 30 waiting
        wait_until(lambda: leased(client) >= 22)
        w.signal(signal.SIGTERM)
        wait_until(lambda: bool(w.events("worker.signal")))
        worker_app.open_gate(dsn, "open")
        assert w.wait(120) == 0
        [gave] = [e for e in w.events("worker.gave_back") if e["why"] == "the worker is stopping"]
        assert gave["count"] == gave["of"] >= 20
        assert (count(dsn, "start"), count(dsn, "done")) == (2, 2)
        again = client.read("jobs", vt=30, qty=100)  # all visible at once, none lost
        assert len(again) == 38
        assert sum(m.read_ct == 2 for m in again) == gave["count"]


def test_a_worker_resumed_after_a_stall_starts_none_of_what_another_reader_took_over(
    dsn: str, spawn: Any, monkeypatch: Any
) -> None:
    """SIGSTOP past the vt, another reader takes the prefetched messages, SIGCONT.

    After SIGCONT two threads race: the loop's heartbeat gives the expired
    waiting messages back, and the handler thread that finished looks for its
    next message. Here the heartbeat usually wins; InFlight.begin refuses an
    expired lease for when it does not (test_worker_duties pins that alone).
    """
    # A late heartbeat margin (0.4 s of a 4 s vt): the waiting messages are
    # still held, not yet given back for waiting too long, when the stop hits.
    monkeypatch.setenv("PGQUEUE_HEARTBEAT_FRACTION", "0.9")
    with prepare(dsn) as client:
        # the running handler ends when the test opens the gate, not after a guessed time
        ids = client.send_batch("jobs", [{"gate": "open"}] * 12)
        w = spawn(dsn, "--concurrency", "1", "--batch", "10", "--vt", "4")
        wait_until(lambda: count(dsn, "start") == 1)
        w.p.send_signal(signal.SIGSTOP)
        taken: list[Any] = []
        try:
            # another reader takes each as soon as the stalled worker's lease on it has
            # run out, until it holds all (the running one's too)
            wait_until(
                lambda: len(taken.extend(client.read("jobs", vt=600, qty=20)) or taken) == 12
            )
        finally:
            w.p.send_signal(signal.SIGCONT)
        worker_app.open_gate(dsn, "open")
        # The resumed worker finishes its running handler, and gives the nine that
        # waited back (by the heartbeat, or by the thread that would have started
        # them), finding their leases gone: after that there is nothing it could start.
        wait_until(lambda: count(dsn, "done") == 1)
        wait_until(lambda: sum(e["of"] for e in w.events("worker.gave_back")) >= 9)
        w.signal(signal.SIGTERM)
        assert w.wait() == 0
        with psycopg.connect(dsn) as conn:
            started = [
                r[0]
                for r in conn.execute(
                    "SELECT msg_id FROM handled WHERE event = 'start' ORDER BY at"
                )
            ]
        # Only the message running when the worker was stopped ran; it was
        # taken over mid-run, which at-least-once allows. None that waited did.
        assert len(started) == 1, f"the resumed worker started {started[1:]} (another's)"
        assert started[0] in ids and {m.msg_id for m in taken} <= set(ids)


def test_a_read_that_poison_drops_a_message_logs_one_line_for_it(
    client: Client, queue: str, captured_logs: list[dict[str, Any]]
) -> None:
    msg_id = client.send(queue, "bad")  # max_attempts 3
    for _ in range(3):
        assert [m.msg_id for m in client.read(queue, vt=0, qty=1)] == [msg_id]
    assert client.read(queue, vt=30, qty=1) == []
    [line] = [e for e in captured_logs if e["event"] == "message.poisoned"]
    assert (line["queue"], line["msg_id"], line["read_ct"], line["by"]) == (
        queue,
        msg_id,
        3,
        "read",
    )
    assert line["reason"].startswith("max_attempts exceeded (read 3 times)")


def test_the_last_failed_attempt_logs_its_poisoning_not_a_retry(
    dsn: str, client: Client, monkeypatch: Any, captured_logs: list[dict[str, Any]]
) -> None:
    import threading

    from support import worker_app

    from pgqueue import Worker, WorkerSettings

    monkeypatch.setenv("PGQUEUE_DSN", dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(worker_app.SCHEMA)
    client.create_queue("jobs", max_attempts=2)
    msg_id = client.send("jobs", {"fail_times": 9})
    settings = WorkerSettings(
        queues=("jobs",), poll_interval=0.1, backoff_base=0.01, backoff_max=0.01
    )
    with Client.from_dsn(dsn, max_size=8) as wc:
        w = Worker(worker_app.app, wc, settings)
        t = threading.Thread(target=w.run, kwargs={"install_signals": False})
        t.start()
        wait_until(lambda: client.metrics("jobs").poison_length == 1)
        w.stop()
        t.join(10)
    mine = [e for e in captured_logs if e.get("msg_id") == msg_id]
    assert [(e["event"], e["read_ct"]) for e in mine if e["event"].startswith("message.")] == [
        ("message.failed", 1),
        ("message.poisoned", 2),
    ]
    assert "retry_in" in mine[0] and "retry_in" not in mine[1]
    assert mine[1]["by"] == "nack" and "RuntimeError" in mine[1]["error"]
    [p] = client.poison_list("jobs")
    assert p.reason.startswith("max_attempts exceeded (read 2 times); last error: RuntimeError")
