"""The CLI and a document no reader can decode: one line and exit 1 when sending it, the
row and how to see it raw when showing it.

tests/ops/test_cli_documents.py has the first cases (a line too deep, in-process;
peek and the poison commands). Here: the real process, the line a refusal names
(a batch refusal named the message's place in its chunk, counted from 1, and
the NUL check its place counted from 0: neither was the line), the size and
the psql query beside every undecodable document in a table and in --json,
and a barrier's undecodable result (a traceback before).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any

import pytest
from click.testing import CliRunner, Result
from support.db import plant

from pgqueue import Client
from pgqueue._cli import main

DEEP = "[" * 10000 + "]" * 10000  # past every Python's json: 3.13 reads 3,000 levels
REFUSED = "[" * 300 + "]" * 300  # Python reads it; every entry refuses it (over 255)
BIG = "9" * 5000  # past Python's default of 4,300 digits


def run(dsn: str, *args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(
        main, [*args, "--dsn", dsn], input=stdin, env={"PGQUEUE_DSN": None}, prog_name="pgqueue"
    )


def process(dsn: str, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """`pgqueue ARGS --dsn DSN` as a real process: default logging, tables unfitted (a pipe)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_") and k != "COLUMNS"}
    return subprocess.run(
        [sys.executable, "-m", "pgqueue", *args, "--dsn", dsn],
        input=stdin,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def one_error(code: int, stdout: str, stderr: str) -> str:
    """The one `pgqueue: error:` line of a command that failed with exit 1."""
    assert code == 1, (code, stdout, stderr)
    assert "Traceback" not in stderr
    [line] = stderr.splitlines()
    assert line.startswith("pgqueue: error: "), line
    return line


def live(sql: Any) -> int:
    return int(sql.execute("SELECT count(*) FROM pgqueue.message").fetchone()[0])


@pytest.mark.parametrize(
    ("line", "said"),
    [
        (DEEP, "line 1 of stdin is nested too deep for Python's JSON reader"),
        (REFUSED, "line 1 of stdin: message is nested more than 255 levels deep"),
    ],
)
def test_a_real_process_says_a_line_too_deep_in_one_line_and_sends_nothing(
    client: Client, sql: Any, dsn: str, line: str, said: str
) -> None:
    client.create_queue("q")
    got = process(dsn, "send", "q", "-", stdin=line + "\n")
    assert said in one_error(got.returncode, got.stdout, got.stderr)
    assert "nothing was sent" in got.stderr
    assert live(sql) == 0


def test_a_real_process_sends_a_5000_digit_integer_and_prints_it_whole(
    client: Client, dsn: str
) -> None:
    client.create_queue("q")
    sent = process(dsn, "send", "q", "-", stdin=f'{{"n": {BIG}}}\n')
    assert sent.returncode == 0 and sent.stderr == "", sent.stderr
    shown = process(dsn, "peek", "q", "--json")
    assert shown.returncode == 0, shown.stderr
    [row] = json.loads(shown.stdout, parse_int=str)  # its digits, whatever this Python's limit
    assert row["message"] == {"n": BIG}


def test_a_line_the_database_refuses_is_named_by_its_line_and_nothing_is_sent(
    client: Client, sql: Any, dsn: str
) -> None:
    """Line 4 (after a blank line) was reported as `messages[3]`."""
    client.create_queue("q")
    got = run(dsn, "send", "q", "-", stdin=f"1\n\n2\n{REFUSED}\n3\n")
    line = one_error(got.exit_code, got.stdout, got.stderr)
    assert line.startswith(
        "pgqueue: error: line 4 of stdin: message is nested more than 255 levels deep"
    ) and line.endswith("; nothing was sent")
    assert live(sql) == 0


def test_a_refused_line_in_a_later_chunk_is_named_by_its_line_and_nothing_is_sent(
    client: Client, sql: Any, dsn: str
) -> None:
    """The CLI sends 1,000 lines a statement: the SQL counts from 1 within the statement."""
    client.create_queue("q")
    got = run(dsn, "send", "q", "-", stdin="1\n" * 1001 + REFUSED + "\n")
    line = one_error(got.exit_code, got.stdout, got.stderr)
    assert line.startswith(
        "pgqueue: error: line 1002 of stdin: message is nested more than 255 levels"
    )
    assert live(sql) == 0


def test_a_line_with_a_nul_is_named_by_its_line_before_anything_is_sent(
    client: Client, sql: Any, dsn: str
) -> None:
    """It was `messages[1]` (counted from 0) for line 2."""
    client.create_queue("q")
    got = run(dsn, "send", "q", "-", stdin='1\n"a\\u0000"\n')
    line = one_error(got.exit_code, got.stdout, got.stderr)
    assert line.startswith("pgqueue: error: line 2 of stdin contains a NUL character")
    assert live(sql) == 0


def test_a_keyed_send_of_a_refused_line_names_it(client: Client, sql: Any, dsn: str) -> None:
    client.create_queue("q")
    got = run(dsn, "send", "q", "-", "--dedupe-key", "k", stdin=REFUSED + "\n")
    line = one_error(got.exit_code, got.stdout, got.stderr)
    assert line.startswith("pgqueue: error: line 1 of stdin: message is nested more than 255")
    refused = run(dsn, "send", "q", REFUSED)
    assert "error: message is nested more than 255 levels" in one_error(
        refused.exit_code, refused.stdout, refused.stderr
    )
    headers = run(dsn, "send", "q", "-", "--headers", f'{{"h": {REFUSED}}}', stdin="1\n2\n")
    assert "headers is nested more than 255 levels" in one_error(
        headers.exit_code, headers.stdout, headers.stderr
    )
    assert live(sql) == 0


@pytest.fixture
def undecodable(client: Client, sql: Any) -> dict[str, int]:
    """Queue q: a healthy message, one too deep, one whose headers are too deep."""
    client.create_queue("q")
    return {
        "ok": client.send("q", {"ok": 1}),
        "deep": plant(sql, "q", DEEP),
        "deep_headers": plant(sql, "q", '{"n": 2}', '{"h": ' + DEEP + "}"),
    }


def raw_length(sql: Any, query: str) -> int:
    """The length of the document the psql query a command printed gives, as psql prints it."""
    [[text]] = sql.execute(f"SELECT d::text FROM ({query}) AS r (d)").fetchall()
    return len(text)


def psql_query(note: str) -> str:
    return note.split("see it raw with psql: ", 1)[1].removesuffix(")")


def chars(note: str) -> int:
    found = re.search(r"; ([\d,]+) characters;", note)
    assert found is not None, note
    return int(found[1].replace(",", ""))


def test_peek_prints_the_row_its_size_and_the_psql_query_that_prints_it_raw(
    sql: Any, dsn: str, undecodable: dict[str, int]
) -> None:
    shown = process(dsn, "peek", "q")
    assert shown.returncode == 0 and shown.stderr == "", shown.stderr
    lines = shown.stdout.splitlines()
    rows = {int(x.split()[0]): x for x in lines[1:4]}
    assert set(rows) == set(undecodable.values())
    assert '{"ok":1}' in rows[undecodable["ok"]]
    assert '{"undecodable":"RecursionError' in rows[undecodable["deep"]]
    notes = lines[4:]
    assert [n.split(":")[0] for n in notes] == [
        f"msg_id {undecodable['deep']}, message",
        f"msg_id {undecodable['deep_headers']}, headers",
    ]
    for note, (msg_id, part) in zip(
        notes,
        [(undecodable["deep"], "message"), (undecodable["deep_headers"], "headers")],
        strict=True,
    ):
        assert ": (cannot be decoded by Python: RecursionError" in note
        assert psql_query(note) == (
            f"SELECT {part} FROM pgqueue.peek('q', 1, {msg_id - 1}) WHERE msg_id = {msg_id}"
        )
        assert raw_length(sql, psql_query(note)) == chars(note)
    assert chars(notes[0]) == len(DEEP)


def test_peek_json_carries_the_psql_query_beside_what_is_known(
    sql: Any, dsn: str, undecodable: dict[str, int]
) -> None:
    shown = run(dsn, "peek", "q", "--json")
    assert shown.exit_code == 0, shown.stderr
    rows = {r["msg_id"]: r for r in json.loads(shown.stdout)}
    assert rows[undecodable["ok"]]["message"] == {"ok": 1}
    deep = rows[undecodable["deep"]]["message"]
    assert deep["undecodable"].startswith("RecursionError") and deep["chars"] == len(DEEP)
    assert raw_length(sql, deep["psql"]) == len(DEEP)
    headers = rows[undecodable["deep_headers"]]["headers"]
    assert raw_length(sql, headers["psql"]) == headers["chars"]
    assert rows[undecodable["deep_headers"]]["message"] == {"n": 2}


def test_the_poison_commands_print_the_size_and_the_psql_query(
    client: Client, sql: Any, dsn: str, undecodable: dict[str, int]
) -> None:
    assert [m.msg_id for m in client.read("q", vt=30, qty=10)] == [undecodable["ok"]]
    listed = process(dsn, "poison", "list", "q")
    assert listed.returncode == 0 and listed.stderr == "", listed.stderr
    notes = [x for x in listed.stdout.splitlines() if x.startswith("msg_id ")]
    assert [n.split(":")[0] for n in notes] == [
        f"msg_id {undecodable['deep_headers']}, headers",
        f"msg_id {undecodable['deep']}, message",
    ]
    query = psql_query(notes[1])
    assert query == f"SELECT message FROM pgqueue.poison_get('q', {undecodable['deep']})"
    assert raw_length(sql, query) == chars(notes[1]) == len(DEEP)
    as_json = run(dsn, "poison", "list", "q", "--json")
    assert as_json.exit_code == 0, as_json.stderr
    rows = {r["msg_id"]: r for r in json.loads(as_json.stdout)}
    assert raw_length(sql, rows[undecodable["deep"]]["message"]["psql"]) == len(DEEP)
    assert rows[undecodable["deep_headers"]]["message"] == {"n": 2}
    one = run(dsn, "poison", "show", "q", str(undecodable["deep_headers"]), "--json")
    assert one.exit_code == 0, one.stderr
    headers = json.loads(one.stdout)["headers"]
    assert raw_length(sql, headers["psql"]) == headers["chars"]
    text = process(dsn, "poison", "show", "q", str(undecodable["deep_headers"]))
    assert text.returncode == 0 and text.stderr == "", text.stderr
    assert "headers:   (cannot be decoded by Python: RecursionError" in text.stdout
    assert '"n": 2' in text.stdout


def test_barrier_show_of_a_result_python_cannot_decode_shows_the_barrier(
    client: Client, sql: Any, dsn: str
) -> None:
    """complete_member takes a result of any depth; barrier show printed a traceback.
    Results are decoded row by row now: the barrier is shown, the result as undecodable."""
    client.create_queue("work")
    client.create_queue("done")
    bid = client.fan_out("work", [1], callback_queue="done", callback_message={})
    [member] = client.read("work", vt=30)
    sql.execute(
        "SELECT pgqueue.complete_member('work', %s, 'failed', %s::jsonb)", (member.msg_id, DEEP)
    )
    shown = process(dsn, "barrier", "show", bid)
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
    assert "state:     fired (failed)" in shown.stdout
    as_json = process(dsn, "barrier", "show", bid, "--json")
    assert as_json.returncode == 0, as_json.stderr
    [failure] = json.loads(as_json.stdout)["failures"]
    assert failure["result"]["undecodable"].startswith("RecursionError")
