"""Barrier fan-in: a 10,000-member fan-out completed by 4 consumer processes.

Reports member completions per second and the time from the last completion
to the callback's delivery to a consumer waiting on LISTEN/NOTIFY.

    python -m benchmarks.barrier_fanin --dsn postgresql://postgres@127.0.0.1/test --runs 3
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time
from typing import Any

from benchmarks.common import DEFAULT_DSN, scratch_database, write_results
from pgqueue import Client


def _consumer(dsn: str, batch: int, start: Any, out: Any) -> None:
    done = 0
    first = last = 0.0
    with Client.from_dsn(dsn, max_size=1) as client:
        client.metrics("members")  # connected and warm before the clock starts
        start.wait()
        while True:
            msgs = client.read("members", vt=60, qty=batch)
            if not msgs:
                break
            first = first or time.time()
            client.complete_members("members", [m.msg_id for m in msgs])
            last = time.time()
            done += len(msgs)
    out.put((done, first, last))


def _callback_waiter(dsn: str, out: Any) -> None:
    with Client.from_dsn(dsn, max_size=2) as client:
        while True:
            got = client.read_or_wait("callbacks", vt=60, qty=1, max_wait_seconds=30)
            if got:
                out.put(time.time())
                return


def run_once(dsn: str, members: int, consumers: int, batch: int) -> tuple[float, float]:
    with Client.from_dsn(dsn) as client:
        client.create_queue("members")
        client.create_queue("callbacks")
        client.purge_queue("members")
        client.purge_queue("callbacks")
        client.fan_out(
            "members",
            [{"n": i} for i in range(members)],
            callback_queue="callbacks",
            callback_message={"done": True},
        )
    ctx = mp.get_context("spawn")
    out: Any = ctx.Queue()
    cb_out: Any = ctx.Queue()
    waiter = ctx.Process(target=_callback_waiter, args=(dsn, cb_out))
    waiter.start()
    time.sleep(1.0)  # let the waiter reach its LISTEN
    start = ctx.Barrier(consumers)
    procs = [ctx.Process(target=_consumer, args=(dsn, batch, start, out)) for _ in range(consumers)]
    for p in procs:
        p.start()
    results = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    delivered = cb_out.get(timeout=60)
    waiter.join()
    total = sum(r[0] for r in results)
    assert total == members, f"completed {total} of {members}"
    start = min(r[1] for r in results if r[1])
    end = max(r[2] for r in results)
    return members / (end - start), (delivered - end) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dsn", default=DEFAULT_DSN)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--members", type=int, default=10_000)
    ap.add_argument("--consumers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=100)
    args = ap.parse_args()
    with scratch_database(args.dsn, "bench_barrier") as target:
        rates, lags = [], []
        for _ in range(args.runs):
            rate, lag = run_once(target, args.members, args.consumers, args.batch)
            rates.append(rate)
            lags.append(lag)
    table = "\n".join(
        [
            f"{args.members} members, {args.consumers} consumer processes, batches of {args.batch},"
            f" {args.runs} runs, {os.cpu_count()} CPUs",
            "",
            "| measure | median | min-max |",
            "|---|---|---|",
            f"| member completions/s | {statistics.median(rates):,.0f} |"
            f" {min(rates):,.0f}-{max(rates):,.0f} |",
            f"| last completion -> callback delivered (ms) | {statistics.median(lags):.1f} |"
            f" {min(lags):.1f}-{max(lags):.1f} |",
        ]
    )
    write_results("barrier_fanin", table)


if __name__ == "__main__":
    main()
