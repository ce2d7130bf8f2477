"""The worker end to end: a full queue of no-op messages drained by one worker process,
and send -> handler-start latency for an idle worker (LISTEN/NOTIFY vs polling).

    python -m benchmarks.worker_e2e --dsn postgresql://postgres@127.0.0.1/test --runs 3
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import threading
import time

from benchmarks.common import DEFAULT_DSN, scratch_database, write_results
from pgqueue import App, Client, Message, Worker, WorkerSettings


def drain(dsn: str, messages: int, concurrency: int) -> float:
    """Messages per second for one worker (in this process) emptying a full queue."""
    done = threading.Event()
    handled = 0
    lock = threading.Lock()
    app = App()

    @app.handler("e2e")
    def noop(msg: Message) -> None:
        nonlocal handled
        with lock:
            handled += 1
            if handled == messages:
                done.set()

    with Client.from_dsn(dsn) as client:
        client.create_queue("e2e")
        client.purge_queue("e2e")
        for start in range(0, messages, 1000):
            client.send_batch("e2e", [{"n": i} for i in range(start, min(start + 1000, messages))])
    wclient = Client.from_dsn(dsn, max_size=concurrency + 3)
    worker = Worker(
        app,
        wclient,
        WorkerSettings(queues=("e2e",), concurrency=concurrency, batch=100, poll_interval=0.1),
    )
    t = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    began = time.monotonic()
    t.start()
    done.wait(600)
    elapsed = time.monotonic() - began
    worker.stop()
    t.join()
    wclient.close()
    return messages / elapsed


def latency(dsn: str, listen: bool, samples: int) -> list[float]:
    """Milliseconds from send() returning to the handler starting, for an idle worker."""
    started: dict[int, float] = {}
    arrived = threading.Event()
    app = App()

    @app.handler("lat")
    def record(msg: Message) -> None:
        started[msg.msg_id] = time.monotonic()
        arrived.set()

    with Client.from_dsn(dsn) as client:
        client.create_queue("lat")
        wclient = Client.from_dsn(dsn, max_size=5)
        worker = Worker(
            app,
            wclient,
            WorkerSettings(queues=("lat",), listen=listen, poll_interval=0.1, concurrency=1),
        )
        t = threading.Thread(target=worker.run, kwargs={"install_signals": False})
        t.start()
        out = []
        for _ in range(samples):
            # idle first (and registered for NOTIFY); jittered, so a poll loop cannot phase-lock
            time.sleep(random.uniform(0.25, 0.45))
            arrived.clear()
            msg_id = client.send("lat", {})
            sent = time.monotonic()
            arrived.wait(10)
            out.append((started[msg_id] - sent) * 1000)
        worker.stop()
        t.join()
        wclient.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dsn", default=DEFAULT_DSN)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--samples", type=int, default=30)
    args = ap.parse_args()
    with scratch_database(args.dsn, "bench_worker") as target:
        rates = [drain(target, args.messages, args.concurrency) for _ in range(args.runs)]
        notify = latency(target, True, args.samples)
        polling = latency(target, False, args.samples)

    def pct(xs: list[float], p: float) -> float:
        return sorted(xs)[min(len(xs) - 1, int(p * len(xs)))]

    table = "\n".join(
        [
            f"one worker process, concurrency {args.concurrency}, batches of 100, {args.runs} runs,"
            f" {os.cpu_count()} CPUs",
            "",
            "| measure | median | min-max |",
            "|---|---|---|",
            f"| drain {args.messages:,} no-op messages (msg/s) | {statistics.median(rates):,.0f} |"
            f" {min(rates):,.0f}-{max(rates):,.0f} |",
            f"| send -> handler start, LISTEN/NOTIFY (ms) | p50 {pct(notify, 0.5):.1f} |"
            f" p99 {pct(notify, 0.99):.1f} |",
            f"| send -> handler start, polling every 100 ms (ms) | p50 {pct(polling, 0.5):.1f} |"
            f" p99 {pct(polling, 0.99):.1f} |",
        ]
    )
    write_results("worker_e2e", table)


if __name__ == "__main__":
    main()
