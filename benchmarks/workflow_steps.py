"""What dependency resolution costs a workflow step, and whether it stays flat as tables grow.

A chain of --steps steps is run by one session: read the step's message,
complete it. Each completion ends the step, resolves its dependent and sends
it, all in its transaction. Compared, in the same database, with completing
a lone message that is a member of a one-member barrier (what a step is
without a workflow). Then the same on a database holding --grow earlier
steps (finished and cancelled workflows), never analyzed by hand.

    python -m benchmarks.workflow_steps --steps 1000 --grow 20000 --runs 3
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks.common import DEFAULT_DSN, scratch_database, write_results
from pgqueue import Client, Step


def chain(client: Client, wid: str, n: int) -> list[float]:
    """Seconds of each completion along a chain of n steps."""
    steps = [Step("s0", "steps", 0)] + [
        Step(f"s{i}", "steps", i, depends_on=(f"s{i - 1}",)) for i in range(1, n)
    ]
    client.start_workflow(wid, steps)
    took = []
    for _ in range(n):
        [msg] = client.read("steps", vt=60, qty=1)
        began = time.perf_counter()
        client.complete_member("steps", msg.msg_id)
        took.append(time.perf_counter() - began)
    assert client.workflow_status(wid).state == "succeeded"
    return took


def lone_members(client: Client, n: int) -> list[float]:
    """Seconds of each completion of n one-member barriers (no workflow)."""
    took = []
    for _ in range(n):
        client.fan_out("steps", [0], callback_queue="sink", callback_message={})
        [msg] = client.read("steps", vt=60, qty=1)
        began = time.perf_counter()
        client.complete_member("steps", msg.msg_id)
        took.append(time.perf_counter() - began)
    client.purge_queue("sink")
    return took


def grow(client: Client, steps: int) -> None:
    """Earlier workflows: `steps` steps in all, in workflows of 1,000, sent then cancelled."""
    for k in range(steps // 1000):
        client.start_workflow(f"old-{k}", [Step(f"s{i}", "steps", i) for i in range(1000)])
        client.cancel_workflow(f"old-{k}")


def main() -> None:
    """Measure and write benchmarks/results/workflow_steps.md."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dsn", default=DEFAULT_DSN)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--grow", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    rows = [
        "| database | a chain step's completion, median (ms) | p95 (ms) |"
        " a lone member's completion, median (ms) | step / lone |",
        "|---|---:|---:|---:|---:|",
    ]
    for grown in (0, args.grow):
        steps, lone = [], []
        for run in range(args.runs):
            with scratch_database(args.dsn, "bench_wf") as db, Client.from_dsn(db) as client:
                client.create_queue("steps")
                client.create_queue("sink")
                grow(client, grown)
                steps += chain(client, f"chain-{run}", args.steps)
                lone += lone_members(client, args.steps)
        med, lmed = statistics.median(steps), statistics.median(lone)
        p95 = statistics.quantiles(steps, n=20)[-1]
        rows.append(
            f"| {'fresh' if not grown else f'{grown:,} earlier steps'} | {med * 1e3:.2f} |"
            f" {p95 * 1e3:.2f} | {lmed * 1e3:.2f} | {med / lmed:.2f}x |"
        )
        print(rows[-1], flush=True)
    write_results(
        "workflow_steps",
        "\n".join(
            [
                "# Workflows: the cost of resolving a step",
                "",
                f"Command: `python -m benchmarks.workflow_steps --steps {args.steps}"
                f" --grow {args.grow} --runs {args.runs}`; fresh databases, never analyzed by"
                " hand. A chain step's completion ends the step, resolves its dependent and"
                " sends it, in one transaction; a lone member's is the same completion without"
                " a workflow.",
                "",
                *rows,
            ]
        ),
    )


if __name__ == "__main__":
    main()
