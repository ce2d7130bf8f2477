"""`pgqueue queue pause|resume` and `pgqueue workers list`, through click's runner."""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg
from click.testing import CliRunner, Result

from pgqueue import Client
from pgqueue._calls import workers as workers_calls
from pgqueue._cli import main


def cli(dsn: str, *args: str) -> Result:
    """Run `pgqueue ARGS --dsn DSN` in-process; tables one line a row (no $COLUMNS)."""
    return CliRunner().invoke(main, [*args, "--dsn", dsn], env={"COLUMNS": None})


def ok(result: Result) -> str:
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result.stdout


def test_pause_and_resume_say_what_changed_and_queue_list_shows_it(
    dsn: str, client: Client, queue: str
) -> None:
    assert ok(cli(dsn, "queue", "pause", "jobs", "--actor", "alice")) == (
        "paused queue 'jobs': reads get nothing until `pgqueue queue resume jobs`\n"
    )
    again = ok(cli(dsn, "queue", "pause", "jobs"))
    assert again.startswith("queue 'jobs' was already paused (")
    assert again.endswith(" by alice); nothing changed\n")
    assert client.read("jobs") == [] and client.list_queues()[0].paused_by == "alice"
    table = ok(cli(dsn, "queue", "list")).splitlines()
    assert table[0].split() == ["QUEUE", "MAX_ATTEMPTS", "CREATED", "PAUSED"]
    assert table[1].endswith(" by alice")
    [row] = json.loads(ok(cli(dsn, "queue", "list", "--json")))
    assert (row["paused"], row["paused_by"]) == (True, "alice") and row["paused_at"]
    assert ok(cli(dsn, "queue", "resume", "jobs")) == (
        "resumed queue 'jobs': reads get its messages again\n"
    )
    assert ok(cli(dsn, "queue", "resume", "jobs")) == (
        "queue 'jobs' was not paused; nothing changed\n"
    )
    assert json.loads(ok(cli(dsn, "queue", "pause", "jobs", "--json"))) == {
        "queue": "jobs",
        "paused": True,
        "changed": True,
    }
    assert json.loads(ok(cli(dsn, "queue", "resume", "jobs", "--json"))) == {
        "queue": "jobs",
        "paused": False,
        "changed": True,
    }
    assert client.list_queues()[0].paused is False


def test_pause_without_an_actor_names_the_user(dsn: str, client: Client, queue: str) -> None:
    ok(cli(dsn, "queue", "pause", "jobs"))
    assert client.list_queues()[0].paused_by  # the operating system's user name


def test_pause_or_resume_of_an_unknown_queue_is_one_line_and_exit_1(dsn: str) -> None:
    for verb in ("pause", "resume"):
        result = cli(dsn, "queue", verb, "nope")
        assert result.exit_code == 1
        assert result.stderr.splitlines() == [
            "pgqueue: error: queue 'nope' does not exist; `pgqueue queue list` shows the queues,"
            " `pgqueue queue create` makes one"
        ]


def heartbeat(client: Client, worker_id: uuid.UUID, **given: Any) -> None:
    args: dict[str, Any] = {
        "host": "web-1",
        "pid": 4242,
        "queues": ["jobs", "other"],
        "concurrency": 8,
        "in_flight": 3,
        "stopping": False,
        "tallies": {},
    }
    args.update(given)
    client.run(workers_calls.worker_heartbeat(worker_id, **args))


def test_workers_list_shows_each_worker_and_whether_it_is_alive(
    dsn: str, client: Client, queue: str, sql: psycopg.Connection[Any]
) -> None:
    assert ok(cli(dsn, "workers", "list")) == (
        "no workers registered; a `pgqueue worker` registers itself as it starts\n"
    )
    assert json.loads(ok(cli(dsn, "workers", "list", "--json"))) == []
    alive, stopping, lost = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    heartbeat(client, lost, pid=1)
    heartbeat(client, stopping, pid=2, stopping=True)
    heartbeat(client, alive, pid=3)
    sql.execute(
        "UPDATE pgqueue.worker SET last_seen_at = last_seen_at - interval '1 minute',"
        " started_at = started_at - interval '1 hour' WHERE worker_id = %s",
        (lost,),
    )
    table = ok(cli(dsn, "workers", "list")).splitlines()
    assert table[0].split() == [
        "ID",
        "HOST",
        "PID",
        "QUEUES",
        "CONCURRENCY",
        "IN_FLIGHT",
        "STARTED",
        "LAST_SEEN",
        "STATE",
    ]
    rows = [line.split() for line in table[1:]]
    assert [(r[0], r[1], r[2], r[3], r[4], r[5], r[-1]) for r in rows] == [
        (str(alive)[:8], "web-1", "3", "jobs,other", "8", "3", "alive"),
        (str(stopping)[:8], "web-1", "2", "jobs,other", "8", "3", "stopping"),
        (str(lost)[:8], "web-1", "1", "jobs,other", "8", "3", "lost"),
    ]
    assert " ".join(rows[2][6:-1]) == "1h ago 1m ago"
    listed = json.loads(ok(cli(dsn, "workers", "list", "--json")))
    assert list(listed[0]) == [
        "worker_id",
        "host",
        "pid",
        "queues",
        "concurrency",
        "in_flight",
        "started_at",
        "last_seen_at",
        "stopping",
        "alive",
    ]
    assert [(w["worker_id"], w["stopping"], w["alive"]) for w in listed] == [
        (str(alive), False, True),
        (str(stopping), True, True),
        (str(lost), False, False),
    ]
    assert listed[0]["queues"] == ["jobs", "other"] and listed[0]["started_at"].endswith("+00:00")
