"""The benchmark suite's smoke run: every system and scenario still runs end to end.

It asserts no timing (the machines are shared and noisy); it keeps the
benchmarks from rotting and checks that they measure what they say.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.db import LOCAL_DSN, answers
from support.extras import needs_extra

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.bench
@pytest.mark.skipif(not answers(LOCAL_DSN), reason="needs the local server (pgbench beside it)")
def test_the_suite_runs_in_smoke_mode(tmp_path: Path) -> None:
    for peer in ("pgmq", "pgqueuer", "asyncpg", "procrastinate"):
        pytest.importorskip(peer, reason="the peers come with pip install -e '.[bench]'")
    out = tmp_path / "suite.md"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks",
            "--smoke",
            "--dsn",
            LOCAL_DSN,
            "--out",
            str(out),
            "--only",
            "sql,enqueue,e2e,latency,barrier,growth,mvcc,pgmq",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    text = out.read_text()
    for section in (
        "## 0.",
        "## 1. Enqueue",
        "## 2. End to end",
        "## 3. Latency",
        "## 4.",
        "## 5.",
        "## 6. MVCC pressure",
        "## 7. The PGMQ client",
    ):
        assert section in text
    for system in ("pgqueue", "PGMQ", "PgQueuer", "Procrastinate"):
        assert f"{system} msg/s" in text, system
    assert "failed" not in text, text


@pytest.mark.bench
@pytest.mark.skipif(not answers(LOCAL_DSN), reason="needs the local server")
def test_the_dashboard_benchmark_runs_in_smoke_mode(tmp_path: Path) -> None:
    needs_extra("web")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.web_pages",
            "--smoke",
            "--dsn",
            LOCAL_DSN,
            "--out",
            str(tmp_path / "web_pages"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    text = (tmp_path / "web_pages.md").read_text()
    for page in ("overview (warm snapshot)", "poison, 10 pages deep", "barrier, 2 pending"):
        assert f"| {page}" in text, page
    assert text.count("\n|") >= 20  # every page measured


@pytest.mark.bench
@pytest.mark.skipif(
    shutil.which("valgrind") is None, reason="needs valgrind (apt-get install valgrind)"
)
def test_the_instruction_count_benchmark_counts_both_systems(tmp_path: Path) -> None:
    pytest.importorskip("pgmq", reason="the peers come with pip install -e '.[bench]'")
    out = tmp_path / "instructions.md"
    # a what-if that changes nothing measured; real PGMQ's database has no pgqueue.message,
    # so it would fail there: it runs on the facade's alone
    what_if = tmp_path / "what_if.sql"
    what_if.write_text("ALTER TABLE pgqueue.message ALTER COLUMN read_ct SET DEFAULT 0;")
    result = subprocess.run(
        [
            *(sys.executable, "-m", "benchmarks.pgmq_instructions", "--calls", "pop"),
            *("--out", str(out), "--facade-sql", str(what_if)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    text = out.read_text()
    assert f"also ran {what_if}" in text
    row = next(line for line in text.splitlines() if line.startswith("| pop |"))
    real, facade, ratio = (cell.strip() for cell in row.strip("|").split("|")[1:])
    # a pop is some hundreds of thousands of instructions on either side
    assert 100 <= float(real.rstrip("k").replace(",", "")) <= 5000, row
    assert 100 <= float(facade.rstrip("k").replace(",", "")) <= 5000, row
    assert float(ratio) > 0, row


@pytest.mark.bench
@pytest.mark.skipif(
    shutil.which("valgrind") is None, reason="needs valgrind (apt-get install valgrind)"
)
def test_the_instruction_count_benchmark_says_what_is_wrong_with_a_what_if(
    tmp_path: Path,
) -> None:
    pytest.importorskip("pgmq", reason="the peers come with pip install -e '.[bench]'")
    bad = tmp_path / "bad.sql"
    bad.write_text("ALTER TABLE pgqueue.no_such_table ADD COLUMN x int;")
    out = tmp_path / "instructions.md"

    def run(sql: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                *(sys.executable, "-m", "benchmarks.pgmq_instructions", "--calls", "pop"),
                *("--out", str(out), "--facade-sql", str(sql)),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )

    failed = run(bad)
    assert failed.returncode != 0
    assert "--facade-sql failed" in failed.stderr and "no_such_table" in failed.stderr
    assert "Traceback" not in failed.stderr, failed.stderr[-3000:]
    missing = run(tmp_path / "missing.sql")
    assert missing.returncode != 0 and "cannot read --facade-sql" in missing.stderr
    assert not out.exists()
