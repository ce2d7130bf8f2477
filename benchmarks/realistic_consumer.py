"""One consumer process of the realistic-load benchmark: W handlers that each sleep 1 ms.

    python -m benchmarks.realistic_consumer SYSTEM DSN W OUT

SYSTEM is pgqueue, pgmq, pgmq-batch, pgqueuer or procrastinate, each run the
way its docs run a consumer, with W handlers at once (pgmq-batch: PGMQ read
in batches, the way a batching adapter runs it). Every handler call appends one line to
OUT: the message's send time (from its payload), the handler's start and its
end (time.time()), flushed every 0.2 s. Prints "ready" once connected.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

QUEUE = "realistic"
WORK_SECONDS = 0.001


class Recorder:
    """Lines of (sent, started, ended), written to a file by a thread of its own."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lines: list[str] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._flush_forever, daemon=True).start()

    def add(self, sent: float, started: float, ended: float) -> None:
        with self.lock:
            self.lines.append(f"{sent:.6f} {started:.6f} {ended:.6f}\n")

    def flush(self) -> None:
        with self.lock:
            lines, self.lines = self.lines, []
        if lines:
            with open(self.path, "a") as out:
                out.writelines(lines)

    def _flush_forever(self) -> None:
        while True:
            time.sleep(0.2)
            self.flush()


def sent_of(payload: Any) -> float:
    """The send time a producer put in the payload."""
    if isinstance(payload, (bytes, bytearray, str)):
        payload = json.loads(payload)
    return float(payload["sent"])


def handle(rec: Recorder, payload: Any) -> None:
    """The work: 1 ms of sleep, as a handler calling a fast service would."""
    started = time.time()
    time.sleep(WORK_SECONDS)
    rec.add(sent_of(payload), started, time.time())


async def handle_async(rec: Recorder, payload: Any) -> None:
    started = time.time()
    await asyncio.sleep(WORK_SECONDS)
    rec.add(sent_of(payload), started, time.time())


def run_pgqueue(dsn: str, w: int, rec: Recorder, stop: threading.Event) -> None:
    from pgqueue import App, Client, Message, Worker, WorkerSettings
    from pgqueue._log import configure_logging

    configure_logging(json=True, level="WARNING")
    app = App()

    @app.handler(QUEUE)
    def work(msg: Message) -> None:
        handle(rec, msg.message)

    settings = WorkerSettings.from_env(queues=(QUEUE,), concurrency=w)  # defaults otherwise
    client = Client.from_dsn(dsn, max_size=settings.pool_size)
    client.metrics(QUEUE)
    print("ready", flush=True)
    worker = Worker(app, client, settings)
    threading.Thread(target=lambda: (stop.wait(), worker.stop()), daemon=True).start()
    worker.run(install_signals=False)


def run_pgmq(dsn: str, w: int, rec: Recorder, stop: threading.Event) -> None:
    """W threads, each: read one (polling on the server when empty), handle, archive it."""
    from psycopg_pool import ConnectionPool

    pool = ConnectionPool(dsn, min_size=min(w, 4), max_size=min(w, 64), kwargs={"autocommit": True})
    pool.wait()
    print("ready", flush=True)

    def loop() -> None:
        while not stop.is_set():
            with pool.connection() as conn:
                rows = conn.execute(
                    "SELECT msg_id, message FROM pgmq.read_with_poll(%s, 30, 1, 1, 100)", (QUEUE,)
                ).fetchall()
            for msg_id, message in rows:
                handle(rec, message)
                with pool.connection() as conn:
                    conn.execute("SELECT pgmq.archive(%s, %s::bigint)", (QUEUE, msg_id))

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(w)]
    for t in threads:
        t.start()
    stop.wait()


def run_pgmq_batch(dsn: str, w: int, rec: Recorder, stop: threading.Event) -> None:
    """PGMQ read in batches: one reader leases up to max(64, 2W) at a time for W handler
    threads, and each batch is archived with one call once its handlers are done.

    The shape of a batching PGMQ adapter: fewer round trips than a read per message,
    at the cost of holding a batch's leases until its last message is handled. The
    reader reads the next batch while the handlers are still on the previous one.
    """
    from concurrent.futures import ThreadPoolExecutor, wait

    from psycopg_pool import ConnectionPool

    qty = max(64, 2 * w)
    pool = ConnectionPool(dsn, min_size=2, max_size=4, kwargs={"autocommit": True})
    pool.wait()
    handlers = ThreadPoolExecutor(max_workers=w)
    archivers = ThreadPoolExecutor(max_workers=2)
    pending = threading.Semaphore(2)  # at most two batches read and not yet archived
    print("ready", flush=True)

    def finish(futures: list[Any], ids: list[int]) -> None:
        wait(futures)
        with pool.connection() as conn:
            conn.execute("SELECT count(*) FROM pgmq.archive(%s, %s::bigint[])", (QUEUE, ids))
        pending.release()

    while not stop.is_set():
        pending.acquire()
        with pool.connection() as conn:
            rows = conn.execute(
                "SELECT msg_id, message FROM pgmq.read_with_poll(%s, 30, %s, 1, 100)",
                (QUEUE, qty),
            ).fetchall()
        if not rows:
            pending.release()
            continue
        futures = [handlers.submit(handle, rec, message) for _, message in rows]
        archivers.submit(finish, futures, [msg_id for msg_id, _ in rows])


def run_pgqueuer(dsn: str, w: int, rec: Recorder, stop: threading.Event) -> None:
    from pgqueuer import PgQueuer
    from pgqueuer.models import Job

    from benchmarks.peers.pgqueuer_peer import _run, driver

    async def go() -> None:
        async with driver(dsn) as drv:
            pgq = PgQueuer(drv)

            @pgq.entrypoint(QUEUE)
            async def work(job: Job) -> None:
                await handle_async(rec, job.payload)

            print("ready", flush=True)
            # W jobs at once at most: its worker-wide cap, which must be at
            # least twice the batch. (A per-entrypoint concurrency_limit of W
            # with batches of 10 ran 38 msg/s at W=4: once at the limit, each
            # dequeue found nothing and waited for the next notification.)
            task = asyncio.create_task(
                pgq.run(batch_size=max(1, w // 2), max_concurrent_tasks=max(2, w))
            )
            await asyncio.get_running_loop().run_in_executor(None, stop.wait)
            pgq.shutdown.set()
            await asyncio.wait_for(task, 10)

    _run(go())


def run_procrastinate(dsn: str, w: int, rec: Recorder, stop: threading.Event) -> None:
    from procrastinate import App, PsycopgConnector

    app = App(connector=PsycopgConnector(conninfo=dsn, min_size=2, max_size=min(w + 2, 64)))

    @app.task(name=QUEUE, queue=QUEUE)
    async def work(sent: float, pad: str = "") -> None:
        await handle_async(rec, {"sent": sent})

    async def go() -> None:
        async with app.open_async():
            print("ready", flush=True)
            worker = asyncio.create_task(
                app.run_worker_async(queues=[QUEUE], concurrency=w, delete_jobs="successful")
            )
            await asyncio.get_running_loop().run_in_executor(None, stop.wait)
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(worker, 10)

    asyncio.run(go())


RUNNERS: dict[str, Callable[[str, int, Recorder, threading.Event], None]] = {
    "pgqueue": run_pgqueue,
    "pgmq": run_pgmq,
    "pgmq-batch": run_pgmq_batch,
    "pgqueuer": run_pgqueuer,
    "procrastinate": run_procrastinate,
}


def main() -> None:
    system, dsn, w, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    rec = Recorder(out)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        RUNNERS[system](dsn, w, rec, stop)
    finally:
        rec.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
