"""The CLI and documents at the edge: too deep for any reader, numbers longer than Python's default.

Before, `pgqueue send Q -` of a line nested 3,000 deep, and `pgqueue peek Q`
or `pgqueue poison show` of such a message, printed a traceback.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner, Result
from support.db import plant

from pgqueue import Client
from pgqueue._cli import main

DEEP = "[" * 10000 + "]" * 10000  # past every Python's json: 3.13 reads 3,000 levels


def run(dsn: str, *args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(
        main, [*args, "--dsn", dsn], input=stdin, env={"PGQUEUE_DSN": None}, prog_name="pgqueue"
    )


def one_error(result: Result) -> str:
    assert result.exit_code == 1, (result.exit_code, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith("pgqueue: error: ")
    return line


@pytest.mark.parametrize(
    ("line", "said"),
    [
        (DEEP, "nested too deep for Python's JSON reader"),
        ("[" * 300 + "]" * 300, "message is nested more than 255 levels deep"),
    ],
)
def test_a_line_too_deep_is_one_line_and_nothing_is_sent(
    client: Client, dsn: str, line: str, said: str
) -> None:
    client.create_queue("q")
    assert said in one_error(run(dsn, "send", "q", "-", stdin=line + "\n"))
    assert client.metrics("q").queue_length == 0


def test_a_number_longer_than_pythons_default_is_sent_and_shown_whole(
    client: Client, dsn: str
) -> None:
    client.create_queue("q")
    big = "9" * 5000
    sent = run(dsn, "send", "q", "-", stdin=f'{{"n": {big}}}\n')
    assert sent.exit_code == 0, sent.stderr
    [msg] = client.peek("q")
    assert msg.message == {"n": 10**5000 - 1}
    shown = run(dsn, "peek", "q", "--json")
    assert shown.exit_code == 0, shown.stderr
    assert f'"n": {big}' in shown.stdout


def test_peek_and_the_poison_commands_show_an_undecodable_message(
    client: Client, sql: Any, dsn: str
) -> None:
    client.create_queue("q")
    deep = plant(sql, "q", DEEP)
    client.send("q", {"ok": 1})
    table = run(dsn, "peek", "q")
    assert table.exit_code == 0 and "Traceback" not in table.stderr, table.stderr
    assert '{"undecodable":"Recurs' in table.stdout and '{"ok":1}' in table.stdout
    as_json = run(dsn, "peek", "q", "--json")
    [first, _] = json.loads(as_json.stdout)
    assert first["message"]["undecodable"].startswith("RecursionError")
    assert first["message"]["chars"] == len(DEEP)
    sql.execute("SELECT pgqueue.poison('q', %s, 'kept')", (deep,))
    listed = run(dsn, "poison", "list", "q")
    assert listed.exit_code == 0 and '{"undecodable"' in listed.stdout, listed.stderr
    shown = run(dsn, "poison", "show", "q", str(deep))
    assert shown.exit_code == 0, shown.stderr
    assert "message:   (cannot be decoded by Python: RecursionError" in shown.stdout
    assert f"SELECT message FROM pgqueue.poison_get('q', {deep})" in shown.stdout
    raw = run(dsn, "poison", "show", "q", str(deep), "--json")
    assert json.loads(raw.stdout)["message"]["chars"] == len(DEEP)
