"""`pgqueue queue …`: create, list, pause, resume, purge and drop queues."""

from __future__ import annotations

import getpass
from datetime import datetime

import click

from pgqueue._cli import _bulk
from pgqueue._cli._bulk import Progress
from pgqueue._cli._connect import connection_options, open_client, server_now
from pgqueue._cli._exits import confirm, expected_errors, fail, yes_option
from pgqueue._cli._json_output import emit_json, json_option, shape
from pgqueue._cli._main import main
from pgqueue._cli._table import Column, echo_table
from pgqueue._cli._text import ago, plural
from pgqueue._client import Client
from pgqueue._errors import sql_literal
from pgqueue._pgmq import NEVER_POISON
from pgqueue.types import QueueInfo, QueueMetrics

QUEUE_FIELDS = {
    "queue": "queue_name",
    "max_attempts": "max_attempts",
    "created_at": "created_at",
    "paused": "paused",
    "paused_at": "paused_at",
    "paused_by": "paused_by",
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
            n = client.purge_queue_chunk(name, up_to_msg_id=m.total_messages, qty=_bulk.CHUNK)
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
        if m.queue_length > _bulk.CHUNK:
            _purge_live(client, name, m, f"emptying {name}")
        if not client.drop_queue(name):
            fail(f"queue {sql_literal(name)} was dropped by someone else meanwhile")
        click.echo(f"dropped queue {sql_literal(name)}")
