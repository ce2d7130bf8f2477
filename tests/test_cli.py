"""The `pgqueue` command: migrate and demo, in-process and as real subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
from click.testing import CliRunner

from pgqueue.cli import main
from pgqueue.migrate import available


def test_migrate_applies_then_reports_up_to_date(empty_dsn: str) -> None:
    runner = CliRunner()
    first = runner.invoke(main, ["migrate", "--dsn", empty_dsn])
    assert first.exit_code == 0, first.output
    names = [m.name for m in available()]
    assert f"applied {len(names)} migration(s): {', '.join(names)}" in first.output
    again = runner.invoke(main, ["migrate", "--dsn", empty_dsn])
    assert again.exit_code == 0 and "up to date" in again.output


def test_migrate_without_any_dsn_says_how_to_give_one(monkeypatch: object) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PGQUEUE_DSN", "DATABASE_URL")}
    result = subprocess.run(
        [sys.executable, "-m", "pgqueue", "migrate"], env=env, capture_output=True, text=True
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "pgqueue: error: no database given: pass a DSN (--dsn), or set PGQUEUE_DSN"
        " (or DATABASE_URL), e.g. postgresql://user@localhost:5432/dbname"
    ]


def test_migrate_against_a_dead_server_is_one_line_and_exit_1() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pgqueue",
            "migrate",
            "--dsn",
            "postgresql://x@127.0.0.1:1/db",
            "--connect-timeout",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("pgqueue: error: could not connect to x@127.0.0.1:1/db")


def test_demo_against_a_server_shows_the_whole_idea(dsn: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pgqueue", "demo", "--dsn", dsn],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "fanned out 100 orders" in out
    assert "attempt 3 of 3" in out
    assert "_pg_transport=True" in out and "succeeded=99 failed=1" in out
    assert "barrier fired exactly once: 1 callback" in out
    assert "$ pgqueue poison list demo_orders" in out and "LookupError" in out
    assert "next:" in out
    with psycopg.connect(dsn) as conn:
        barriers = conn.execute(
            "SELECT state, succeeded, failed, callback_msg_id IS NOT NULL FROM pgqueue.barrier"
        ).fetchall()
        poison = conn.execute("SELECT msg_id, read_ct, reason FROM pgqueue.poison").fetchall()
        live = conn.execute("SELECT count(*) FROM pgqueue.message").fetchone()
    assert barriers == [("fired", 99, 1, True)]
    assert [(p[0], p[1]) for p in poison] == [(57, 3)]
    assert "last error: LookupError: SKU-UNKNOWN is not in the catalogue" in poison[0][2]
    assert live == (0,)  # every order and the callback acked


def test_demo_runs_again_on_the_same_database(dsn: str) -> None:
    runner = CliRunner()
    for _ in range(2):
        result = runner.invoke(main, ["demo", "--dsn", dsn])
        assert result.exit_code == 0, result.output
        assert "succeeded=99 failed=1" in result.stdout
    with psycopg.connect(dsn) as conn:
        fired = conn.execute("SELECT count(*) FROM pgqueue.barrier WHERE state = 'fired'")
        assert fired.fetchone() == (2,)
        assert conn.execute("SELECT count(*) FROM pgqueue.poison").fetchone() == (1,)


def test_demo_with_no_dsn_runs_on_the_embedded_postgres(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PGQUEUE_DSN", "DATABASE_URL")}
    env["XDG_CACHE_HOME"] = str(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "pgqueue", "demo"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    assert "starting the embedded Postgres" in result.stdout
    assert "succeeded=99 failed=1" in result.stdout
