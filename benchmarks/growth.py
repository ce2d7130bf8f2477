"""Cost growth: does pgqueue stay flat as dead (archived) rows and waiting messages pile up?

pgbench drives single sends and read+ack batches of 100 (ack by delete, and by
archive) on one queue, first empty, then beside 1M and 5M archived rows (of
the same queue, written straight into pgqueue.archive), then with 100k visible
messages waiting in the queue.
"""

from __future__ import annotations

import statistics
import time

import psycopg

from benchmarks.common import scratch_database
from benchmarks.sql_calls import Scenario, pgbench

SEND = "SELECT pgqueue.send('bench', '{\"n\": 1}');"
_READ_100 = "ARRAY(SELECT msg_id FROM pgqueue.read('bench', 30, 100))"
READ_DELETE = f"SELECT count(*) FROM pgqueue.delete('bench', {_READ_100});"
READ_ARCHIVE = f"SELECT count(*) FROM pgqueue.archive('bench', {_READ_100});"
ACKS = (("read+delete", READ_DELETE), ("read+archive", READ_ARCHIVE))


def _fill_archive(conn: psycopg.Connection[object], rows: int) -> None:
    """Add archived rows to the queue's archive, 500k per statement."""
    step = 500_000
    have = conn.execute("SELECT count(*) FROM pgqueue.archive").fetchone()[0]  # type: ignore[index]
    while have < rows:
        k = min(step, rows - have)
        conn.execute(
            "INSERT INTO pgqueue.archive (queue_id, msg_id, read_ct, enqueued_at, vt, message)"
            " SELECT q.queue_id, -(%s + g), 1, now() - interval '1 day', now(), '{\"n\": 1}'"
            " FROM pgqueue.queue q, generate_series(1, %s) g WHERE q.queue_name = 'bench'",
            (have, k),
        )
        have += k
    conn.execute("VACUUM ANALYZE pgqueue.archive")


def _preload(conn: psycopg.Connection[object], n: int) -> None:
    for _ in range(n // 1000):
        conn.execute(
            "SELECT count(*) FROM pgqueue.send_batch('bench',"
            " ARRAY(SELECT '{\"n\": 1}'::jsonb FROM generate_series(1, 1000)))"
        )


def run(dsn: str, scale: float, smoke: bool) -> list[str]:
    """Measure each level three times; markdown lines."""
    levels = [0, 10_000] if smoke else [0, int(1_000_000 * scale), int(5_000_000 * scale)]
    waiting = 2_000 if smoke else int(100_000 * scale)
    runs = 1 if smoke else 3
    send_txns = max(50, int(3000 * scale))
    batch_txns = max(5, int(300 * scale))
    rows: list[tuple[str, dict[str, list[float]]]] = []
    with (
        scratch_database(dsn, "bench_growth") as target,
        psycopg.connect(target, autocommit=True) as conn,
    ):
        conn.execute("SELECT pgqueue.create_queue('bench')")

        def measure(keep: bool) -> dict[str, list[float]]:
            return _measure(conn, target, runs, send_txns, batch_txns, keep)

        for level in levels:
            began = time.monotonic()
            _fill_archive(conn, level)
            took = time.monotonic() - began
            print(f"  growth: {level:,} archived rows ({took:.0f} s to fill)")
            rows.append((f"{level:,} archived rows", measure(keep=False)))
        _preload(conn, waiting)
        label = f"{levels[-1]:,} archived + {waiting:,} visible waiting"
        rows.append((label, measure(keep=True)))
    base = rows[0][1]
    lines = [
        "## 5. Cost growth (messages/s, pgbench, 1 connection; pgqueue only)",
        "",
        "| state | send | read+delete batch 100 | read+archive batch 100"
        " | vs empty (send / delete / archive) |",
        "|---|---|---|---|---|",
    ]
    for label, got in rows:
        cells = []
        rel = []
        for key in ("send", "read+delete", "read+archive"):
            xs = got[key]
            cells.append(f"{statistics.median(xs):,.0f} ({min(xs):,.0f}-{max(xs):,.0f})")
            rel.append(f"{statistics.median(xs) / statistics.median(base[key]):.0%}")
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {' / '.join(rel)} |")
    return [*lines, ""]


def _measure(
    conn: psycopg.Connection[object],
    target: str,
    runs: int,
    send_txns: int,
    batch_txns: int,
    keep: bool,
) -> dict[str, list[float]]:
    """Send, then read+ack each way, `runs` times; keep: leave what waits in the queue."""
    got: dict[str, list[float]] = {}
    for _ in range(runs):
        conn.execute("CHECKPOINT")
        got.setdefault("send", []).append(
            pgbench(target, SEND, Scenario("send", "send", 1, 1, send_txns))
        )
        for name, script in ACKS:
            # reads take the oldest first: top up what this run will take
            _preload(conn, batch_txns * 100 + 1000)
            sc = Scenario(name, "read_delete", 1, 100, batch_txns)
            got.setdefault(name, []).append(pgbench(target, script, sc))
        if not keep:
            conn.execute("SELECT pgqueue.purge_queue('bench')")
            conn.execute("VACUUM ANALYZE pgqueue.message")
    return got
