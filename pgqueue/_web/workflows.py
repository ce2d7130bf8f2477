"""The workflow pages: every workflow by state, and one workflow's DAG."""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from pgqueue._calls import workflow as _workflow
from pgqueue._web import draw
from pgqueue._web.pages import NOT_FOUND, render
from pgqueue._web.state import client_of, state_of


async def workflow_list(request: Request) -> Response:
    """Workflows newest first, filtered by state."""
    client = await client_of(state_of(request))
    state = request.query_params.get("state") or None
    if state not in (None, "running", "succeeded", "failed", "cancelled"):
        raise HTTPException(400, "state must be running, succeeded, failed or cancelled")
    flows = await client.run(_workflow.list_workflows(state, 100))
    return await render(request, "workflows.html", flows=flows, state=state or "")


async def workflow_page(request: Request) -> Response:
    """One workflow: its DAG with each step's state, and the steps' figures."""
    client = await client_of(state_of(request))
    wid = request.query_params.get("id")
    if not wid:
        raise HTTPException(400, "name a workflow: ?id=...")
    try:
        status = await client.run(_workflow.workflow_status(wid))
        steps = await client.run(_workflow.workflow_steps(wid))
    except NOT_FOUND as exc:
        raise HTTPException(404, str(exc)) from exc
    dag = draw.layout([(s.step, s.state, s.depends_on) for s in steps])
    return await render(request, "workflow.html", w=status, steps=steps, dag=dag, box=draw)
