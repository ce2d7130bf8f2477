"""Realistic load, as a newcomer meets it: a fresh database, handlers that work, a steady producer.

    python -m benchmarks.realistic --private [--runs 3] [--warmup 20] [--measure 120]

For each system (pgqueue, PGMQ, PgQueuer, Procrastinate), in turn, for each
shape (one process at W = 4, 16, 64, 256 handlers; four processes at W = 16):
a new database on a fresh stock cluster (--private: initdb defaults,
autovacuum on), the system's schema installed and nothing ANALYZEd or
VACUUMed by the benchmark; a producer keeps about DEPTH messages of 256 bytes
visible; each handler sleeps 1 ms. After the warm-up, the measured time is cut
in windows: the median completion rate of the windows, the claim latency
(from the send to the handler's start) at p50 and p99, and the median depth.
The consumers run each system the way its docs run one (see
benchmarks/realistic_consumer.py).

Two more sections, each its own invocation:

    python -m benchmarks.realistic --private --paced 1000 --shapes 16x1
    python -m benchmarks.realistic --private --analyze-at 30 --shapes 16x1

--paced R: the producer sends R msg/s (a slice every 10 ms) instead of holding
a depth, so the claim latency is the system's own, not the wait behind a
backlog (holding 4,000 visible makes any FIFO queue's claim latency about
4,000 / rate: Little's law). --analyze-at T: no warm-up; the database is
ANALYZEd T seconds in; the table compares the median window of the first T
seconds of a fresh database with that of the T seconds from 5 s after it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

import psycopg

from benchmarks.common import RESULTS, scratch_database

REPO = Path(__file__).resolve().parents[1]
QUEUE = "realistic"
DEPTH = 4000
PAD = "x" * 220  # a 256-byte payload with the send time
SYSTEMS = ("pgqueue", "pgmq", "pgmq-batch", "pgqueuer", "procrastinate")
PGMQ = ("pgmq", "pgmq-batch")  # one reader per handler; one batching reader
SHAPES = ((4, 1), (16, 1), (64, 1), (256, 1), (16, 4))  # (W, processes)


def payloads(n: int) -> list[dict[str, Any]]:
    now = time.time()
    return [{"sent": now, "pad": PAD} for _ in range(n)]


# -- each system's schema and producer -----------------------------------------


def install(system: str, dsn: str) -> None:
    """The system's schema and queue, nothing more (no ANALYZE, no VACUUM)."""
    if system == "pgqueue":
        from pgqueue import Client

        with Client.from_dsn(dsn, max_size=1) as c:
            c.migrate()
            c.create_queue(QUEUE)
    elif system.startswith("pgmq"):
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(files("pgmq").joinpath("sql", "pgmq.sql").read_text())
            conn.execute("SELECT pgmq.create(%s)", (QUEUE,))
    elif system == "pgqueuer":
        from benchmarks.peers import pgqueuer_peer

        pgqueuer_peer.install(dsn)
    else:
        from benchmarks.peers import procrastinate_peer

        procrastinate_peer.install(dsn)


def sender(system: str, dsn: str) -> tuple[Callable[[int], None], Callable[[], None]]:
    """send(n) for the system's batch API, and close()."""
    if system == "pgqueue":
        from pgqueue import Client

        client = Client.from_dsn(dsn, max_size=1)
        return (lambda n: client.send_batch(QUEUE, payloads(n))), client.close
    if system.startswith("pgmq"):
        conn = psycopg.connect(dsn, autocommit=True)

        def send_pgmq(n: int) -> None:
            conn.execute(
                "SELECT count(*) FROM pgmq.send_batch(%s, %s::jsonb[])",
                (QUEUE, [json.dumps(p) for p in payloads(n)]),
            )

        return send_pgmq, conn.close
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    def call(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    if system == "pgqueuer":
        from pgqueuer.queries import Queries

        from benchmarks.peers.pgqueuer_peer import driver

        holder = driver(dsn)
        queries = Queries(call(holder.__aenter__()))

        def send_pgqueuer(n: int) -> None:
            blobs = [json.dumps(p).encode() for p in payloads(n)]
            call(queries.enqueue([QUEUE] * n, blobs, [0] * n))

        return send_pgqueuer, lambda: call(holder.__aexit__(None, None, None))
    from procrastinate import App, PsycopgConnector

    app = App(connector=PsycopgConnector(conninfo=dsn, min_size=1, max_size=2))

    @app.task(name=QUEUE, queue=QUEUE)
    async def work(sent: float, pad: str = "") -> None:
        return None

    call(app.open_async().__aenter__())

    def send_procrastinate(n: int) -> None:
        call(work.batch_defer_async(*payloads(n)))

    return send_procrastinate, lambda: call(app.connector.close_async())


# -- one cell ----------------------------------------------------------------------


@dataclass
class Cell:
    system: str
    w: int
    processes: int
    rates: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    depths: list[float] = field(default_factory=list)
    error: str = ""
    before_analyze: float = 0.0  # --analyze-at: median window before, and after
    after_analyze: float = 0.0

    @property
    def rate(self) -> float:
        return statistics.median(self.rates) if self.rates else 0.0

    def latency(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000


class Tally:
    """Handler calls finished so far, counted from the consumers' files as they grow."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths
        self.offsets = {p: 0 for p in paths}
        self.count = 0

    def update(self) -> int:
        for p in self.paths:
            try:
                with p.open("rb") as f:
                    f.seek(self.offsets[p])
                    chunk = f.read()
            except FileNotFoundError:
                continue
            # whole lines only: the writer appends them whole, and flushes often
            complete = chunk[: chunk.rfind(b"\n") + 1]
            self.offsets[p] += len(complete)
            self.count += complete.count(b"\n")
        return self.count


def run_cell(system: str, server: str, w: int, processes: int, args: argparse.Namespace) -> Cell:
    cell = Cell(system, w, processes)
    with (
        scratch_database(server, f"real_{system.replace('-', '_')}", migrate=False) as dsn,
        tempfile.TemporaryDirectory() as tmp,
    ):
        install(system, dsn)
        outs = [Path(tmp) / f"c{i}.txt" for i in range(processes)]
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.realistic_consumer",
                    system,
                    dsn,
                    str(w),
                    str(out),
                ],
                cwd=REPO,
                stdout=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                text=True,
                env=dict(os.environ, PYTHONPATH=str(REPO)),
            )
            for out in outs
        ]
        send, close = sender(system, dsn)
        try:
            for p in procs:
                assert p.stdout is not None
                for line in p.stdout:
                    if line.strip() == "ready":
                        break
                threading.Thread(target=p.stdout.read, daemon=True).start()
            tally = Tally(outs)
            sent = 0
            began = time.time()
            measure_from = began + args.warmup
            end = measure_from + args.measure
            next_sample = measure_from
            analyze_at = began + args.analyze_at if args.analyze_at else None
            while time.time() < end:
                now = time.time()
                done = tally.update()
                depth = sent - done
                if now >= next_sample:
                    cell.depths.append(depth)
                    next_sample += 1.0
                if analyze_at is not None and now >= analyze_at:
                    analyze_at = None
                    with psycopg.connect(dsn, autocommit=True) as conn:
                        conn.execute("ANALYZE")
                if args.paced:
                    due = int((now - began) * args.paced) - sent
                    if due > 0:
                        send(due)
                        sent += due
                    time.sleep(0.01)
                elif depth < DEPTH:
                    n = min(500, DEPTH - depth)
                    send(n)
                    sent += n
                else:
                    time.sleep(0.005)
        except Exception as exc:  # a peer that breaks under the load is reported, not fatal
            cell.error = f"{type(exc).__name__}: {exc}"[:200]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            close()
        ends: list[float] = []
        for out in outs:
            if not out.exists():
                continue
            for line in out.read_text().splitlines():
                s, st, e = (float(x) for x in line.split())
                if measure_from <= st < end:
                    cell.latencies.append(st - s)
                if measure_from <= e < end:
                    ends.append(e)
        windows = [0] * int(args.measure // args.window)
        for e in ends:
            k = int((e - measure_from) // args.window)
            if 0 <= k < len(windows):
                windows[k] += 1
        cell.rates = [n / args.window for n in windows]
        if args.analyze_at:
            per = int(args.analyze_at // args.window)
            skip = int(5 // args.window)
            before, after = windows[:per], windows[per + skip : 2 * per + skip]
            cell.before_analyze = statistics.median(before) / args.window if before else 0.0
            cell.after_analyze = statistics.median(after) / args.window if after else 0.0
    return cell


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--private", action="store_true", help="a fresh stock cluster (initdb)")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--warmup", type=float, default=20)
    ap.add_argument("--measure", type=float, default=120)
    ap.add_argument("--window", type=float, default=5)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--shapes", default=",".join(f"{w}x{p}" for w, p in SHAPES))
    ap.add_argument("--out", default="realistic")
    ap.add_argument("--paced", type=float, default=0, help="send R msg/s instead of a depth")
    ap.add_argument(
        "--analyze-at", type=float, default=0, help="ANALYZE T s in; compare before and after"
    )
    args = ap.parse_args()
    if args.analyze_at:
        args.warmup, args.measure = 0, 2 * args.analyze_at + 5
    systems = args.systems.split(",")
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    results: dict[tuple[str, int, int], list[Cell]] = {}

    def go(server: str) -> None:
        for run in range(args.runs):
            for w, procs in shapes:
                for system in systems:  # in turn: drift hits every system alike
                    cell = run_cell(system, server, w, procs, args)
                    results.setdefault((system, w, procs), []).append(cell)
                    print(
                        f"run {run + 1} W={w} x{procs} {system}: {cell.rate:,.0f}/s"
                        f" p50 {cell.latency(0.5):.0f} ms p99 {cell.latency(0.99):.0f} ms"
                        f" {cell.error}",
                        file=sys.stderr,
                        flush=True,
                    )

    if args.private:
        from benchmarks.server import private_server

        with private_server() as server:
            go(server)
    else:
        go(args.dsn)
    if args.analyze_at:
        report_analyze(args, shapes, systems, results)
        return
    load = f"--paced {args.paced:g}" if args.paced else f"a depth of {DEPTH:,}"
    lines = [
        f"`python -m benchmarks.realistic {'--private ' if args.private else ''}--runs {args.runs}"
        f" --warmup {args.warmup:g} --measure {args.measure:g}"
        f"{f' --paced {args.paced:g}' if args.paced else ''}`: {load}; medians over runs of"
        f" each cell's median {args.window:g} s window; claim latency is send to handler start.",
        "",
        "| W x processes | system | completions/s | vs best PGMQ | claim p50 ms | claim p99 ms"
        " | depth | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for w, procs in shapes:
        # against the faster of PGMQ's two consumers at this shape
        base_rate = max(
            (
                statistics.median(c.rate for c in results[(p, w, procs)])
                for p in PGMQ
                if (p, w, procs) in results
            ),
            default=0.0,
        )
        for system in systems:
            cells = results[(system, w, procs)]
            rate = statistics.median(c.rate for c in cells)
            p50 = statistics.median(c.latency(0.5) for c in cells)
            p99 = statistics.median(c.latency(0.99) for c in cells)
            depth = statistics.median(statistics.median(c.depths) if c.depths else 0 for c in cells)
            errors = "; ".join(c.error for c in cells if c.error) or ""
            ratio = f"{rate / base_rate:.2f}x" if base_rate else "-"
            lines.append(
                f"| {w} x {procs} | {system} | {rate:,.0f} | {ratio} | {p50:,.0f} | {p99:,.0f}"
                f" | {depth:,.0f} | {errors} |"
            )
    text = "\n".join(lines) + "\n"
    (RESULTS / f"{args.out}.md").write_text(text)
    print(text)


def report_analyze(
    args: argparse.Namespace,
    shapes: list[tuple[int, ...]],
    systems: list[str],
    results: dict[tuple[str, int, int], list[Cell]],
) -> None:
    """The first T seconds of a fresh database against the T seconds after an ANALYZE."""
    t = args.analyze_at
    lines = [
        f"`python -m benchmarks.realistic {'--private ' if args.private else ''}--runs {args.runs}"
        f" --analyze-at {t:g}`: a depth of {DEPTH:,}, no warm-up; the median {args.window:g} s"
        f" window of the first {t:g} s of a fresh database, and of {t:g} s from 5 s after"
        " an ANALYZE; medians over runs.",
        "",
        f"| W x processes | system | first {t:g} s, msg/s | after ANALYZE, msg/s | first / after |",
        "|---|---|---|---|---|",
    ]
    for w, procs in shapes:
        for system in systems:
            cells = results[(system, w, procs)]
            first = statistics.median(c.before_analyze for c in cells)
            after = statistics.median(c.after_analyze for c in cells)
            ratio = f"{first / after:.2f}" if after else "-"
            lines.append(f"| {w} x {procs} | {system} | {first:,.0f} | {after:,.0f} | {ratio} |")
    text = "\n".join(lines) + "\n"
    (RESULTS / f"{args.out}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
