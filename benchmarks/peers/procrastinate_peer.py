"""Procrastinate (PyPI `procrastinate`) measured the way the benchmarks measure pgqueue.

Driver: psycopg 3 through procrastinate's `PsycopgConnector` (an AsyncConnectionPool,
created with procrastinate's defaults: a liveness check on every borrow, and each
query in its own transaction). Its async API throughout (`defer_async`,
`batch_defer_async`, `run_worker_async`), on asyncio, as its own `run_worker` does.

Polling-only latency uses the worker's documented `listen_notify=False` with
`fetch_job_polling_interval=POLL_INTERVAL` (the defer trigger still NOTIFYs; the
worker just does not listen).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import time

import psycopg
from procrastinate import App, PsycopgConnector
from procrastinate.types import JSONDict

from benchmarks.peers import _support

NAME = "Procrastinate"
QUEUE = "bench"
TASK = "noop"
PRELOAD_BATCH = 1000  # jobs per batch_defer call when filling the queue for drain
POLL_INTERVAL = 0.1  # seconds, polling-only latency: as pgqueue's and PGMQ's polls

# Worker settings for drain (`App.run_worker_async` options, as `procrastinate worker`
# takes them). A worker fetches one job per query (there is no batch fetch) in one
# loop, so its only throughput lever is `concurrency`: that many async jobs in
# flight, each finishing on its own pool connection. Measured here (5,000 jobs, noisy
# 2-CPU box): 1 -> 130-290/s, 5 -> 85-385/s, 10 -> 225-387/s, 20 -> 215-220/s,
# 50 -> 150-200/s, so 10, with a pool of concurrency + 2 (the fetch loop, heartbeat
# and abort polling; LISTEN has its own connection). delete_jobs="successful"
# deletes a job on completion instead of keeping it as 'succeeded' (docs:
# howto/production/delete_finished_jobs), as pgqueue deletes on ack; "never" (the
# default) was no faster.
WORKER_CONCURRENCY = 10
WORKER_DELETE_JOBS = "successful"


def make_app(dsn: str, pool_size: int) -> App:
    """A procrastinate App on a pool of `pool_size` connections, with the no-op task."""
    app = App(connector=PsycopgConnector(conninfo=dsn, min_size=pool_size, max_size=pool_size))

    @app.task(name=TASK, queue=QUEUE)
    async def noop(n: int = 0) -> None:
        return None

    return app


def install(dsn: str) -> None:
    """Apply procrastinate's schema with its SchemaManager (as `procrastinate schema --apply`)."""

    async def go() -> None:
        app = make_app(dsn, 1)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    asyncio.run(go())


def reset(dsn: str) -> None:
    """Empty procrastinate's job, event, periodic-defer and worker tables."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "TRUNCATE procrastinate_events, procrastinate_periodic_defers,"
            " procrastinate_jobs, procrastinate_workers"
        )


def enqueue_single(dsn: str, n: int, conns: int) -> float:
    """Messages per second for n single defers spread over `conns` connections."""

    async def go() -> float:
        app = make_app(dsn, conns)
        task = app.tasks[TASK]
        async with app.open_async():

            async def loop(count: int) -> None:
                for i in range(count):
                    await task.defer_async(n=i)

            began = time.monotonic()
            await asyncio.gather(*(loop(c) for c in _support.split(n, conns)))
            return n / (time.monotonic() - began)

    return asyncio.run(go())


async def _defer_batches(app: App, n: int, batch: int) -> None:
    """Defer n jobs in batch_defer calls of `batch`."""
    task = app.tasks[TASK]
    for start in range(0, n, batch):
        kwargs: list[JSONDict] = [{"n": i} for i in range(start, min(start + batch, n))]
        await task.batch_defer_async(*kwargs)


def enqueue_batch(dsn: str, n: int, batch: int = 100) -> float:
    """Messages per second deferring n jobs in batch_defer calls of `batch`, one connection."""

    async def go() -> float:
        app = make_app(dsn, 1)
        async with app.open_async():
            began = time.monotonic()
            await _defer_batches(app, n, batch)
            return n / (time.monotonic() - began)

    return asyncio.run(go())


DONE_SQL = "SELECT NOT EXISTS (SELECT 1 FROM procrastinate_jobs WHERE status IN ('todo', 'doing'))"


def drain(dsn: str, n: int, processes: int) -> float:
    """Messages per second for `processes` worker processes emptying a queue of n no-op jobs."""
    reset(dsn)

    async def preload() -> None:
        app = make_app(dsn, 1)
        async with app.open_async():
            await _defer_batches(app, n, PRELOAD_BATCH)

    asyncio.run(preload())
    _support.vacuum_analyze(dsn, "procrastinate_jobs", "procrastinate_events")
    args = [
        dsn,
        "--concurrency",
        str(WORKER_CONCURRENCY),
        "--delete-jobs",
        WORKER_DELETE_JOBS,
    ]
    seconds = _support.time_drain(
        dsn, "benchmarks.peers.procrastinate_worker", args, processes, DONE_SQL
    )
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'"
        ).fetchone()
        if row is None or row[0]:
            raise RuntimeError(f"{row} jobs did not succeed")
    return n / seconds


def latency(dsn: str, samples: int, listen: bool) -> list[float]:
    """Milliseconds from defer returning to the task starting, for an idle in-process worker."""

    async def go() -> list[float]:
        started: dict[int, float] = {}
        arrived = asyncio.Event()
        app = App(connector=PsycopgConnector(conninfo=dsn, min_size=4, max_size=4))

        @app.task(name="lat", queue="lat")
        async def record(k: int) -> None:
            started[k] = time.monotonic()
            arrived.set()

        async with app.open_async():
            worker = asyncio.create_task(
                app.run_worker_async(
                    queues=["lat"],
                    concurrency=1,
                    listen_notify=listen,
                    fetch_job_polling_interval=POLL_INTERVAL,
                    delete_jobs=WORKER_DELETE_JOBS,
                    install_signal_handlers=False,
                )
            )
            try:

                async def one(k: int) -> float:
                    arrived.clear()
                    await record.defer_async(k=k)
                    sent = time.monotonic()
                    await asyncio.wait_for(arrived.wait(), 10 + POLL_INTERVAL)
                    return (started[k] - sent) * 1000

                await asyncio.sleep(0.3)
                await one(-1)  # warm-up: the worker is running (and listening)
                out = []
                for k in range(samples):
                    await asyncio.sleep(random.uniform(0.25, 0.45))  # idle; jittered vs polls
                    out.append(await one(k))
            finally:
                worker.cancel()  # procrastinate's documented way: a graceful stop
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait_for(worker, 10)
        return out

    return asyncio.run(go())


def _self_check() -> None:
    """Run every function once, small, on a scratch database, and print the figures."""
    _support.self_check(
        sys.modules[__name__],
        f"worker concurrency {WORKER_CONCURRENCY}, delete_jobs {WORKER_DELETE_JOBS}",
    )


if __name__ == "__main__":
    # Through the package, not __main__: procrastinate warns about apps made in __main__.
    from benchmarks.peers import procrastinate_peer

    procrastinate_peer._self_check()
