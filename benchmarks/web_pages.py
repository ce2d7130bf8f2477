"""How long each dashboard page takes with a big install behind it.

A fresh database gets --queues queues (100 live messages in each of the
first 100), --poison poison rows spread over them, --barriers finished
barriers of 10 members each, one open fan-out of --members members of which
all but two are done (one of those two failed first), --workflows
four-step workflows and a registered worker. The data goes in with
set-based INSERTs as the schema's owner (the barrier and workflow rows
through the API), and nothing is ANALYZEd or VACUUMed by hand: autovacuum
does what it does for any user. Then each page is requested --requests
times through the app in process (httpx's ASGI transport: the request,
the SQL, the template; no network), and the median and p95 are reported.
The overview is measured with its shared snapshot warm (the figures of the
last 5 s, as every viewer but one sees them) and cold (each request runs
the snapshot's query itself).

    python -m benchmarks.web_pages                  # 1,000 / 1,000,000 / 10,000
    python -m benchmarks.web_pages --smoke          # small, for the test suite
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from typing import Any

import httpx
import psycopg

from benchmarks.common import DEFAULT_DSN, scratch_database, write_results
from pgqueue import Client, Step


def load(
    dsn: str, queues: int, poison: int, barriers: int, members: int, flows: int
) -> dict[str, Any]:
    """Fill the database; what the pages will be asked for."""
    started = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "SELECT pgqueue.create_queue('q' || lpad(i::text, 4, '0'))"
            " FROM generate_series(1, %s) i",
            (queues,),
        )
        # live messages in the first 100 queues, through send_batch (as producers do)
        conn.execute(
            "SELECT pgqueue.send_batch('q' || lpad(i::text, 4, '0'),"
            " array_fill('{\"n\": 1}'::jsonb, ARRAY[100]))"
            " FROM generate_series(1, least(%s, 100)) i",
            (queues,),
        )
        conn.execute(
            "INSERT INTO pgqueue.poison (queue_id, msg_id, read_ct, enqueued_at, poisoned_at,"
            " reason, message)"
            " SELECT q.queue_id, 1000000 + g, 5, now() - interval '2 days',"
            "        now() - make_interval(secs => g / 10.0),"
            "        CASE WHEN g %% 10000 = 0 THEN 'attempts exhausted: RareError: vendor down'"
            "             ELSE 'attempts exhausted: ValueError: bad input ' || g END,"
            "        jsonb_build_object('order', g, 'lines', jsonb_build_array(1, 2, 3))"
            "   FROM generate_series(1, %s) g"
            "   JOIN pgqueue.queue q ON q.queue_id = (SELECT min(queue_id) FROM pgqueue.queue)"
            "        + g %% %s",
            (poison, queues),
        )
    with Client.from_dsn(dsn) as client:
        client.create_queue("work", max_attempts=3)
        client.create_queue("done")
        for start in range(0, barriers, 500):
            with client.connection() as conn, conn.transaction():
                for i in range(start, min(start + 500, barriers)):
                    client.fan_out(
                        "work",
                        [{"i": j} for j in range(10)],
                        barrier_id=f"batch-{i:05}",
                        callback_queue="done",
                        callback_message={"batch": i},
                        conn=conn,
                    )
            ids = [
                r[0]
                for r in conn_rows(
                    dsn,
                    "SELECT msg_id FROM pgqueue.message m"
                    " JOIN pgqueue.queue q USING (queue_id) WHERE q.queue_name = 'work'",
                )
            ]
            for chunk in range(0, len(ids), 1000):
                client.complete_members("work", ids[chunk : chunk + 1000])
        client.fan_out(
            "work",
            [{"line": j} for j in range(members)],
            barrier_id="big-fan-out",
            callback_queue="done",
            callback_message={"big": True},
        )
        ids = sorted(
            r[0]
            for r in conn_rows(
                dsn, "SELECT msg_id FROM pgqueue.barrier_member WHERE barrier_id = 'big-fan-out'"
            )
        )
        client.complete_member("work", ids[0], outcome="failed", result={"error": "declined"})
        for chunk in range(1, len(ids) - 2, 1000):
            client.complete_members("work", ids[chunk : min(chunk + 1000, len(ids) - 2)])
        client.read("work", vt=600, qty=1)
        for i in range(flows):
            client.start_workflow(
                f"flow-{i:04}",
                [
                    Step("extract", "work", {"f": i}),
                    Step("transform", "work", {"f": i}, depends_on=("extract",)),
                    Step("audit", "work", {"f": i}, depends_on=("extract",)),
                    Step("load", "work", {"f": i}, depends_on=("transform", "audit")),
                ],
            )
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "SELECT * FROM pgqueue.worker_heartbeat(%s, 'bench-host', 4242, ARRAY['work'],"
                " 8, 3, now(), false, '{}', '{}', '{}', '{}')",
                (uuid.uuid4(),),
            )
            cursor_row = conn.execute(
                "SELECT poisoned_at, queue_id, msg_id FROM pgqueue.poison"
                " ORDER BY poisoned_at DESC, queue_id DESC, msg_id DESC OFFSET 500 LIMIT 1"
            ).fetchone()
            some = conn.execute(
                "SELECT msg_id FROM pgqueue.poison p JOIN pgqueue.queue q USING (queue_id)"
                " WHERE q.queue_name = %s LIMIT 1",
                (f"q{min(queues, 500):04}",),
            ).fetchone()
    cursor = None
    if cursor_row is not None:
        cursor = json.dumps([cursor_row[0].isoformat(), cursor_row[1], cursor_row[2]])
    return {
        "seconds": time.perf_counter() - started,
        "cursor": cursor,
        "poison_id": some[0] if some else None,
        "queue": f"q{min(queues, 500):04}",
    }


def conn_rows(dsn: str, sql: str) -> list[tuple[Any, ...]]:
    """One query's rows on a connection of its own."""
    with psycopg.connect(dsn) as conn:
        return conn.execute(sql).fetchall()


def pages(info: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, path) of every page measured."""
    q = info["queue"]
    out = [
        ("overview (warm snapshot)", "/"),
        ("overview, sorted by poison, page 5", "/?sort=poison&dir=desc&page=5"),
        ("overview, filtered", "/?q=q05"),
        ("queue", f"/queue?name={q}"),
        ("queue with 100 live messages", "/queue?name=q0001"),
        ("poison, all queues", "/poison"),
        ("poison, one queue", f"/poison?queue={q}"),
        ("poison, reason matching 1 in 10,000", "/poison?reason=RareError"),
        ("poison, reason matching nothing (capped scan)", "/poison?reason=no-such-text"),
        ("poison, last 15 minutes", "/poison?since=15m"),
        (
            "poison, confirm all of one queue (count)",
            f"/poison/confirm?action=requeue&all=1&queue={q}",
        ),
        ("barriers", "/barriers"),
        ("barriers, open", "/barriers?state=open"),
        ("barrier, 2 pending of the big fan-out", "/barrier?id=big-fan-out"),
        ("barrier, fired", "/barrier?id=batch-00007"),
        ("workflows", "/workflows"),
        ("workflow", "/workflow?id=flow-0001"),
        ("workers", "/workers"),
    ]
    if info["cursor"]:
        out.insert(
            6,
            (
                "poison, 10 pages deep",
                "/poison?" + httpx.QueryParams({"cursor": info["cursor"]}).__str__(),
            ),
        )
    if info["poison_id"]:
        out.insert(7, ("poison message", f"/poison/message?queue={q}&id={info['poison_id']}"))
    return out


async def measure(dsn: str, info: dict[str, Any], requests: int) -> list[tuple[str, float, float]]:
    """(label, median ms, p95 ms) of every page, and of the cold overview."""
    from pgqueue.web import create_app

    app = create_app(dsn, allow_owner=True)
    results = []
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://dash") as http:
        for label, path in pages(info):
            times = []
            for _ in range(requests + 2):  # the first two warm the pool and the plans
                began = time.perf_counter()
                response = await http.get(path)
                times.append((time.perf_counter() - began) * 1000)
                assert response.status_code == 200, (
                    path,
                    response.status_code,
                    response.text[:300],
                )
            results.append(_stats(label, times[2:]))
        snap = app.state.pgqueue.snapshot
        cold, stale = [], []
        for _ in range(max(requests // 3, 3)):
            snap.taken = 0.0  # as at start: the request runs the snapshot's query
            began = time.perf_counter()
            assert (await http.get("/")).status_code == 200
            cold.append((time.perf_counter() - began) * 1000)
            snap.taken = time.monotonic() - 60  # stale: served, and refreshed behind the page
            began = time.perf_counter()
            assert (await http.get("/")).status_code == 200
            stale.append((time.perf_counter() - began) * 1000)
            if snap.task is not None:
                await snap.task
        results.insert(1, _stats("overview, stale snapshot (refreshed behind the page)", stale))
        results.insert(2, _stats("overview, no snapshot yet (runs its query)", cold))
        await app.state.pgqueue.client.close()
    return results


def _stats(label: str, times: list[float]) -> tuple[str, float, float]:
    times = sorted(times)
    return (label, statistics.median(times), times[min(len(times) - 1, int(0.95 * len(times)))])


def main() -> None:
    """Load, measure and write the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dsn", default=DEFAULT_DSN)
    ap.add_argument("--queues", type=int, default=1000)
    ap.add_argument("--poison", type=int, default=1_000_000)
    ap.add_argument("--barriers", type=int, default=10_000)
    ap.add_argument("--members", type=int, default=10_000)
    ap.add_argument("--workflows", type=int, default=100)
    ap.add_argument("--requests", type=int, default=30)
    ap.add_argument("--smoke", action="store_true", help="small sizes, 3 requests a page")
    ap.add_argument("--out", default="web_pages", help="results name (benchmarks/results/NAME.md)")
    args = ap.parse_args()
    if args.smoke:
        args.queues, args.poison, args.barriers, args.members = 20, 2000, 30, 200
        args.workflows, args.requests = 3, 3
    with scratch_database(args.dsn, "bench_web") as db:
        info = load(db, args.queues, args.poison, args.barriers, args.members, args.workflows)
        results = asyncio.run(measure(db, info, args.requests))
        with psycopg.connect(db) as conn:
            analyzed = conn.execute(
                "SELECT coalesce(max(greatest(last_autoanalyze, last_analyze))::text, 'never')"
                " FROM pg_stat_user_tables WHERE schemaname = 'pgqueue' AND relname = 'poison'"
            ).fetchone()[0]
    rows = ["| page | median (ms) | p95 (ms) |", "|---|---:|---:|"]
    rows += [f"| {label} | {med:.1f} | {p95:.1f} |" for label, med, p95 in results]
    slowest = max(results, key=lambda r: r[1])
    table = "\n".join(
        [
            "# Dashboard pages with a big install behind them",
            "",
            f"Command: `python -m benchmarks.web_pages{' --smoke' if args.smoke else ''}`:"
            f" {args.queues:,} queues, {args.poison:,} poison rows, {args.barriers:,} finished"
            f" barriers of 10 members and one open fan-out of {args.members:,} members,"
            f" {args.workflows} workflows; {args.requests} requests a page through the app in"
            f" process; a fresh database, loaded in {info['seconds']:.0f} s, never analyzed by"
            f" hand (autovacuum last analyzed the poison table: {analyzed}).",
            "",
            *rows,
            "",
            f"Slowest median: {slowest[0]}, {slowest[1]:.1f} ms.",
        ]
    )
    write_results(args.out, table)


if __name__ == "__main__":
    main()
