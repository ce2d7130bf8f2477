"""`pgqueue queue …`, `send`, `peek` and `metrics`: queues and their live messages."""

from __future__ import annotations

import getpass
import json
import math
import re
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import Any, TextIO

import click

from pgqueue._calls import encode_json
from pgqueue._cli._common import (
    Column,
    Progress,
    RawQuery,
    ago,
    compact_json,
    confirm,
    connection_options,
    echo_table,
    emit_json,
    expected_errors,
    fail,
    human_age,
    json_option,
    open_client,
    plural,
    server_now,
    shape,
    undecodable_notes,
    with_raw_queries,
    yes_option,
)
from pgqueue._cli._main import main
from pgqueue._cli.poison import REASON_LIMIT
from pgqueue._client import Client
from pgqueue._errors import InvalidArgument, InvalidMessage, sql_literal
from pgqueue._pgmq import NEVER_POISON
from pgqueue.types import KeyedSend, PeekedMessage, QueueInfo, QueueMetrics

# Rows per transaction for bulk work: short transactions, steady progress.
CHUNK = 1000

QUEUE_FIELDS = {
    "queue": "queue_name",
    "max_attempts": "max_attempts",
    "created_at": "created_at",
    "paused": "paused",
    "paused_at": "paused_at",
    "paused_by": "paused_by",
}
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


@main.group()
def queue() -> None:
    """Create, list, pause, resume, purge and drop queues."""


@queue.command("create")
@click.argument("names", metavar="NAME...", nargs=-1, required=True)
@click.option(
    "--max-attempts",
    type=click.IntRange(min=1),
    default=5,
    show_default=True,
    help="Reads before a message is poison-dropped.",
)
@connection_options
def queue_create(
    names: tuple[str, ...], max_attempts: int, dsn: str | None, connect_timeout: float
) -> None:
    """Create each queue NAME (or set its max-attempts if it exists), in one transaction."""
    with expected_errors(), open_client(dsn, connect_timeout) as client:
        existing = {q.queue_name for q in client.list_queues()}
        with client.connection() as conn, conn.transaction():
            for name in names:
                client.create_queue(name, max_attempts=max_attempts, conn=conn)
        for name in names:
            verb = "updated" if name in existing else "created"
            click.echo(f"{verb} queue {sql_literal(name)} (max_attempts={max_attempts})")


@queue.command("list")
@json_option
@connection_options
def queue_list(as_json: bool, dsn: str | None, connect_timeout: float) -> None:
    """List every queue with its max-attempts, and since when (and by whom) it is paused."""
    with expected_errors(), open_client(dsn, connect_timeout) as client:
        now = server_now(client)
        queues = client.list_queues()
    if as_json:
        emit_json([{**shape(q, QUEUE_FIELDS), "max_attempts": _attempts(q)} for q in queues])
        return
    echo_table(
        [Column("QUEUE"), Column("MAX_ATTEMPTS", right=True), Column("CREATED"), Column("PAUSED")],
        [
            (q.queue_name, _attempts_cell(q), ago(q.created_at, now), _paused_cell(q, now))
            for q in queues
        ],
        empty="no queues yet; create one with `pgqueue queue create NAME`",
    )


# How the table shows a queue that never poison-drops (--json: null).
UNLIMITED = "unlimited"


def _attempts(q: QueueInfo) -> int | None:
    """The queue's max_attempts; None for a queue that never poison-drops.

    A queue imported from PGMQ (or made by the facade) keeps PGMQ's behaviour
    with the largest max_attempts a read count can hold: no read reaches it.
    """
    return None if q.max_attempts >= NEVER_POISON else q.max_attempts


def _attempts_cell(q: QueueInfo) -> int | str:
    """The MAX_ATTEMPTS cell: the number, or 'unlimited'."""
    attempts = _attempts(q)
    return UNLIMITED if attempts is None else attempts


def _paused_cell(q: QueueInfo, now: datetime) -> str:
    """'-' for a running queue; '3m ago by alice' for a paused one."""
    if q.paused_at is None:
        return "-"
    by = f" by {q.paused_by}" if q.paused_by else ""
    return f"{ago(q.paused_at, now)}{by}"


def _default_actor() -> str | None:
    """Who pauses from this shell: the operating system's user name, if it has one."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return None


@queue.command("pause")
@click.argument("name")
@click.option(
    "--actor",
    default=None,
    metavar="TEXT",
    help="Who pauses it, kept as paused_by [default: your user name].",
)
@json_option
@connection_options
def queue_pause(
    name: str, actor: str | None, as_json: bool, dsn: str | None, connect_timeout: float
) -> None:
    """Pause NAME: reads (workers') get nothing from it until `pgqueue queue resume NAME`.

    Sends, acks, nacks and barrier completions go on; messages wait. Leases
    already handed out and barrier deadlines keep running.
    """
    who = actor if actor is not None else _default_actor()
    with expected_errors(), open_client(dsn, connect_timeout) as client:
        changed = client.pause_queue(name, actor=who)
        info = None if changed else _queue_info(client, name)
        now = server_now(client)
    if as_json:
        emit_json({"queue": name, "paused": True, "changed": changed})
    elif changed:
        click.echo(
            f"paused queue {sql_literal(name)}: reads get nothing until"
            f" `pgqueue queue resume {name}`"
        )
    else:
        since = f" ({_paused_cell(info, now)})" if info is not None else ""
        click.echo(f"queue {sql_literal(name)} was already paused{since}; nothing changed")


@queue.command("resume")
@click.argument("name")
@json_option
@connection_options
def queue_resume(name: str, as_json: bool, dsn: str | None, connect_timeout: float) -> None:
    """Resume NAME: reads get its messages again, and waiting workers are woken at once."""
    with expected_errors(), open_client(dsn, connect_timeout) as client:
        changed = client.resume_queue(name)
    if as_json:
        emit_json({"queue": name, "paused": False, "changed": changed})
    elif changed:
        click.echo(f"resumed queue {sql_literal(name)}: reads get its messages again")
    else:
        click.echo(f"queue {sql_literal(name)} was not paused; nothing changed")


def _queue_info(client: Client, name: str) -> QueueInfo | None:
    return next((q for q in client.list_queues() if q.queue_name == name), None)


def _purge_live(client: Client, name: str, m: QueueMetrics, label: str) -> int:
    """Delete the queue's live messages in chunks, up to the last id sent before we began."""
    bar = Progress(m.queue_length, label)
    done = 0
    try:
        while True:
            n = client.purge_queue_chunk(name, up_to_msg_id=m.total_messages, qty=CHUNK)
            if n == 0:
                return done
            done += n
            bar.update(n)
    except KeyboardInterrupt:
        fail(f"interrupted after purging {plural(done, 'message')}; run it again to finish", 130)
    finally:
        bar.close()


@queue.command("purge")
@click.argument("name")
@yes_option
@connection_options
def queue_purge(name: str, yes: bool, dsn: str | None, connect_timeout: float) -> None:
    """Delete every live message of NAME (poison messages stay; see `poison purge`).

    Messages sent while the purge runs are kept. Barrier members purged count
    as failed, so their barriers still fire.
    """
    with expected_errors(), open_client(dsn, connect_timeout) as client:
        m = client.metrics(name)  # QueueNotFound: one line
        if m.queue_length == 0:
            click.echo(f"queue {sql_literal(name)} has no live messages; nothing to purge")
            return
        live = plural(m.queue_length, "live message")
        confirm(f"Delete the {live} of queue {sql_literal(name)}?", yes)
        done = _purge_live(client, name, m, f"purging {name}")
        click.echo(f"purged {plural(done, 'message')} from queue {sql_literal(name)}")


@queue.command("drop")
@click.argument("name")
@yes_option
@connection_options
def queue_drop(name: str, yes: bool, dsn: str | None, connect_timeout: float) -> None:
    """Drop NAME with its live, archived and poison messages.

    Refused while open barriers will send their callback to NAME.
    """
    with expected_errors(), open_client(dsn, connect_timeout) as client:
        m = client.metrics(name)  # QueueNotFound: one line
        confirm(
            f"Drop queue {sql_literal(name)} with {plural(m.queue_length, 'live message')}"
            f" and {plural(m.poison_length, 'poison message')}?",
            yes,
        )
        if m.queue_length > CHUNK:
            _purge_live(client, name, m, f"emptying {name}")
        if not client.drop_queue(name):
            fail(f"queue {sql_literal(name)} was dropped by someone else meanwhile")
        click.echo(f"dropped queue {sql_literal(name)}")


class _NotJson(ValueError):
    """A value Python's JSON reader takes but JSON has not (NaN, Infinity, 1e999)."""


def _no_constant(name: str) -> Any:
    raise _NotJson(
        f"{name} is not a JSON value (JSON has no NaN or Infinity; send null or a string instead)"
    )


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _NotJson(f"the number {text} is out of range (beyond 1.8e308); send it as a string")
    return value


def _parse_json(text: str, where: str) -> Any:
    """JSON from text; else InvalidMessage saying why, in JSON terms, and that nothing was sent."""
    sys.set_int_max_str_digits(0)  # integers of any length, as Postgres takes them
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError as exc:
        raise InvalidMessage(
            f"{where} is nested too deep for Python's JSON reader (about 1,000 levels);"
            " pgqueue takes at most 255 levels: flatten it; nothing was sent"
        ) from exc
    except json.JSONDecodeError as exc:
        raise InvalidMessage(
            f"{where} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno});"
            " nothing was sent"
        ) from exc
    except _NotJson as exc:
        raise InvalidMessage(f"{where} is not valid JSON: {exc}; nothing was sent") from exc


def _message(text: str, where: str) -> Any:
    """A message from text, checked as the client will check it (a NUL, ...), naming `where`."""
    value = _parse_json(text, where)
    try:
        encode_json(value, where)
    except InvalidMessage as exc:
        raise InvalidMessage(f"{exc}; nothing was sent") from exc
    return value


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
        parsed_headers = None if headers is None else _parse_json(headers, "--headers")
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
        messages = [_message(text, where) for where, text in given]
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
                for start in range(0, len(messages), CHUNK):
                    chunk = messages[start : start + CHUNK]
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
