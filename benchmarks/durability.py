"""What each durability choice costs: sends and acks on a primary with a standby.

A pg_auto_failover formation (a monitor, a primary and one synchronous
standby; the failover soak's engine, tests/soak/failover.py) on local ports,
freshly migrated, nothing ANALYZEd. The same queue is driven under three
`synchronous_commit` settings, chosen per session through the DSN's
`options`, in interleaved rounds (A B C A B C ...):

- `local`: asynchronous; a commit waits for the primary's own disk only;
- `on`: a commit also waits until the standby has flushed its WAL (what
  pg_auto_failover sets up by default);
- `remote_apply`: a commit waits until the standby has applied it.

For each: the latency of one send from one producer (median and p99), the
sends per second of 8 producers, and the latency of one worker-style ack (a
read of one message and its fenced delete). The standby is on the same
machine: the round trip to it is a loopback, so these are lower bounds of
what a standby in another zone costs. Medians of the rounds, and each
setting's ratio to `local`.

    python -m benchmarks.durability                  # 3 rounds
    python -m benchmarks.durability --rounds 1 --sends 100
"""

from __future__ import annotations

import argparse
import atexit
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from psycopg.conninfo import make_conninfo

from benchmarks.common import write_results
from pgqueue import Client

SETTINGS = ("local", "on", "remote_apply")
QUEUE = "durability"


def _engine() -> Any:
    """The failover soak's module (its Formation), from this source checkout."""
    soak = Path(__file__).resolve().parent.parent / "tests" / "soak"
    sys.path.insert(0, str(soak))
    import failover

    return failover


def send_latencies(dsn: str, n: int) -> list[float]:
    """Seconds for each of n sends from one producer."""
    out = []
    with Client.from_dsn(dsn, max_size=1) as client:
        client.send(QUEUE, {"warm": True})
        for i in range(n):
            started = time.perf_counter()
            client.send(QUEUE, {"i": i, "pad": "x" * 200})
            out.append(time.perf_counter() - started)
    return out


def throughput(dsn: str, producers: int, seconds: float) -> float:
    """Sends per second of `producers` threads sending one message per call."""
    counts = [0] * producers
    stop = threading.Event()
    with Client.from_dsn(dsn, max_size=producers) as client:

        def produce(slot: int) -> None:
            while not stop.is_set():
                client.send(QUEUE, {"slot": slot})
                counts[slot] += 1

        threads = [threading.Thread(target=produce, args=(i,)) for i in range(producers)]
        started = time.perf_counter()
        for t in threads:
            t.start()
        time.sleep(seconds)
        stop.set()
        for t in threads:
            t.join()
        return sum(counts) / (time.perf_counter() - started)


def ack_latencies(dsn: str, n: int) -> list[float]:
    """Seconds for each of n read-one-then-fenced-delete rounds."""
    out = []
    with Client.from_dsn(dsn, max_size=1) as client:
        client.send_batch(QUEUE, [{"i": i} for i in range(n)])
        with client.connection() as conn:
            conn.autocommit = True
            for _ in range(n):
                started = time.perf_counter()
                (msg,) = client.read(QUEUE, vt=30, conn=conn)
                conn.execute(
                    "SELECT * FROM pgqueue.delete(%s, %s::bigint[], %s::timestamptz[])",
                    (QUEUE, [msg.msg_id], [msg.enqueued_at]),
                ).fetchall()
                out.append(time.perf_counter() - started)
    return out


def p99(xs: list[float]) -> float:
    """The 99th percentile."""
    return statistics.quantiles(xs, n=100)[98]


def measure(uri: str, rounds: int, sends: int, seconds: float) -> dict[str, dict[str, float]]:
    """Per setting: the medians over the rounds of each figure."""
    figures: dict[str, dict[str, list[float]]] = {s: {} for s in SETTINGS}
    with Client.from_dsn(uri) as admin:
        admin.migrate()
        admin.create_queue(QUEUE)
    for r in range(rounds):
        for setting in SETTINGS:
            dsn = make_conninfo(uri, options=f"-c synchronous_commit={setting}")
            lat = send_latencies(dsn, sends)
            acks = ack_latencies(dsn, sends // 2)
            rate = throughput(dsn, 8, seconds)
            with Client.from_dsn(uri) as admin:
                admin.purge_queue(QUEUE)
            got = figures[setting]
            got.setdefault("send median (ms)", []).append(statistics.median(lat) * 1000)
            got.setdefault("send p99 (ms)", []).append(p99(lat) * 1000)
            got.setdefault("sends/s, 8 producers", []).append(rate)
            got.setdefault("read + ack median (ms)", []).append(statistics.median(acks) * 1000)
            print(f"round {r + 1} {setting}: {statistics.median(lat) * 1000:.2f} ms, {rate:.0f}/s")
    return {s: {k: statistics.median(v) for k, v in f.items()} for s, f in figures.items()}


def table(result: dict[str, dict[str, float]], rounds: int, sends: int) -> str:
    """The markdown table: each figure per setting, with its ratio to `local`."""
    names = list(result["local"])
    head = "| synchronous_commit | " + " | ".join(names) + " |"
    rows = [head, "|" + "---|" * (len(names) + 1)]
    for setting in SETTINGS:
        cells = []
        for name in names:
            value = result[setting][name]
            ratio = value / result["local"][name]
            cells.append(f"{value:,.2f}" + ("" if setting == "local" else f" ({ratio:.2f}x)"))
        rows.append(f"| `{setting}` | " + " | ".join(cells) + " |")
    return (
        "# Durability settings: what a synchronous standby costs\n\n"
        f"`python -m benchmarks.durability --rounds {rounds} --sends {sends}`: a primary and"
        " one standby (pg_auto_failover) on this machine, medians of the rounds; in"
        " brackets, the ratio to `local`.\n\n" + "\n".join(rows)
    )


def main() -> None:
    """Build the formation, measure, tear it down, print and keep the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sends", type=int, default=400)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    failover = _engine()
    if reason := failover.skip_reason():
        print(f"skipped: {reason}")
        return
    workdir = Path(tempfile.mkdtemp(prefix="pgqueue-durability-"))
    os.chmod(workdir, 0o755)  # the engine runs as postgres below it
    formation = failover.Formation(workdir / "engine", 2)
    atexit.register(formation.teardown)
    try:
        formation.create(timeout=120)
        result = measure(formation.uri(), args.rounds, args.sends, args.seconds)
    finally:
        formation.teardown()
    write_results("durability", table(result, args.rounds, args.sends))


if __name__ == "__main__":
    main()
