"""`pgqueue send`, `peek` and `metrics`: a queue's live messages and its figures."""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import Any, TextIO

import click

from pgqueue._cli import _bulk
from pgqueue._cli._bulk import Progress
from pgqueue._cli._connect import connection_options, open_client, server_now
from pgqueue._cli._exits import expected_errors, fail
from pgqueue._cli._json_input import parse_json, read_message
from pgqueue._cli._json_output import (
    RawQuery,
    compact_json,
    emit_json,
    json_option,
    shape,
    undecodable_notes,
    with_raw_queries,
)
from pgqueue._cli._main import main
from pgqueue._cli._table import Column, echo_table
from pgqueue._cli._text import ago, human_age
from pgqueue._cli.poison import REASON_LIMIT
from pgqueue._client import Client
from pgqueue._errors import InvalidArgument, InvalidMessage, sql_literal
from pgqueue.types import KeyedSend, PeekedMessage

METRICS_FIELDS = {
    "queue": "queue_name",
    "queue_length": "queue_length",
    "visible_length": "visible_length",
    "oldest_msg_age_sec": "oldest_msg_age_sec",
    "newest_msg_age_sec": "newest_msg_age_sec",
    "total_messages": "total_messages",
    "poison_length": "poison_length",
    "scrape_time": "scrape_time",
}
PEEK_FIELDS = {
    "queue": "queue",
    "msg_id": "msg_id",
    "read_ct": "read_ct",
    "enqueued_at": "enqueued_at",
    "vt": "vt",
    "dedupe_key": "dedupe_key",
    "last_error": "last_error",
    "message": "message",
    "headers": "headers",
}


# How the entries name the message they refuse: `message`, or a batch's
# `messages[i]`, counted from 1 within the statement.
_REFUSED = re.compile(r"(?:message|messages\[(\d+)\]) ")


def _naming_the_line(exc: InvalidArgument, lines: Sequence[str], first: int) -> InvalidArgument:
    """The database's refusal of a message, naming the line of stdin it came from (else exc).

    A batch's refusal counts within its statement, and the CLI sends 1,000
    lines a statement after skipping blank ones: `messages[3]` may be line 1,004.
    """
    found = _REFUSED.match(str(exc))
    if found is None or isinstance(exc, InvalidMessage):  # InvalidMessage: Python's own check
        return exc
    index = first + (int(found[1]) - 1 if found[1] else 0)
    if not 0 <= index < len(lines):
        return exc
    return InvalidArgument(f"{lines[index]}: message {str(exc)[found.end() :]}; nothing was sent")


def stdin_prompt(stream: TextIO) -> str | None:
    """The line to show before reading messages from stream: only when a person types them."""
    if not stream.isatty():
        return None
    end = "Ctrl-Z then Enter" if sys.platform == "win32" else "Ctrl-D"
    return (
        f"reading messages from the terminal, one JSON value per line; end with {end}"
        " (Ctrl-C sends nothing)"
    )


@main.command()
@click.argument("queue_name", metavar="QUEUE")
@click.argument("message", metavar="[JSON | -]", required=False, default="-")
@click.option("--delay", type=click.IntRange(min=0), default=0, help="Seconds before visible.")
@click.option("--headers", default=None, metavar="JSON", help="Headers: a JSON object.")
@click.option(
    "--dedupe-key",
    default=None,
    help="Single-flight key (one message): nothing is sent while an unfinished message holds it.",
)
@json_option
@connection_options
def send(
    queue_name: str,
    message: str,
    delay: int,
    headers: str | None,
    dedupe_key: str | None,
    as_json: bool,
    dsn: str | None,
    connect_timeout: float,
) -> None:
    """Send one JSON message to QUEUE, or with `-` (the default) one per line of stdin.

    All lines are checked before anything is sent, and they are sent in one
    transaction: a bad line or a lost connection sends nothing. With
    --dedupe-key, a key an unfinished message holds sends nothing: the command
    says so, names that message and exits 0.
    """
    with expected_errors():
        parsed_headers = None if headers is None else parse_json(headers, "--headers")
        if parsed_headers is not None and not isinstance(parsed_headers, dict):
            raise InvalidMessage('--headers must be a JSON object like {"trace": "t-1"}')
        if message == "-":
            if (prompt := stdin_prompt(sys.stdin)) is not None:
                click.echo(prompt, err=True)
            given = [
                (f"line {n} of stdin", line)
                for n, line in enumerate(sys.stdin, start=1)
                if line.strip()
            ]
            if not given:
                fail("no messages on stdin (one JSON value per line); nothing was sent")
            if dedupe_key is not None and len(given) > 1:
                fail("--dedupe-key applies to one message; stdin had several; nothing was sent")
            lines = [where for where, _ in given]
        else:
            given, lines = [("the message", message)], []
        messages = [read_message(text, where) for where, text in given]
        with open_client(dsn, connect_timeout) as client:
            if dedupe_key is None:
                ids = _send_all(client, queue_name, messages, parsed_headers, delay, lines)
                sent = True
                line = _sent_line(queue_name, ids)
            else:
                try:
                    keyed = client.send_keyed(
                        queue_name,
                        messages[0],
                        dedupe_key=dedupe_key,
                        headers=parsed_headers,
                        delay=delay,
                    )
                except InvalidArgument as exc:
                    raise _naming_the_line(exc, lines, 0) from exc
                ids, sent = [keyed.msg_id], keyed.sent
                line = _keyed_line(queue_name, keyed, dedupe_key)
    if as_json:
        duplicate_of = ids[0] if sent is False else None
        emit_json({"queue": queue_name, "msg_ids": ids, "sent": sent, "duplicate_of": duplicate_of})
    else:
        click.echo(line)


def _sent_line(queue_name: str, ids: list[int]) -> str:
    """What a send without a key did, in one line."""
    where = f"queue {sql_literal(queue_name)}"
    if len(ids) == 1:
        return f"sent msg_id {ids[0]} to {where}"
    return f"sent {len(ids)} messages to {where} (msg_ids {ids[0]}..{ids[-1]})"


def _keyed_line(queue_name: str, keyed: KeyedSend, dedupe_key: str) -> str:
    """What a keyed send did, in one line."""
    where = f"queue {sql_literal(queue_name)}"
    key = f"dedupe key {sql_literal(dedupe_key)}"
    if keyed.sent:
        return f"sent msg_id {keyed.msg_id} to {where}"
    return f"not sent: message {keyed.msg_id} (still unfinished) already holds {key} in {where}"


def _send_all(
    client: Client,
    queue_name: str,
    messages: list[Any],
    headers: dict[str, Any] | None,
    delay: int,
    lines: Sequence[str],
) -> list[int]:
    """Send everything in one transaction (all or nothing); the msg_ids in order.

    A message the database refuses is named by its line of stdin (`lines`), if any.
    """
    start = 0
    try:
        if len(messages) == 1:
            return [client.send(queue_name, messages[0], headers=headers, delay=delay)]
        ids: list[int] = []
        bar = Progress(len(messages), f"sending to {queue_name}")
        try:
            with client.connection() as conn, conn.transaction():
                for start in range(0, len(messages), _bulk.CHUNK):
                    chunk = messages[start : start + _bulk.CHUNK]
                    ids += client.send_batch(
                        queue_name, chunk, headers=[headers] * len(chunk), delay=delay, conn=conn
                    )
                    bar.update(len(chunk))
        finally:
            bar.close()
        return ids
    except InvalidArgument as exc:
        raise _naming_the_line(exc, lines, start) from exc


@main.command()
@click.argument("queue_name", metavar="QUEUE")
@click.option(
    "--limit", type=click.IntRange(min=0), default=20, show_default=True, help="Rows at most."
)
@click.option("--after", type=click.IntRange(min=0), default=0, help="Start after this msg_id.")
@json_option
@connection_options
def peek(
    queue_name: str, limit: int, after: int, as_json: bool, dsn: str | None, connect_timeout: float
) -> None:
    """Show QUEUE's live messages, oldest first, without leasing them.

    Nothing changes: no visibility timeout is set and read counts stay.
    STATE is visible (a read would take it), in_flight (leased to a consumer
    until VISIBLE) or delayed (sent with a delay).
    """
    with expected_errors(), open_client(dsn, connect_timeout) as client:
        now = server_now(client)
        got = client.peek(queue_name, qty=limit, after_msg_id=after)
    if as_json:
        emit_json(
            [
                {**with_raw_queries(shape(p, PEEK_FIELDS), _peek_raw(p)), "state": p.state(now)}
                for p in got
            ]
        )
        return
    echo_table(
        [
            Column("MSG_ID", right=True),
            Column("STATE"),
            Column("READ_CT", right=True),
            Column("ENQUEUED"),
            Column("VISIBLE"),
            Column("LAST ERROR", fit="wrap", limit=REASON_LIMIT),
            Column("MESSAGE", fit="clip", limit=60),
        ],
        [_peek_row(p, now) for p in got],
        empty=f"queue {sql_literal(queue_name)} has no live messages"
        + (f" after msg_id {after}" if after else ""),
        footer=f"(first {limit}; more with --after {got[-1].msg_id})" if len(got) == limit else "",
        notes=undecodable_notes(got, _peek_raw),
    )


def _peek_raw(p: PeekedMessage) -> RawQuery:
    """The psql query that prints a column of this live message raw (peek takes the next one)."""
    source = f"pgqueue.peek({sql_literal(p.queue)}, 1, {p.msg_id - 1}) WHERE msg_id = {p.msg_id}"
    return lambda column: f"SELECT {column} FROM {source}"


def _peek_row(p: PeekedMessage, now: datetime) -> tuple[Any, ...]:
    return (
        p.msg_id,
        p.state(now),
        p.read_ct,
        ago(p.enqueued_at, now),
        ago(p.vt, now),
        p.last_error or "-",
        compact_json(p.message),
    )


@main.command()
@click.argument("queue_name", metavar="[QUEUE]", required=False)
@json_option
@connection_options
def metrics(queue_name: str | None, as_json: bool, dsn: str | None, connect_timeout: float) -> None:
    """Show size and age figures of QUEUE, or of every queue."""
    with expected_errors(), open_client(dsn, connect_timeout) as client:
        rows = [client.metrics(queue_name)] if queue_name else client.metrics_all()
    if as_json:
        emit_json([shape(m, METRICS_FIELDS) for m in rows])
        return
    echo_table(
        [
            Column("QUEUE"),
            Column("LIVE", right=True),
            Column("VISIBLE", right=True),
            Column("OLDEST", right=True),
            Column("NEWEST", right=True),
            Column("SENT", right=True),
            Column("POISON", right=True),
        ],
        [
            (
                m.queue_name,
                m.queue_length,
                m.visible_length,
                human_age(m.oldest_msg_age_sec),
                human_age(m.newest_msg_age_sec),
                m.total_messages,
                m.poison_length,
            )
            for m in rows
        ],
        empty="no queues yet; create one with `pgqueue queue create NAME`",
    )
