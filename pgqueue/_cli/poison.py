"""`pgqueue poison …`: inspect, requeue and purge poison (dead-letter) messages."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import click

from pgqueue._cli._bulk import Progress
from pgqueue._cli._connect import connection_options, open_client, server_now
from pgqueue._cli._exits import confirm, expected_errors, fail, yes_option
from pgqueue._cli._json_output import (
    RawQuery,
    compact_json,
    emit_json,
    json_option,
    shape,
    undecodable_line,
    undecodable_notes,
    with_raw_queries,
)
from pgqueue._cli._main import main
from pgqueue._cli._table import Column, echo_table
from pgqueue._cli._text import ago, duration_option, plural, when
from pgqueue._client import Client
from pgqueue._connection import Connection
from pgqueue._errors import sql_literal
from pgqueue.types import PoisonFilter, PoisonMessage, Undecodable

POISON_FIELDS = {
    "queue": "queue_name",
    "msg_id": "msg_id",
    "read_ct": "read_ct",
    "enqueued_at": "enqueued_at",
    "poisoned_at": "poisoned_at",
    "reason": "reason",
    "message": "message",
    "headers": "headers",
}
# Ids per transaction for bulk requeue and purge.
CHUNK = 500
# Characters of a reason a table shows (wrapped); `poison show` has all of it.
REASON_LIMIT = 300

POISON_COLUMNS = [
    Column("QUEUE"),
    Column("MSG_ID", right=True),
    Column("READ_CT", right=True),
    Column("ENQUEUED"),
    Column("POISONED"),
    Column("REASON", fit="wrap", limit=REASON_LIMIT),
    Column("MESSAGE", fit="clip", limit=60),
]


def poison_rows(
    items: Sequence[PoisonMessage], now: datetime | None = None
) -> list[tuple[object, ...]]:
    """The rows of the `poison list` table, with ages seen from now (the server's, if given)."""
    at = datetime.now(UTC) if now is None else now
    return [
        (
            p.queue_name,
            p.msg_id,
            p.read_ct,
            ago(p.enqueued_at, at),
            ago(p.poisoned_at, at),
            p.reason,
            compact_json(p.message),
        )
        for p in items
    ]


@main.group()
def poison() -> None:
    """Inspect, requeue and purge poison messages (those that ran out of attempts)."""


@poison.command("list")
@click.argument("queue_name", metavar="[QUEUE]", required=False)
@click.option(
    "--limit", type=click.IntRange(min=0), default=50, show_default=True, help="Rows at most."
)
@duration_option("--since", help="Only poisoned in the last …, e.g. 2h.")
@click.option("--reason", default=None, help="Only reasons containing this text (any case).")
@json_option
@connection_options
def poison_list(
    queue_name: str | None,
    limit: int,
    since: timedelta | None,
    reason: str | None,
    as_json: bool,
    dsn: str | None,
    connect_timeout: float,
) -> None:
    """List poison messages, newest first, of QUEUE or of every queue."""
    with expected_errors(), open_client(dsn, connect_timeout) as client:
        now = server_now(client)
        after = None if since is None else now - since
        items = client.poison_list(queue_name, qty=limit, since=after, reason=reason)
        total = client.poison_count(queue_name, PoisonFilter(after=after, reason=reason))
    if as_json:
        emit_json([with_raw_queries(shape(p, POISON_FIELDS), poison_raw(p)) for p in items])
        return
    where = f" in queue {sql_literal(queue_name)}" if queue_name else ""
    echo_table(
        POISON_COLUMNS,
        poison_rows(items, now),
        empty=f"no poison messages{where}" + (" match" if since or reason else ""),
        footer=f"({len(items)} of {total}; see more with --limit)" if total > len(items) else "",
        notes=undecodable_notes(items, poison_raw),
    )


def poison_raw(p: PoisonMessage) -> RawQuery:
    """The psql query that prints a column of this poison message raw."""
    source = f"pgqueue.poison_get({sql_literal(p.queue_name)}, {p.msg_id})"
    return lambda column: f"SELECT {column} FROM {source}"


@poison.command("show")
@click.argument("queue_name", metavar="QUEUE")
@click.argument("msg_id", type=int)
@json_option
@connection_options
def poison_show(
    queue_name: str, msg_id: int, as_json: bool, dsn: str | None, connect_timeout: float
) -> None:
    """Show one poison message in full: message, headers and reason."""
    with expected_errors(), open_client(dsn, connect_timeout) as client:
        p = client.poison_get(queue_name, msg_id)
    if p is None:
        fail(
            f"queue {sql_literal(queue_name)} has no poison message {msg_id};"
            f" `pgqueue poison list {queue_name}` shows the ones it has"
        )
    if as_json:
        emit_json(with_raw_queries(shape(p, POISON_FIELDS), poison_raw(p)))
        return
    click.echo(f"queue:     {p.queue_name}")
    click.echo(f"msg_id:    {p.msg_id}")
    click.echo(f"read_ct:   {p.read_ct}")
    click.echo(f"enqueued:  {when(p.enqueued_at)}")
    click.echo(f"poisoned:  {when(p.poisoned_at)}")
    click.echo(f"reason:    {p.reason}")
    raw = poison_raw(p)
    if p.headers is None:
        click.echo("headers:   (none)")
    elif isinstance(p.headers, Undecodable):
        click.echo("headers:   " + undecodable_line(p.headers, raw("headers")))
    else:
        click.echo("headers:")
        emit_json(p.headers)
    if isinstance(p.message, Undecodable):
        click.echo("message:   " + undecodable_line(p.message, raw("message")))
    else:
        click.echo("message:")
        emit_json(p.message)


class _Missing(Exception):
    """Some of the ids asked for are not poison messages of the queue: roll back."""


def _explicit(
    client: Client,
    queue_name: str,
    msg_ids: Sequence[int],
    act: Callable[[list[int], Connection], int],
    verb: str,
) -> int:
    """Apply act to exactly these ids in one transaction; if any is missing, change nothing."""
    wanted = sorted(set(msg_ids))
    try:
        with client.connection() as conn, conn.transaction():
            if act(wanted, conn) != len(wanted):
                raise _Missing
    except _Missing:
        missing = [i for i in wanted if client.poison_get(queue_name, i) is None]
        shown = ", ".join(map(str, missing[:20])) + (" …" if len(missing) > 20 else "")
        fail(
            f"queue {sql_literal(queue_name)} has no poison message {shown}; nothing was {verb}"
            f" (`pgqueue poison list {queue_name}` shows the ones it has)"
        )
    return len(wanted)


def _bulk(
    client: Client,
    queue_name: str,
    where: PoisonFilter,
    verb: str,
    past: str,
    act: Callable[[list[int]], int],
    yes: bool,
    quiet: bool = False,
) -> int:
    """Apply act to every matching poison id, a chunk per transaction; how many it changed."""
    total = client.poison_count(queue_name, where)
    if total == 0:
        if not quiet:
            in_queue = f"in queue {sql_literal(queue_name)}"
            click.echo(f"no poison messages {in_queue} match; nothing to {verb}")
        return 0
    n = plural(total, "poison message")
    confirm(f"{verb.capitalize()} {n} of queue {sql_literal(queue_name)}?", yes)
    bar = Progress(total, f"{verb} {queue_name}")
    done = 0
    after = 0
    try:
        while ids := client.poison_ids(queue_name, after_msg_id=after, qty=CHUNK, where=where):
            done += act(ids)
            after = ids[-1]
            bar.update(len(ids))
    except KeyboardInterrupt:
        fail(f"interrupted: {past} {done} of {total} messages; run it again to finish", 130)
    finally:
        bar.close()
    return done


def _selection(
    msg_ids: Sequence[int],
    all_: bool,
    since: timedelta | None,
    older_than: timedelta | None,
    reason: str | None,
) -> None:
    """Usage check: either ids or --all (with its filters), never both, never neither."""
    if bool(msg_ids) == all_:
        raise click.UsageError("give MSG_IDs or --all (not both)")
    if msg_ids and (since or older_than or reason):
        raise click.UsageError("--since, --older-than and --reason go with --all")


def _window(
    now: datetime, since: timedelta | None, older_than: timedelta | None, reason: str | None
) -> PoisonFilter:
    """Poisoned in [now - since, now - older_than); never after `now`, when the command began."""
    return PoisonFilter(
        after=None if since is None else now - since,
        before=now - (older_than or timedelta(0)),
        reason=reason,
    )


def _selection_options(func: Callable[..., None]) -> Callable[..., None]:
    for option in reversed(
        [
            click.argument("queue_name", metavar="QUEUE"),
            click.argument("msg_ids", metavar="[MSG_ID]...", nargs=-1, type=int),
            click.option("--all", "all_", is_flag=True, help="Every poison message of QUEUE."),
            duration_option("--since", help="With --all: poisoned in the last …"),
            duration_option("--older-than", help="With --all: poisoned before …"),
            click.option("--reason", help="With --all: reason contains this text (any case)."),
            yes_option,
            connection_options,
        ]
    ):
        func = option(func)
    return func


@dataclass(frozen=True)
class _Change:
    """A change to poison messages: its words and how to apply it to ids (on conn, if given)."""

    verb: str
    past: str
    act: Callable[[Client, str, list[int], Connection | None], int]


_PURGE = _Change("purge", "purged", lambda c, q, ids, conn: c.poison_purge(q, ids, conn=conn))


def _change(
    change: _Change,
    queue_name: str,
    msg_ids: tuple[int, ...],
    all_: bool,
    since: timedelta | None,
    older_than: timedelta | None,
    reason: str | None,
    yes: bool,
    dsn: str | None,
    connect_timeout: float,
    quiet: bool = False,
) -> int:
    """Apply the change to the selected messages, after confirmation; how many it changed.

    `quiet` leaves out the line saying nothing matched (--json prints the document alone).
    """
    _selection(msg_ids, all_, since, older_than, reason)
    with expected_errors(), open_client(dsn, connect_timeout) as client:
        if msg_ids:
            n = plural(len(set(msg_ids)), "poison message")
            confirm(f"{change.verb.capitalize()} {n} of queue {sql_literal(queue_name)}?", yes)
            return _explicit(
                client,
                queue_name,
                msg_ids,
                lambda ids, conn: change.act(client, queue_name, ids, conn),
                change.past,
            )
        return _bulk(
            client,
            queue_name,
            _window(server_now(client), since, older_than, reason),
            change.verb,
            change.past,
            lambda ids: change.act(client, queue_name, ids, None),
            yes,
            quiet,
        )


# New msg_ids a requeue line names; --json gives them all.
SHOWN_IDS = 20


@poison.command("requeue")
@_selection_options
@json_option
def poison_requeue(as_json: bool, **selection: Any) -> None:
    """Put poison messages back in QUEUE with a fresh read count, under new ids, and print them.

    Either the given MSG_IDs (all of them, or none if one is not there), or
    --all of them, narrowed by --since, --older-than and --reason, a chunk
    per transaction. Messages poisoned again while this runs are left alone.
    """
    new_ids: list[int] = []

    def requeue(client: Client, queue: str, ids: list[int], conn: Connection | None) -> int:
        moved = client.poison_requeue(queue, ids, conn=conn)
        new_ids.extend(moved)
        return len(moved)

    done = _change(_Change("requeue", "requeued", requeue), **selection, quiet=as_json)
    queue_name = selection["queue_name"]
    if as_json:
        emit_json({"queue": queue_name, "requeued": done, "msg_ids": new_ids})
    elif done:
        shown = ", ".join(map(str, new_ids[:SHOWN_IDS]))
        rest = len(new_ids) - SHOWN_IDS
        more = f" and {rest} more (--json lists all)" if rest > 0 else ""
        ids = "msg_id" if done == 1 else "msg_ids"
        click.echo(
            f"requeued {plural(done, 'message')} to queue {sql_literal(queue_name)}"
            f" as new {ids} {shown}{more}"
        )


@poison.command("purge")
@_selection_options
def poison_purge(**selection: Any) -> None:
    """Delete poison messages of QUEUE for good.

    Either the given MSG_IDs (all of them, or none if one is not there), or
    --all of them, narrowed by --older-than, --since and --reason, a chunk
    per transaction. Messages poisoned after the command began are kept.
    """
    if done := _change(_PURGE, **selection):
        queue_name = selection["queue_name"]
        click.echo(f"purged {plural(done, 'poison message')} from queue {sql_literal(queue_name)}")
