"""pgqueue against its peers and the machine's limit, side by side in one run.

    python -m benchmarks --dsn postgresql://postgres@127.0.0.1/test --runs 3
    python -m benchmarks --smoke          # seconds; what CI runs

Every system gets a database of its own on the same server; each measurement
is taken for every system in turn (A B C D A B C D ...) so drift on a noisy
machine hits all alike; tables show medians, min-max and ratios. See
benchmarks/README.md for what each column means.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import psycopg

from benchmarks import ceiling, growth
from benchmarks.common import DEFAULT_DSN, RESULTS, scratch_database

SYSTEMS = [
    "benchmarks.systems.pgqueue_sys",
    "benchmarks.systems.pgmq_sys",
    "benchmarks.peers.pgqueuer_peer",
    "benchmarks.peers.procrastinate_peer",
]
GROUPS = ("sql", "enqueue", "e2e", "latency", "barrier", "growth", "mvcc", "pgmq")


@dataclass
class Results:
    """Samples by (table, row, system), and the order rows and systems appeared in."""

    samples: dict[tuple[str, str, str], list[float]] = field(default_factory=dict)
    rows: dict[str, list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def add(self, table: str, row: str, system: str, value: float) -> None:
        """Record one measurement."""
        self.samples.setdefault((table, row, system), []).append(value)
        if row not in self.rows.setdefault(table, []):
            self.rows[table].append(row)

    def get(self, table: str, row: str, system: str) -> list[float]:
        """The samples of one cell (empty if not measured)."""
        return self.samples.get((table, row, system), [])


def load_systems(names: list[str], notes: list[str]) -> list[ModuleType]:
    """The adapters that import; a note for each that does not (peer not installed)."""
    out = []
    for name in names:
        try:
            out.append(importlib.import_module(name))
        except ImportError as exc:
            notes.append(f"{name.rsplit('.', 1)[-1]} skipped: {exc} (pip install -e '.[bench]')")
    return out


def cell(xs: list[float], digits: int = 0) -> str:
    """median (min-max), or a dash."""
    if not xs:
        return "-"
    fmt = f"{{:,.{digits}f}}"
    med = fmt.format(statistics.median(xs))
    if len(xs) == 1:
        return med
    return f"{med} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def ratio(a: list[float], b: list[float], lower_is_better: bool = False) -> str:
    """pgqueue's median over the peer's, as 1.23x (above 1: pgqueue is better)."""
    if not a or not b or min(statistics.median(a), statistics.median(b)) <= 0:
        return "-"
    r = statistics.median(b) / statistics.median(a) if lower_is_better else None
    r = r if r is not None else statistics.median(a) / statistics.median(b)
    return f"{r:.2f}x"


def system_table(
    res: Results, table: str, systems: list[str], unit: str, lower_is_better: bool = False
) -> list[str]:
    """A markdown table: one row per scenario, a column per system, ratios to pgqueue."""
    peers = [s for s in systems if s != "pgqueue"]
    head = ["scenario", *[f"{s} {unit}" for s in systems], *[f"pgqueue/{p}" for p in peers]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in res.rows.get(table, []):
        own = res.get(table, row, "pgqueue")
        cells = [cell(res.get(table, row, s), 1 if lower_is_better else 0) for s in systems]
        ratios = [ratio(own, res.get(table, row, p), lower_is_better) for p in peers]
        lines.append("| " + " | ".join([row, *cells, *ratios]) + " |")
    return lines


def environment(dsn: str) -> str:
    """Postgres version and the settings that shape these figures, CPUs, platform."""
    with psycopg.connect(dsn) as conn:
        settings = {
            name: conn.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
            for name in (
                "server_version",
                "shared_buffers",
                "synchronous_commit",
                "wal_level",
                "max_connections",
                "autovacuum",
            )
        }
    pairs = ", ".join(f"{k}={v}" for k, v in settings.items())
    return f"PostgreSQL {pairs}; {os.cpu_count()} CPUs; {platform.platform()}"


def measure(
    res: Results,
    table: str,
    row: str,
    systems: list[ModuleType],
    dbs: dict[str, str],
    runs: int,
    fn: Callable[[ModuleType, str], float],
) -> None:
    """Take `runs` interleaved samples of fn for every system (reset before each)."""
    for _ in range(runs):
        for mod in systems:
            mod.reset(dbs[mod.NAME])
            try:
                value = fn(mod, dbs[mod.NAME])
            except Exception as exc:  # a peer failing must not hide the others' figures
                res.notes.append(f"{mod.NAME}, {table} / {row}: failed: {exc!r}"[:300])
                continue
            res.add(table, row, mod.NAME, value)
            print(f"  {table} | {row} | {mod.NAME}: {value:,.1f}", file=sys.stderr, flush=True)


def main() -> None:
    """Run the selected groups and write benchmarks/results/suite.md (or --out)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dsn", default=DEFAULT_DSN)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply message counts")
    ap.add_argument("--only", default=",".join(GROUPS), help=f"comma list of {GROUPS}")
    ap.add_argument("--smoke", action="store_true", help="tiny and quick, for CI")
    ap.add_argument(
        "--skip",
        default="",
        help="comma list of peers to leave out (PGMQ, PgQueuer, Procrastinate), e.g. for"
        " full-size end-to-end runs where the slowest peer would take most of the time",
    )
    ap.add_argument("--out", default=None, help="results file [benchmarks/results/suite.md]")
    ap.add_argument(
        "--private",
        action="store_true",
        help="run on a fresh cluster with Postgres' stock settings (initdb), not on --dsn",
    )
    args = ap.parse_args()
    if args.private:
        from benchmarks.server import private_server

        with private_server() as dsn:
            args.dsn = dsn
            run_suite(args, ap)
    else:
        run_suite(args, ap)


def run_suite(args: argparse.Namespace, ap: argparse.ArgumentParser) -> None:
    """Run the selected groups against args.dsn and print/write the tables."""
    groups = [g.strip() for g in args.only.split(",") if g.strip()]
    unknown = set(groups) - set(GROUPS)
    if unknown:
        ap.error(f"unknown groups {sorted(unknown)}; choose from {GROUPS}")
    scale = 0.02 if args.smoke else args.scale
    runs = 1 if args.smoke else args.runs

    def n(count: int) -> int:
        return max(100, int(count * scale))

    res = Results()
    began = time.monotonic()
    out: list[str] = [
        "# pgqueue benchmark suite",
        "",
        environment(args.dsn),
        f"Runs: {runs} interleaved per cell; scale {scale}; command: python -m benchmarks "
        + " ".join(sys.argv[1:]),
        "",
    ]
    needs_systems = {"enqueue", "e2e", "latency"} & set(groups)
    systems = load_systems(SYSTEMS, res.notes) if needs_systems else []
    skipped = {x.strip().lower() for x in args.skip.split(",") if x.strip()}
    systems = [m for m in systems if m.NAME.lower() not in skipped or m.NAME == "pgqueue"]
    names = [m.NAME for m in systems]
    stack = [scratch_database(args.dsn, f"bench_{m.NAME.lower()}", migrate=False) for m in systems]
    dbs = {m.NAME: cm.__enter__() for m, cm in zip(systems, stack, strict=True)}
    try:
        for m in systems:
            m.install(dbs[m.NAME])
        if "sql" in groups:
            out += ceiling.run(args.dsn, runs, scale, res.notes)
        if "enqueue" in groups:
            print("enqueue", file=sys.stderr)
            t = "enqueue"
            cases: list[tuple[str, Callable[[ModuleType, str], float]]] = [
                ("single send, 1 conn", lambda m, d: m.enqueue_single(d, n(3000), 1)),
                ("single send, 4 conns", lambda m, d: m.enqueue_single(d, n(6000), 4)),
                ("batches of 100, 1 conn", lambda m, d: m.enqueue_batch(d, n(100_000), 100)),
            ]
            for row, fn in cases:
                measure(res, t, row, systems, dbs, runs, fn)
            out += ["## 1. Enqueue (messages/s, through each library's Python API)", ""]
            out += [*system_table(res, t, names, "msg/s"), ""]
        if "e2e" in groups:
            print("end to end", file=sys.stderr)
            size = n(50_000)
            for procs in (1, 4):
                row = f"{size:,} no-op messages, {procs} worker process(es)"
                measure(
                    res, "e2e", row, systems, dbs, runs, lambda m, d, p=procs: m.drain(d, size, p)
                )
            # pgqueue's batch handler beside PGMQ's loop, which is a batch loop
            # too (read 100, delete 100); the other peers have no equivalent
            batchers = [m for m in systems if hasattr(m, "drain_batch") or m.NAME == "PGMQ"]
            for procs in (1, 4):
                row = f"{size:,} no-op messages, {procs} worker process(es), batch handler"
                measure(
                    res,
                    "e2e",
                    row,
                    batchers,
                    dbs,
                    runs,
                    lambda m, d, p=procs: getattr(m, "drain_batch", m.drain)(d, size, p),
                )
            out += ["## 2. End to end: full queue to empty (messages/s)", ""]
            out += [*system_table(res, "e2e", names, "msg/s"), ""]
            out += [
                "Batch handler rows: pgqueue with `@app.handler(..., batch=True)` (one call per"
                " read of 100); PGMQ's consumer loop is the same in both kinds of rows; PgQueuer"
                " and Procrastinate have no batch handler here (`-`).",
                "",
            ]
        if "latency" in groups:
            print("latency", file=sys.stderr)
            samples = 5 if args.smoke else 30
            for listen in (True, False):
                label = "LISTEN/NOTIFY" if listen else "polling"
                for m in systems:
                    m.reset(dbs[m.NAME])
                    try:
                        xs = m.latency(dbs[m.NAME], samples, listen)
                    except Exception as exc:
                        res.notes.append(f"{m.NAME}, latency {label}: failed: {exc!r}"[:300])
                        continue
                    if xs:
                        s = sorted(xs)
                        res.add("latency", f"p50, {label}", m.NAME, s[len(s) // 2])
                        res.add("latency", f"p99, {label}", m.NAME, s[int(0.99 * (len(s) - 1))])
                    else:
                        res.notes.append(f"{m.NAME}: no {label} mode (see its adapter)")
            out += ["## 3. Latency: send -> handler start, idle consumer (ms; lower is better)"]
            out += ["", *system_table(res, "latency", names, "ms", lower_is_better=True), ""]
    finally:
        for cm in stack:
            cm.__exit__(None, None, None)
    if "barrier" in groups:
        out += barrier_section(args.dsn, runs, 200 if args.smoke else 10_000)
    if "growth" in groups:
        out += growth.run(args.dsn, scale, args.smoke)
    if "mvcc" in groups:
        out += mvcc_section(args.dsn, args.smoke)
    if "pgmq" in groups:  # section 7: PGMQ's client on pgqueue's facade beside real PGMQ
        from benchmarks.pgmq_facade import suite_section

        out += suite_section(args.dsn, runs, args.smoke)
    if res.notes:
        out += ["## Notes", ""] + [f"- {note}" for note in res.notes] + [""]
    out.append(f"Took {time.monotonic() - began:,.0f} s.")
    text = "\n".join(out)
    print(text)
    path = args.out or (None if args.smoke else str(RESULTS / "suite.md"))
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")


def barrier_section(dsn: str, runs: int, members: int) -> list[str]:
    """Scenario 4: a fan-out completed by 4 consumer processes; pgqueue only."""
    from benchmarks.barrier_fanin import run_once
    from benchmarks.common import scratch_database

    rates, lags = [], []
    with scratch_database(dsn, "bench_barrier") as target:
        for _ in range(runs):
            rate, lag = run_once(target, members, 4, 100)
            rates.append(rate)
            lags.append(lag)
    return [
        f"## 4. Barrier fan-in: {members:,} members, 4 consumer processes, batches of 100",
        "",
        "| measure | pgqueue | PGMQ, PgQueuer, Procrastinate |",
        "|---|---|---|",
        f"| member completions/s | {cell(rates)} | no equivalent |",
        f"| last completion -> callback delivered (ms) | {cell(lags, 1)} | no equivalent |",
        "",
    ]


def mvcc_section(dsn: str, smoke: bool) -> list[str]:
    """Scenario 6, from benchmarks/mvcc_pressure.py when it is present."""
    try:
        mod: Any = importlib.import_module("benchmarks.mvcc_pressure")
    except ImportError:
        return ["## 6. MVCC pressure", "", "not measured in this run", ""]
    lines: list[str] = mod.suite_section(dsn, smoke)
    return lines


if __name__ == "__main__":
    main()
