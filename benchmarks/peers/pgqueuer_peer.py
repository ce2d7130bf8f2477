"""PgQueuer (PyPI `pgqueuer`) measured the way the benchmarks measure pgqueue.

Driver: asyncpg (`AsyncpgDriver`, one connection per client or worker; install it
with `pip install 'pgqueuer[asyncpg]'`), the driver PgQueuer's own CLI (`pgq install`,
`pgq run`) tries first and its benchmark tool's default. Without asyncpg, or with
PGQUEUER_PEER_DRIVER=psycopg, its `PsycopgDriver` over a psycopg 3 AsyncConnection is
used instead. That one is slower here (drains ~30-40% slower, latency ~1.5 ms
higher): on PgQueuer 1.6 its NOTIFY watcher holds the connection lock while it waits
(up to 1 s) for a notification, so the worker's queries queue behind it.
Event loop: uvloop, as `pgq run` uses (uvloop is a dependency of pgqueuer on Linux).

Polling-only latency is not measured: `latency(..., listen=False)` returns []. The
queue table's trigger NOTIFYs on every insert and a PgQueuer worker always LISTENs;
neither can be switched off through its API (`dequeue_timeout` is only the fallback
wait between dequeues when no notification arrives).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import random
import sys
import time
from collections.abc import AsyncIterator, Coroutine
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import timedelta
from typing import Any, TypeVar

from pgqueuer import PgQueuer
from pgqueuer.models import Job
from pgqueuer.ports.driver import Driver
from pgqueuer.queries import Queries
from psycopg.conninfo import conninfo_to_dict

from benchmarks.peers import _support

NAME = "PgQueuer"
ENTRYPOINT = "noop"
# "asyncpg" or "psycopg"; asyncpg when it is installed, unless the environment says.
DRIVER = os.environ.get("PGQUEUER_PEER_DRIVER") or (
    "asyncpg" if importlib.util.find_spec("asyncpg") else "psycopg"
)
PRELOAD_BATCH = 1000  # messages per enqueue call when filling the queue for drain

# Worker settings for drain (passed to `pgqueuer.run`, the Python form of `pgq run`).
# batch_size 500: the dequeue batch, which also sizes the completion-log buffer (one
# DELETE ... INSERT INTO pgqueuer_log per `batch_size` jobs or per 0.1 s). Measured
# here (20,000 jobs, 3 interleaved runs, noisy 2-CPU box): the default 10 drains at
# ~2,000/s, 100 at ~4,000-7,000/s, 250-1000 at ~6,000-8,000/s with no clear winner.
# max_concurrent_tasks unset (unlimited, the default): a cap adds worker-budget CTEs
# to every dequeue and was no faster. Everything else default (durable tables,
# 30 s heartbeat, 30 s dequeue_timeout).
WORKER_BATCH_SIZE = 500
WORKER_MAX_CONCURRENT_TASKS: int | None = None

T = TypeVar("T")


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on uvloop when it is there (as `pgq run` does), else asyncio."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def _asyncpg_params(dsn: str) -> dict[str, Any]:
    """asyncpg.connect keyword arguments for a libpq DSN (URI or key=value)."""
    info = conninfo_to_dict(dsn)
    names = {"host": "host", "port": "port", "user": "user", "password": "password"}
    params: dict[str, Any] = {names[k]: v for k, v in info.items() if k in names}
    if "dbname" in info:
        params["database"] = info["dbname"]
    if "port" in params:
        params["port"] = int(params["port"])
    return params


@asynccontextmanager
async def driver(dsn: str) -> AsyncIterator[Driver]:
    """A PgQueuer driver on one new connection of the configured kind, closed afterwards."""
    if DRIVER == "psycopg":
        import psycopg

        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            yield Queries.from_psycopg_connection(conn).driver
    elif DRIVER == "asyncpg":
        import asyncpg  # type: ignore[import-untyped]

        conn = await asyncpg.connect(**_asyncpg_params(dsn))
        try:
            yield Queries.from_asyncpg_connection(conn).driver
        finally:
            await conn.close()
    else:
        raise ValueError(f"PGQUEUER_PEER_DRIVER must be asyncpg or psycopg, not {DRIVER!r}")


def _payload(i: int) -> bytes:
    """A small JSON payload."""
    return b'{"n": %d}' % i


def install(dsn: str) -> None:
    """Install PgQueuer's schema, as `pgq install` does (durability: durable, the default)."""

    async def go() -> None:
        async with driver(dsn) as drv:
            queries = Queries(drv)
            if not await queries.schema_is_installed():
                await queries.install()

    _run(go())


def reset(dsn: str) -> None:
    """Empty the queue, its log and its statistics."""

    async def go() -> None:
        async with driver(dsn) as drv:
            queries = Queries(drv)
            await queries.clear_queue()
            await queries.clear_queue_log()
            await queries.clear_statistics_log()

    _run(go())


def enqueue_single(dsn: str, n: int, conns: int) -> float:
    """Messages per second for n single enqueues spread over `conns` connections."""

    async def go() -> float:
        async with AsyncExitStack() as stack:
            clients = [Queries(await stack.enter_async_context(driver(dsn))) for _ in range(conns)]

            async def loop(queries: Queries, count: int) -> None:
                for i in range(count):
                    await queries.enqueue(ENTRYPOINT, _payload(i))

            began = time.monotonic()
            await asyncio.gather(
                *(loop(q, c) for q, c in zip(clients, _support.split(n, conns), strict=True))
            )
            return n / (time.monotonic() - began)

    return _run(go())


async def _enqueue_batches(queries: Queries, n: int, batch: int) -> None:
    """Enqueue n messages in calls of `batch`."""
    for start in range(0, n, batch):
        k = min(batch, n - start)
        await queries.enqueue([ENTRYPOINT] * k, [_payload(start + i) for i in range(k)], [0] * k)


def enqueue_batch(dsn: str, n: int, batch: int = 100) -> float:
    """Messages per second enqueuing n messages in calls of `batch`, one connection."""

    async def go() -> float:
        async with driver(dsn) as drv:
            queries = Queries(drv)
            began = time.monotonic()
            await _enqueue_batches(queries, n, batch)
            return n / (time.monotonic() - began)

    return _run(go())


DONE_SQL = "SELECT NOT EXISTS (SELECT 1 FROM pgqueuer)"


def drain(dsn: str, n: int, processes: int) -> float:
    """Messages per second for `processes` worker processes emptying a queue of n no-op jobs."""

    reset(dsn)

    async def preload() -> None:
        async with driver(dsn) as drv:
            await _enqueue_batches(Queries(drv), n, PRELOAD_BATCH)

    _run(preload())
    _support.vacuum_analyze(dsn, "pgqueuer", "pgqueuer_log")
    args = [dsn, "--driver", DRIVER, "--batch-size", str(WORKER_BATCH_SIZE)]
    if WORKER_MAX_CONCURRENT_TASKS:
        args += ["--max-concurrent-tasks", str(WORKER_MAX_CONCURRENT_TASKS)]
    seconds = _support.time_drain(
        dsn, "benchmarks.peers.pgqueuer_worker", args, processes, DONE_SQL
    )

    async def check() -> None:
        async with driver(dsn) as drv:
            rows = await drv.fetch(
                "SELECT count(*) AS c FROM pgqueuer_log WHERE status = 'successful'"
            )
            if rows[0]["c"] != n:
                raise RuntimeError(f"{rows[0]['c']} of {n} jobs logged successful")

    _run(check())
    return n / seconds


def latency(dsn: str, samples: int, listen: bool) -> list[float]:
    """Milliseconds from enqueue returning to the handler starting, idle in-process worker."""
    if not listen:
        return []  # see the module docstring: PgQueuer always listens

    async def go() -> list[float]:
        started: dict[int, float] = {}
        arrived = asyncio.Event()
        async with driver(dsn) as wdrv, driver(dsn) as cdrv:
            pgq = PgQueuer(wdrv)

            @pgq.entrypoint("lat")
            async def record(job: Job) -> None:
                started[job.id] = time.monotonic()
                arrived.set()

            client = Queries(cdrv)
            worker = asyncio.create_task(pgq.run(dequeue_timeout=timedelta(seconds=30)))
            try:

                async def one() -> float:
                    arrived.clear()
                    (job_id,) = await client.enqueue("lat", b"{}")
                    sent = time.monotonic()
                    await asyncio.wait_for(arrived.wait(), 10)
                    return (started[job_id] - sent) * 1000

                await asyncio.sleep(0.3)
                await one()  # warm-up: the worker is running and listening
                out = []
                for _ in range(samples):
                    await asyncio.sleep(random.uniform(0.25, 0.45))  # idle; jittered vs polls
                    out.append(await one())
            finally:
                pgq.shutdown.set()
                await asyncio.wait_for(worker, 10)
        return out

    return _run(go())


def _self_check() -> None:
    """Run every function once, small, on a scratch database, and print the figures."""
    _support.self_check(
        sys.modules[__name__], f"driver {DRIVER}, worker batch_size {WORKER_BATCH_SIZE}"
    )


if __name__ == "__main__":
    _self_check()
