"""The barrier pages: every barrier with its progress, and one barrier in full."""

from __future__ import annotations

from datetime import datetime

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from pgqueue._calls import barrier as _barrier
from pgqueue._web import draw, params, queries
from pgqueue._web.pages import NOT_FOUND, PAGE, render
from pgqueue._web.state import client_of, state_of
from pgqueue.types import BarrierStatus


def _barrier_id(request: Request) -> str:
    bid = request.query_params.get("id")
    if not bid:
        raise HTTPException(400, "name a barrier: ?id=...")
    return bid


async def barrier_list(request: Request) -> Response:
    """Barriers newest first with their progress, by keyset; filter by state."""
    client = await client_of(state_of(request))
    state = request.query_params.get("state") or None
    if state not in (None, "open", "fired", "expired"):
        raise HTTPException(400, "state must be open, fired or expired")
    cursor = params.decode_cursor(request.query_params.get("cursor"), (datetime, str))
    rows = await client.run(queries.barrier_page(state, PAGE + 1, cursor))
    barriers = [BarrierStatus(*r) for r in rows]
    more = len(barriers) > PAGE
    barriers = barriers[:PAGE]
    steps = await client.run(queries.barrier_steps([b.barrier_id for b in barriers]))
    bars = {
        b.barrier_id: draw.outcome_bar(
            {
                "succeeded": b.succeeded,
                "failed": b.failed,
                "cancelled": b.cancelled,
                "pending": b.remaining,
            }
        )
        for b in barriers
    }
    last = barriers[-1] if more and barriers else None
    return await render(
        request,
        "barriers.html",
        barriers=barriers,
        steps=steps,
        bars=bars,
        state=state or "",
        next_cursor=params.encode_cursor(last.created_at, last.barrier_id) if last else None,
    )


async def barrier_page(request: Request) -> Response:
    """One barrier: its outcome bar, deadline, callback, failures and what it waits on."""
    client = await client_of(state_of(request))
    bid = _barrier_id(request)
    try:
        status = await client.run(_barrier.barrier_status(bid))
        outcomes = await client.run(queries.barrier_outcomes(bid))
        failures = await client.run(queries.failures_shown(bid, PAGE))
        pending = await client.run(queries.barrier_pending(bid, PAGE))
        step = (await client.run(queries.barrier_steps([bid]))).get(bid)
    except NOT_FOUND as exc:
        raise HTTPException(404, str(exc)) from exc
    return await render(
        request,
        "barrier.html",
        b=status,
        step=step,
        outcomes=outcomes,
        segments=draw.outcome_bar(outcomes),
        failures=failures,
        pending=pending,
        failed_total=sum(n for k, n in outcomes.items() if k not in ("succeeded", "pending")),
    )
