"""The operator commands through click's runner, with the database state checked after each."""

from __future__ import annotations

import json
import threading
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner, Result

from pgqueue import Client, Step
from pgqueue._cli import _bulk as queues_cli
from pgqueue._cli import main
from pgqueue._cli import poison as poison_cli
from pgqueue._cli._text import parse_duration


def cli(
    dsn: str, *args: str, input: str | None = None, env: dict[str, str] | None = None
) -> Result:
    """Run `pgqueue ARGS --dsn DSN` in-process; tables one line a row (no $COLUMNS)."""
    return CliRunner().invoke(
        main, [*args, "--dsn", dsn], input=input, env={"COLUMNS": None, **(env or {})}
    )


def ok(result: Result) -> str:
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result.stdout


def one_line_error(result: Result, code: int = 1) -> str:
    """The command failed with `code` and said so in exactly one line, without a traceback."""
    assert result.exit_code == code, (result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("pgqueue: error: "), result.stderr
    assert len(lines) <= 2 and "Traceback" not in result.stderr  # (a prompt, then the line)
    assert result.exception is None or isinstance(result.exception, SystemExit)
    return lines[-1]


def poison_some(client: Client, queue: str, n: int) -> list[int]:
    """n messages of `queue` (max_attempts 1) poisoned by the read after their only delivery."""
    client.create_queue(queue, max_attempts=1)
    ids = client.send_batch(queue, [{"n": i} for i in range(n)])
    for msg in client.read(queue, vt=30, qty=n):
        client.set_vt(queue, msg.msg_id, 0, error=f"ValueError: bad n={msg.message['n']}")
    assert client.read(queue, vt=30, qty=n) == []  # the poison drop
    return ids


def age_poison(sql: psycopg.Connection[Any], ids: list[int], hours: int) -> None:
    sql.execute(
        "UPDATE pgqueue.poison SET poisoned_at = poisoned_at - make_interval(hours => %s)"
        " WHERE msg_id = ANY(%s)",
        (hours, ids),
    )


# -- every command has complete help ------------------------------------------


def _commands(group: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = []
    for name, cmd in group.commands.items():
        found.append((*path, name))
        if hasattr(cmd, "commands"):
            found += _commands(cmd, (*path, name))
    return found


def test_every_command_has_help_that_says_what_it_does() -> None:
    commands = _commands(main)
    assert {("poison", "list"), ("poison", "requeue"), ("barrier", "show"), ("peek",)} <= set(
        commands
    )
    for path in commands:
        result = CliRunner().invoke(main, [*path, "--help"])
        assert result.exit_code == 0, path
        summary = result.stdout.split("\n\n")[1].strip()
        assert len(summary) > 20, (path, summary)


# -- queues ---------------------------------------------------------------------


def test_queue_create_list_and_json(dsn: str) -> None:
    assert "created queue 'jobs' (max_attempts=4)" in ok(
        cli(dsn, "queue", "create", "jobs", "--max-attempts", "4")
    )
    assert "updated queue 'jobs' (max_attempts=2)" in ok(
        cli(dsn, "queue", "create", "jobs", "--max-attempts", "2")
    )
    table = ok(cli(dsn, "queue", "list")).splitlines()
    assert table[0].split() == ["QUEUE", "MAX_ATTEMPTS", "CREATED", "PAUSED"]
    assert table[1].split()[:2] == ["jobs", "2"] and table[1].split()[-1] == "-"
    [row] = json.loads(ok(cli(dsn, "queue", "list", "--json")))
    assert list(row) == ["queue", "max_attempts", "created_at", "paused", "paused_at", "paused_by"]
    assert row["queue"] == "jobs" and row["max_attempts"] == 2 and row["paused"] is False


def test_queue_create_rejects_a_bad_name_in_one_line(dsn: str) -> None:
    line = one_line_error(cli(dsn, "queue", "create", "bad name; drop table x"))
    assert "queue name" in line


def test_send_one_and_many_from_stdin(client: Client, dsn: str, queue: str) -> None:
    assert ok(cli(dsn, "send", queue, '{"a": 1}')) == f"sent msg_id 1 to queue '{queue}'\n"
    out = ok(cli(dsn, "send", queue, "-", input='{"b": 2}\n\n[3]\n"four"\n'))
    assert out == f"sent 3 messages to queue '{queue}' (msg_ids 2..4)\n"
    got = client.read(queue, vt=30, qty=10)
    assert [m.message for m in got] == [{"a": 1}, {"b": 2}, [3], "four"]


def test_send_with_headers_delay_dedupe_and_json(client: Client, dsn: str, queue: str) -> None:
    args = ["send", queue, '{"x": 1}', "--headers", '{"trace": "t"}', "--dedupe-key", "k"]
    first = json.loads(ok(cli(dsn, *args, "--json")))
    again = json.loads(ok(cli(dsn, *args, "--json")))
    assert first == {"queue": queue, "msg_ids": [1], "sent": True, "duplicate_of": None}
    assert again == {"queue": queue, "msg_ids": [1], "sent": False, "duplicate_of": 1}
    ok(cli(dsn, "send", queue, "{}", "--delay", "60"))
    [msg] = client.read(queue, vt=30, qty=10)  # the delayed one is not visible
    assert msg.headers == {"trace": "t"}


def test_send_with_a_bad_line_sends_nothing(client: Client, dsn: str, queue: str) -> None:
    line = one_line_error(cli(dsn, "send", queue, "-", input='{"ok": 1}\n{"broken": \n[2]\n'))
    assert "line 2 of stdin is not valid JSON" in line and "nothing was sent" in line
    assert client.metrics(queue).total_messages == 0
    assert "not valid JSON" in one_line_error(cli(dsn, "send", queue, "{nope"))
    assert "JSON object" in one_line_error(cli(dsn, "send", queue, "1", "--headers", "[1]"))
    assert "no messages on stdin" in one_line_error(cli(dsn, "send", queue, input=""))
    many = '{"a": 1}\n{"a": 2}\n'
    assert "--dedupe-key" in one_line_error(
        cli(dsn, "send", queue, "--dedupe-key", "k", input=many)
    )
    assert client.metrics(queue).total_messages == 0


def test_send_many_is_one_transaction_across_chunks(
    client: Client, dsn: str, queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(queues_cli, "CHUNK", 4)
    lines = "".join(json.dumps({"n": i}) + "\n" for i in range(10))
    assert "sent 10 messages" in ok(cli(dsn, "send", queue, input=lines))
    assert [m.message["n"] for m in client.peek(queue, qty=20)] == list(range(10))


def test_unknown_queue_is_one_line_naming_the_way_out(dsn: str) -> None:
    for args in (
        ["send", "nope", "{}"],
        ["peek", "nope"],
        ["metrics", "nope"],
        ["poison", "list", "nope"],
    ):
        line = one_line_error(cli(dsn, *args))
        assert "queue 'nope' does not exist" in line and "pgqueue queue list" in line


def test_peek_changes_nothing(client: Client, dsn: str, queue: str, sql: Any) -> None:
    client.send_batch(queue, [{"n": 1}, {"n": 2}])
    client.send(queue, {"n": 3}, delay=300)
    [leased] = client.read(queue, vt=300, qty=1)
    client.set_vt(queue, leased.msg_id, 300, error="KeyError: 'sku'")
    before = sql.execute("SELECT * FROM pgqueue.message ORDER BY msg_id").fetchall()
    table = ok(cli(dsn, "peek", queue)).splitlines()
    assert table[0].split()[:3] == ["MSG_ID", "STATE", "READ_CT"]
    states = {int(r.split()[0]): r.split()[1] for r in table[1:]}
    assert states == {1: "in_flight", 2: "visible", 3: "delayed"}
    assert "KeyError: 'sku'" in table[1]
    rows = json.loads(ok(cli(dsn, "peek", queue, "--json", "--limit", "2", "--after", "1")))
    assert [r["msg_id"] for r in rows] == [2, 3]
    assert list(rows[0]) == [
        "queue", "msg_id", "read_ct", "enqueued_at", "vt", "dedupe_key", "last_error",
        "message", "headers", "state",
    ]  # fmt: skip
    after = sql.execute("SELECT * FROM pgqueue.message ORDER BY msg_id").fetchall()
    assert after == before


def test_metrics_table_and_json(client: Client, dsn: str, queue: str) -> None:
    client.send_batch(queue, [{}, {}])
    client.create_queue("other")
    table = ok(cli(dsn, "metrics")).splitlines()
    assert table[0].split() == ["QUEUE", "LIVE", "VISIBLE", "OLDEST", "NEWEST", "SENT", "POISON"]
    assert [r.split()[0] for r in table[1:]] == [queue, "other"]
    [m] = json.loads(ok(cli(dsn, "metrics", queue, "--json")))
    assert m["queue"] == queue and m["queue_length"] == 2 and m["poison_length"] == 0
    assert list(m) == [
        "queue", "queue_length", "visible_length", "oldest_msg_age_sec", "newest_msg_age_sec",
        "total_messages", "poison_length", "scrape_time",
    ]  # fmt: skip


def test_queue_purge_asks_and_works_in_chunks(
    client: Client, dsn: str, queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(queues_cli, "CHUNK", 3)
    client.send_batch(queue, [{"n": i} for i in range(10)])
    refused = cli(dsn, "queue", "purge", queue)  # no terminal, no --yes: nothing happens
    assert "nothing was changed" in one_line_error(refused)
    assert client.metrics(queue).queue_length == 10
    assert "nothing was changed" in one_line_error(cli(dsn, "queue", "purge", queue, input="n\n"))
    out = ok(cli(dsn, "queue", "purge", queue, input="y\n"))
    assert f"purged 10 messages from queue '{queue}'" in out
    assert client.metrics(queue).queue_length == 0


def test_queue_purge_counts_barrier_members_as_failed(client: Client, dsn: str, queue: str) -> None:
    client.create_queue("done")
    barrier_id = client.fan_out(queue, [{}, {}, {}], callback_queue="done", callback_message={})
    ok(cli(dsn, "queue", "purge", queue, "--yes"))
    status = client.barrier_status(barrier_id)
    assert (status.state, status.failed, status.remaining) == ("fired", 3, 0)


def test_queue_drop(client: Client, dsn: str, queue: str) -> None:
    client.create_queue("done")
    client.fan_out(queue, [{}], callback_queue="done", callback_message={})
    line = one_line_error(cli(dsn, "queue", "drop", "done", "--yes"))
    assert "open barrier" in line
    assert any(q.queue_name == "done" for q in client.list_queues())
    assert f"dropped queue '{queue}'" in ok(cli(dsn, "queue", "drop", queue, "--yes"))
    assert "dropped queue 'done'" in ok(cli(dsn, "queue", "drop", "done", "--yes"))
    assert client.list_queues() == []


# -- poison -----------------------------------------------------------------------


def test_poison_list_table_filters_and_json(client: Client, dsn: str, sql: Any) -> None:
    ids = poison_some(client, "jobs", 5)
    age_poison(sql, ids[:2], hours=5)
    table = ok(cli(dsn, "poison", "list")).splitlines()
    assert table[0].split() == [
        "QUEUE", "MSG_ID", "READ_CT", "ENQUEUED", "POISONED", "REASON", "MESSAGE",
    ]  # fmt: skip
    assert [int(r.split()[1]) for r in table[1:]] == [5, 4, 3, 2, 1]  # newest first
    assert "last error: ValueError: bad n=4" in table[1]
    recent = ok(cli(dsn, "poison", "list", "jobs", "--since", "1h")).splitlines()
    assert [int(r.split()[1]) for r in recent[1:]] == [5, 4, 3]
    matched = json.loads(ok(cli(dsn, "poison", "list", "--reason", "BAD N=2", "--json")))
    assert [p["msg_id"] for p in matched] == [3]
    assert list(matched[0]) == [
        "queue", "msg_id", "read_ct", "enqueued_at", "poisoned_at", "reason", "message", "headers",
    ]  # fmt: skip
    limited = ok(cli(dsn, "poison", "list", "--limit", "2")).splitlines()
    assert len(limited) == 4 and limited[-1] == "(2 of 5; see more with --limit)"
    assert (
        ok(cli(dsn, "poison", "list", "--reason", "nothing like it"))
        == "no poison messages match\n"
    )


def test_poison_show(client: Client, dsn: str) -> None:
    [msg_id, *_] = poison_some(client, "jobs", 1)
    out = ok(cli(dsn, "poison", "show", "jobs", str(msg_id)))
    assert "reason:    max_attempts exceeded" in out and '"n": 0' in out
    shown = json.loads(ok(cli(dsn, "poison", "show", "jobs", str(msg_id), "--json")))
    assert shown["message"] == {"n": 0} and shown["read_ct"] == 1
    line = one_line_error(cli(dsn, "poison", "show", "jobs", "999"))
    assert "has no poison message 999" in line


def test_poison_requeue_ids_all_or_nothing(client: Client, dsn: str) -> None:
    ids = poison_some(client, "jobs", 3)
    line = one_line_error(cli(dsn, "poison", "requeue", "jobs", str(ids[0]), "999", "--yes"))
    assert "no poison message 999" in line and "nothing was requeued" in line
    assert client.metrics("jobs").poison_length == 3 and client.metrics("jobs").queue_length == 0
    out = ok(cli(dsn, "poison", "requeue", "jobs", str(ids[0]), str(ids[1]), input="y\n"))
    assert "requeued 2 messages to queue 'jobs'" in out
    back = client.peek("jobs")
    assert sorted(m.message["n"] for m in back) == [0, 1]
    assert all(m.read_ct == 0 and m.msg_id > ids[-1] for m in back)  # new ids


def test_poison_requeue_all_since_in_chunks(
    client: Client, dsn: str, sql: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(poison_cli, "CHUNK", 3)
    ids = poison_some(client, "jobs", 10)
    age_poison(sql, ids[:4], hours=48)
    assert "nothing was changed" in one_line_error(cli(dsn, "poison", "requeue", "jobs", "--all"))
    out = ok(cli(dsn, "poison", "requeue", "jobs", "--all", "--since", "1d", "--yes"))
    assert out.startswith("requeued 6 messages to queue 'jobs' as new msg_ids ")
    assert sorted(m.message["n"] for m in client.peek("jobs", qty=20)) == list(range(4, 10))
    assert sorted(p.msg_id for p in client.poison_list("jobs")) == ids[:4]
    none_left = ok(cli(dsn, "poison", "requeue", "jobs", "--all", "--since", "1d", "--yes"))
    assert "nothing to requeue" in none_left


def test_poison_purge_all_older_than_and_ids(
    client: Client, dsn: str, sql: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(poison_cli, "CHUNK", 2)
    ids = poison_some(client, "jobs", 7)
    age_poison(sql, ids[:5], hours=24 * 8)
    out = ok(cli(dsn, "poison", "purge", "jobs", "--all", "--older-than", "7d", "--yes"))
    assert out.strip() == "purged 5 poison messages from queue 'jobs'"
    assert sorted(p.msg_id for p in client.poison_list("jobs")) == ids[5:]
    assert "no poison message 1" in one_line_error(
        cli(dsn, "poison", "purge", "jobs", "1", "--yes")
    )
    out = ok(cli(dsn, "poison", "purge", "jobs", str(ids[5]), "--yes"))
    assert out.strip() == "purged 1 poison message from queue 'jobs'"
    assert [p.msg_id for p in client.poison_list("jobs")] == ids[6:]


def test_poison_bulk_usage_errors_exit_2(dsn: str) -> None:
    for args in (
        ["poison", "requeue", "jobs"],
        ["poison", "purge", "jobs", "1", "--all"],
        ["poison", "purge", "jobs", "1", "--older-than", "1d"],
        ["poison", "list", "--since", "ten minutes"],
        ["poison", "purge", "jobs", "--all", "--older-than", "-5d"],
        ["poison", "list", "--limit", "-1"],
        ["poison", "show", "jobs", "abc"],
    ):
        line = one_line_error(cli(dsn, *args), code=2)
        assert "--help" in line, args


def test_durations() -> None:
    assert parse_duration("90s").total_seconds() == 90
    assert parse_duration("1h30m").total_seconds() == 5400
    assert parse_duration("2D").total_seconds() == 172800
    assert parse_duration("1.5w").total_seconds() == 1.5 * 604800
    for bad in ("", "10", "10x", "m5", "1h 30m", "-5m"):
        with pytest.raises(ValueError, match="is not a duration"):
            parse_duration(bad)


# -- barriers and claims ------------------------------------------------------------


def test_barrier_list_and_show_say_which_members_failed_and_why(
    client: Client, dsn: str, sql: Any
) -> None:
    client.create_queue("work", max_attempts=1)
    client.create_queue("done")
    first_id = client.fan_out("work", [{}], callback_queue="done", callback_message={})
    barrier_id = client.fan_out("work", [{"i": i} for i in range(4)], callback_queue="done",
                                callback_message={})  # fmt: skip
    members = sorted(
        sql.execute(
            "SELECT member_index, msg_id FROM pgqueue.barrier_member WHERE barrier_id = %s",
            (barrier_id,),
        ).fetchall()
    )
    ids = [m for _, m in members]
    client.complete_member("work", ids[0])
    client.complete_member("work", ids[1], outcome="failed", result={"error": "card declined"})
    client.poison("work", ids[2], "operator: bad payload")
    client.purge_queue_chunk("work", up_to_msg_id=ids[3], qty=10)  # also takes first_id's member
    status = client.barrier_status(barrier_id)
    assert status.state == "fired" and status.failed == 3

    listed = json.loads(ok(cli(dsn, "barrier", "list", "--json")))
    assert {b["barrier_id"] for b in listed} == {first_id, barrier_id}
    assert list(listed[0]) == [
        "barrier_id", "queue", "callback_queue", "total", "succeeded", "failed", "remaining",
        "state", "created_at", "fired_at", "callback_msg_id", "deadline", "policy",
        "max_failures", "max_failure_ratio", "cancelled", "sealed", "outcome",
    ]  # fmt: skip
    fired = ok(cli(dsn, "barrier", "list", "--state", "fired")).splitlines()
    assert fired[0].split()[:3] == ["BARRIER_ID", "STATE", "QUEUE"] and len(fired) == 3

    shown = ok(cli(dsn, "barrier", "show", barrier_id))
    assert "progress:  4/4 done (succeeded 1, failed 3, cancelled 0, remaining 0)" in shown
    assert "state:     fired (failed)" in shown and "policy:    wait_all" in shown
    assert "card declined" in shown and "operator: bad payload" in shown
    assert "purged from the queue" in shown
    as_json = json.loads(ok(cli(dsn, "barrier", "show", barrier_id, "--json")))
    assert [(f["member_index"], f["outcome"]) for f in as_json["failures"]] == [
        (1, "failed"),
        (2, "poisoned"),
        (3, "purged"),
    ]
    line = one_line_error(cli(dsn, "barrier", "show", "no-such-barrier"))
    assert "does not exist" in line and "pgqueue barrier list" in line


def test_barrier_seal_and_a_policy_shown(client: Client, dsn: str) -> None:
    client.create_queue("work")
    client.create_queue("done")
    bid = client.open_barrier(
        "work", callback_queue="done", callback_message={}, messages=[1, 2], max_failures=1
    )
    shown = ok(cli(dsn, "barrier", "show", bid))
    assert "state:     open (not sealed: takes members)" in shown
    assert "policy:    max_failures: at most 1 failed" in shown
    said = ok(cli(dsn, "barrier", "seal", bid)).strip()
    assert said == f"sealed {bid}: fires when its 2 remaining member(s) end"
    for m in client.read("work", vt=30, qty=2):
        client.complete_member("work", m.msg_id)
    status = json.loads(ok(cli(dsn, "barrier", "seal", bid, "--json")))
    assert (status["state"], status["outcome"], status["sealed"]) == ("fired", "succeeded", True)
    line = one_line_error(cli(dsn, "barrier", "seal", "no-such-barrier"))
    assert "does not exist" in line


def test_barrier_expire(client: Client, dsn: str, sql: Any) -> None:
    client.create_queue("work")
    client.create_queue("done")
    barrier_id = client.fan_out("work", [{}], callback_queue="done", callback_message={},
                                deadline_seconds=1)  # fmt: skip
    sql.execute("UPDATE pgqueue.barrier SET deadline = now() - interval '1 minute'")
    assert ok(cli(dsn, "barrier", "expire")).strip() == "expired 1 barrier"
    assert client.barrier_status(barrier_id).state == "expired"
    shown = ok(cli(dsn, "barrier", "show", barrier_id))
    assert "deadline passed" in shown


def test_claims_list_and_purge(client: Client, dsn: str, sql: Any) -> None:
    with client.claim("orchestrate:A", owner="me") as held:
        assert held.acquired
        [row] = json.loads(ok(cli(dsn, "claims", "list", "--json")))
        assert row["key"] == "orchestrate:A" and row["owner"] == "me" and row["state"] == "held"
        held.finish()
    table = ok(cli(dsn, "claims", "list")).splitlines()
    assert table[0].split()[:3] == ["KEY", "STATE", "OWNER"]
    assert table[1].split()[:2] == ["orchestrate:A", "finished"]
    sql.execute("UPDATE pgqueue.claim SET finished_at = finished_at - interval '40 days'")
    assert ok(cli(dsn, "claims", "purge", "--older-than", "30d", "--yes")).strip() == (
        "purged 1 tombstone"
    )


# -- connection problems ----------------------------------------------------------


def test_a_database_never_migrated_says_run_migrate(empty_dsn: str) -> None:
    for args in (["poison", "list"], ["queue", "list"], ["barrier", "list"], ["peek", "x"]):
        line = one_line_error(cli(empty_dsn, *args))
        assert "pgqueue migrate" in line, args


def test_dsn_comes_from_the_environment(dsn: str, queue: str) -> None:
    for var in ("PGQUEUE_DSN", "DATABASE_URL"):
        env = {"PGQUEUE_DSN": "", "DATABASE_URL": "", var: dsn}
        result = CliRunner().invoke(main, ["queue", "list"], env=env)
        assert result.exit_code == 0 and queue in result.stdout, var


def test_bulk_requeue_ends_while_consumers_keep_poisoning(
    client: Client, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cut-off taken at the start bounds the work: it ends, and it loses nothing."""
    monkeypatch.setattr(poison_cli, "CHUNK", 5)
    client.create_queue("jobs", max_attempts=1)
    for msg_id in client.send_batch("jobs", [{"n": n} for n in range(40)]):
        client.poison("jobs", msg_id, "seed")
    stop = threading.Event()
    poisoned_meanwhile = []

    def consumer() -> None:
        # Reads everything requeued and poisons it again, as a consumer of a
        # still-broken queue would, plus fresh failures.
        with Client.from_dsn(dsn, max_size=2) as own:
            while not stop.is_set():
                fresh = own.send("jobs", {"fresh": True})
                own.poison("jobs", fresh, "fresh failure")
                poisoned_meanwhile.append(fresh)
                for msg in own.read("jobs", vt=30, qty=10):
                    own.poison("jobs", msg.msg_id, "still broken")

    t = threading.Thread(target=consumer)
    t.start()
    try:
        out = ok(cli(dsn, "poison", "requeue", "jobs", "--all", "--yes"))
    finally:
        stop.set()
        t.join()
    requeued = int(out.split()[1])
    assert requeued >= 40
    m = client.metrics("jobs")
    assert m.queue_length + m.poison_length == 40 + len(poisoned_meanwhile)  # nothing lost


def test_worker_refuses_bad_apps_and_missing_queues_in_one_line(dsn: str) -> None:
    line = one_line_error(cli(dsn, "worker", "no_such_module:app"), 2)
    assert "no module named 'no_such_module'" in line
    line = one_line_error(cli(dsn, "worker", "examples.albums:WORK_QUEUE"), 2)
    assert "is of type str, not a pgqueue.App" in line
    line = one_line_error(cli(dsn, "worker", "support.worker_app:app"))
    assert "do not exist; create them first" in line
    line = one_line_error(cli(dsn, "worker", "support.worker_app:app", "--vt", "0"), 2)
    assert "'--vt'" in line


def test_workflow_list_show_and_cancel(client: Client, dsn: str) -> None:
    client.create_queue("steps")
    client.start_workflow(
        "nightly",
        [
            Step("extract", "steps", 1),
            Step("load", "steps", 2, depends_on=("extract",)),
        ],
    )
    listed = json.loads(ok(cli(dsn, "workflow", "list", "--json")))
    assert [(w["workflow_id"], w["state"], w["steps"], w["enqueued"]) for w in listed] == [
        ("nightly", "running", 2, 1)
    ]
    table = ok(cli(dsn, "workflow", "list")).splitlines()
    assert table[0].split()[:2] == ["WORKFLOW_ID", "STATE"] and table[1].split()[:2] == [
        "nightly",
        "running",
    ]
    shown = ok(cli(dsn, "workflow", "show", "nightly"))
    assert "steps:     0/2 ended" in shown
    rows = {line.split()[0]: line.split() for line in shown.splitlines()[6:]}
    assert rows["extract"][1:4] == ["enqueued", "steps", "0/1"]
    assert rows["load"][1] == "waiting" and rows["load"][-1] == "extract"
    detail = json.loads(ok(cli(dsn, "workflow", "show", "nightly", "--json")))["steps_detail"]
    assert [(s["step"], s["depends_on"]) for s in detail] == [
        ("extract", []),
        ("load", ["extract"]),
    ]
    # cancelling asks first; without an answer nothing changes
    refused = cli(dsn, "workflow", "cancel", "nightly")
    assert refused.exit_code == 1 and client.workflow_status("nightly").state == "running"
    done = json.loads(ok(cli(dsn, "workflow", "cancel", "nightly", "--yes", "--json")))
    assert (done["state"], done["cancelled"]) == ("cancelled", 2)
    assert client.metrics("steps").queue_length == 0
    line = one_line_error(cli(dsn, "workflow", "show", "no-such"))
    assert "does not exist" in line
