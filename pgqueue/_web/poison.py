"""The poison pages: the list, one message in full, and the bulk requeue and purge.

An action is confirmed first, with the exact count it will change, then
POSTed. Picked messages change all or none, in one transaction (409 if one
is gone); a filter's matches change a chunk per transaction, as the CLI does,
and past MAX_ACTION_ROWS the page points at the CLI instead. What a
selection is, and how it is parsed, is selection.py's.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from pgqueue._async_client import AsyncClient
from pgqueue._errors import PgQueueError
from pgqueue._web import params, queries
from pgqueue._web.guard import checked_form
from pgqueue._web.pages import NOT_FOUND, PAGE, log_action, redirect, render
from pgqueue._web.selection import SINCE, Selection, cli_command, filter_of, selection_of
from pgqueue._web.state import State, client_of, state_of

MAX_ACTION_ROWS = 10_000  # past this, an action points at the CLI
CHUNK = 500  # rows per transaction of a bulk action, as the CLI does
PAYLOAD_CHARS = 65_536  # of a payload shown in full
SCAN_LIMIT = 30_000  # poison rows one reason search examines


def _flash(st: State, token: str | None) -> tuple[str, int] | None:
    """The result an action signed for the page it redirects to; a link cannot forge one."""
    subject = st.signer.verify("flash", token, 300) if token else None
    action, _, count = (subject or "").partition(":")
    return (action, int(count)) if action and count.isdigit() else None


def _poison_filter(request: Request) -> dict[str, Any]:
    p = request.query_params
    since = p.get("since", "")
    return {
        "queue": p.get("queue") or None,
        "reason": (p.get("reason") or "").strip() or None,
        "since": since if since in SINCE else "",
    }


async def poison_list(request: Request) -> Response:
    """Poison messages newest first, filtered by queue, reason and age, by keyset."""
    st = state_of(request)
    client = await client_of(st)
    f = _poison_filter(request)
    now = await client.run(queries.NOW)
    cursor = params.decode_cursor(request.query_params.get("cursor"), (datetime, int, int))
    after = now - SINCE[f["since"]] if f["since"] else None
    try:
        rows = await client.run(
            queries.poison_page(f["queue"], PAGE + 1, after, None, f["reason"], cursor, SCAN_LIMIT)
        )
    except NOT_FOUND as exc:
        raise HTTPException(404, str(exc)) from exc
    capped = rows[-1] if rows and rows[-1].capped else None
    found = [r for r in rows if not r.capped]
    more = len(found) > PAGE
    found = found[:PAGE]
    next_cursor = None
    if capped is not None:
        next_cursor = params.encode_cursor(capped.poisoned_at, capped.queue_id, capped.msg_id)
    elif more:
        last = found[-1]
        next_cursor = params.encode_cursor(last.poisoned_at, last.queue_id, last.msg_id)
    queues = sorted(r.name for r in st.snapshot.rows if r.poison) if st.snapshot.rows else []
    return await render(
        request,
        "poison.html",
        rows=found,
        f=f,
        capped=capped is not None,
        scan_limit=SCAN_LIMIT,
        next_cursor=next_cursor,
        first_page=cursor is None,
        queues=queues,
        flash=_flash(st, request.query_params.get("done")),
    )


async def poison_message(request: Request) -> Response:
    """One poison message in full: payload, headers, read count and reason."""
    client = await client_of(state_of(request))
    name = params.queue_name(request, {"name": request.query_params.get("queue")})
    msg_id = params.message_id(request.query_params.get("id"), "id")
    try:
        found = await client.run(queries.poison_shown(name, msg_id, PAYLOAD_CHARS))
    except NOT_FOUND as exc:
        raise HTTPException(404, str(exc)) from exc
    if found is None:
        raise HTTPException(404, f"queue {name!r} has no poison message {msg_id}")
    return await render(
        request, "poison_message.html", m=found, limit=PAYLOAD_CHARS, pretty=queries.PRETTY_BYTES
    )


async def poison_confirm(request: Request) -> Response:
    """Say exactly how many messages an action will change before it does."""
    client = await client_of(state_of(request))
    now: datetime = await client.run(queries.NOW)
    sel = selection_of(request.query_params, now)
    if sel.ids:
        count = len(sel.ids)
    else:
        assert sel.queue is not None
        try:
            count = await client.poison_count(sel.queue, filter_of(sel))
        except NOT_FOUND as exc:
            raise HTTPException(404, str(exc)) from exc
    too_many = count > MAX_ACTION_ROWS
    cli = cli_command(sel)
    return await render(
        request,
        "confirm.html",
        sel=sel,
        count=count,
        too_many=too_many,
        max_rows=MAX_ACTION_ROWS,
        cli=cli,
    )


async def poison_act(request: Request) -> Response:
    """Requeue or purge the confirmed selection; report how many rows changed."""
    form = await checked_form(request)
    st = state_of(request)
    client = await client_of(st)
    sel = selection_of(form, None)
    if sel.ids:
        changed = await _act_on_ids(client, sel)
        target: dict[str, Any] = {"ids": [f"{q}:{i}" for q, i in sel.ids]}
    else:
        target = {"queue": sel.queue, "reason": sel.reason, "since": sel.since}
        target["before"] = sel.before.isoformat() if sel.before else None
        changed = await _act_on_filter(request, client, sel, target)
    log_action(request, f"poison.{sel.action}", changed=changed, **target)
    flash = st.signer.sign("flash", f"{sel.action}:{changed}")
    return redirect(request, "/poison", done=flash)


async def _act_on_ids(client: AsyncClient, sel: Selection) -> int:
    """All of the selected messages or none: one transaction; 409 if any is gone."""
    by_queue: dict[str, list[int]] = {}
    for q, i in sel.ids:
        by_queue.setdefault(q, []).append(i)
    if len(sel.ids) > MAX_ACTION_ROWS:
        raise HTTPException(400, f"at most {MAX_ACTION_ROWS} messages at once")
    changed = 0
    try:
        async with client.connection() as conn, conn.transaction():
            for q, ids in sorted(by_queue.items()):
                if sel.action == "requeue":
                    n = len(await client.poison_requeue(q, ids, conn=conn))
                else:
                    n = await client.poison_purge(q, ids, conn=conn)
                if n != len(ids):
                    raise _Gone
                changed += n
    except _Gone as exc:
        raise HTTPException(
            409, "some of the selected messages are no longer poisoned; nothing was changed"
        ) from exc
    except NOT_FOUND as exc:
        raise HTTPException(404, str(exc)) from exc
    return changed


class _Gone(Exception):
    """A selected message is gone: roll the whole action back."""


async def _act_on_filter(
    request: Request, client: AsyncClient, sel: Selection, target: dict[str, Any]
) -> int:
    """Every message of the queue that matched when confirmed, a chunk per transaction.

    Refuses (changing nothing) past MAX_ACTION_ROWS. A failure part way is
    logged with what was changed already, and the page says how many.
    """
    assert sel.queue is not None
    where = filter_of(sel)
    try:
        total = await client.poison_count(sel.queue, where)
    except NOT_FOUND as exc:
        raise HTTPException(404, str(exc)) from exc
    if total > MAX_ACTION_ROWS:
        raise HTTPException(
            400,
            f"{total} messages match: the dashboard changes at most {MAX_ACTION_ROWS} at once;"
            f" nothing was changed. Run: {cli_command(sel)}",
        )
    changed = 0
    after = 0
    try:
        while ids := await client.poison_ids(sel.queue, after_msg_id=after, qty=CHUNK, where=where):
            if sel.action == "requeue":
                changed += len(await client.poison_requeue(sel.queue, ids))
            else:
                changed += await client.poison_purge(sel.queue, ids)
            after = ids[-1]
    except (psycopg.Error, PgQueueError) as exc:
        log_action(
            request,
            f"poison.{sel.action}",
            changed=changed,
            error=str(exc).strip().splitlines()[0],
            **target,
        )
        past = "requeued" if sel.action == "requeue" else "purged"
        raise HTTPException(
            500,
            f"{changed} messages were {past} before this failed: {str(exc).strip()}."
            " Confirm again to finish.",
        ) from exc
    return changed
