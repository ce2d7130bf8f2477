"""Workflows as calls: start, graft, seal, cancel, and read a workflow's progress and results."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from pgqueue._calls import Call, Row, encode_json, int32, scalar
from pgqueue._calls.barrier import RESULT_COLUMNS, member_results
from pgqueue._errors import InvalidArgument
from pgqueue.types import MemberResult, Step, StepStatus, WorkflowStatus

STATES = ("running", "succeeded", "failed", "cancelled")


def _status(rows: list[Row]) -> WorkflowStatus:
    return WorkflowStatus(*rows[0])


def ordered(steps: Sequence[Step], known: Sequence[str] = ()) -> list[Step]:
    """The steps with each one after its dependencies; InvalidArgument on a cycle or a stranger."""
    by_name: dict[str, Step] = {}
    for s in steps:
        if s.name in by_name:
            raise InvalidArgument(f"step {s.name!r} is listed twice")
        by_name[s.name] = s
    placed: list[Step] = []
    done = set(known)
    visiting: set[str] = set()

    def place(s: Step, path: tuple[str, ...]) -> None:
        if s.name in done:
            return
        if s.name in visiting:
            raise InvalidArgument("steps depend on each other in a cycle: " + " -> ".join(path))
        visiting.add(s.name)
        for d in s.depends_on:
            if d in by_name:
                place(by_name[d], (*path, d))
        visiting.discard(s.name)
        done.add(s.name)
        placed.append(s)

    for s in steps:
        place(s, (s.name,))
    return placed


def step_json(s: Step) -> dict[str, Any]:
    """A step as the SQL function takes it."""
    doc: dict[str, Any] = {"step": s.name, "queue": s.queue}
    if s.messages is not None:
        doc["messages"] = list(s.messages)
    else:
        doc["message"] = s.message
    if s.depends_on:
        doc["depends_on"] = list(s.depends_on)
    for key in ("headers", "policy", "max_failures", "max_failure_ratio"):
        value = getattr(s, key)
        if value is not None:
            doc[key] = value
    if s.on_dependency_failure != "cancel":
        doc["on_dependency_failure"] = s.on_dependency_failure
    return doc


def start_workflow(
    workflow_id: str,
    steps: Sequence[Step],
    callback_queue: str | None = None,
    callback_message: Any = None,
    headers: dict[str, Any] | None = None,
    sealed: bool = True,
) -> Call[str]:
    """Start a workflow with its steps in one transaction; its id."""
    return Call(
        "start_workflow",
        "SELECT pgqueue.start_workflow(%s, %s::jsonb, %s, %s::jsonb, %s::jsonb, %s, %s)",
        (
            workflow_id,
            encode_json([step_json(s) for s in ordered(steps)], "steps"),
            callback_queue,
            encode_json({} if callback_message is None else callback_message, "callback_message"),
            None if headers is None else encode_json(headers, "headers"),
            sealed,
            uuid.uuid4(),  # one per call: its retries find its run, even finished
        ),
        scalar,
    )


def add_steps(workflow_id: str, steps: Sequence[Step]) -> Call[None]:
    """Graft steps onto a running workflow that is not sealed."""
    known = {d for s in steps for d in s.depends_on} - {s.name for s in steps}
    return Call(
        "add_steps",
        "SELECT pgqueue.add_steps(%s, %s::jsonb)",
        (workflow_id, encode_json([step_json(s) for s in ordered(steps, list(known))], "steps")),
        lambda rows: None,
        # not retried blindly: a retry after a lost reply would find its steps and fail
        retryable=False,
    )


def seal_workflow(workflow_id: str) -> Call[WorkflowStatus]:
    """No more steps: the workflow ends when its last step does."""
    return Call("seal_workflow", "SELECT * FROM pgqueue.seal_workflow(%s)", (workflow_id,), _status)


def cancel_workflow(workflow_id: str) -> Call[WorkflowStatus]:
    """Cancel what has not started; the workflow ends as cancelled."""
    return Call(
        "cancel_workflow", "SELECT * FROM pgqueue.cancel_workflow(%s)", (workflow_id,), _status
    )


def workflow_status(workflow_id: str) -> Call[WorkflowStatus]:
    """The workflow's state and its steps counted by state."""
    return Call(
        "workflow_status", "SELECT * FROM pgqueue.workflow_status(%s)", (workflow_id,), _status
    )


def workflow_steps(workflow_id: str) -> Call[list[StepStatus]]:
    """Every step, in the order they were added."""
    return Call(
        "workflow_steps",
        "SELECT * FROM pgqueue.workflow_steps(%s)",
        (workflow_id,),
        lambda rows: [StepStatus(*r) for r in rows],
    )


def step_results(workflow_id: str, step: str) -> Call[list[MemberResult]]:
    """What a step's members returned, by member index."""
    return Call(
        "step_results",
        f"SELECT {RESULT_COLUMNS} FROM pgqueue.step_results(%s, %s)",
        (workflow_id, step),
        member_results,
    )


def list_workflows(state: str | None = None, qty: int = 100) -> Call[list[WorkflowStatus]]:
    """The newest workflows, optionally only those in one state."""
    return Call(
        "list_workflows",
        "SELECT * FROM pgqueue.list_workflows(%s, %s)",
        (state, int32("qty", qty)),
        lambda rows: [WorkflowStatus(*r) for r in rows],
    )
