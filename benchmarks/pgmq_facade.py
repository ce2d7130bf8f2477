"""PGMQ's own Python client against real PGMQ and against pgqueue's `pgmq` facade, side by side.

    python -m benchmarks.pgmq_facade --rounds 3            # results/pgmq_facade.md
    python -m benchmarks.pgmq_facade --private --rounds 5  # a stock cluster of its own
    python -m benchmarks.pgmq_facade --smoke               # seconds; tiny sizes
    python -m benchmarks.pgmq_facade --profile             # where the time goes, per SQL function
    python -m benchmarks --only pgmq                       # the same table, as suite section 7

The client is the PyPI `pgmq` package's `PGMQueue` (init_extension=False),
unchanged, in both columns:
- *real PGMQ*: PGMQ's own `pgmq.sql`, from that package, in a fresh database;
- *pgqueue facade*: a fresh database, `pgqueue migrate` and then the facade
  (`pgqueue._pgmq.install`).

Every measurement gets a new database cloned from a template of its system
(nothing ANALYZEd or VACUUMed by the benchmark, so it is the planner's and
the tables' state a newcomer meets), and the systems are measured in turn,
A B A B, round after round. Workers are processes (forked, one `PGMQueue`
each, started together behind a barrier): producers send their share;
consumers loop until the queue is empty, running a handler of about 0.2 ms
of JSON work per message. Cells are medians of the rounds, with min-max.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.resources import files
from multiprocessing.connection import Connection
from typing import Any

import psycopg
import psycopg.sql
from psycopg.conninfo import conninfo_to_dict

from benchmarks.common import DEFAULT_DSN, RESULTS, with_db

QUEUE = "bench"
SYSTEMS = ("real", "facade")
LABELS = {"real": "real PGMQ", "facade": "pgqueue facade", "whatif": "facade + what-if"}
HANDLER_SECONDS = 0.0002
PRELOAD_CHUNK = 1000
MESSAGE = {"order": 0, "sku": "SKU-1234", "qty": 3, "note": "x" * 64}


@dataclass(frozen=True)
class Scenario:
    """One row pair of the table: a client call pattern, at 1 and at 4 workers."""

    key: str
    label: str
    producer: bool  # sends (timed); else consumes a preloaded queue
    count: int  # messages per measurement at scale 1


SCENARIOS = (
    Scenario("send", "send, one message per call", True, 3000),
    Scenario("send_batch", "send_batch, 100 per call", True, 40_000),
    Scenario("read_delete", "read 1 + handler + delete", False, 3000),
    Scenario("read_archive", "read 1 + handler + archive", False, 3000),
    Scenario("pop", "pop 1 + handler", False, 3000),
)
WORKERS = (1, 4)


# -- the two systems' databases ------------------------------------------------


def _url(dsn: str) -> str:
    """A libpq DSN as the URL the pgmq client parses (it wants a user and a password)."""
    p = conninfo_to_dict(dsn)
    user = p.get("user") or "postgres"
    password = p.get("password") or "postgres"  # the client's own default; trust auth ignores it
    host, port = p.get("host") or "127.0.0.1", p.get("port") or "5432"
    return f"postgresql://{user}:{password}@{host}:{port}/{p['dbname']}"


def install_real(dsn: str) -> None:
    """PGMQ's own pgmq.sql, as shipped in the `pgmq` package."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(files("pgmq").joinpath("sql", "pgmq.sql").read_text().encode())


def install_facade(dsn: str) -> None:
    """pgqueue's schema (`pgqueue migrate`), then the pgmq facade over it."""
    from pgqueue import Client
    from pgqueue._pgmq import install  # type: ignore[import-not-found,unused-ignore]

    with Client.from_dsn(dsn, max_size=1) as client:
        client.migrate()
    with psycopg.connect(dsn, autocommit=True) as conn:
        install(conn)


def install_whatif(sql_text: str) -> Callable[[str], None]:
    """The facade, then a schema change of `--facade-sql` (a what-if measured beside both)."""

    def install(dsn: str) -> None:
        install_facade(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            try:
                conn.execute(sql_text.encode())
            except psycopg.Error as exc:
                raise SystemExit(f"--facade-sql failed: {exc}") from None

    return install


INSTALL: dict[str, Callable[[str], None]] = {"real": install_real, "facade": install_facade}


def _create_db(server: str, name: str, template: str | None = None) -> str:
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}" + (f" TEMPLATE {template}" if template else ""))
    return with_db(server, name)


def _drop_db(server: str, name: str) -> None:
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@contextmanager
def templates(server: str, systems: tuple[str, ...] = SYSTEMS) -> Iterator[dict[str, str]]:
    """One template database per system, installed once; their names."""
    made: dict[str, str] = {}
    try:
        for system in systems:
            name = f"bench_pgmqf_{system}_tmpl_{uuid.uuid4().hex[:6]}"
            made[system] = name
            INSTALL[system](_create_db(server, name))
        yield made
    finally:
        for name in made.values():
            _drop_db(server, name)


@contextmanager
def fresh(server: str, template: str, settings: dict[str, str] | None = None) -> Iterator[str]:
    """A new database cloned from the template (with `settings` as its own), dropped afterwards."""
    name = f"bench_pgmqf_{uuid.uuid4().hex[:8]}"
    target = _create_db(server, name, template)
    with psycopg.connect(server, autocommit=True) as admin:
        for key, value in (settings or {}).items():
            admin.execute(
                psycopg.sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                    psycopg.sql.Identifier(name),
                    psycopg.sql.Identifier(key),
                    psycopg.sql.Literal(value),
                )
            )
    try:
        yield target
    finally:
        _drop_db(server, name)


def prepare_queue(dsn: str, preload: int) -> None:
    """Create the queue and, for consumers, fill it (untimed; no ANALYZE, no VACUUM)."""
    from pgmq import PGMQueue

    q = PGMQueue(conn_string=_url(dsn), init_extension=False, pool_size=1)
    try:
        q.create_queue(QUEUE)
        for start in range(0, preload, PRELOAD_CHUNK):
            size = min(PRELOAD_CHUNK, preload - start)
            q.send_batch(QUEUE, [dict(MESSAGE, order=start + i) for i in range(size)])
    finally:
        q.close()


# -- the workers ---------------------------------------------------------------


def handle(message: dict[str, Any]) -> None:
    """About 0.2 ms of JSON work, what a small handler does with its message."""
    blob = json.dumps(message)
    end = time.perf_counter() + HANDLER_SECONDS
    while time.perf_counter() < end:
        json.loads(blob)


def _work(key: str, url: str, share: int, go: Any, out: Connection) -> None:
    """One worker process: a PGMQueue of its own, the barrier, then the timed loop."""
    from pgmq import PGMQueue

    q = PGMQueue(conn_string=url, init_extension=False, pool_size=1)
    lat: list[float] = []
    done = 0
    try:
        q.metrics(QUEUE)  # the pool's connection is open before the clock starts
        go.wait()
        began = time.monotonic()
        if key == "send":
            for i in range(share):
                t = time.perf_counter()
                q.send(QUEUE, dict(MESSAGE, order=i))
                lat.append(time.perf_counter() - t)
            done = share
        elif key == "send_batch":
            for start in range(0, share, 100):
                size = min(100, share - start)
                t = time.perf_counter()
                q.send_batch(QUEUE, [dict(MESSAGE, order=start + i) for i in range(size)])
                lat.append(time.perf_counter() - t)
            done = share
        else:
            while True:
                t = time.perf_counter()
                msg: Any = q.pop(QUEUE) if key == "pop" else q.read(QUEUE, vt=30)
                if msg is None:
                    break
                handle(msg.message)
                if key == "read_delete":
                    q.delete(QUEUE, msg.msg_id)
                elif key == "read_archive":
                    q.archive(QUEUE, msg.msg_id)
                lat.append(time.perf_counter() - t)
                done += 1
        ended = time.monotonic()
        out.send((began, ended, done, lat, None))
    except Exception as exc:  # reported, not hidden
        out.send((0.0, 0.0, 0, [], repr(exc)))
    finally:
        q.close()
        out.close()


def run_workers(key: str, dsn: str, count: int, workers: int) -> tuple[float, float, int]:
    """msg/s, p50 per call (ms), messages done; `workers` processes started together."""
    ctx = multiprocessing.get_context("fork")
    go = ctx.Barrier(workers)
    shares = [count // workers + (1 if i < count % workers else 0) for i in range(workers)]
    pipes = [ctx.Pipe(duplex=False) for _ in range(workers)]
    procs = [
        ctx.Process(target=_work, args=(key, _url(dsn), shares[i], go, pipes[i][1]), daemon=True)
        for i in range(workers)
    ]
    for p in procs:
        p.start()
    results = []
    try:
        for reader, writer in pipes:
            writer.close()
            if not reader.poll(600):
                raise RuntimeError(f"{key}: a worker gave no result in 600 s")
            results.append(reader.recv())
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()
    errors = [r[4] for r in results if r[4]]
    if errors:
        raise RuntimeError(f"{key}: {errors[0]}")
    began = min(r[0] for r in results)
    ended = max(r[1] for r in results)
    done = sum(r[2] for r in results)
    lat = sorted(x for r in results for x in r[3])
    p50 = lat[len(lat) // 2] * 1000 if lat else 0.0
    return done / (ended - began), p50, done


# -- the run -------------------------------------------------------------------


@dataclass
class Cells:
    """Samples per (row, system)."""

    rate: dict[tuple[str, str], list[float]]
    p50: dict[tuple[str, str], list[float]]
    rows: list[str]
    notes: list[str]
    systems: tuple[str, ...] = SYSTEMS


def measure(
    server: str,
    rounds: int,
    scale: float,
    log: Callable[[str], None],
    systems: tuple[str, ...] = SYSTEMS,
    settings: dict[str, str] | None = None,
    scenarios: tuple[Scenario, ...] = SCENARIOS,
) -> Cells:
    """Every scenario at 1 and 4 workers, for each system in turn, `rounds` times."""
    cells = Cells({}, {}, [], [], systems)
    with templates(server, systems) as tmpl:
        for r in range(rounds):
            for sc in scenarios:
                for workers in WORKERS:
                    count = max(workers * 10, int(sc.count * scale))
                    row = f"{sc.label}, {workers} {'producer' if sc.producer else 'consumer'}"
                    row += "s" if workers > 1 else ""
                    if row not in cells.rows:
                        cells.rows.append(row)
                    for system in systems:
                        with fresh(server, tmpl[system], settings) as dsn:
                            prepare_queue(dsn, 0 if sc.producer else count)
                            try:
                                rate, p50, done = run_workers(sc.key, dsn, count, workers)
                            except Exception as exc:
                                cells.notes.append(f"{LABELS[system]}, {row}: failed: {exc}"[:300])
                                continue
                        if done != count:
                            cells.notes.append(
                                f"{LABELS[system]}, {row}: {done} of {count} messages done"
                            )
                        cells.rate.setdefault((row, system), []).append(rate)
                        cells.p50.setdefault((row, system), []).append(p50)
                        log(
                            f"  round {r + 1} | {row} | {LABELS[system]}:"
                            f" {rate:,.0f} msg/s, p50 {p50:.3f} ms per call"
                        )
    return cells


def _cell(xs: list[float], digits: int) -> str:
    if not xs:
        return "-"
    fmt = f"{{:,.{digits}f}}"
    med = fmt.format(statistics.median(xs))
    return med if len(xs) == 1 else f"{med} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def _ratio(a: list[float], b: list[float]) -> float | None:
    if not a or not b or statistics.median(b) <= 0:
        return None
    return statistics.median(a) / statistics.median(b)


def _columns(cells: Cells, unit: str) -> list[str]:
    """The header rows of a table: each system's column, then each other one's ratio to real."""
    others = [s for s in cells.systems if s != "real"]
    names = [f"{LABELS[s]} {unit}" for s in cells.systems]
    ratios = [f"{'facade' if s == 'facade' else LABELS[s]}/real" for s in others]
    heads = ["scenario", *names, *(ratios if "real" in cells.systems else [])]
    return [f"| {' | '.join(heads)} |", "|" + "---|" * len(heads)]


def _rows(cells: Cells, samples: dict[tuple[str, str], list[float]], digits: int) -> list[str]:
    out = []
    for row in cells.rows:
        values = [samples.get((row, s), []) for s in cells.systems]
        ratios = []
        if "real" in cells.systems:
            real = samples.get((row, "real"), [])
            ratios = [
                _fmt(_ratio(samples.get((row, s), []), real)) for s in cells.systems if s != "real"
            ]
        out.append(f"| {' | '.join([row, *(_cell(v, digits) for v in values), *ratios])} |")
    return out


def table(cells: Cells) -> list[str]:
    """Two markdown tables, throughput (msg/s) and p50 per call (ms), with ratios to real PGMQ."""
    out = [
        "Throughput, messages/s (higher is better; facade/real >= 1.00: the facade is at"
        " least as fast):",
        "",
        *_columns(cells, "msg/s"),
        *_rows(cells, cells.rate, 0),
        "",
        "Per call, p50 in ms (one send, one send_batch of 100, or one message's read + handler"
        " + delete/archive, or pop + handler; lower is better; facade/real <= 1.00: the"
        " facade is at least as fast):",
        "",
        *_columns(cells, "ms"),
        *_rows(cells, cells.p50, 3),
        "",
    ]
    if cells.notes:
        out += ["Notes:", "", *[f"- {n}" for n in cells.notes], ""]
    return out


def _fmt(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}"


def environment(dsn: str) -> str:
    """Postgres version and the settings that shape these figures, CPUs, platform."""
    with psycopg.connect(dsn) as conn:
        pairs = []
        for name in ("server_version", "shared_buffers", "synchronous_commit", "autovacuum"):
            row = conn.execute(f"SHOW {name}").fetchone()
            pairs.append(f"{name}={row[0] if row else '?'}")
    return f"PostgreSQL {', '.join(pairs)}; {os.cpu_count()} CPUs; {platform.platform()}"


def suite_section(dsn: str, runs: int, smoke: bool) -> list[str]:
    """Section 7 of `python -m benchmarks`: this benchmark's tables."""
    scale = 0.01 if smoke else 1.0
    cells = measure(dsn, runs, scale, lambda s: print(s, file=sys.stderr, flush=True))
    return [
        "## 7. The PGMQ client: pgqueue's pgmq facade beside real PGMQ",
        "",
        f"PyPI `pgmq` {_version('pgmq')} `PGMQueue`, fresh database per measurement, workers"
        f" are processes; {runs} interleaved run(s), scale {scale}."
        " See benchmarks/pgmq_facade.py.",
        "",
        *table(cells),
    ]


def _settings_note(settings: dict[str, str]) -> str:
    """' with synchronous_commit=off,' or nothing."""
    if not settings:
        return ""
    return " with " + ", ".join(f"{k}={v}" for k, v in settings.items()) + " set on each database,"


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


# -- profile: where the time goes ----------------------------------------------

PROFILE_CALLS: tuple[tuple[str, str, str], ...] = (
    ("send", "SELECT * FROM pgmq.send(queue_name=>%s::text, msg=>%s::jsonb)", "msg"),
    (
        "send_batch of 100",
        "SELECT * FROM pgmq.send_batch(queue_name=>%s::text, msgs=>%s::jsonb[])",
        "batch",
    ),
    ("read 1", "SELECT * FROM pgmq.read(queue_name=>%s::text, vt=>30, qty=>1)", ""),
    ("delete 1", "SELECT pgmq.delete(queue_name=>%s::text, msg_id=>%s::bigint)", "id"),
    ("archive 1", "SELECT pgmq.archive(queue_name=>%s::text, msg_id=>%s::bigint)", "id"),
    ("pop 1", "SELECT * FROM pgmq.pop(queue_name=>%s::text, qty=>1)", ""),
)


def profile(server: str, n: int, systems: tuple[str, ...] = SYSTEMS) -> list[str]:
    """Per call: the server's execution time, WAL and buffers, and its time per SQL function."""
    from psycopg.types.json import Jsonb

    out = [
        f"Profile: {n} calls of each (the first 10 left out of the medians) on one connection"
        " after a preload of the queue, each call under EXPLAIN (ANALYZE, WAL, BUFFERS) in a"
        " transaction of its own: the server's execution time (median, ms), the WAL it"
        " wrote and the shared buffers it touched (medians); then the SQL functions with"
        " the most self time (pg_stat_user_functions, track_functions = 'all'; ms over"
        " all the calls, x calls).",
        "",
    ]
    with templates(server, systems) as tmpl:
        for system in systems:
            with fresh(server, tmpl[system]) as dsn:
                prepare_queue(dsn, 0)
                out += [
                    f"### {LABELS[system]}",
                    "",
                    "| call | exec ms | WAL bytes | buffers hit | self time by function (ms) |",
                    "|---|---|---|---|---|",
                ]
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute("SET track_functions = 'all'")
                    conn.execute(
                        "SELECT * FROM pgmq.send_batch(%s, %s::jsonb[])",
                        (QUEUE, [Jsonb(MESSAGE)] * (3 * n)),
                    )
                    ids = [r[0] for r in conn.execute("SELECT msg_id FROM pgmq.q_" + QUEUE)]
                    for label, sql, arg in PROFILE_CALLS:
                        _flush_stats(conn)
                        conn.execute("SELECT pg_stat_reset()")
                        samples = []
                        for _ in range(n):
                            params: tuple[Any, ...] = (QUEUE,)
                            if arg == "msg":
                                params = (QUEUE, Jsonb(MESSAGE))
                            elif arg == "batch":
                                params = (QUEUE, [Jsonb(MESSAGE)] * 100)
                            elif arg == "id":
                                params = (QUEUE, ids.pop())
                            row = conn.execute(
                                "EXPLAIN (ANALYZE, WAL, BUFFERS, FORMAT JSON) " + sql, params
                            ).fetchone()
                            assert row is not None
                            plan = row[0][0]
                            samples.append(
                                (
                                    plan["Execution Time"],
                                    plan["Plan"].get("WAL Bytes", 0),
                                    plan["Plan"].get("Shared Hit Blocks", 0),
                                )
                            )
                        _flush_stats(conn)
                        funcs = conn.execute(
                            "SELECT schemaname || '.' || funcname, calls, self_time"
                            " FROM pg_stat_user_functions WHERE calls > 0"
                            " ORDER BY self_time DESC LIMIT 4"
                        ).fetchall()
                        med = [statistics.median(x[j] for x in samples[10:]) for j in range(3)]
                        top = "; ".join(f"{f[0]} {f[2]:.0f} x{f[1]}" for f in funcs)
                        out.append(
                            f"| {label} | {med[0]:.3f} | {med[1]:,.0f} | {med[2]:.0f} | {top} |"
                        )
                out.append("")
    return out


def _flush_stats(conn: psycopg.Connection[Any]) -> None:
    """This backend's pending statistics reach the shared views (Postgres 15 and later)."""
    if conn.info.server_version >= 150000:
        conn.execute("SELECT pg_stat_force_next_flush()")
    time.sleep(0.3 if conn.info.server_version >= 150000 else 1.1)


# -- main ----------------------------------------------------------------------


def main() -> None:
    """Run the side-by-side benchmark and write benchmarks/results/pgmq_facade.md (or --out)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--dsn", default=DEFAULT_DSN, help="a server the benchmark may create databases on"
    )
    ap.add_argument("--rounds", type=int, default=3, help="interleaved samples per cell")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply message counts")
    ap.add_argument("--smoke", action="store_true", help="tiny and quick (scale 0.01, 1 round)")
    ap.add_argument("--private", action="store_true", help="on a fresh stock cluster (initdb)")
    ap.add_argument("--profile", action="store_true", help="per-function server time, no table")
    ap.add_argument("--out", default=None, help="results file [benchmarks/results/pgmq_facade.md]")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting of every measured database, e.g. synchronous_commit=off (repeatable)",
    )
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma list of {SYSTEMS}")
    ap.add_argument(
        "--only",
        default=None,
        metavar="KEYS",
        help=f"comma list of scenarios to run, of {tuple(sc.key for sc in SCENARIOS)}",
    )
    ap.add_argument(
        "--facade-sql",
        default=None,
        metavar="FILE",
        help="also measure the facade with this SQL run on its databases (a what-if), side by side",
    )
    args = ap.parse_args()
    if args.private:
        from benchmarks.server import private_server

        with private_server() as dsn:
            args.dsn = dsn
            run(args)
    else:
        run(args)


def run(args: argparse.Namespace) -> None:
    """The run against args.dsn: print the tables, write them unless --smoke without --out."""
    began = time.monotonic()
    systems = tuple(s.strip() for s in args.systems.split(",") if s.strip() in SYSTEMS)
    scenarios = SCENARIOS
    if args.only:
        keys = [k.strip() for k in args.only.split(",") if k.strip()]
        unknown = [k for k in keys if k not in {sc.key for sc in SCENARIOS}]
        if unknown or not keys:
            sys.exit(
                f"--only: unknown scenario {', '.join(unknown) or repr(args.only)};"
                f" choose from {', '.join(sc.key for sc in SCENARIOS)}"
            )
        scenarios = tuple(sc for sc in SCENARIOS if sc.key in keys)
    if args.facade_sql:
        try:
            with open(args.facade_sql) as f:
                INSTALL["whatif"] = install_whatif(f.read())
        except OSError as exc:
            sys.exit(f"cannot read --facade-sql {args.facade_sql}: {exc.strerror}")
        systems = (*systems, "whatif")
    command = "python -m benchmarks.pgmq_facade " + " ".join(sys.argv[1:])
    head = [
        "# PGMQ's Python client: pgqueue's pgmq facade beside real PGMQ",
        "",
        f"Command: `{command.strip()}`",
        "",
        environment(args.dsn),
        "",
    ]
    if args.profile:
        text = "\n".join([*head, *profile(args.dsn, 30 if args.smoke else 300, systems)])
        print(text)
        if args.out:
            with open(args.out, "w") as f:
                f.write(text + "\n")
        return
    scale = 0.01 if args.smoke else args.scale
    rounds = 1 if args.smoke else args.rounds
    settings = dict(kv.split("=", 1) for kv in args.set)
    cells = measure(
        args.dsn,
        rounds,
        scale,
        lambda s: print(s, file=sys.stderr, flush=True),
        systems,
        settings,
        scenarios,
    )
    body = [
        f"PyPI `pgmq` {_version('pgmq')} `PGMQueue` (init_extension=False) in every column;"
        f" {rounds} round(s), A B interleaved,{_settings_note(settings)}"
        " a fresh database per measurement (nothing"
        f" ANALYZEd or VACUUMed); scale {scale}; workers are processes, one client and one"
        " connection each; consumers run a handler of about 0.2 ms of JSON work per message.",
        "",
        *(
            [f"The what-if column is the facade with {args.facade_sql} run on its databases.", ""]
            if args.facade_sql
            else []
        ),
        *table(cells),
        f"Took {time.monotonic() - began:,.0f} s.",
    ]
    text = "\n".join([*head, *body])
    print(text)
    path = args.out or (None if args.smoke else str(RESULTS / "pgmq_facade.md"))
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
