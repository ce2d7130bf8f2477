"""`pgqueue barrier …` and `pgqueue claims …`: fan-in progress and single-flight keys."""

from __future__ import annotations

from datetime import timedelta

import click

from pgqueue._cli._connect import connection_options, open_client, server_now
from pgqueue._cli._exits import confirm, expected_errors, yes_option
from pgqueue._cli._json_output import emit_json, json_option, shape
from pgqueue._cli._main import main
from pgqueue._cli._table import Column, echo_table
from pgqueue._cli._text import ago, duration_option, exact_duration, plural, when
from pgqueue._cli.poison import REASON_LIMIT
from pgqueue.types import BarrierStatus

BARRIER_FIELDS = {
    "barrier_id": "barrier_id",
    "queue": "queue_name",
    "callback_queue": "callback_queue",
    "total": "total",
    "succeeded": "succeeded",
    "failed": "failed",
    "remaining": "remaining",
    "state": "state",
    "created_at": "created_at",
    "fired_at": "fired_at",
    "callback_msg_id": "callback_msg_id",
    "deadline": "deadline",
    "policy": "policy",
    "max_failures": "max_failures",
    "max_failure_ratio": "max_failure_ratio",
    "cancelled": "cancelled",
    "sealed": "sealed",
    "outcome": "outcome",
}
FAILURE_FIELDS = {
    "member_index": "member_index",
    "msg_id": "msg_id",
    "outcome": "outcome",
    "reason": "reason",
    "result": "result",
    "completed_at": "completed_at",
}
CLAIM_FIELDS = {
    "key": "key",
    "owner": "owner",
    "state": "state",
    "lease_until": "lease_until",
    "claimed_at": "claimed_at",
    "finished_at": "finished_at",
}


@main.group()
def barrier() -> None:
    """Inspect fan-out barriers and fire overdue ones."""


@barrier.command("list")
@click.option("--state", type=click.Choice(["open", "fired", "expired"]), help="Only this state.")
@click.option(
    "--limit", type=click.IntRange(min=0), default=50, show_default=True, help="Rows at most."
)
@json_option
@connection_options
def barrier_list(
    state: str | None, limit: int, as_json: bool, dsn: str | None, connect_timeout: float
) -> None:
    """List barriers, newest first."""
    with expected_errors(), open_client(dsn, connect_timeout) as client:
        now = server_now(client)
        items = client.list_barriers(state=state, qty=limit)
    if as_json:
        emit_json([shape(b, BARRIER_FIELDS) for b in items])
        return
    echo_table(
        [
            Column("BARRIER_ID"),
            Column("STATE"),
            Column("QUEUE"),
            Column("TOTAL", right=True),
            Column("OK", right=True),
            Column("FAILED", right=True),
            Column("LEFT", right=True),
            Column("CREATED"),
            Column("FIRED"),
        ],
        [
            (
                b.barrier_id,
                b.state,
                b.queue_name or "(dropped)",
                b.total,
                b.succeeded,
                b.failed,
                b.remaining,
                ago(b.created_at, now),
                ago(b.fired_at, now),
            )
            for b in items
        ],
        empty="no barriers" + (f" in state {state}" if state else ""),
    )


@barrier.command("show")
@click.argument("barrier_id")
@click.option(
    "--limit",
    type=click.IntRange(min=0),
    default=50,
    show_default=True,
    help="Failed members shown at most.",
)
@json_option
@connection_options
def barrier_show(
    barrier_id: str, limit: int, as_json: bool, dsn: str | None, connect_timeout: float
) -> None:
    """Show a barrier's progress and the members that failed, with why."""
    with expected_errors(), open_client(dsn, connect_timeout) as client:
        now = server_now(client)
        b = client.barrier_status(barrier_id)
        failures = client.barrier_failures(barrier_id, qty=limit)
    if as_json:
        emit_json(
            {**shape(b, BARRIER_FIELDS), "failures": [shape(f, FAILURE_FIELDS) for f in failures]}
        )
        return
    click.echo(f"barrier:   {b.barrier_id}")
    ended = f" ({b.outcome})" if b.outcome else ("" if b.sealed else " (not sealed: takes members)")
    click.echo(f"state:     {b.state}{ended}")
    click.echo(f"policy:    {policy_text(b)}")
    click.echo(f"members:   queue {b.queue_name or '(dropped)'}")
    click.echo(
        f"progress:  {b.total - b.remaining}/{b.total} done"
        f" (succeeded {b.succeeded}, failed {b.failed}, cancelled {b.cancelled},"
        f" remaining {b.remaining})"
    )
    click.echo(
        f"callback:  queue {b.callback_queue or '(dropped)'}, msg_id {b.callback_msg_id or '-'}"
    )
    click.echo(f"created:   {when(b.created_at)}")
    click.echo(f"fired:     {when(b.fired_at)}")
    click.echo(f"deadline:  {when(b.deadline)}")
    if not failures:
        click.echo("no failed members")
        return
    click.echo("failed members:")
    echo_table(
        [
            Column("INDEX", right=True),
            Column("MSG_ID", right=True),
            Column("OUTCOME"),
            Column("COMPLETED"),
            Column("REASON", fit="wrap", limit=REASON_LIMIT),
        ],
        [
            (f.member_index, f.msg_id, f.outcome, ago(f.completed_at, now), f.reason)
            for f in failures
        ],
        empty="",
        footer=f"(first {limit}; see more with --limit)" if len(failures) == limit else "",
    )


def policy_text(b: BarrierStatus) -> str:
    """The failure policy as a reader says it."""
    if b.policy != "max_failures":
        return b.policy
    limits = []
    if b.max_failures is not None:
        limits.append(f"at most {b.max_failures} failed")
    if b.max_failure_ratio is not None:
        limits.append(f"at most {b.max_failure_ratio:g} of the members failed")
    return "max_failures: " + ", and ".join(limits)


@barrier.command("seal")
@click.argument("barrier_id")
@json_option
@connection_options
def barrier_seal(barrier_id: str, as_json: bool, dsn: str | None, connect_timeout: float) -> None:
    """Say an open barrier takes no more members: it fires once each has an outcome."""
    with expected_errors(), open_client(dsn, connect_timeout) as client:
        b = client.seal(barrier_id)
    if as_json:
        emit_json(shape(b, BARRIER_FIELDS))
        return
    if b.state == "open":
        click.echo(f"sealed {b.barrier_id}: fires when its {b.remaining} remaining member(s) end")
    else:
        click.echo(
            f"sealed {b.barrier_id}: {b.state} ({b.outcome}), callback msg_id {b.callback_msg_id}"
        )


@barrier.command("expire")
@connection_options
def barrier_expire(dsn: str | None, connect_timeout: float) -> None:
    """Fire the callbacks of barriers past their deadline (missing members count as timed out).

    Safe to run from cron and from many places at once; workers also do it.
    """
    with expected_errors(), open_client(dsn, connect_timeout) as client:
        n = client.expire_barriers()
    click.echo(f"expired {plural(n, 'barrier')}")


@main.group()
def claims() -> None:
    """Inspect single-flight claims and purge old tombstones."""


@claims.command("list")
@click.option(
    "--limit", type=click.IntRange(min=0), default=50, show_default=True, help="Rows at most."
)
@json_option
@connection_options
def claims_list(limit: int, as_json: bool, dsn: str | None, connect_timeout: float) -> None:
    """List the most recent claims: held ones with their lease, finished ones (tombstones)."""
    with expected_errors(), open_client(dsn, connect_timeout) as client:
        now = server_now(client)
        items = client.list_claims(qty=limit)
    if as_json:
        emit_json([shape(c, CLAIM_FIELDS) for c in items])
        return
    echo_table(
        [
            Column("KEY"),
            Column("STATE"),
            Column("OWNER"),
            Column("CLAIMED"),
            Column("LEASE UNTIL"),
            Column("FINISHED"),
        ],
        [
            (
                c.key,
                c.state,
                c.owner,
                ago(c.claimed_at, now),
                ago(c.lease_until, now),
                ago(c.finished_at, now),
            )
            for c in items
        ],
        empty="no claims",
    )


@claims.command("purge")
@duration_option("--older-than", required=True, help="Finished before …, e.g. 30d.")
@yes_option
@connection_options
def claims_purge(older_than: timedelta, yes: bool, dsn: str | None, connect_timeout: float) -> None:
    """Delete tombstones of claims finished longer ago than --older-than.

    After that, the same key could be claimed and its work run again.
    """
    with expected_errors(), open_client(dsn, connect_timeout) as client:
        confirm(f"Delete claim tombstones older than {exact_duration(older_than)}?", yes)
        n = client.purge_claims(older_than_seconds=int(older_than.total_seconds()))
    click.echo(f"purged {plural(n, 'tombstone')}")
