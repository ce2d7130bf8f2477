"""The SQL calls themselves, pgqueue beside PGMQ, driven by pgbench on one server.

Each system lives in its own database on the same server; runs are
interleaved (pgqueue, PGMQ, pgqueue, ...) so drift on a noisy machine hits both
alike. PGMQ's SQL comes from the `pgmq` package on PyPI (pip install pgmq), which
ships PGMQ's own pgmq.sql, installed into a plain database.

    python -m benchmarks.sql_calls --dsn postgresql://postgres@127.0.0.1/test --runs 3
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from benchmarks.common import with_db
from pgqueue._migrate import migrate

RESULTS = Path(__file__).parent / "results"


@dataclass(frozen=True)
class System:
    name: str
    install: str  # "pgqueue" or "pgmq"
    create: str
    send: str
    read_delete: str  # takes :qty


PGQUEUE = System(
    "pgqueue",
    "pgqueue",
    "SELECT pgqueue.create_queue('bench', 5)",
    "SELECT pgqueue.send('bench', '{\"n\": 1}');",
    "SELECT count(*) FROM pgqueue.delete('bench',"
    " ARRAY(SELECT msg_id FROM pgqueue.read('bench', 30, :qty)));",
)
PGMQ = System(
    "pgmq",
    "pgmq",
    "SELECT pgmq.create('bench')",
    "SELECT pgmq.send('bench', '{\"n\": 1}');",
    "SELECT count(*) FROM pgmq.delete('bench',"
    " ARRAY(SELECT msg_id FROM pgmq.read('bench', 30, :qty)));",
)


@dataclass(frozen=True)
class Scenario:
    label: str
    kind: str  # "send" or "read_delete"
    clients: int
    qty: int
    transactions: int  # per client

    def messages(self) -> int:
        return self.qty * self.transactions * self.clients


SCENARIOS = [
    Scenario("send, 1 conn", "send", 1, 1, 3000),
    Scenario("send, 4 conns", "send", 4, 1, 2000),
    Scenario("read+delete batch 100, 1 conn", "read_delete", 1, 100, 400),
    Scenario("read+delete batch 100, 4 conns", "read_delete", 4, 100, 200),
    Scenario("read+delete batch 1, 1 conn", "read_delete", 1, 1, 3000),
    Scenario("read+delete batch 1, 4 conns", "read_delete", 4, 1, 1500),
]


def install(dsn: str, system: System) -> str:
    db = f"bench_{system.name}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {db}")
    target = with_db(dsn, db)
    with psycopg.connect(target, autocommit=True) as conn:
        if system.install == "pgqueue":
            migrate(conn)
        else:
            from importlib.resources import files

            conn.execute(files("pgmq").joinpath("sql", "pgmq.sql").read_text())
    return db


def prepare(dsn: str, system: System, preload: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        schema = system.install
        conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,))
        if system is PGQUEUE:
            conn.execute("SELECT pgqueue.drop_queue('bench')")
        else:
            conn.execute("SELECT pgmq.drop_queue('bench')")
        conn.execute(system.create)
        batch = "ARRAY(SELECT '{\"n\": 1}'::jsonb FROM generate_series(1, 1000))"
        fn = "pgqueue.send_batch" if system is PGQUEUE else "pgmq.send_batch"
        for _ in range(preload // 1000):
            conn.execute(f"SELECT count(*) FROM {fn}('bench', {batch})")
        conn.execute("CHECKPOINT")
        conn.execute("VACUUM ANALYZE")


def pgbench(dsn: str, script: str, sc: Scenario) -> float:
    params: dict[str, Any] = conninfo_to_dict(dsn)
    env = dict(os.environ)
    for key, var in (("host", "PGHOST"), ("port", "PGPORT"), ("user", "PGUSER")):
        if params.get(key):
            env[var] = str(params[key])
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(script)
    out = subprocess.run(
        [
            "pgbench",
            "-n",
            "-f",
            f.name,
            "-c",
            str(sc.clients),
            "-j",
            str(sc.clients),
            "-t",
            str(sc.transactions),
            "-D",
            f"qty={sc.qty}",
            "-M",
            "prepared",
            str(params["dbname"]),
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    os.unlink(f.name)
    tps = float(re.search(r"tps = ([\d.]+)", out).group(1))  # type: ignore[union-attr]
    return tps * sc.qty


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--dsn", default=os.environ.get("PGQUEUE_DSN", "postgresql://postgres@127.0.0.1/test")
    )
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply transaction counts")
    args = ap.parse_args()
    systems = [PGQUEUE, PGMQ]
    dbs = {s.name: install(args.dsn, s) for s in systems}
    results: dict[tuple[str, str], list[float]] = {}
    try:
        for sc0 in SCENARIOS:
            sc = Scenario(
                sc0.label,
                sc0.kind,
                sc0.clients,
                sc0.qty,
                max(1, int(sc0.transactions * args.scale)),
            )
            for _ in range(args.runs):
                for s in systems:  # interleaved: A B A B ...
                    target = with_db(args.dsn, dbs[s.name])
                    prepare(target, s, sc.messages() + 2000 if sc.kind == "read_delete" else 0)
                    script = s.send if sc.kind == "send" else s.read_delete
                    results.setdefault((sc.label, s.name), []).append(pgbench(target, script, sc))
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            for db in dbs.values():
                admin.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
    with psycopg.connect(args.dsn) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
        sync = conn.execute("SHOW synchronous_commit").fetchone()[0]  # type: ignore[index]
    lines = [
        f"PostgreSQL {version}, synchronous_commit={sync}, {os.cpu_count()} CPUs,"
        f" {platform.platform()}; {args.runs} interleaved runs, messages/s",
        "",
        "| scenario | pgqueue median (min-max) | PGMQ median (min-max) | pgqueue/PGMQ |",
        "|---|---|---|---|",
    ]
    for sc in SCENARIOS:
        a = results[(sc.label, "pgqueue")]
        b = results[(sc.label, "pgmq")]
        ma, mb = statistics.median(a), statistics.median(b)
        lines.append(
            f"| {sc.label} | {ma:,.0f} ({min(a):,.0f}-{max(a):,.0f}) |"
            f" {mb:,.0f} ({min(b):,.0f}-{max(b):,.0f}) | {ma / mb:.2f}x |"
        )
    table = "\n".join(lines)
    print(table)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "sql_calls.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
