"""Workflows, as methods of Client (WorkflowApi) and AsyncClient (AsyncWorkflowApi)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pgqueue._adapt import AsyncConnArg, ConnArg
from pgqueue._api.base import AsyncRunner, SyncRunner
from pgqueue._calls import workflow as _workflow
from pgqueue.types import JSON, MemberResult, Step, StepStatus, WorkflowStatus


class WorkflowApi(SyncRunner):
    """Workflows: the blocking methods."""

    def start_workflow(
        self,
        workflow_id: str,
        steps: Sequence[Step],
        *,
        callback_queue: str | None = None,
        callback_message: JSON = None,
        headers: dict[str, Any] | None = None,
        sealed: bool = True,
        conn: ConnArg | None = None,
    ) -> str:
        """Start a workflow: each step is sent exactly once, when its dependencies have ended.

        One transaction (yours, with `conn`). The id is unique while the
        workflow runs: starting it again with the same steps is a retry and
        returns the id; anything else raises WorkflowConflict. With
        `callback_queue`, one final callback follows when every step has
        ended. `sealed=False` lets add_steps graft steps on until
        seal_workflow().
        """
        call = _workflow.start_workflow(
            workflow_id, steps, callback_queue, callback_message, headers, sealed
        )
        return self.run(call, conn)

    def add_steps(
        self, workflow_id: str, steps: Sequence[Step], *, conn: ConnArg | None = None
    ) -> None:
        """Graft steps onto a running, unsealed workflow (in conn's transaction, if given).

        A dependency may name a step already there (one that ended counts as
        ended). Not retried on a dead connection: WorkflowConflict after a
        lost reply means the steps are there.
        """
        self.run(_workflow.add_steps(workflow_id, steps), conn)

    def seal_workflow(self, workflow_id: str, *, conn: ConnArg | None = None) -> WorkflowStatus:
        """No more steps will be added: the workflow ends when its last step does."""
        return self.run(_workflow.seal_workflow(workflow_id), conn)

    def cancel_workflow(self, workflow_id: str) -> WorkflowStatus:
        """Cancel every step that has not started; the workflow ends as cancelled."""
        return self.run(_workflow.cancel_workflow(workflow_id))

    def workflow_status(self, workflow_id: str) -> WorkflowStatus:
        """The workflow's state and its steps counted by state; WorkflowNotFound if none."""
        return self.run(_workflow.workflow_status(workflow_id))

    def workflow_steps(self, workflow_id: str) -> list[StepStatus]:
        """Every step of the workflow, with its state and its members' counts."""
        return self.run(_workflow.workflow_steps(workflow_id))

    def step_results(self, workflow_id: str, step: str) -> list[MemberResult]:
        """What a step's members returned (by reference: how a step reads its dependencies)."""
        return self.run(_workflow.step_results(workflow_id, step))

    def list_workflows(self, *, state: str | None = None, qty: int = 100) -> list[WorkflowStatus]:
        """The newest workflows, optionally only running, succeeded, failed or cancelled ones."""
        return self.run(_workflow.list_workflows(state, qty))


class AsyncWorkflowApi(AsyncRunner):
    """Workflows: the asyncio methods, with the same guarantees."""

    async def start_workflow(
        self,
        workflow_id: str,
        steps: Sequence[Step],
        *,
        callback_queue: str | None = None,
        callback_message: JSON = None,
        headers: dict[str, Any] | None = None,
        sealed: bool = True,
        conn: AsyncConnArg | None = None,
    ) -> str:
        """Start a workflow: each step is sent exactly once, when its dependencies have ended.

        One transaction (yours, with `conn`). The id is unique while the
        workflow runs: starting it again with the same steps is a retry and
        returns the id; anything else raises WorkflowConflict. With
        `callback_queue`, one final callback follows when every step has
        ended. `sealed=False` lets add_steps graft steps on until
        seal_workflow().
        """
        call = _workflow.start_workflow(
            workflow_id, steps, callback_queue, callback_message, headers, sealed
        )
        return await self.run(call, conn)

    async def add_steps(
        self, workflow_id: str, steps: Sequence[Step], *, conn: AsyncConnArg | None = None
    ) -> None:
        """Graft steps onto a running, unsealed workflow (in conn's transaction, if given).

        A dependency may name a step already there (one that ended counts as
        ended). Not retried on a dead connection: WorkflowConflict after a
        lost reply means the steps are there.
        """
        await self.run(_workflow.add_steps(workflow_id, steps), conn)

    async def seal_workflow(
        self, workflow_id: str, *, conn: AsyncConnArg | None = None
    ) -> WorkflowStatus:
        """No more steps will be added: the workflow ends when its last step does."""
        return await self.run(_workflow.seal_workflow(workflow_id), conn)

    async def cancel_workflow(self, workflow_id: str) -> WorkflowStatus:
        """Cancel every step that has not started; the workflow ends as cancelled."""
        return await self.run(_workflow.cancel_workflow(workflow_id))

    async def workflow_status(self, workflow_id: str) -> WorkflowStatus:
        """The workflow's state and its steps counted by state; WorkflowNotFound if none."""
        return await self.run(_workflow.workflow_status(workflow_id))

    async def workflow_steps(self, workflow_id: str) -> list[StepStatus]:
        """Every step of the workflow, with its state and its members' counts."""
        return await self.run(_workflow.workflow_steps(workflow_id))

    async def step_results(self, workflow_id: str, step: str) -> list[MemberResult]:
        """What a step's members returned (by reference: how a step reads its dependencies)."""
        return await self.run(_workflow.step_results(workflow_id, step))

    async def list_workflows(
        self, *, state: str | None = None, qty: int = 100
    ) -> list[WorkflowStatus]:
        """The newest workflows, optionally only running, succeeded, failed or cancelled ones."""
        return await self.run(_workflow.list_workflows(state, qty))
