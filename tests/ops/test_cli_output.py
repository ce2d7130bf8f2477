"""What the `pgqueue` command prints: tables that fit the terminal, ages, honest sends, wording."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from itertools import takewhile
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner, Result
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from support.db import FAST_RETRY
from support.faultproxy import FaultProxy

from pgqueue import Client, KeyedSend
from pgqueue._cli import main
from pgqueue._cli import messages as queues_cli
from pgqueue._cli._table import Column, output_width, render_table
from pgqueue._cli._text import exact_duration, human_age
from pgqueue._roles import PRODUCER


def cli(dsn: str, *args: str, input: str | None = None, columns: int | None = None) -> Result:
    """Run `pgqueue ARGS --dsn DSN` in-process, with $COLUMNS set to `columns` (or unset)."""
    env = {"COLUMNS": None if columns is None else str(columns)}
    return CliRunner().invoke(main, [*args, "--dsn", dsn], input=input, env=env)


def ok(result: Result) -> str:
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result.stdout


def error_line(result: Result) -> str:
    """The one `pgqueue: error:` line of a command that failed with exit code 1."""
    assert result.exit_code == 1, (result.stdout, result.stderr)
    [line] = [line for line in result.stderr.splitlines() if line.strip()]
    assert line.startswith("pgqueue: error: "), line
    return line


def column_text(table: str, header: str) -> str:
    """The text of one column of a one-row table: in its column, or under the row."""
    lines = [line for line in table.splitlines() if not line.startswith("(")]
    label = f"  {header}: "
    under = [k for k, line in enumerate(lines) if line.startswith(label)]
    if under:
        rest = lines[under[0] + 1 :]
        more = takewhile(lambda line: line.startswith(" " * len(label)) and line.strip(), rest)
        return " ".join([lines[under[0]][len(label) :], *(line.strip() for line in more)])
    start = lines[0].index(header)
    after = re.compile(r"\S").search(lines[0], start + len(header))
    end = None if after is None else after.start()
    return " ".join(filter(None, (line[start:end].strip() for line in lines[1:])))


def poison_one(client: Client, queue: str, message: Any, error: str) -> str:
    """Poison one message after its only delivery failed with `error`; its reason."""
    client.create_queue(queue, max_attempts=1)
    client.send(queue, message)
    [msg] = client.read(queue, vt=30, qty=1)
    client.set_vt(queue, msg.msg_id, 0, error=error)
    assert client.read(queue, vt=30, qty=1) == []  # the poison drop
    [p] = client.poison_list(queue)
    return p.reason


LONG_ERROR = (
    "LookupError: SKU-UNKNOWN is not in the catalogue (looked in 3 warehouses: north, south"
    " and the overflow depot by the docks; none of them lists it)"
)


# -- tables fit the terminal ------------------------------------------------------


@pytest.mark.parametrize("columns", [100, 60])
def test_poison_list_fits_the_terminal_and_wraps_the_whole_reason(
    client: Client, dsn: str, columns: int
) -> None:
    reason = poison_one(client, "thumbnails", {"image": "x" * 300}, LONG_ERROR)
    assert len(reason) > 150
    table = ok(cli(dsn, "poison", "list", columns=columns))
    assert all(len(line) <= columns for line in table.splitlines()), table
    assert table.splitlines()[1].split()[:3] == ["thumbnails", "1", "1"]  # ids never cut
    assert column_text(table, "REASON") == reason  # all of it, on continuation lines
    # at 60 columns a reason column would be a few words wide: it goes under its row
    assert ("  REASON: max_attempts exceeded" in table) == (columns == 60)


def test_a_narrow_table_gives_way_in_free_text_never_in_ids() -> None:
    columns = [
        Column("ID", right=True),
        Column("NAME"),
        Column("REASON", fit="wrap"),
        Column("MESSAGE", fit="clip"),
    ]
    reason = " ".join(f"word{i}" for i in range(40))
    rows = [(123456789, "orders_eu", reason, json.dumps({"k": "v" * 80}))]
    wide = render_table(columns, rows, width=70)
    assert all(len(line) <= 70 for line in wide.splitlines()), wide
    assert wide.splitlines()[1].split()[:2] == ["123456789", "orders_eu"]
    assert column_text(wide, "REASON") == reason
    assert '{"k": "vvv' in wide and "…" in wide  # the preview is cut, with an ellipsis
    narrow = render_table(columns, rows, width=40)  # the preview left out, the reason under
    assert all(len(line) <= 40 for line in narrow.splitlines()), narrow
    assert narrow.splitlines()[0].split() == ["ID", "NAME"] and "(MESSAGE left out" in narrow
    assert narrow.splitlines()[2].startswith("  REASON: word0 word1")
    assert column_text(narrow, "REASON") == reason
    tiny = render_table(columns, rows, width=10)  # too narrow for the ids: they stay whole
    assert tiny.splitlines()[1].split()[:2] == ["123456789", "orders_eu"]


def test_tables_have_one_line_per_row_when_piped_without_columns(client: Client, dsn: str) -> None:
    reason = poison_one(client, "thumbnails", {"n": 1}, LONG_ERROR)
    table = ok(cli(dsn, "poison", "list"))
    assert len(table.splitlines()) == 2 and reason in table  # grep finds a row by its reason


def test_output_width_is_columns_then_the_terminal_then_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "77")
    assert output_width() == 77
    monkeypatch.delenv("COLUMNS")
    monkeypatch.setattr(sys, "stdout", io.StringIO())  # a pipe, a file
    assert output_width() is None


def test_peek_and_barrier_show_fit_too(client: Client, dsn: str, sql: Any) -> None:
    client.create_queue("work", max_attempts=5)
    msg_id = client.send("work", {"sku": "SKU-UNKNOWN", "note": "y" * 200})
    client.read("work", vt=300, qty=1)
    client.set_vt("work", msg_id, 300, error=LONG_ERROR)
    table = ok(cli(dsn, "peek", "work", columns=100))
    assert all(len(line) <= 100 for line in table.splitlines()), table
    assert column_text(table, "LAST ERROR") == LONG_ERROR
    client.create_queue("done")
    barrier_id = client.fan_out("work", [{}], callback_queue="done", callback_message={})
    [member] = sql.execute(
        "SELECT msg_id FROM pgqueue.barrier_member WHERE barrier_id = %s", (barrier_id,)
    ).fetchone()
    client.poison("work", member, LONG_ERROR)
    shown = ok(cli(dsn, "barrier", "show", barrier_id, columns=80))
    assert all(len(line) <= 80 for line in shown.splitlines()), shown
    failures = shown[shown.index("failed members:\n") + len("failed members:\n") :]
    assert column_text(failures, "REASON") == LONG_ERROR


# -- ages in human units ---------------------------------------------------------


def test_human_ages() -> None:
    assert [human_age(s) for s in (0, 45, 1627, 3600, 3 * 3600 + 12 * 60 + 5)] == [
        "0s", "45s", "27m", "1h", "3h12m",
    ]  # fmt: skip
    assert [human_age(s) for s in (2 * 86400 + 4 * 3600 + 99, 40 * 86400, None)] == [
        "2d4h", "40d", "-",
    ]  # fmt: skip
    assert [exact_duration(timedelta(seconds=s)) for s in (90, 5400, 30 * 86400, 907200)] == [
        "1m30s", "1h30m", "30d", "10d12h",
    ]  # fmt: skip


def test_tables_show_ages_and_json_keeps_seconds(client: Client, dsn: str, sql: Any) -> None:
    client.create_queue("jobs", max_attempts=1)
    client.send("jobs", {"n": 1})
    sql.execute("UPDATE pgqueue.message SET enqueued_at = enqueued_at - interval '1627 seconds'")
    metrics = ok(cli(dsn, "metrics", "jobs")).splitlines()
    assert metrics[1].split()[3] == "27m"  # OLDEST
    [m] = json.loads(ok(cli(dsn, "metrics", "jobs", "--json")))
    assert 1627 <= m["oldest_msg_age_sec"] <= 1630
    client.poison("jobs", 1, "operator: bad payload")
    sql.execute("UPDATE pgqueue.poison SET poisoned_at = poisoned_at - interval '3h 12m'")
    listed = ok(cli(dsn, "poison", "list")).splitlines()
    assert listed[1].split()[3:7] == ["27m", "ago", "3h12m", "ago"]
    queues = ok(cli(dsn, "queue", "list")).splitlines()
    assert re.fullmatch(r"(now|\d+s ago) +-", queues[1].split(maxsplit=2)[2])  # CREATED, PAUSED
    refused = cli(dsn, "claims", "purge", "--older-than", "720h", input="n\n")
    assert "older than 30d?" in refused.stderr


# -- a keyed send says whether it sent ----------------------------------------------


def test_a_repeated_keyed_send_says_nothing_was_sent_and_names_the_holder(
    client: Client, dsn: str, queue: str
) -> None:
    args = ["send", queue, '{"order": 3}', "--dedupe-key", "o3"]
    assert ok(cli(dsn, *args)) == f"sent msg_id 1 to queue '{queue}'\n"
    assert ok(cli(dsn, *args)) == (
        f"not sent: message 1 (still unfinished) already holds dedupe key 'o3' in queue '{queue}'\n"
    )
    again = json.loads(ok(cli(dsn, *args, "--json")))
    assert again == {"queue": queue, "msg_ids": [1], "sent": False, "duplicate_of": 1}
    assert client.metrics(queue).total_messages == 1
    client.delete(queue, 1)  # finished: the key is free again
    after = json.loads(ok(cli(dsn, *args, "--json")))
    assert after == {"queue": queue, "msg_ids": [2], "sent": True, "duplicate_of": None}
    plain = json.loads(ok(cli(dsn, "send", queue, "{}", "--json")))
    assert plain == {"queue": queue, "msg_ids": [3], "sent": True, "duplicate_of": None}


def race_keyed_sends(client: Client, queue: str, key: str, n: int) -> list[KeyedSend]:
    """n sends of the same key, released at once, each on a connection of its own."""
    start = threading.Barrier(n)

    def send(i: int) -> KeyedSend:
        start.wait()
        return client.send_keyed(queue, {"by": i}, dedupe_key=key)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(send, range(n)))


def test_concurrent_keyed_sends_report_exactly_one_sent(dsn: str, queue: str) -> None:
    with Client.from_dsn(dsn, max_size=8) as shared:
        for round_ in range(5):
            got = race_keyed_sends(shared, queue, f"k{round_}", 8)
            [winner] = [g for g in got if g.sent]
            assert {g.msg_id for g in got} == {winner.msg_id}
            held = [m for m in shared.peek(queue, qty=100) if m.dedupe_key == f"k{round_}"]
            assert [m.msg_id for m in held] == [winner.msg_id]


def test_a_keyed_send_whose_commit_reply_was_lost_still_says_it_sent(dsn: str) -> None:
    """The retry finds the message its first attempt committed, and knows it as its own."""
    proxy = FaultProxy(dsn)
    try:
        with Client.from_dsn(proxy.dsn, retry=FAST_RETRY, prepare_threshold=None) as client:
            client.create_queue("q")
            proxy.cut_after_request_containing(b"pgqueue.send_keyed(")
            got = client.send_keyed("q", {"order": 3}, dedupe_key="o3")
            assert proxy.cuts == 1 and got == KeyedSend(1, True)
            assert client.send_keyed("q", {"order": 3}, dedupe_key="o3") == KeyedSend(1, False)
            assert client.metrics("q").total_messages == 1
    finally:
        proxy.close()


@pytest.fixture
def producer_dsn(server_dsn: str, dsn: str) -> Iterator[str]:
    """This test's database, logged in as a new login role that is only a producer."""
    name = f"pgq_t_{uuid.uuid4().hex[:10]}_cli_producer"
    role = pgsql.Identifier(name)
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(pgsql.SQL("CREATE ROLE {} LOGIN").format(role))
        admin.execute(pgsql.SQL("GRANT {} TO {}").format(pgsql.Identifier(PRODUCER), role))
    params: dict[str, Any] = conninfo_to_dict(dsn)
    params["user"] = name
    yield make_conninfo("", **params)
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,)
        )
        admin.execute(pgsql.SQL("DROP ROLE {}").format(role))


def test_a_producer_login_is_told_whether_its_keyed_send_sent(
    client: Client, producer_dsn: str, queue: str
) -> None:
    """send_keyed is granted with send: a producer gets the same answer as an operator."""
    args = ["send", queue, '{"order": 3}', "--dedupe-key", "o3"]
    assert ok(cli(producer_dsn, *args)) == f"sent msg_id 1 to queue '{queue}'\n"
    shown = json.loads(ok(cli(producer_dsn, *args, "--json")))
    assert shown == {"queue": queue, "msg_ids": [1], "sent": False, "duplicate_of": 1}
    assert client.metrics(queue).total_messages == 1


# -- wording -----------------------------------------------------------------------


def test_nan_is_refused_in_json_terms_and_nothing_is_sent(
    client: Client, dsn: str, queue: str
) -> None:
    line = error_line(cli(dsn, "send", queue, '{"price": NaN}'))
    assert line == (
        "pgqueue: error: the message is not valid JSON: NaN is not a JSON value (JSON has"
        " no NaN or Infinity; send null or a string instead); nothing was sent"
    )
    line = error_line(cli(dsn, "send", queue, input='{"a": 1}\n[-Infinity]\n'))
    assert "line 2 of stdin is not valid JSON: -Infinity is not a JSON value" in line
    assert "nothing was sent" in line
    line = error_line(cli(dsn, "send", queue, "{}", "--headers", '{"w": NaN}'))
    assert "--headers is not valid JSON: NaN" in line
    assert client.metrics(queue).total_messages == 0


def test_messages_quote_names_and_keys_in_single_quotes(
    client: Client, dsn: str, queue: str
) -> None:
    missing = error_line(cli(dsn, "send", "nosuchq", "{}"))
    assert "queue 'nosuchq' does not exist; `pgqueue queue list`" in missing
    missing = error_line(cli(dsn, "barrier", "show", "b-1"))
    assert "barrier 'b-1' does not exist" in missing
    assert '"' not in error_line(cli(dsn, "poison", "show", queue, "9"))
    args = ["send", queue, "{}", "--dedupe-key", "it's"]
    ok(cli(dsn, *args))
    assert "dedupe key 'it''s'" in ok(cli(dsn, *args))
    assert "barrier 'it''s' does not exist" in error_line(cli(dsn, "barrier", "show", "it's"))
    assert "barrier 'a\"b' does not exist" in error_line(cli(dsn, "barrier", "show", 'a"b'))
    reserved = error_line(cli(dsn, "send", queue, "{}", "--headers", '{"_pg_x": 1}'))
    assert "header '_pg_x' is reserved" in reserved
    client.create_queue("done")
    client.fan_out(queue, [{}], callback_queue="done", callback_message={})
    in_use = error_line(cli(dsn, "queue", "drop", "done", "--yes"))
    assert "queue 'done' receives the callbacks of 1 open barrier(s)" in in_use


def test_poison_show_says_when_there_are_no_headers(client: Client, dsn: str) -> None:
    poison_one(client, "jobs", {"n": 0}, "ValueError: bad n")
    out = ok(cli(dsn, "poison", "show", "jobs", "1"))
    assert "headers:   (none)\n" in out and "null" not in out
    client.send("jobs", {"n": 1}, headers={"trace": "t-1"})
    client.poison("jobs", 2, "operator: bad")
    out = ok(cli(dsn, "poison", "show", "jobs", "2"))
    assert 'headers:\n{\n  "trace": "t-1"\n}\n' in out


def test_send_prompts_on_a_terminal_only() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    prompt = queues_cli.stdin_prompt(Terminal())
    assert prompt is not None and "one JSON value per line" in prompt and "Ctrl-D" in prompt
    assert queues_cli.stdin_prompt(io.StringIO()) is None


def test_send_from_a_terminal_says_how_to_end_the_input(dsn: str, queue: str) -> None:
    leader, follower = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k not in ("PGQUEUE_DSN", "DATABASE_URL")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgqueue", "send", queue, "--dsn", dsn],
        stdin=follower,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    os.close(follower)
    os.write(leader, b'{"a": 1}\n\x04')  # a line, then Ctrl-D on the next one
    out, err = proc.communicate(timeout=60)
    os.close(leader)
    assert proc.returncode == 0, err
    assert "end with Ctrl-D" in err and out == f"sent msg_id 1 to queue '{queue}'\n"
    piped = cli(dsn, "send", queue, input='{"a": 2}\n')
    assert ok(piped) == f"sent msg_id 2 to queue '{queue}'\n" and piped.stderr == ""
