"""PGMQ (its own pgmq.sql from the `pgmq` PyPI package) driven from Python with psycopg.

PGMQ is SQL only: there is no worker, so the drain uses a small consumer loop
(benchmarks/systems/pgmq_worker.py) that reads 100 at a time and deletes them
with one call, the way PGMQ's docs use read and delete.
"""

from __future__ import annotations

import json
import random
import threading
import time
from importlib.resources import files

import psycopg

from benchmarks.peers import _support

NAME = "PGMQ"
QUEUE = "bench"
PRELOAD_BATCH = 1000


def install(dsn: str) -> None:
    """Install pgmq.sql and create the queue."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(files("pgmq").joinpath("sql", "pgmq.sql").read_text())
        conn.execute("SELECT pgmq.create(%s)", (QUEUE,))


def reset(dsn: str) -> None:
    """Drop and recreate the queue."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pgmq.drop_queue(%s)", (QUEUE,))
        conn.execute("SELECT pgmq.create(%s)", (QUEUE,))


def enqueue_single(dsn: str, n: int, conns: int) -> float:
    """Messages/s for n pgmq.send calls over conns connections."""
    shares = _support.split(n, conns)
    links = [psycopg.connect(dsn, autocommit=True, prepare_threshold=0) for _ in shares]

    def sender(index: int) -> None:
        for i in range(shares[index]):
            links[index].execute("SELECT pgmq.send(%s, %s::jsonb)", (QUEUE, json.dumps({"n": i})))

    try:
        return n / _support.timed_threads(list(range(len(shares))), sender)
    finally:
        for link in links:
            link.close()


def _send_batch(conn: psycopg.Connection[object], start: int, stop: int) -> None:
    conn.execute(
        "SELECT count(*) FROM pgmq.send_batch(%s, %s::jsonb[])",
        (QUEUE, [json.dumps({"n": i}) for i in range(start, stop)]),
    )


def enqueue_batch(dsn: str, n: int, batch: int = 100) -> float:
    """Messages/s for n messages sent `batch` per pgmq.send_batch call."""
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=0) as conn:
        began = time.monotonic()
        for start in range(0, n, batch):
            _send_batch(conn, start, min(n, start + batch))
        return n / (time.monotonic() - began)


def drain(dsn: str, n: int, processes: int) -> float:
    """Messages/s for `processes` consumer loops emptying a queue of n messages."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for start in range(0, n, PRELOAD_BATCH):
            _send_batch(conn, start, min(n, start + PRELOAD_BATCH))
        conn.execute(f"VACUUM ANALYZE pgmq.q_{QUEUE}")  # as every adapter does
    seconds = _support.time_drain(
        dsn,
        "benchmarks.systems.pgmq_worker",
        [dsn],
        processes,
        f"SELECT NOT EXISTS (SELECT 1 FROM pgmq.q_{QUEUE})",
    )
    return n / seconds


def latency(dsn: str, samples: int, listen: bool) -> list[float]:
    """Milliseconds from send to an idle consumer having the message.

    With listen: PGMQ's insert notifications (enable_notify_insert, no
    throttle) wake a LISTENing consumer. Without: pgmq.read_with_poll, which
    polls on the server every 100 ms (its default).
    """
    got: dict[int, float] = {}
    arrived = threading.Event()
    stop = threading.Event()
    with psycopg.connect(dsn, autocommit=True) as conn:
        if listen:
            conn.execute("SELECT pgmq.enable_notify_insert(%s, 0)", (QUEUE,))

    def consumer() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            if listen:
                conn.execute(f'LISTEN "pgmq.q_{QUEUE}.INSERT"')
            while not stop.is_set():
                if listen:
                    rows = conn.execute("SELECT msg_id FROM pgmq.read(%s, 30, 1)", (QUEUE,))
                else:
                    rows = conn.execute(
                        "SELECT msg_id FROM pgmq.read_with_poll(%s, 30, 1, 1, 100)", (QUEUE,)
                    )
                ids = [r[0] for r in rows.fetchall()]
                for msg_id in ids:
                    got[msg_id] = time.monotonic()
                    conn.execute("SELECT pgmq.delete(%s, %s::bigint)", (QUEUE, msg_id))
                    arrived.set()
                if not ids and listen:
                    for _ in conn.notifies(timeout=1.0, stop_after=1):
                        pass

    t = threading.Thread(target=consumer, daemon=True)
    t.start()
    out = []
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for _ in range(samples):
                time.sleep(random.uniform(0.25, 0.45))  # jittered: no phase lock with a poll
                arrived.clear()
                row = conn.execute("SELECT pgmq.send(%s, '{}'::jsonb)", (QUEUE,)).fetchone()
                sent = time.monotonic()
                assert row is not None
                arrived.wait(10)
                out.append((got[row[0]] - sent) * 1000)
    finally:
        stop.set()
        t.join(5)
        if listen:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("SELECT pgmq.disable_notify_insert(%s)", (QUEUE,))
    return out
