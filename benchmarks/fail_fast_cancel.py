"""How fast a fail_fast barrier cancels what is left, and whether that stays flat.

For each size, a fresh database (never analyzed by hand) gets `--others`
finished barriers first (the barrier tables grown, as in a long-lived
install), then a fail_fast fan-out of N members; one member fails, and the
time of that one completion, which fires the barrier and cancels the N - 1
others in its transaction, is measured. Reported: the median over --runs,
and the cost per cancelled member, which should not grow with N or with the
barriers already there.

    python -m benchmarks.fail_fast_cancel --sizes 1000,10000,100000 --runs 3
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks.common import DEFAULT_DSN, scratch_database, write_results
from pgqueue import Client


def one(dsn: str, n: int, others: int) -> float:
    """Seconds for the failing completion that cancels n - 1 members."""
    with scratch_database(dsn, "bench_cancel") as db, Client.from_dsn(db) as client:
        client.create_queue("work")
        client.create_queue("done")
        for _ in range(others // 1000):
            bid = client.fan_out(
                "work", [0] * 1000, callback_queue="done", callback_message={}, policy="fail_fast"
            )
            msgs = client.read("work", vt=60, qty=1)
            client.complete_member("work", msgs[0].msg_id, outcome="failed")
            assert client.barrier_status(bid).cancelled == 999
        client.purge_queue("done")
        bid = client.fan_out(
            "work",
            [{"i": i} for i in range(n)],
            callback_queue="done",
            callback_message={},
            policy="fail_fast",
        )
        [first] = client.read("work", vt=60, qty=1)
        began = time.perf_counter()
        client.complete_member("work", first.msg_id, outcome="failed")
        took = time.perf_counter() - began
        s = client.barrier_status(bid)
        assert (s.outcome, s.cancelled) == ("failed", n - 1), s
        return took


def main() -> None:
    """Measure each size --runs times; print and write the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dsn", default=DEFAULT_DSN)
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--others", type=int, default=20_000, help="members of earlier barriers")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    rows = [
        "| members | earlier barriers' members | cancel, median (s) | per cancelled member (µs) |",
        "|---:|---:|---:|---:|",
    ]
    for n in sizes:
        for others in (0, args.others):
            times = [one(args.dsn, n, others) for _ in range(args.runs)]
            med = statistics.median(times)
            rows.append(f"| {n:,} | {others:,} | {med:.3f} | {med / max(n - 1, 1) * 1e6:.1f} |")
            print(rows[-1], flush=True)
    table = "\n".join(
        [
            "# fail_fast: cancelling what is left",
            "",
            f"Command: `python -m benchmarks.fail_fast_cancel --sizes {args.sizes}"
            f" --others {args.others} --runs {args.runs}`; fresh databases, never analyzed"
            " by hand; the time of the one failing completion that fires the barrier and"
            " cancels every other member in its transaction.",
            "",
            *rows,
        ]
    )
    write_results("fail_fast_cancel", table)


if __name__ == "__main__":
    main()
