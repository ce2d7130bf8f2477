"""pgqueue before and after a change: the suite's own sections, run from two checkouts in turn.

    git worktree add /tmp/before <commit>
    python -m benchmarks.before_after --before /tmp/before --runs 3 --only sql,e2e

Each round runs `python -m benchmarks --private --runs 1 --only ...` once in
the other checkout (with its own code and migrations) and once in this one,
A B A B ..., each on a fresh stock cluster, so the machine's drift hits both
alike. The table gives pgqueue's median of each row, both ways, and the ratio
after/before with the ratio of each round's pair; the peers' columns are left
out (they are the same code both times).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import RESULTS

HERE = Path(__file__).resolve().parents[1]


def pgqueue_column(markdown: str) -> dict[str, float]:
    """Row name -> pgqueue's figure, from the tables of one suite run (sections 0 to 2)."""
    rows: dict[str, float] = {}
    header: list[str] = []
    for line in markdown.splitlines():
        if not line.startswith("| "):
            header = [] if not line.strip() else header
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not header:
            header = cells
            continue
        if set(cells[0]) <= {"-"}:
            continue
        column = next((i for i, h in enumerate(header) if h.startswith("pgqueue")), None)
        if column is None or column >= len(cells):
            continue
        figure = cells[column].split(" ")[0].replace(",", "")
        try:
            rows[cells[0]] = float(figure)
        except ValueError:
            continue
    return rows


def run_suite(checkout: Path, only: str, skip: str) -> dict[str, float]:
    """pgqueue's figures of one run of the suite from that checkout, on a fresh cluster."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "suite.md"
        env = dict(os.environ, PYTHONPATH=str(checkout))
        subprocess.run(
            [sys.executable, "-m", "benchmarks", "--private", "--runs", "1", "--only", only]
            + (["--skip", skip] if skip else [])
            + ["--out", str(out)],
            cwd=checkout,
            env=env,
            check=True,
            capture_output=True,
        )
        return pgqueue_column(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, type=Path, help="checkout of the code before")
    ap.add_argument("--runs", type=int, default=3, help="rounds (one run of each per round)")
    ap.add_argument("--only", default="sql,e2e", help="the suite's sections [sql,e2e]")
    ap.add_argument("--skip", default="Procrastinate,PgQueuer", help="peers to leave out")
    ap.add_argument("--out", default="before_after", help="results file name in results/")
    args = ap.parse_args()
    before: list[dict[str, float]] = []
    after: list[dict[str, float]] = []
    for i in range(args.runs):
        before.append(run_suite(args.before.resolve(), args.only, args.skip))
        after.append(run_suite(HERE, args.only, args.skip))
        print(f"round {i + 1} of {args.runs} done", file=sys.stderr)
    lines = [
        f"`python -m benchmarks.before_after --before <checkout> --runs {args.runs}"
        f" --only {args.only}`: pgqueue's figures (messages/s), medians of {args.runs}"
        " interleaved runs, each on a fresh stock cluster.",
        "",
        "| scenario | before | after | after/before | each round |",
        "|---|---|---|---|---|",
    ]
    for row in before[0]:
        b = [r[row] for r in before if row in r]
        a = [r[row] for r in after if row in r]
        if not a or not b:
            continue
        pairs = " ".join(f"{y / x:.2f}" for x, y in zip(b, a, strict=False))
        ratio = statistics.median(a) / statistics.median(b)
        lines.append(
            f"| {row} | {statistics.median(b):,.0f} | {statistics.median(a):,.0f}"
            f" | {ratio:.2f}x | {pairs} |"
        )
    text = "\n".join(lines) + "\n"
    (RESULTS / f"{args.out}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
