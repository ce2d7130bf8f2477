"""The SQL calls under pgbench beside the machine's ceiling: plain INSERTs on the same server.

The ceiling is what Postgres does with the same commits and no queue logic: a
single-row INSERT per transaction into a table with a bigserial key, a jsonb
payload and a timestamp (1 and 4 clients), and 100-row INSERTs. pgqueue's and
PGMQ's SQL functions run as pgbench scripts against their own databases.
"""

from __future__ import annotations

import statistics

import psycopg

from benchmarks import sql_calls
from benchmarks.common import scratch_database, with_db
from benchmarks.sql_calls import PGMQ, PGQUEUE, Scenario

CEILING_TABLE = (
    "CREATE TABLE ceiling (id bigserial PRIMARY KEY, payload jsonb NOT NULL,"
    " created_at timestamptz NOT NULL DEFAULT now())"
)
INSERT_1 = "INSERT INTO ceiling (payload) VALUES ('{\"n\": 1}');"
INSERT_100 = "INSERT INTO ceiling (payload) SELECT '{\"n\": 1}' FROM generate_series(1, 100);"
BATCH_100 = {
    "pgqueue": "SELECT count(*) FROM pgqueue.send_batch('bench',"
    " ARRAY(SELECT '{\"n\": 1}'::jsonb FROM generate_series(1, 100)));",
    "pgmq": "SELECT count(*) FROM pgmq.send_batch('bench',"
    " ARRAY(SELECT '{\"n\": 1}'::jsonb FROM generate_series(1, 100)));",
}

# (label, kind, clients, qty, transactions per client, ceiling script or None)
ROWS = [
    ("send, 1 conn", "send", 1, 1, 3000, INSERT_1),
    ("send, 4 conns", "send", 4, 1, 2000, INSERT_1),
    ("send batch 100, 1 conn", "batch", 1, 100, 300, INSERT_100),
    ("read+delete batch 100, 1 conn", "read_delete", 1, 100, 400, None),
    ("read+delete batch 100, 4 conns", "read_delete", 4, 100, 200, None),
    ("read+delete batch 1, 1 conn", "read_delete", 1, 1, 3000, None),
    ("read+delete batch 1, 4 conns", "read_delete", 4, 1, 1500, None),
]


def _med(xs: list[float]) -> str:
    if not xs:
        return "-"
    med = statistics.median(xs)
    return f"{med:,.0f} ({min(xs):,.0f}-{max(xs):,.0f})" if len(xs) > 1 else f"{med:,.0f}"


def run(dsn: str, runs: int, scale: float, notes: list[str]) -> list[str]:
    """Measure every row for the ceiling, pgqueue and PGMQ, interleaved; markdown lines."""
    systems = [PGQUEUE, PGMQ]
    dbs = {s.name: sql_calls.install(dsn, s) for s in systems}
    got: dict[tuple[str, str], list[float]] = {}
    try:
        with scratch_database(dsn, "bench_ceiling", migrate=False) as ceiling_dsn:
            with psycopg.connect(ceiling_dsn, autocommit=True) as conn:
                conn.execute(CEILING_TABLE)
            for label, kind, clients, qty, txns, ceiling_sql in ROWS:
                sc = Scenario(label, kind, clients, qty, max(1, int(txns * scale)))
                for _ in range(runs):
                    if ceiling_sql is not None:
                        with psycopg.connect(ceiling_dsn, autocommit=True) as conn:
                            conn.execute("TRUNCATE ceiling")
                            conn.execute("CHECKPOINT")
                        got.setdefault((label, "ceiling"), []).append(
                            sql_calls.pgbench(ceiling_dsn, ceiling_sql, sc)
                        )
                    for s in systems:
                        target = with_db(dsn, dbs[s.name])
                        preload = sc.messages() + 2000 if kind == "read_delete" else 0
                        sql_calls.prepare(target, s, preload)
                        script = {
                            "send": s.send,
                            "read_delete": s.read_delete,
                            "batch": BATCH_100[s.install],
                        }[kind]
                        got.setdefault((label, s.name), []).append(
                            sql_calls.pgbench(target, script, sc)
                        )
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            for db in dbs.values():
                admin.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
    lines = [
        "## 0. The SQL calls under pgbench, and the machine's ceiling (messages/s)",
        "",
        "| scenario | ceiling (plain INSERT) | pgqueue | PGMQ | pgqueue/PGMQ | pgqueue/ceiling |",
        "|---|---|---|---|---|---|",
    ]
    for label, *_ in ROWS:
        c, a, b = got.get((label, "ceiling"), []), got[(label, "pgqueue")], got[(label, "pgmq")]
        vs = statistics.median(a) / statistics.median(b)
        of = f"{statistics.median(a) / statistics.median(c):.0%}" if c else "-"
        lines.append(f"| {label} | {_med(c)} | {_med(a)} | {_med(b)} | {vs:.2f}x | {of} |")
    return [*lines, ""]
