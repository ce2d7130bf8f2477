"""The `pgqueue` command: migrate and demo, in-process and as real subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import psycopg
from click.testing import CliRunner

from pgqueue._cli import main
from pgqueue._migrate import available


def test_migrate_applies_then_reports_up_to_date(empty_dsn: str) -> None:
    runner = CliRunner()
    first = runner.invoke(main, ["migrate", "--dsn", empty_dsn])
    assert first.exit_code == 0, first.output
    names = [m.name for m in available()]
    assert f"applied {len(names)} migration(s): {', '.join(names)}" in first.output
    again = runner.invoke(main, ["migrate", "--dsn", empty_dsn])
    assert again.exit_code == 0 and "up to date" in again.output


def test_an_operators_command_that_succeeds_says_it_on_stdout_and_nothing_on_stderr(
    empty_dsn: str,
) -> None:
    """Its output says what it did; INFO lines (one per migration) were noise on stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_LOG")}
    for args in (["migrate"], ["queue", "create", "jobs"], ["send", "jobs", "{}"]):
        result = subprocess.run(
            [sys.executable, "-m", "pgqueue", *args, "--dsn", empty_dsn],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout and result.stderr == "", (args, result.stderr)
    loud = subprocess.run(
        [sys.executable, "-m", "pgqueue", "queue", "create", "more", "--dsn", empty_dsn],
        env=dict(env, PGQUEUE_LOG_LEVEL="DEBUG"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert loud.returncode == 0 and loud.stderr  # the level is still the user's to raise


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
        timeout=120,  # an outer bound: a refused connection ends it at once
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
    assert "next, in this shell:" in out
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


def pgqueue_cmd(*args: str, input: str | None = None, timeout: float = 60) -> Any:
    """Run the installed command as a user would: a real process, real pipes."""
    env = {k: v for k, v in os.environ.items() if k not in ("PGQUEUE_DSN", "DATABASE_URL")}
    return subprocess.run(
        [sys.executable, "-m", "pgqueue", *args],
        input=input,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_operator_session_as_real_processes(dsn: str) -> None:
    assert (
        pgqueue_cmd("queue", "create", "jobs", "--max-attempts", "1", "--dsn", dsn).returncode == 0
    )
    lines = "".join(json.dumps({"n": n}) + "\n" for n in range(50))
    sent = pgqueue_cmd("send", "jobs", "--dsn", dsn, input=lines)
    assert (
        sent.returncode == 0 and sent.stdout == "sent 50 messages to queue 'jobs' (msg_ids 1..50)\n"
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT count(*) FROM pgqueue.read('jobs', 0, 50)")
        conn.execute("SELECT count(*) FROM pgqueue.read('jobs', 30, 50)")  # poison drop
    listed = pgqueue_cmd("poison", "list", "jobs", "--json", "--limit", "100", "--dsn", dsn)
    assert listed.returncode == 0, listed.stderr
    assert sorted(p["msg_id"] for p in json.loads(listed.stdout)) == list(range(1, 51))
    refused = pgqueue_cmd("poison", "requeue", "jobs", "--all", "--dsn", dsn, input="")
    assert refused.returncode == 1 and "nothing was changed" in refused.stderr
    requeued = pgqueue_cmd("poison", "requeue", "jobs", "--all", "--yes", "--dsn", dsn)
    new_ids = ", ".join(map(str, range(51, 71)))  # the new msg_ids, the first 20 of them
    assert requeued.returncode == 0 and requeued.stdout == (
        f"requeued 50 messages to queue 'jobs' as new msg_ids {new_ids} and 30 more"
        " (--json lists all)\n"
    )
    with psycopg.connect(dsn) as conn:
        live = conn.execute("SELECT count(*), max(read_ct) FROM pgqueue.message").fetchone()
        poison = conn.execute("SELECT count(*) FROM pgqueue.poison").fetchone()
    assert live == (50, 0) and poison == (0,)
    bad = pgqueue_cmd("poison", "list", "--since", "yesterday", "--dsn", dsn)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr


def test_a_dsn_that_does_not_answer_fails_in_seconds_for_every_command() -> None:
    dead = "postgresql://x@127.0.0.1:1/db"
    for args in (["poison", "list"], ["send", "jobs", "{}"], ["barrier", "show", "b"]):
        result = pgqueue_cmd(*args, "--dsn", dead, "--connect-timeout", "1", timeout=120)
        assert result.returncode == 1, args
        assert result.stderr.startswith("pgqueue: error: could not connect to x@127.0.0.1:1/db")
        assert result.stderr.count("\n") == 1


def test_bulk_work_shows_a_progress_bar_on_a_terminal(client: Any, dsn: str) -> None:
    import pty

    client.create_queue("jobs", max_attempts=1)
    for msg_id in client.send_batch("jobs", [{} for _ in range(1200)]):
        client.poison("jobs", msg_id, "seed")
    leader, follower = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k not in ("PGQUEUE_DSN", "DATABASE_URL")}
    args = ["poison", "requeue", "jobs", "--all", "--yes", "--dsn", dsn]
    result = subprocess.run(
        [sys.executable, "-m", "pgqueue", *args],
        stdout=subprocess.PIPE,
        stderr=follower,
        stdin=follower,
        env=env,
        timeout=60,
    )
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the terminal closed
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    assert result.returncode == 0
    assert result.stdout.startswith(b"requeued 1200 messages to queue 'jobs' as new msg_ids ")
    assert b"requeue jobs" in seen and b"100%" in seen  # the bar, on the terminal only
