"""`pgqueue workflow …`: list workflows, show one step by step, cancel one."""

from __future__ import annotations

import click

from pgqueue._calls.workflow import STATES
from pgqueue._cli._connect import connection_options, open_client, server_now
from pgqueue._cli._exits import confirm, expected_errors, yes_option
from pgqueue._cli._json_output import emit_json, json_option, shape
from pgqueue._cli._main import main
from pgqueue._cli._table import Column, echo_table
from pgqueue._cli._text import ago, when
from pgqueue.types import StepStatus, WorkflowStatus

WORKFLOW_FIELDS = {
    "workflow_id": "workflow_id",
    "state": "state",
    "sealed": "sealed",
    "steps": "steps",
    "steps_left": "steps_left",
    "waiting": "waiting",
    "enqueued": "enqueued",
    "succeeded": "succeeded",
    "failed": "failed",
    "cancelled": "cancelled",
    "callback_queue": "callback_queue",
    "callback_msg_id": "callback_msg_id",
    "created_at": "created_at",
    "finished_at": "finished_at",
}
STEP_FIELDS = {
    "step": "step",
    "queue": "queue_name",
    "state": "state",
    "depends_on": "depends_on",
    "on_dependency_failure": "on_dependency_failure",
    "barrier_id": "barrier_id",
    "total": "total",
    "succeeded": "succeeded",
    "failed": "failed",
    "cancelled": "cancelled",
    "remaining": "remaining",
    "enqueued_at": "enqueued_at",
    "finished_at": "finished_at",
}


@main.group()
def workflow() -> None:
    """Inspect workflows (steps with dependencies) and cancel them."""


@workflow.command("list")
@click.option("--state", type=click.Choice(list(STATES)), help="Only this state.")
@click.option(
    "--limit", type=click.IntRange(min=0), default=50, show_default=True, help="Rows at most."
)
@json_option
@connection_options
def workflow_list(
    state: str | None, limit: int, as_json: bool, dsn: str | None, connect_timeout: float
) -> None:
    """List workflows, newest first, with their steps counted by state."""
    with expected_errors(), open_client(dsn, connect_timeout) as client:
        now = server_now(client)
        items = client.list_workflows(state=state, qty=limit)
    if as_json:
        emit_json([shape(w, WORKFLOW_FIELDS) for w in items])
        return
    echo_table(
        [
            Column("WORKFLOW_ID"),
            Column("STATE"),
            Column("STEPS", right=True),
            Column("OK", right=True),
            Column("FAILED", right=True),
            Column("CANCELLED", right=True),
            Column("LEFT", right=True),
            Column("CREATED"),
            Column("FINISHED"),
        ],
        [
            (
                w.workflow_id,
                w.state + ("" if w.sealed else " (unsealed)"),
                w.steps,
                w.succeeded,
                w.failed,
                w.cancelled,
                w.steps_left,
                ago(w.created_at, now),
                ago(w.finished_at, now),
            )
            for w in items
        ],
        empty="no workflows" + (f" in state {state}" if state else ""),
    )


def _summary(w: WorkflowStatus) -> None:
    click.echo(f"workflow:  {w.workflow_id}")
    click.echo(f"state:     {w.state}" + ("" if w.sealed else " (not sealed: takes steps)"))
    click.echo(
        f"steps:     {w.steps - w.steps_left}/{w.steps} ended (succeeded {w.succeeded},"
        f" failed {w.failed}, cancelled {w.cancelled}; waiting {w.waiting},"
        f" enqueued {w.enqueued})"
    )
    click.echo(f"callback:  queue {w.callback_queue or '-'}, msg_id {w.callback_msg_id or '-'}")
    click.echo(f"created:   {when(w.created_at)}")
    click.echo(f"finished:  {when(w.finished_at)}")


def _done(s: StepStatus) -> str:
    """A sent step's members that ended, of all; "-" before it is sent."""
    if s.remaining is None or s.total is None:
        return "-"
    return f"{s.total - s.remaining}/{s.total}"


@workflow.command("show")
@click.argument("workflow_id")
@json_option
@connection_options
def workflow_show(workflow_id: str, as_json: bool, dsn: str | None, connect_timeout: float) -> None:
    """Show a workflow and each step: its state, dependencies and members' progress."""
    with expected_errors(), open_client(dsn, connect_timeout) as client:
        w = client.workflow_status(workflow_id)
        steps = client.workflow_steps(workflow_id)
    if as_json:
        emit_json(
            {**shape(w, WORKFLOW_FIELDS), "steps_detail": [shape(s, STEP_FIELDS) for s in steps]}
        )
        return
    _summary(w)
    echo_table(
        [
            Column("STEP"),
            Column("STATE"),
            Column("QUEUE"),
            Column("DONE", right=True),
            Column("DEPENDS_ON", fit="wrap", limit=400),
        ],
        [
            (
                s.step,
                s.state,
                s.queue_name or "(dropped)",
                "-"
                if s.remaining is None or s.total is None
                else f"{s.total - s.remaining}/{s.total}",
                ", ".join(s.depends_on) or "-",
            )
            for s in steps
        ],
        empty="no steps",
    )


@workflow.command("cancel")
@click.argument("workflow_id")
@yes_option
@json_option
@connection_options
def workflow_cancel(
    workflow_id: str, yes: bool, as_json: bool, dsn: str | None, connect_timeout: float
) -> None:
    """Cancel a running workflow: steps not started are cancelled; running members finish."""
    with expected_errors(), open_client(dsn, connect_timeout) as client:
        w = client.workflow_status(workflow_id)
        if w.state == "running":
            confirm(
                f"cancel workflow {workflow_id!r}: {w.waiting + w.enqueued} step(s) not ended?", yes
            )
            w = client.cancel_workflow(workflow_id)
    if as_json:
        emit_json(shape(w, WORKFLOW_FIELDS))
        return
    _summary(w)
