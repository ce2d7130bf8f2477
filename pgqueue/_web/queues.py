"""The overview of every queue, one queue's page, and its pause and resume.

The overview is drawn from the shared snapshot (snapshot.py), filtered,
sorted and paged here; only the shown queues' rates are queried. A pause or
resume updates the snapshot's row at once, so the next page shows it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from pgqueue._async_client import AsyncClient
from pgqueue._web import draw, params, queries
from pgqueue._web.guard import checked_form
from pgqueue._web.pages import NOT_FOUND, PAGE, log_action, redirect, render
from pgqueue._web.snapshot import overview_rows
from pgqueue._web.state import client_of, state_of

OVERVIEW_PAGE = 100  # queues per page of the overview
SORTS = ("name", "visible", "leased", "delayed", "oldest", "poison", "barriers")


def _sort_key(sort: str) -> Callable[[queries.QueueRow], Any]:
    return {
        "name": lambda r: r.name,
        "visible": lambda r: r.visible,
        "leased": lambda r: r.leased,
        "delayed": lambda r: r.delayed,
        "oldest": lambda r: r.oldest_visible_age or 0.0,
        "poison": lambda r: r.poison,
        "barriers": lambda r: r.barriers_open,
    }[sort]


def _total(values: Sequence[int | None]) -> str:
    """The sum over the window; a dash until two samples give a difference."""
    known = [v for v in values if v is not None]
    return str(sum(known)) if known else "\u2013"


async def rates_of(client: AsyncClient, names: list[str]) -> dict[str, dict[str, str]]:
    """Each named queue's sent and acked sparklines over the last hour."""
    series = await client.run(queries.rates(names, 60)) if names else {}
    return {
        name: {
            "sent": draw.sparkline(sent),
            "acked": draw.sparkline(acked),
            "sent_total": _total(sent),
            "acked_total": _total(acked),
        }
        for name, (sent, acked) in series.items()
    }


async def overview(request: Request) -> Response:
    """Every queue: counts, age, poison, rates; filter, sort and 100 a page."""
    st = state_of(request)
    snap = await overview_rows(st)
    q = request.query_params.get("q", "").strip()
    sort = request.query_params.get("sort", "name")
    sort = sort if sort in SORTS else "name"
    desc = request.query_params.get("dir", "desc" if sort != "name" else "asc") == "desc"
    rows = [r for r in snap.rows if q.lower() in r.name.lower()] if q else list(snap.rows)
    rows.sort(key=_sort_key(sort), reverse=desc)
    pages = max(1, -(-len(rows) // OVERVIEW_PAGE))
    try:
        page = min(max(1, int(request.query_params.get("page", "1"))), pages)
    except ValueError:
        page = 1
    shown = rows[(page - 1) * OVERVIEW_PAGE : page * OVERVIEW_PAGE]
    rates = await rates_of(await client_of(st), [r.name for r in shown])
    totals = {
        "queues": len(snap.rows),
        "visible": sum(r.visible for r in snap.rows),
        "leased": sum(r.leased for r in snap.rows),
        "poison": sum(r.poison for r in snap.rows),
        "paused": sum(r.paused for r in snap.rows),
        "barriers": sum(r.barriers_open for r in snap.rows),
    }
    return await render(
        request,
        "overview.html",
        rows=shown,
        rates=rates,
        q=q,
        sort=sort,
        desc=desc,
        page=page,
        pages=pages,
        matched=len(rows),
        totals=totals,
        snapshot_age=time.monotonic() - snap.taken,
    )


async def queue_page(request: Request) -> Response:
    """One queue: its counts, rates, pause state and its live messages by keyset."""
    st = state_of(request)
    client = await client_of(st)
    name = params.queue_name(request)
    snap = await overview_rows(st)
    row = next((r for r in snap.rows if r.name == name), None)
    after = params.message_id(request.query_params.get("after") or "0", "after")
    try:
        messages = await client.run(queries.peek_shown(name, PAGE + 1, after))
    except NOT_FOUND as exc:
        raise HTTPException(404, str(exc)) from exc
    if row is None:  # created since the snapshot
        snap.taken = 0.0
        row = next((r for r in (await overview_rows(st)).rows if r.name == name), None)
    more = len(messages) > PAGE
    messages = messages[:PAGE]
    rates = await rates_of(client, [name])
    return await render(
        request,
        "queue.html",
        name=name,
        row=row,
        messages=messages,
        next_after=messages[-1].msg_id if more and messages else None,
        rates=rates.get(name),
    )


async def queue_action(request: Request) -> Response:
    """Pause or resume a queue (POST from the queue's page)."""
    st = state_of(request)
    form = await checked_form(request)
    name = params.queue_name(request, form)
    action = request.path_params["action"]
    if action not in ("pause", "resume"):
        raise HTTPException(404, "no such action: pause or resume")
    client = await client_of(st)
    try:
        if action == "pause":
            changed = await client.pause_queue(name, actor=request.state.actor)
        else:
            changed = await client.resume_queue(name)
    except NOT_FOUND as exc:
        raise HTTPException(404, str(exc)) from exc
    # the shared figures show the new state at once, without waiting for their query
    st.snapshot.rows = [
        replace(r, paused=action == "pause") if r.name == name else r for r in st.snapshot.rows
    ]
    log_action(request, f"queue.{action}", queue=name, changed=int(changed))
    return redirect(request, "/queue", name=name, done=f"{action}d" if changed else "unchanged")
