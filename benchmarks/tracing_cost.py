"""What tracing costs pgqueue: sends and a worker's drain with tracing off, and with the SDK on.

python -m benchmarks.tracing_cost [--dsn DSN] [--runs 5] [--messages 20000]

Each run measures every mode in turn (off, sdk-drop, sampled-off; see
benchmarks/otel_modes.py), A B C A B C, on a fresh database per mode and run,
never analyzed or vacuumed by hand. Two figures per mode:
- single sends, one connection: the producer span and the context's header;
- a full queue drained by one worker process (4 handler threads, a handler
  that sleeps 1 ms): the process and settle spans, and the context read back.
It prints medians and the ratio to `off`, and writes
benchmarks/results/tracing_cost.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from benchmarks.common import scratch_database
from benchmarks.otel_modes import MODES, provider
from benchmarks.peers import _support
from pgqueue import Client

QUEUE = "bench"
OUT = Path(__file__).parent / "results" / "tracing_cost.md"


def sends(dsn: str, mode: str, n: int) -> float:
    """Messages/s for n single sends on one connection, traced as `mode` says."""
    with Client.from_dsn(dsn, max_size=1, tracer_provider=provider(mode)) as client:
        client.metrics(QUEUE)
        began = time.perf_counter()
        for i in range(n):
            client.send(QUEUE, {"n": i, "pad": "x" * 200})
        return n / (time.perf_counter() - began)


def drain(dsn: str, mode: str, n: int) -> float:
    """Messages/s for one worker process emptying n messages (sent traced as `mode` says)."""
    with Client.from_dsn(dsn, max_size=1, tracer_provider=provider(mode)) as client:
        for start in range(0, n, 500):
            client.send_batch(QUEUE, [{"sleep_ms": 1} for _ in range(min(500, n - start))])
    os.environ["PGQUEUE_BENCH_OTEL"] = mode
    try:
        seconds = _support.time_drain(
            dsn,
            "benchmarks.tracing_worker",
            [dsn],
            1,
            "SELECT NOT EXISTS (SELECT 1 FROM pgqueue.message)",
        )
    finally:
        os.environ.pop("PGQUEUE_BENCH_OTEL", None)
    return n / seconds


def main() -> None:
    """Measure every mode `runs` times, interleaved; print and write the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--sends", type=int, default=3_000)
    args = ap.parse_args()
    figures: dict[tuple[str, str], list[float]] = {}
    for run in range(args.runs):
        for mode in MODES:
            with scratch_database(args.dsn, "bench_tracing") as db:
                with Client.from_dsn(db) as c:
                    c.create_queue(QUEUE)
                s = sends(db, mode, args.sends)
                d = drain(db, mode, args.messages)
            figures.setdefault(("send", mode), []).append(s)
            figures.setdefault(("drain", mode), []).append(d)
            print(f"run {run + 1} {mode}: send {s:,.0f}/s, drain {d:,.0f}/s", flush=True)
    lines = [
        "# What tracing costs (medians, messages/s)",
        "",
        f"Command: `python -m benchmarks.tracing_cost --runs {args.runs}"
        f" --messages {args.messages} --sends {args.sends}`; modes interleaved per run,"
        " a fresh database each, never analyzed by hand.",
        "",
        "| measure | " + " | ".join(MODES) + " | sdk-drop / off | sampled-off / off |",
        "|---|" + "---:|" * (len(MODES) + 2),
    ]
    for what, label in (
        ("send", f"single sends, 1 connection ({args.sends:,})"),
        ("drain", f"drain, 1 worker, 4 threads, 1 ms handler ({args.messages:,})"),
    ):
        med = {m: statistics.median(figures[(what, m)]) for m in MODES}
        lines.append(
            f"| {label} | "
            + " | ".join(f"{med[m]:,.0f}" for m in MODES)
            + f" | {med['sdk-drop'] / med['off']:.2f}x | {med['sampled-off'] / med['off']:.2f}x |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    OUT.write_text(text)


if __name__ == "__main__":
    main()
