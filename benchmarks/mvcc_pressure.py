"""Consumers under MVCC pressure: the claim path with an old snapshot held open.

Each design gets a scratch database on the same server:
  pgqueue   every migration (0005: read lanes, floors and the late sweep)
  before    pgqueue's migrations up to 0004 (the claim walked message_claim_idx
            from its start): the design before read lanes, for before/after
  pgmq      PGMQ's own pgmq.sql from the `pgmq` PyPI package
For each design and each consumer count, one after the other on the same server:

  clean       consumers only, --clean seconds
  (a) held    plus one session idle in a REPEATABLE READ transaction that has
              read from the queue tables, held --hold seconds
  recovery    the holder commits; --recovery seconds
  (b) readers plus four REPEATABLE READ sessions that each count the queue
              and archive tables over and over in one transaction of
              --reader-txn seconds, staggered so that a snapshot that old
              always exists; --hold seconds
  (c)         with --rc-control: the same readers in READ COMMITTED, so the
              same scanning load without old snapshots; --hold seconds

A consumer is a process looping one statement, read 100 (vt 30) then delete
them by id array. Completions are counted in 5-second windows; per phase we
report the median window, its % of the clean median, the lowest window, dead
tuples of the queue table (pg_stat_user_tables, at the end of the phase) and
the autovacuum runs on it during the phase. The queue is topped up before
each phase (not timed) so it never runs dry.

    python -m benchmarks.mvcc_pressure --dsn postgresql://postgres@127.0.0.1/test --hold 180

--throughput instead compares the clean rates of pgqueue before and after claim
lanes with pgbench (send on 1 and 4 connections, read+delete batch 100 on 1
and 4), interleaved runs, as benchmarks.sql_calls does.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import statistics
import threading
import time
import uuid
from dataclasses import dataclass, field
from importlib.resources import files
from typing import Any

import psycopg

from benchmarks.common import RESULTS, with_db
from pgqueue._migrate import available

QUEUE = "bench"
WINDOW = 5.0


@dataclass(frozen=True)
class Design:
    """One claim design under test: how to install it, fill it, consume and scan it."""

    key: str
    label: str
    upto: int | None = None  # pgqueue: highest migration applied (None: all)
    pgmq: bool = False

    @property
    def table(self) -> str:
        return f"pgmq.q_{QUEUE}" if self.pgmq else "pgqueue.message"

    @property
    def archive(self) -> str:
        return f"pgmq.a_{QUEUE}" if self.pgmq else "pgqueue.archive"

    @property
    def read_delete(self) -> str:
        schema = "pgmq" if self.pgmq else "pgqueue"
        return (
            f"SELECT count(*) FROM {schema}.delete('{QUEUE}',"
            f" ARRAY(SELECT msg_id FROM {schema}.read('{QUEUE}', 30, 100)))"
        )


DESIGNS = {
    d.key: d
    for d in (
        Design("pgqueue", "pgqueue"),
        Design("before", "pgqueue 0001-0004 (before lanes)", upto=4),
        Design("pgmq", "PGMQ", pgmq=True),
    )
}


def connect(dsn: str, autocommit: bool = True) -> psycopg.Connection[Any]:
    """A connection, waiting out a server that is full (the machine is shared)."""
    for _ in range(120):
        try:
            return psycopg.connect(dsn, autocommit=autocommit)
        except psycopg.OperationalError as exc:
            if "too many clients" not in str(exc):
                raise
            time.sleep(1)
    return psycopg.connect(dsn, autocommit=autocommit)


def install(dsn: str, design: Design) -> str:
    """A scratch database with the design installed and the bench queue; its DSN."""
    db = f"mvcc_{design.key}_{uuid.uuid4().hex[:6]}"
    with connect(dsn) as admin:
        admin.execute(f"CREATE DATABASE {db}")
    target = with_db(dsn, db)
    with connect(target) as conn:
        if design.pgmq:
            conn.execute(files("pgmq").joinpath("sql", "pgmq.sql").read_text())
            conn.execute("SELECT pgmq.create(%s)", (QUEUE,))
            return target
        conn.execute("CREATE SCHEMA pgqueue")
        conn.execute(
            "CREATE TABLE pgqueue.schema_version (version integer PRIMARY KEY, name text NOT NULL,"
            " checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for m in available():
            if design.upto is not None and m.version > design.upto:
                break
            with conn.transaction():
                conn.execute(m.sql.encode())
                conn.execute(
                    "INSERT INTO pgqueue.schema_version (version, name, checksum)"
                    " VALUES (%s, %s, %s)",
                    (m.version, m.name, m.checksum),
                )
        conn.execute("SELECT pgqueue.create_queue(%s, 5)", (QUEUE,))
    return target


def drop(dsn: str, target: str) -> None:
    db = psycopg.conninfo.conninfo_to_dict(target)["dbname"]
    with connect(dsn) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


def top_up(target: str, design: Design, want: int) -> None:
    """Bring the queue to at least `want` fresh messages, each like a send (vt = enqueued_at)."""
    if design.pgmq:
        fill = (
            f"INSERT INTO {design.table} (enqueued_at, vt, message)"
            " SELECT c.t, c.t, '{\"n\": 1}'"
            "   FROM (SELECT clock_timestamp() AS t FROM generate_series(1, %s)) c"
        )
    else:
        fill = (
            "INSERT INTO pgqueue.message (queue_id, msg_id, enqueued_at, vt, message)"
            " SELECT q.queue_id, nextval(q.msg_seq), c.t, c.t, '{\"n\": 1}'"
            "   FROM pgqueue.queue q,"
            "        LATERAL (SELECT clock_timestamp() AS t FROM generate_series(1, %s)) c"
            f"  WHERE q.queue_name = '{QUEUE}'"
        )
    with connect(target) as conn:
        have = conn.execute(f"SELECT count(*) FROM {design.table}").fetchone()[0]  # type: ignore[index]
        missing = want - have
        while missing > 0:
            n = min(missing, 200_000)
            conn.execute(fill, (n,))
            missing -= n
        if have == 0:
            conn.execute(f"VACUUM ANALYZE {design.table}")
        conn.execute("CHECKPOINT")


def consumer(target: str, statement: str, counter: Any, stop: Any, paused: Any) -> None:
    with connect(target) as conn:
        cur = conn.cursor()
        cur.execute("SET application_name = 'mvcc_consumer'")
        while not stop.is_set():
            if paused.is_set():  # a top-up is running: it is not timed
                time.sleep(0.05)
                continue
            cur.execute(statement)
            counter.value += cur.fetchone()[0]  # type: ignore[index]


def holder(conn: psycopg.Connection[Any], design: Design, stop: threading.Event) -> None:
    """(a): one session idle in a REPEATABLE READ transaction that has read the queue."""
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    conn.execute(f"SELECT msg_id FROM {design.table} LIMIT 1").fetchall()
    stop.wait()
    conn.execute("COMMIT")


def reader(
    conn: psycopg.Connection[Any],
    design: Design,
    stop: threading.Event,
    delay: float,
    txn_seconds: float,
    pause: float,
    spent: list[float],
    isolation: str = "REPEATABLE READ",
) -> None:
    """(b): one of four REPEATABLE READ sessions counting the queue tables over and over.

    With READ COMMITTED (the control phase) each count has a snapshot of its
    own: the same scanning work, no old snapshot.
    """
    if stop.wait(delay):
        return
    while not stop.is_set():
        conn.execute(f"BEGIN ISOLATION LEVEL {isolation}")
        began = time.monotonic()
        while not stop.is_set() and time.monotonic() - began < txn_seconds:
            t0 = time.monotonic()
            conn.execute(f"SELECT count(*) FROM {design.table}").fetchone()
            conn.execute(f"SELECT count(*) FROM {design.archive}").fetchone()
            spent.append(time.monotonic() - t0)
            stop.wait(pause)
        conn.execute("COMMIT")


def table_stats(conn: psycopg.Connection[Any], table: str) -> tuple[int, int, int]:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT n_dead_tup, n_live_tup, autovacuum_count FROM pg_stat_user_tables"
        " WHERE relid = %s::regclass",
        (table,),
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


@dataclass
class Phase:
    name: str
    windows: list[float] = field(default_factory=list)
    dead_end: int = 0
    dead_max: int = 0
    autovacuums: int = 0
    live_end: int = 0
    note: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.windows) if self.windows else 0.0


class Run:
    """N consumer processes on one design's database, counted in windows."""

    def __init__(self, target: str, design: Design, consumers: int) -> None:
        self.target = target
        self.table = design.table
        ctx = mp.get_context("spawn")
        self.stop = ctx.Event()
        self.paused = ctx.Event()
        self.counters = [ctx.Value("q", 0, lock=False) for _ in range(consumers)]
        self.procs = [
            ctx.Process(
                target=consumer,
                args=(target, design.read_delete, c, self.stop, self.paused),
                daemon=True,
            )
            for c in self.counters
        ]

    def start(self) -> None:
        self.monitor = connect(self.target)
        for p in self.procs:
            p.start()

    def top_up(self, design: Design, want: int) -> None:
        """Fill the queue with the consumers paused (the filling is not timed)."""
        self.paused.set()
        try:
            top_up(self.target, design, want)
        finally:
            self.paused.clear()

    def total(self) -> int:
        return sum(c.value for c in self.counters)

    def measure(self, name: str, seconds: float) -> Phase:
        phase = Phase(name)
        _, _, av0 = table_stats(self.monitor, self.table)
        last, t_last = self.total(), time.monotonic()
        end = t_last + seconds
        while time.monotonic() < end - 0.01:
            time.sleep(max(0.0, min(WINDOW, end - time.monotonic())))
            now, t = self.total(), time.monotonic()
            phase.windows.append((now - last) / (t - t_last))
            last, t_last = now, t
            dead, _, _ = table_stats(self.monitor, self.table)
            phase.dead_max = max(phase.dead_max, dead)
            for p in self.procs:
                if not p.is_alive():
                    raise RuntimeError(f"a consumer died (exit code {p.exitcode})")
        phase.dead_end, phase.live_end, av1 = table_stats(self.monitor, self.table)
        phase.autovacuums = av1 - av0
        print(
            f"  {name}: median {phase.median:,.0f}/s min {min(phase.windows):,.0f}/s"
            f" dead {phase.dead_end:,} live {phase.live_end:,} autovacuum {phase.autovacuums}"
            f" windows {[round(w) for w in phase.windows]}",
            flush=True,
        )
        return phase

    def close(self) -> None:
        self.monitor.close()
        self.stop.set()
        for p in self.procs:
            p.join(30)
            if p.is_alive():
                p.terminate()


def pressure(dsn: str, design: Design, consumers: int, args: argparse.Namespace) -> list[Phase]:
    """The phases for one design and consumer count, on a scratch database."""
    print(f"{design.label}, {consumers} consumer(s)", flush=True)
    phases_b = [("(b) 4 overlapping RR readers", "REPEATABLE READ")]
    if args.rc_control:
        phases_b.append(("(c) control: same readers, READ COMMITTED", "READ COMMITTED"))
    target = install(dsn, design)
    # opened up front: a full server later must not silently drop a phase's pressure
    sessions = [connect(target) for _ in range(5)]
    try:
        top_up(target, design, args.preload)  # the warm-up's share
        run = Run(target, design, consumers)
        run.start()
        try:
            time.sleep(2)  # connect and warm up
            # enough for the clean phase at the warm-up's rate, with room to rise
            t0, n0 = time.monotonic(), run.total()
            time.sleep(2)
            rate = (run.total() - n0) / (time.monotonic() - t0)
            run.top_up(design, int(rate * 1.5 * args.clean) + args.preload)
            phases = [run.measure("clean", args.clean)]
            # enough not to run dry: pressure lowers rates, recovery may exceed clean
            budget = max(phases[0].median, 1.0) * 1.2

            run.top_up(design, int(budget * (args.hold + args.recovery)) + args.preload)
            stop = threading.Event()
            t = threading.Thread(target=holder, args=(sessions[0], design, stop), daemon=True)
            t.start()
            time.sleep(0.5)
            phases.append(run.measure("(a) idle RR snapshot held", args.hold))
            stop.set()
            t.join()
            phases.append(run.measure("recovery", args.recovery))

            for label, isolation in phases_b:
                run.top_up(design, int(budget * args.hold) + args.preload)
                stop = threading.Event()
                spent: list[float] = []
                readers = [
                    threading.Thread(
                        target=reader,
                        args=(
                            sessions[1 + i],
                            design,
                            stop,
                            i * args.reader_txn / 4,
                            args.reader_txn,
                            args.reader_pause,
                            spent,
                            isolation,
                        ),
                        daemon=True,
                    )
                    for i in range(4)
                ]
                for r in readers:
                    r.start()
                phases.append(run.measure(label, args.hold))
                stop.set()
                for r in readers:
                    r.join()
                phases[-1].note = (
                    f"{len(spent)} scans, median {statistics.median(spent) if spent else 0:.2f} s,"
                    f" readers busy {sum(spent) / args.hold / 4:.0%} of their time"
                )
                print(f"  readers: {phases[-1].note}", flush=True)
        finally:
            run.close()
    finally:
        for c in sessions:
            c.close()
        drop(dsn, target)
    return phases


def pressure_table(args: argparse.Namespace, results: dict[tuple[str, int], list[Phase]]) -> str:
    """The phases of every design as one markdown table, with its command line."""
    lines = [
        f"{server_line(args.dsn)}; `python -m benchmarks.mvcc_pressure --hold {args.hold}"
        f" --clean {args.clean} --recovery {args.recovery}"
        f" --consumers {' '.join(map(str, args.consumers))} --reader-txn {args.reader_txn}"
        f" --reader-pause {args.reader_pause}`",
        "",
        *pressure_rows(results),
    ]
    return "\n".join(lines)


def pressure_rows(results: dict[tuple[str, int], list[Phase]]) -> list[str]:
    """The table of phases, and the readers' notes under it."""
    lines = [
        "Completions/s (read 100 + delete by array, vt 30) in 5 s windows; % is of the same"
        " design's clean median; a min window of 0 is a hang; dead = n_dead_tup of the queue"
        " table at the end of the phase (max seen during it); autovac = autovacuum runs on it"
        " during the phase.",
        "",
        "| design | consumers | phase | median/s | % of clean | min window/s"
        " | dead at end (max) | autovac |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (design, n), phases in results.items():
        clean = phases[0].median
        for p in phases:
            share = f"{100 * p.median / clean:.0f}%" if clean else "n/a (clean ran dry)"
            lines.append(
                f"| {DESIGNS[design].label} | {n} | {p.name} | {p.median:,.0f}"
                f" | {share} |"
                f" {min(p.windows):,.0f} | {p.dead_end:,} ({p.dead_max:,}) | {p.autovacuums} |"
            )
    notes = [
        f"- {DESIGNS[d].label}, {n} consumer(s), {p.name.split()[0]} readers: {p.note}"
        for (d, n), ps in results.items()
        for p in ps
        if p.note
    ]
    return [*lines, "", *notes]


def server_line(dsn: str) -> str:
    with connect(dsn, autocommit=False) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
        sync = conn.execute("SHOW synchronous_commit").fetchone()[0]  # type: ignore[index]
    return (
        f"PostgreSQL {version}, synchronous_commit={sync}, {os.cpu_count()} CPUs,"
        f" {platform.platform()}"
    )


# ---------------------------------------------------------------------------
# clean throughput, pgbench, interleaved


def throughput(args: argparse.Namespace) -> str:
    """pgbench on the SQL calls of section 0 (sql_calls.SCENARIOS), two designs interleaved."""
    from benchmarks.sql_calls import SCENARIOS as scenarios
    from benchmarks.sql_calls import pgbench

    send = f"SELECT pgqueue.send('{QUEUE}', '{{\"n\": 1}}');"
    read_delete = (
        f"SELECT count(*) FROM pgqueue.delete('{QUEUE}',"
        f" ARRAY(SELECT msg_id FROM pgqueue.read('{QUEUE}', 30, :qty)));"
    )
    before = Design("before", f"pgqueue 0001-{args.before:04d}", upto=args.before)
    pair = (before, DESIGNS["pgqueue"])
    targets = {d.key: install(args.dsn, d) for d in pair}
    got: dict[tuple[str, str], list[float]] = {}
    try:
        for sc in scenarios:
            for _ in range(args.runs):
                for design, target in targets.items():  # interleaved
                    with connect(target) as conn:
                        conn.execute("SELECT pgqueue.drop_queue(%s)", (QUEUE,))
                        conn.execute("SELECT pgqueue.create_queue(%s, 5)", (QUEUE,))
                    if sc.kind == "read_delete":
                        top_up(target, DESIGNS["pgqueue"], sc.messages() + 2000)
                    else:
                        with connect(target) as conn:
                            conn.execute("VACUUM ANALYZE pgqueue.message")
                            conn.execute("CHECKPOINT")
                    script = send if sc.kind == "send" else read_delete
                    got.setdefault((sc.label, design), []).append(pgbench(target, script, sc))
    finally:
        for target in targets.values():
            drop(args.dsn, target)
    lines = [
        f"{server_line(args.dsn)}; {args.runs} interleaved runs, messages/s;"
        f" `python -m benchmarks.mvcc_pressure --throughput --before {args.before}"
        f" --runs {args.runs}`",
        "",
        f"| scenario | before (0001-{args.before:04d}) median (min-max)"
        " | now (every migration) median (min-max)"
        " | now/before |",
        "|---|---|---|---|",
    ]
    for sc in scenarios:
        a, b = got[(sc.label, "before")], got[(sc.label, "pgqueue")]
        ma, mb = statistics.median(a), statistics.median(b)
        lines.append(
            f"| {sc.label} | {ma:,.0f} ({min(a):,.0f}-{max(a):,.0f}) |"
            f" {mb:,.0f} ({min(b):,.0f}-{max(b):,.0f}) | {mb / ma:.2f}x |"
        )
    return "\n".join(lines)


def suite_section(dsn: str, smoke: bool) -> list[str]:
    """Scenario 6 of `python -m benchmarks`: every design, 4 consumers, 180 s holds."""
    args = parser().parse_args(["--dsn", dsn])
    args.consumers = [4]
    if smoke:
        args.consumers = [1]
        args.clean = args.hold = args.recovery = args.reader_txn = 2.0
        args.reader_pause = 0.2
        args.preload = 150_000  # the warm-up alone takes tens of thousands
    results = {
        (key, n): pressure(dsn, design, n, args)
        for n in args.consumers
        for key, design in DESIGNS.items()
    }
    return [
        "## 6. MVCC pressure",
        "",
        f"Phases: clean {args.clean:g} s, (a) an idle REPEATABLE READ snapshot held"
        f" {args.hold:g} s, recovery {args.recovery:g} s, (b) four overlapping REPEATABLE READ"
        f" readers ({args.reader_txn:g} s transactions) for {args.hold:g} s;"
        " `python -m benchmarks.mvcc_pressure` runs more (1 and 4 consumers, a READ COMMITTED"
        " control).",
        "",
        *pressure_rows(results),
        "",
    ]


def parser() -> argparse.ArgumentParser:
    """The command line of `python -m benchmarks.mvcc_pressure`."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--dsn", default=os.environ.get("PGQUEUE_DSN", "postgresql://postgres@127.0.0.1/test")
    )
    ap.add_argument("--hold", type=float, default=180, help="seconds of each pressure phase")
    ap.add_argument("--clean", type=float, default=30, help="seconds of the clean phase")
    ap.add_argument("--recovery", type=float, default=60, help="seconds after (a) ends")
    ap.add_argument("--consumers", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--designs", nargs="+", default=list(DESIGNS), choices=list(DESIGNS))
    ap.add_argument(
        "--preload",
        type=int,
        default=1_000_000,
        help="messages kept in the queue beyond what a phase consumes at the clean rate",
    )
    ap.add_argument(
        "--reader-txn", type=float, default=60, help="(b): seconds each RR transaction lasts"
    )
    ap.add_argument(
        "--reader-pause", type=float, default=5.0, help="(b): seconds between two counts"
    )
    ap.add_argument(
        "--rc-control",
        action="store_true",
        help="add a phase with the (b) readers in READ COMMITTED: their load without old snapshots",
    )
    ap.add_argument("--throughput", action="store_true", help="clean pgbench comparison instead")
    ap.add_argument(
        "--private",
        action="store_true",
        help="start a stock Postgres cluster of its own (autovacuum on) instead of --dsn",
    )
    ap.add_argument("--runs", type=int, default=3, help="--throughput: interleaved runs")
    ap.add_argument(
        "--before",
        type=int,
        default=4,
        help="--throughput: the last migration of the design compared against (4: before lanes)",
    )
    ap.add_argument("--out", default=None, help="results file name (benchmarks/results/<out>.md)")
    return ap


def main() -> None:
    args = parser().parse_args()
    if args.private:
        from benchmarks.server import private_server

        with private_server() as dsn:
            args.dsn = dsn
            run(args)
    else:
        run(args)


def run(args: argparse.Namespace) -> None:
    """Run what the command line asks for and keep its table in benchmarks/results."""
    if args.throughput:
        table = throughput(args)
        name = args.out or "mvcc_throughput"
    else:
        results: dict[tuple[str, int], list[Phase]] = {}
        for n in args.consumers:
            for design in args.designs:
                results[(design, n)] = pressure(args.dsn, DESIGNS[design], n, args)
        table = pressure_table(args, results)
        name = args.out or "mvcc_pressure"
    print(table)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
