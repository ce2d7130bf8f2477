"""pgqueue measured through its Python client and its worker, like the peers."""

from __future__ import annotations

import time

import psycopg

from benchmarks.otel_modes import install_from_env
from benchmarks.peers import _support
from benchmarks.worker_e2e import latency as _latency
from pgqueue import Client

install_from_env()  # PGQUEUE_BENCH_OTEL: the producer side traces too when asked

NAME = "pgqueue"
QUEUE = "bench"
PRELOAD_BATCH = 1000
# The worker as a user would run it for no-op work: 4 handler threads, reads
# and acks in batches of 100.
WORKER_ARGS = ["--concurrency", "4", "--batch", "100"]


def install(dsn: str) -> None:
    """Migrate the database and create the queue."""
    with Client.from_dsn(dsn) as client:
        client.migrate()
        client.create_queue(QUEUE)


def reset(dsn: str) -> None:
    """Empty the queue (and its archive and poison rows)."""
    with Client.from_dsn(dsn) as client:
        client.drop_queue(QUEUE)
        client.create_queue(QUEUE)


def enqueue_single(dsn: str, n: int, conns: int) -> float:
    """Messages/s for n single sends (one transaction each) over conns threads."""
    with Client.from_dsn(dsn, min_size=conns, max_size=conns) as client:
        client.metrics(QUEUE)  # warm

        def sender(k: int) -> None:
            for i in range(k):
                client.send(QUEUE, {"n": i})

        return n / _support.timed_threads(_support.split(n, conns), sender)


def enqueue_batch(dsn: str, n: int, batch: int = 100) -> float:
    """Messages/s for n messages sent `batch` per call on one connection."""
    with Client.from_dsn(dsn, max_size=1) as client:
        client.metrics(QUEUE)
        began = time.monotonic()
        for start in range(0, n, batch):
            client.send_batch(QUEUE, [{"n": i} for i in range(start, min(n, start + batch))])
        return n / (time.monotonic() - began)


def preload(dsn: str, n: int) -> None:
    """Fill the queue with n no-op messages, then VACUUM ANALYZE (as every adapter does)."""
    with Client.from_dsn(dsn, max_size=1) as client:
        for start in range(0, n, PRELOAD_BATCH):
            client.send_batch(
                QUEUE, [{"n": i} for i in range(start, min(n, start + PRELOAD_BATCH))]
            )
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE pgqueue.message")


def drain(dsn: str, n: int, processes: int) -> float:
    """Messages/s for `processes` worker processes emptying a queue of n no-op messages."""
    preload(dsn, n)
    seconds = _support.time_drain(
        dsn,
        "benchmarks.systems.pgqueue_worker",
        [dsn, *WORKER_ARGS],
        processes,
        "SELECT NOT EXISTS (SELECT 1 FROM pgqueue.message)",
    )
    return n / seconds


def drain_batch(dsn: str, n: int, processes: int) -> float:
    """As drain, with a batch handler: one call per read of 100."""
    preload(dsn, n)
    seconds = _support.time_drain(
        dsn,
        "benchmarks.systems.pgqueue_worker",
        [dsn, *WORKER_ARGS, "--batch-handler"],
        processes,
        "SELECT NOT EXISTS (SELECT 1 FROM pgqueue.message)",
    )
    return n / seconds


def latency(dsn: str, samples: int, listen: bool) -> list[float]:
    """Milliseconds from send() returning to an idle worker's handler starting."""
    return _latency(dsn, listen, samples)
