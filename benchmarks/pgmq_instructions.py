"""Server instructions per call of PGMQ's client: real PGMQ beside pgqueue's pgmq facade.

Counts, not seconds, so a busy machine gives the same figures: a private
PostgreSQL cluster (initdb; fsync and autovacuum off) runs under valgrind's
callgrind with every backend traced. Each system gets a database installed as
benchmarks/pgmq_facade.py installs it, with a queue of 1,000 messages, while
the cluster runs normally; then the cluster restarts under callgrind. For each
call, one connection makes 20 + 30 calls and another 20 + 130, each in a
transaction of its own as PGMQ's client makes them, with the client's own SQL
(`pgmq._sql`); the difference of the two backends' totals over 100 is one
call's instructions, with start-up, warm-up and exit cancelled out. A
throwaway connection goes first, so that neither measured backend builds the
relation cache's init file that the first backend of a database after a
restart builds.

What it leaves out: the client (the same in both columns), the network, and
the time a commit waits for its WAL flush (fsync is off: a flush is the same
in both columns).

    python -m benchmarks.pgmq_instructions            # the table, into results/
    python -m benchmarks.pgmq_instructions --calls pop --out /tmp/x.md
    python -m benchmarks.pgmq_instructions --facade-sql change.sql --out /tmp/y.md

`--facade-sql` runs a file of SQL on each facade database once it is installed,
before anything is measured: a schema change's cost, counted before a
migration is written for it.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import psycopg

from benchmarks import pgmq_facade as side
from benchmarks.common import RESULTS, with_db
from benchmarks.server import _as_postgres, _bindir, init_cluster

WARMUP = 20
SHORT, LONG = 30, 130
BATCH = 100


def _calls() -> dict[str, Callable[[psycopg.Connection[Any]], None]]:
    """One call of each measured kind, as PGMQ's client sends it, committed."""
    from pgmq import _sql  # type: ignore[import-untyped,unused-ignore]
    from psycopg.types.json import Jsonb

    def ack(sql: str) -> Callable[[psycopg.Connection[Any]], None]:
        def call(conn: psycopg.Connection[Any]) -> None:
            rows = conn.execute(_sql.READ, (side.QUEUE, 30, 1)).fetchall()
            conn.commit()
            conn.execute(sql, (side.QUEUE, rows[0][0])).fetchall()
            conn.commit()

        return call

    def pop(conn: psycopg.Connection[Any]) -> None:
        conn.execute(_sql.POP, (side.QUEUE, 1)).fetchall()
        conn.commit()

    def read(conn: psycopg.Connection[Any]) -> None:
        conn.execute(_sql.READ, (side.QUEUE, 30, 1)).fetchall()
        conn.commit()

    def send(conn: psycopg.Connection[Any]) -> None:
        conn.execute(_sql.SEND, (side.QUEUE, Jsonb(side.MESSAGE))).fetchall()
        conn.commit()

    def send_batch(conn: psycopg.Connection[Any]) -> None:
        batch = [Jsonb(side.MESSAGE)] * BATCH
        conn.execute(_sql.SEND_BATCH, (side.QUEUE, batch)).fetchall()
        conn.commit()

    return {
        "send": send,
        f"send_batch of {BATCH}": send_batch,
        "read": read,
        "read + delete": ack(_sql.DELETE),
        "read + archive": ack(_sql.ARCHIVE),
        "pop": pop,
    }


class Traced:
    """A private cluster (benchmarks.server), started plainly or under callgrind."""

    def __init__(self) -> None:
        self.cluster = init_cluster({"fsync": "off", "autovacuum": "off"})
        self.dumps = os.path.join(self.cluster.root, "dumps")
        os.makedirs(self.dumps)
        if os.geteuid() == 0:
            shutil.chown(self.dumps, "postgres", "postgres")
        self.server = self.cluster.dsn
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, traced: bool) -> None:
        """Start the server (under callgrind, every backend traced) and wait until it answers."""
        if not traced:
            self.cluster.start()
            return
        cmd = [
            "valgrind",
            "--tool=callgrind",
            "--trace-children=yes",
            f"--callgrind-out-file={self.dumps}/cg.%p",
            f"{self.cluster.bindir}/postgres",
            "-D",
            self.cluster.data,
            *shlex.split(self.cluster.options),
        ]
        log_path = os.path.join(self.cluster.root, "log")
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(_as_postgres(cmd), stdout=log, stderr=log)
        deadline = time.monotonic() + 300
        while True:
            try:
                psycopg.connect(self.server, connect_timeout=5).close()
                return
            except psycopg.OperationalError as exc:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the private server did not start: see {log_path}") from exc
                time.sleep(1)

    def stop(self) -> None:
        """Stop the server (fast shutdown) and wait for it."""
        self.cluster.stop()
        if self.proc is not None:
            self.proc.wait(120)
            self.proc = None

    def dsn(self, db: str) -> str:
        """A DSN of one of its databases."""
        return with_db(self.server, db)

    def backend_total(self, pid: int) -> int:
        """The instructions a backend ran, from the dump callgrind writes when it exits."""
        path = f"{self.dumps}/cg.{pid}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if os.path.exists(path):
                with open(path) as dump:
                    text = dump.read()
                found = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
                if found:
                    return int(found.group(1))
            time.sleep(0.5)
        raise RuntimeError(f"no callgrind dump for backend {pid}")

    def remove(self) -> None:
        """Stop the server and remove the cluster."""
        self.stop()
        shutil.rmtree(self.cluster.root, ignore_errors=True)


def measure(
    names: list[str], log: Callable[[str], None], facade_sql: str | None = None
) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], float]]:
    """Instructions per call, and WAL bytes per call, for each (call, system)."""
    calls = _calls()
    cluster = Traced()
    out: dict[tuple[str, str], float] = {}
    wal: dict[tuple[str, str], float] = {}
    try:
        cluster.start(traced=False)
        with psycopg.connect(cluster.server, autocommit=True) as admin:
            for name in names:
                for system in side.SYSTEMS:
                    db = f"cg_{system}_{names.index(name)}"
                    admin.execute(f"CREATE DATABASE {db}")
                    side.INSTALL[system](cluster.dsn(db))
                    side.prepare_queue(cluster.dsn(db), 1000)
                    if facade_sql and system == "facade":
                        with psycopg.connect(cluster.dsn(db), autocommit=True) as conn:
                            try:
                                conn.execute(facade_sql.encode())
                            except psycopg.Error as exc:
                                raise SystemExit(f"--facade-sql failed: {exc}") from None
        cluster.stop()
        cluster.start(traced=True)
        for name in names:
            for system in side.SYSTEMS:
                db = f"cg_{system}_{names.index(name)}"
                # The first backend of a database after a restart builds the
                # relation cache's init file, millions of instructions that
                # would count against the short run: a throwaway one does.
                first = psycopg.connect(cluster.dsn(db))
                pid = first.info.backend_pid
                first.execute("SELECT 1")
                first.close()
                cluster.backend_total(pid)
                totals = []
                for n in (SHORT, LONG):
                    conn = psycopg.connect(cluster.dsn(db))
                    pid = conn.info.backend_pid
                    for _ in range(WARMUP):
                        calls[name](conn)
                    # the WAL the long run's calls wrote, read by another backend
                    before = _wal_lsn(cluster.dsn(db)) if n == LONG else ""
                    for _ in range(n):
                        calls[name](conn)
                    if n == LONG:
                        wal[(name, system)] = _wal_bytes_since(cluster.dsn(db), before) / n
                    conn.close()
                    totals.append(cluster.backend_total(pid))
                out[(name, system)] = (totals[1] - totals[0]) / (LONG - SHORT)
                log(f"  {name} | {side.LABELS[system]}: {out[(name, system)] / 1000:,.1f}k")
    finally:
        cluster.remove()
    return out, wal


def _wal_lsn(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


def _wal_bytes_since(dsn: str, lsn: str) -> float:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s::pg_lsn)", (lsn,)
        ).fetchone()
    assert row is not None
    return float(row[0])


def table(
    names: list[str], values: dict[tuple[str, str], float], cell: Callable[[float], str]
) -> list[str]:
    """A markdown table: each call's value on both systems (as `cell` writes it), and the ratio."""
    rows = [
        "| call | real PGMQ | pgqueue facade | facade/real |",
        "|---|---|---|---|",
    ]
    for name in names:
        real, facade = values[(name, "real")], values[(name, "facade")]
        ratio = f"{facade / real:.2f}" if real else "-"
        rows.append(f"| {name} | {cell(real)} | {cell(facade)} | {ratio} |")
    return rows


def main() -> None:
    """Measure and print the table; write it to results/pgmq_instructions.md (or --out)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", default=",".join(_calls()), help="comma list of calls to measure")
    ap.add_argument("--out", default=str(RESULTS / "pgmq_instructions.md"), help="results file")
    ap.add_argument(
        "--facade-sql",
        metavar="FILE",
        help="SQL to run on each facade database after installing it (a what-if)",
    )
    args = ap.parse_args()
    facade_sql = None
    if args.facade_sql:
        try:
            with open(args.facade_sql) as f:
                facade_sql = f.read()
        except OSError as exc:
            sys.exit(f"cannot read --facade-sql {args.facade_sql}: {exc.strerror}")
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed: apt-get install valgrind")
    known = list(_calls())
    names = [c.strip() for c in args.calls.split(",") if c.strip()]
    unknown = [c for c in names if c not in known]
    if unknown:
        sys.exit(f"unknown call {unknown[0]!r}: choose from {', '.join(known)}")
    command = " ".join(["python -m benchmarks.pgmq_instructions", *sys.argv[1:]])
    began = time.monotonic()
    counts, wal = measure(names, lambda s: print(s, file=sys.stderr, flush=True), facade_sql)
    version = side._version("pgmq")
    text = "\n".join(
        [
            "# Server instructions per call: PGMQ's client on real PGMQ and on the facade",
            "",
            f"Command: `{command}`",
            "",
            *(
                [f"The facade's databases also ran {args.facade_sql} before measuring.", ""]
                if args.facade_sql
                else []
            ),
            f"PyPI `pgmq` {version}; {_server_version()}; valgrind's callgrind, every backend"
            f" traced; per call: (total of {WARMUP}+{LONG} calls - total of {WARMUP}+{SHORT})"
            f" / {LONG - SHORT}, each call committed; fsync off. Thousands of instructions"
            " (lower is better; facade/real <= 1.00: the facade does no more work).",
            "",
            *table(names, counts, lambda v: f"{v / 1000:,.0f}k"),
            "",
            "WAL bytes per call, as `pg_current_wal_insert_lsn()` moved over the long run's"
            " measured calls (the WAL a commit waits to flush; lower is better):",
            "",
            *table(names, wal, lambda v: f"{v:,.0f}"),
            "",
            f"Took {time.monotonic() - began:,.0f} s.",
        ]
    )
    print(text)
    with open(args.out, "w") as f:
        f.write(text + "\n")


def _server_version() -> str:
    done = subprocess.run([f"{_bindir()}/postgres", "--version"], capture_output=True, text=True)
    return done.stdout.strip() or "PostgreSQL"


if __name__ == "__main__":
    main()
