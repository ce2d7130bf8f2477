"""Acks that are slow cannot starve leases, and cannot keep a worker from stopping.

The ack path is slowed for real: a trigger on pgqueue.message sleeps in
every statement that deletes messages, for as long as the table slow_acks
says.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import psycopg
from support import worker_app
from support.db import wait_until
from support.processes import count, prepare

from pgqueue import Client, Worker, WorkerSettings

SLOW_ACKS = """
CREATE TABLE IF NOT EXISTS public.slow_acks (seconds float8);
CREATE OR REPLACE FUNCTION public.slow_ack() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE s float8;
BEGIN
    SELECT seconds INTO s FROM public.slow_acks LIMIT 1;
    IF s IS NOT NULL THEN PERFORM pg_sleep(s); END IF;
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER slow_ack AFTER DELETE ON pgqueue.message
    FOR EACH STATEMENT EXECUTE FUNCTION public.slow_ack();
"""


def slow_acks(dsn: str, seconds: float | None) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SLOW_ACKS)
        conn.execute("DELETE FROM public.slow_acks")
        if seconds is not None:
            conn.execute("INSERT INTO public.slow_acks VALUES (%s)", (seconds,))


def acks_sleeping(dsn: str) -> int:
    """Statements of this database asleep in slow_ack's pg_sleep (an ack under way)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event = 'PgSleep' AND pid <> pg_backend_pid()"
        ).fetchone()
    return int(row[0]) if row else 0


def test_messages_waiting_for_a_slow_ack_keep_their_leases(
    dsn: str, client: Client, monkeypatch: Any
) -> None:
    monkeypatch.setenv("PGQUEUE_DSN", dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(worker_app.SCHEMA)
    client.create_queue("jobs", max_attempts=5)
    slow_acks(dsn, 3.0)  # longer than the vt
    ids = client.send_batch("jobs", [{"n": i} for i in range(20)])
    settings = WorkerSettings(queues=("jobs",), vt=2, concurrency=4, poll_interval=0.1)
    with Client.from_dsn(dsn, max_size=settings.pool_size) as wc:
        w = Worker(worker_app.app, wc, settings)
        t = threading.Thread(target=w.run, kwargs={"install_signals": False})
        t.start()
        wait_until(lambda: count(dsn, "done") == 20, timeout=120)
        wait_until(lambda: client.metrics("jobs").queue_length == 0, timeout=120)
        w.stop()
        t.join(30)
    assert count(dsn, "start") == 20, "a message whose ack was slow was handed out again"
    assert client.delete_many("jobs", ids) == []


def test_a_worker_stops_within_its_grace_while_an_ack_is_stuck(dsn: str, spawn: Any) -> None:
    with prepare(dsn) as client:
        slow_acks(dsn, 60.0)
        client.send_batch("jobs", [{"n": i} for i in range(5)])
        w = spawn(dsn, "--shutdown-grace", "2", "--vt", "30")
        wait_until(lambda: count(dsn, "done") == 5)
        wait_until(lambda: acks_sleeping(dsn) >= 1)  # the ack is in its 60 s statement now
        w.signal(signal.SIGTERM)
        started = time.monotonic()
        assert w.wait(60) == 0
        # its grace (2 s) and a second, not the 60 s ack: a bound far above what load adds
        assert time.monotonic() - started < 40
        assert w.events("worker.acks_unfinished")


def test_a_worker_held_back_by_its_acks_reads_again_when_they_land_not_at_its_next_poll(
    dsn: str, client: Client, monkeypatch: Any
) -> None:
    from pgqueue._worker import reader

    monkeypatch.setenv("PGQUEUE_DSN", dsn)
    monkeypatch.setattr(reader, "ACKS_BEHIND", 4)  # held back after a few finished messages
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(worker_app.SCHEMA)
    client.create_queue("jobs", max_attempts=5)
    slow_acks(dsn, 0.2)
    client.send_batch("jobs", [{"n": i} for i in range(40)])
    # a poll interval far longer than the test: only a wake-up by the acks can finish it
    settings = WorkerSettings(queues=("jobs",), concurrency=4, poll_interval=600)
    with Client.from_dsn(dsn, max_size=settings.pool_size) as wc:
        w = Worker(worker_app.app, wc, settings)
        t = threading.Thread(target=w.run, kwargs={"install_signals": False})
        t.start()
        try:
            wait_until(lambda: client.metrics("jobs").queue_length == 0, timeout=120)
        finally:
            w.stop()
            t.join(30)


def test_an_ack_retried_onto_a_promoted_async_standby_leaves_a_reused_id_alone(
    dsn: str, client: Client, monkeypatch: Any
) -> None:
    # Acted out on one server: while the handler runs, its message's send is
    # "lost" (the row goes, and the queue's sequence is set back), and a new
    # send takes the same msg_id, as on a promoted asynchronous standby.
    monkeypatch.setenv("PGQUEUE_DSN", dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(worker_app.SCHEMA)
    client.create_queue("jobs", max_attempts=5)
    # held at a gate while its send is "lost": it cannot finish first on a slow machine
    first = client.send("jobs", {"n": 1, "gate": "open"})
    settings = WorkerSettings(queues=("jobs",), vt=30, concurrency=1, poll_interval=0.1)
    with Client.from_dsn(dsn, max_size=settings.pool_size) as wc:
        w = Worker(worker_app.app, wc, settings)
        t = threading.Thread(target=w.run, kwargs={"install_signals": False})
        t.start()
        try:
            wait_until(lambda: count(dsn, "start") == 1)
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("DELETE FROM pgqueue.message WHERE msg_id = %s", (first,))
                conn.execute(
                    "SELECT setval(msg_seq, %s, false) FROM pgqueue.queue"
                    " WHERE queue_name = 'jobs'",
                    (first,),
                )
            again = client.send("jobs", {"n": 2}, delay=5)  # not read before the first ack
            assert again == first
            worker_app.open_gate(dsn, "open")
            wait_until(lambda: count(dsn, "done") == 2, timeout=120)
            wait_until(lambda: client.metrics("jobs").queue_length == 0, timeout=120)
        finally:
            w.stop()
            t.join(30)
    with psycopg.connect(dsn) as conn:
        runs = conn.execute(
            "SELECT read_ct FROM handled WHERE event = 'done' ORDER BY at"
        ).fetchall()
    # the new message was handled (read once), not acked by the first one's ack
    assert runs == [(1,), (1,)]
