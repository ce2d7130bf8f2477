"""What one scrape of `pgqueue exporter` costs, however many queues there are.

A fresh database (nothing ANALYZEd or VACUUMed), Q queues, M live messages in
each, a tenth of the queues with half their messages leased, and a few open
barriers. It times the exporter's collector end to end (the one query and the
exposition text), and the query alone, beside `metrics_all()`, and prints a
table of medians. The scratch database is dropped at the end.

    python -m benchmarks.exporter_scrape [--dsn DSN] [--queues 1000] [--messages 100]
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
from prometheus_client import generate_latest

from pgqueue import Client
from pgqueue._metrics import exporter_registry

LOCAL_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"


@contextmanager
def scratch_database(admin_dsn: str) -> Iterator[str]:
    """A new database on admin_dsn's server, dropped afterwards however the run ends."""
    name = f"pgq_scrape_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    params = psycopg.conninfo.conninfo_to_dict(admin_dsn)
    params["dbname"] = name
    try:
        yield psycopg.conninfo.make_conninfo("", **params)
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def median_ms(fn: Callable[[], object], runs: int) -> tuple[float, float]:
    """Median and max of fn's wall time over runs, in milliseconds."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), max(times)


def main() -> None:
    """Fill a fresh database and print the scrape's cost."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.exporter_scrape")
    ap.add_argument("--dsn", default=LOCAL_DSN, help="a server where databases may be created")
    ap.add_argument("--queues", type=int, default=1000)
    ap.add_argument("--messages", type=int, default=100, help="live messages per queue")
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    with scratch_database(args.dsn) as dsn, Client.from_dsn(dsn) as client:
        client.migrate()
        names = [f"q{i:04d}" for i in range(args.queues)]
        for name in names:
            client.create_queue(name)
            client.send_batch(name, [{"i": j} for j in range(args.messages)])
        for name in names[::10]:
            client.read(name, vt=600, qty=args.messages // 2)
        for name in names[:5]:
            client.fan_out(name, [{"m": 1}, {"m": 2}], callback_queue=name, callback_message={})
        registry = exporter_registry(client.run)
        body = generate_latest(registry)
        with psycopg.connect(dsn, autocommit=True) as conn:
            live = conn.execute("SELECT count(*) FROM pgqueue.message").fetchone()
            rows = [
                (
                    "full scrape (query and exposition)",
                    *median_ms(lambda: generate_latest(registry), args.runs),
                ),
                (
                    "pgqueue.exporter_metrics() alone",
                    *median_ms(
                        lambda: conn.execute("SELECT * FROM pgqueue.exporter_metrics()").fetchall(),
                        args.runs,
                    ),
                ),
                (
                    "pgqueue.metrics_all(), for comparison",
                    *median_ms(
                        lambda: conn.execute("SELECT * FROM pgqueue.metrics_all()").fetchall(),
                        args.runs,
                    ),
                ),
            ]
    print(
        f"{args.queues} queues, {live[0] if live else 0} live messages, never analyzed;"
        f" {len(body)} bytes of exposition; {args.runs} runs each"
    )
    print()
    print("| what | median ms | max ms |")
    print("|---|---:|---:|")
    for what, med, worst in rows:
        print(f"| {what} | {med:.1f} | {worst:.1f} |")


if __name__ == "__main__":
    main()
