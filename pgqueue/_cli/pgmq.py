"""`pgqueue pgmq …`: install the pgmq facade, and move a real PGMQ's queues into pgqueue."""

from __future__ import annotations

from dataclasses import asdict
from datetime import timedelta

import click

from pgqueue import _pgmq
from pgqueue._cli._connect import connection_options, open_client
from pgqueue._cli._exits import confirm, expected_errors, yes_option
from pgqueue._cli._json_output import emit_json, json_option
from pgqueue._cli._main import main
from pgqueue._cli._table import Column, echo_table
from pgqueue._cli._text import duration_option, plural
from pgqueue._errors import sql_literal

DEFAULT_LOCK_TIMEOUT = timedelta(seconds=60)


# What PGMQ's Python client needs beside a facade installed as SQL: its default
# start-up runs CREATE EXTENSION IF NOT EXISTS pgmq, which fails here (after an
# import, with PGMQ's own files still on the server: relation "meta" already exists).
CLIENT_SWITCH = (
    "PGMQ's clients: start PGMQ's Python client with init_extension=False (or"
    " PG_INIT_EXTENSION=false); its default CREATE EXTENSION pgmq fails beside the facade"
)


@main.group("pgmq")
def pgmq_group() -> None:
    """The pgmq facade: PGMQ's SQL API over pgqueue, and moving off a real PGMQ (docs/pgmq.md)."""


@pgmq_group.command("install")
@connection_options
def pgmq_install(dsn: str | None, connect_timeout: float) -> None:
    """Install (or upgrade) schema pgmq, PGMQ's functions over pgqueue's queues.

    Needs `pgqueue migrate` first; refused beside a real PGMQ (see `pgqueue pgmq import`).
    """
    with expected_errors(), open_client(dsn, connect_timeout) as client, client.connection() as c:
        before = _pgmq.status(c)
        version = _pgmq.install(c)
    verb = "reinstalled" if before.installed else "installed"
    click.echo(f"{verb} the pgmq facade (PGMQ {version} API) in schema pgmq")
    click.echo(CLIENT_SWITCH)


@pgmq_group.command("uninstall")
@yes_option
@connection_options
def pgmq_uninstall(yes: bool, dsn: str | None, connect_timeout: float) -> None:
    """Remove the pgmq facade; its queues and messages stay pgqueue's (topic bindings go)."""
    with expected_errors(), open_client(dsn, connect_timeout) as client, client.connection() as c:
        found = _pgmq.status(c)
        if found.installed:
            confirm(
                "Remove the pgmq facade? PGMQ clients stop working here; the queues and their"
                " messages stay in pgqueue, the topic bindings are dropped",
                yes,
            )
        removed = _pgmq.uninstall(c)
    if removed:
        click.echo("removed the pgmq facade; the queues and their messages stay in pgqueue")
    else:
        click.echo("the pgmq facade is not installed here; nothing to remove")


@pgmq_group.command("status")
@json_option
@connection_options
def pgmq_status(as_json: bool, dsn: str | None, connect_timeout: float) -> None:
    """Whether the facade is installed (which version), and whether a real PGMQ is here."""
    with expected_errors(), open_client(dsn, connect_timeout) as client, client.connection() as c:
        found = _pgmq.status(c)
    if as_json:
        emit_json(asdict(found))
        return
    if found.installed:
        how = " as the extension pgmq" if found.as_extension else ""
        click.echo(f"pgmq facade: installed{how} (PGMQ {found.version} API)")
        if found.version != found.available_version:
            click.echo(
                f"  this pgqueue has {found.available_version}: `pgqueue pgmq install` upgrades it"
            )
    else:
        click.echo(
            f"pgmq facade: not installed (`pgqueue pgmq install` installs the PGMQ"
            f" {found.available_version} API)"
        )
    if found.real_pgmq is None:
        click.echo("real PGMQ: none")
    else:
        queues = plural(found.pgmq_queues, "queue")
        click.echo(
            f"real PGMQ: {found.real_pgmq}, {queues}; `pgqueue pgmq import` moves them into pgqueue"
        )


@pgmq_group.command("import")
@click.option("--dry-run", is_flag=True, help="Report what would move; change nothing.")
@click.option(
    "--queue",
    "queues",
    multiple=True,
    metavar="NAME",
    help="Move only this PGMQ queue (repeat); PGMQ stays, without the facade, while it has others.",
)
@duration_option(
    "--lock-timeout",
    help="How long to wait for PGMQ's tables (a long transaction may hold them) [60s].",
)
@yes_option
@json_option
@connection_options
def pgmq_import(
    dry_run: bool,
    queues: tuple[str, ...],
    lock_timeout: timedelta | None,
    yes: bool,
    as_json: bool,
    dsn: str | None,
    connect_timeout: float,
) -> None:
    """Move a real PGMQ's queues and archives into pgqueue, then put the facade in its place.

    One transaction: every live message keeps its msg_id, read_ct, times,
    payload and headers, every archived one too; producers and readers wait
    for it, then find the facade. Anything that cannot move as it is stops
    the import with nothing changed.
    """
    wait = (lock_timeout or DEFAULT_LOCK_TIMEOUT).total_seconds()
    selected = list(queues) or None
    with expected_errors(), open_client(dsn, connect_timeout) as client, client.connection() as c:
        plan = _pgmq.import_pgmq(c, queues=selected, dry_run=True, lock_timeout_seconds=wait)
        if dry_run:
            report = plan
        else:
            if not (as_json or yes):
                _show(plan)
            confirm(
                f"Move {plural(len(plan.queues), 'queue')} into pgqueue and remove"
                f" {'them from ' if plan.left_in_pgmq else ''}PGMQ?",
                yes,
            )
            report = _pgmq.import_pgmq(c, queues=selected, lock_timeout_seconds=wait)
    if as_json:
        emit_json(asdict(report))
        return
    if dry_run or yes:  # else the plan was shown before the question
        _show(report)
    click.echo(_summary(report))
    for note in report.notes:
        click.echo(f"note: {note}")
    if report.facade_version is not None and not report.dry_run:
        click.echo(CLIENT_SWITCH)


def _show(report: _pgmq.ImportReport) -> None:
    """The table of queues and their counts."""
    echo_table(
        [
            Column("QUEUE"),
            Column("PGMQ_NAME"),
            Column("LIVE", right=True),
            Column("ARCHIVED", right=True),
            Column("GROUPED", right=True),
            Column("LAST_ID", right=True),
            Column("KIND"),
        ],
        [
            (
                q.queue_name,
                q.pgmq_name,
                q.live,
                q.archived,
                q.grouped,
                q.last_msg_id,
                "partitioned" if q.partitioned else "unlogged" if q.unlogged else "-",
            )
            for q in report.queues
        ],
        empty="PGMQ has no queues",
    )


def _summary(report: _pgmq.ImportReport) -> str:
    live = sum(q.live for q in report.queues)
    archived = sum(q.archived for q in report.queues)
    what = (
        f"{plural(len(report.queues), 'queue')} ({plural(live, 'live message')},"
        f" {archived} archived) from PGMQ ({report.pgmq})"
    )
    if report.dry_run:
        return f"dry run: would move {what} into pgqueue; nothing was changed"
    if report.facade_version is None:
        left = ", ".join(sql_literal(n) for n in report.left_in_pgmq)
        return f"moved {what} into pgqueue; PGMQ keeps {left}"
    return (
        f"moved {what} into pgqueue, removed PGMQ and installed the pgmq facade"
        f" (PGMQ {report.facade_version} API)"
    )
