"""The dashboard's pages and actions: a Starlette app over an AsyncClient.

Every page is server-rendered HTML; a few lines of JS refresh marked parts of
it while the tab is visible. Every action is a POST from a confirmation page,
carrying a CSRF token, and is logged with the actor who made it. A read-only
app registers no POST routes and draws no controls, and its own connections
are read-only sessions, so a missed path fails in the database as well.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from starlette.applications import Starlette
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from pgqueue._async_client import AsyncClient
from pgqueue._calls import barrier as _barrier
from pgqueue._calls import workflow as _workflow
from pgqueue._errors import (
    BarrierNotFound,
    ConnectionLost,
    InvalidArgument,
    PgQueueError,
    QueueNotFound,
    WorkflowNotFound,
)
from pgqueue._log import get_logger
from pgqueue._retry import RetryPolicy
from pgqueue._settings import resolve_dsn
from pgqueue._web import draw, formats, params, queries
from pgqueue._web.headers import Dashboard
from pgqueue._web.security import (
    CSRF_TTL_SECONDS,
    SESSION_COOKIE,
    SESSION_TTL_SECONDS,
    AuthCallable,
    Credentials,
    Signer,
    authenticate,
    same_origin,
)
from pgqueue.types import BarrierStatus, PoisonFilter

HERE = Path(__file__).parent
PAGE = 50  # rows per page of messages, poison and barriers
OVERVIEW_PAGE = 100  # queues per page of the overview
MAX_ACTION_ROWS = 10_000  # past this, an action points at the CLI
CHUNK = 500  # rows per transaction of a bulk action, as the CLI does
PAYLOAD_CHARS = 65_536  # of a payload shown in full
SCAN_LIMIT = 30_000  # poison rows one reason search examines
SAMPLE_EVERY = 30.0  # seconds between the app's samples of sent totals
SINCE = {
    "15m": timedelta(minutes=15),
    "1h": timedelta(hours=1),
    "6h": timedelta(hours=6),
    "24h": timedelta(days=1),
    "7d": timedelta(days=7),
}
SORTS = ("name", "visible", "leased", "delayed", "oldest", "poison", "barriers")

log = get_logger("pgqueue.web")

# What a page answers 404 for; every other error is the database's (503) or a bug (500).
NOT_FOUND = (QueueNotFound, BarrierNotFound, WorkflowNotFound)
# A page should answer or fail within seconds, not wait out a worker's retry budget.
WEB_RETRY = RetryPolicy(attempts=3, deadline_seconds=5.0)


@dataclass
class Snapshot:
    """The overview's figures, shared by every viewer, refreshed at most so often."""

    rows: list[queries.QueueRow] = field(default_factory=list)
    taken: float = 0.0  # time.monotonic() of the last refresh
    cost: float = 0.0  # seconds the last refresh took
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    task: asyncio.Task[None] | None = None  # the refresh running behind the pages

    def stale(self) -> bool:
        """Whether the figures are older than max(5 s, 10 x what the query costs)."""
        return time.monotonic() - self.taken > max(5.0, 10 * self.cost)


@dataclass
class State:
    """What the app keeps between requests."""

    dsn: str | None
    read_only: bool
    signer: Signer
    creds: Credentials
    auth: AuthCallable | None
    allow_owner: bool
    hosts: frozenset[str] | None = None  # the Host headers served; None: any
    client: AsyncClient | None = None
    owns_client: bool = False
    checked: bool = False
    snapshot: Snapshot = field(default_factory=Snapshot)
    sampled: float = 0.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class RefusedRole(PgQueueError):
    """The dashboard's login role is not one it should run as."""


def web_dsn(dsn: str | None, read_only: bool) -> str:
    """The DSN with the dashboard's session settings: a statement timeout; read-only if asked."""
    resolved = resolve_dsn(dsn)
    if resolved is None:
        raise InvalidArgument("no database given: pass --dsn, or set PGQUEUE_DSN (or DATABASE_URL)")
    options = conninfo_to_dict(resolved).get("options") or ""
    extra = "-c statement_timeout=15000"
    if read_only:
        extra += " -c default_transaction_read_only=on"
    return make_conninfo(resolved, options=f"{options} {extra}".strip())


async def client_of(state: State) -> AsyncClient:
    """The app's client, opened (and its role checked) on first use."""
    if state.client is not None and state.checked:
        return state.client
    async with state.lock:
        if state.client is None:
            state.client = await _open_client(state)
            state.owns_client = True
        if not state.checked:
            grants = await state.client.run(queries.GRANTS)
            check_grants(grants, state.allow_owner)
            if state.read_only and not grants.read_only_session:
                log.warning(
                    "web.session_settings_unsupported",
                    detail="the server or a pooler ignored default_transaction_read_only:"
                    " read-only rests on the dashboard's routes alone",
                )
            state.checked = True
    return state.client


async def _open_client(state: State) -> AsyncClient:
    """A pool with the dashboard's session settings; without them behind a pooler refusing them."""
    try:
        return await AsyncClient.from_dsn(
            web_dsn(state.dsn, state.read_only),
            min_size=1,
            max_size=4,
            retry=WEB_RETRY,
            connect_timeout=5.0,
        )
    except (psycopg.Error, PgQueueError) as exc:
        if "unsupported startup parameter" not in str(exc):
            raise
    log.warning(
        "web.session_settings_unsupported",
        detail="the connection refused startup options (a pooler?): no statement timeout,"
        " and read-only rests on the dashboard's routes alone",
    )
    return await AsyncClient.from_dsn(
        resolve_dsn(state.dsn), min_size=1, max_size=4, retry=WEB_RETRY, connect_timeout=5.0
    )


def check_grants(grants: queries.Grants, allow_owner: bool) -> None:
    """Refuse a role that cannot operate pgqueue, or holds more than it should (unless allowed)."""
    if (grants.superuser or grants.owner) and not allow_owner:
        what = "a superuser" if grants.superuser else "the owner of the pgqueue schema"
        raise RefusedRole(
            f"role {grants.role!r} is {what}: run the dashboard as a role that holds"
            " pgqueue_operator and nothing more (docs/dashboard.md), or pass --allow-owner"
        )
    if not (grants.operator or grants.superuser or grants.owner):
        raise RefusedRole(
            f"role {grants.role!r} lacks pgqueue_operator: GRANT pgqueue_operator TO {grants.role}"
        )


def _state(request: Request) -> State:
    st: State = request.app.state.pgqueue
    return st


templates = Jinja2Templates(
    env=jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(HERE / "templates")),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
)
templates.env.filters["age"] = formats.age
templates.env.filters["since"] = formats.since_text
templates.env.filters["size"] = formats.size
templates.env.globals["urlencode"] = urlencode
templates.env.globals["cli"] = formats.command


async def render(request: Request, template: str, **context: Any) -> Response:
    """A page, with what every page needs: the actor, a CSRF token, the mode."""
    st = _state(request)
    actor: str = request.state.actor
    context.update(
        actor=actor,
        read_only=st.read_only,
        csrf=st.signer.sign("csrf", actor),
        root=request.scope.get("root_path", ""),
        now=datetime.now(UTC),
    )
    response: Response = templates.TemplateResponse(request, template, context)
    return response


# -- pages ---------------------------------------------------------------------


async def overview_rows(st: State) -> Snapshot:
    """The overview's snapshot; stale figures are served while one refresh runs behind them.

    Only a snapshot that was never taken, or was invalidated (taken = 0)
    after an action, makes the request wait for the query.
    """
    snap = st.snapshot
    if snap.taken == 0.0:
        await refresh_snapshot(st)
    elif snap.stale() and (snap.task is None or snap.task.done()):
        snap.task = asyncio.create_task(refresh_snapshot(st, background=True))
    return snap


async def refresh_snapshot(st: State, *, background: bool = False) -> None:
    """Run the snapshot's query once, whoever else asks at the same time."""
    snap = st.snapshot
    async with snap.lock:
        if snap.taken != 0.0 and not (background and snap.stale()):
            return  # another request refreshed it meanwhile
        try:
            client = await client_of(st)
            started = time.monotonic()
            snap.rows = await client.run(queries.OVERVIEW)
            snap.cost = time.monotonic() - started
            snap.taken = time.monotonic()
            await sample(st, client)
        except (psycopg.Error, PgQueueError) as exc:
            if not background:
                raise
            log.warning("web.snapshot_failed", error=str(exc).strip())


async def sample(st: State, client: AsyncClient) -> None:
    """Record this minute's sent totals, at most every SAMPLE_EVERY seconds (not when read-only)."""
    if st.read_only or time.monotonic() - st.sampled < SAMPLE_EVERY:
        return
    st.sampled = time.monotonic()
    try:
        await client.sample_rates()
    except psycopg.Error as exc:
        log.warning("web.sample_failed", error=str(exc).strip())


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
    st = _state(request)
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


def _queue_name(request: Request, source: dict[str, Any] | FormData | None = None) -> str:
    name = (source if source is not None else request.query_params).get("name")
    if not isinstance(name, str) or not name:
        raise HTTPException(400, "name a queue: ?name=...")
    return name


async def queue_page(request: Request) -> Response:
    """One queue: its counts, rates, pause state and its live messages by keyset."""
    st = _state(request)
    client = await client_of(st)
    name = _queue_name(request)
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
    st = _state(request)
    form = await checked_form(request)
    name = _queue_name(request, form)
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
    _log_action(request, f"queue.{action}", queue=name, changed=int(changed))
    return _redirect(request, "/queue", name=name, done=f"{action}d" if changed else "unchanged")


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
    st = _state(request)
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
    client = await client_of(_state(request))
    name = _queue_name(request, {"name": request.query_params.get("queue")})
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


@dataclass(frozen=True)
class Selection:
    """What a poison action touches: explicit (queue, id) pairs, or one queue's filter."""

    action: str
    ids: list[tuple[str, int]]
    queue: str | None
    reason: str | None
    since: str
    before: datetime | None

    def fields(self) -> list[tuple[str, str]]:
        """The hidden form fields that carry it to the POST."""
        out = [("action", self.action)]
        out += [("m", f"{q}:{i}") for q, i in self.ids]
        if not self.ids:
            out += [("all", "1"), ("queue", self.queue or ""), ("reason", self.reason or "")]
            out += [
                ("since", self.since),
                ("before", self.before.isoformat() if self.before else ""),
            ]
        return out


MAX_SELECTED = 500  # ids one selection carries (a page shows 50)


def _selection(source: Any, now: datetime | None) -> Selection:
    """What the request asks to change; 400 for anything not made by these pages.

    `now` (the database's clock) fixes the cut-off of a filter's selection on
    the confirmation page; the act (None) must carry the one it confirmed.
    """
    action = source.get("action")
    if action not in ("requeue", "purge"):
        raise HTTPException(400, "action must be requeue or purge")
    ids: list[tuple[str, int]] = []
    for item in source.getlist("m"):
        queue, sep, text = str(item).rpartition(":")
        if not sep:
            raise HTTPException(400, "bad selection: pick messages on the poison page")
        ids.append((queue, params.message_id(text, "the selected id")))
    if len(ids) > MAX_SELECTED:
        raise HTTPException(400, f"select at most {MAX_SELECTED} messages at once")
    if ids:
        return Selection(action, sorted(set(ids)), None, None, "", None)
    if source.get("all") != "1":
        raise HTTPException(400, "select messages first, or act on all that match a filter")
    target = source.get("queue") or None
    if target is None:
        raise HTTPException(400, "choose a queue to act on all its matching messages")
    since = source.get("since") or ""
    if since and since not in SINCE:
        raise HTTPException(400, f"since must be one of {', '.join(SINCE)}")
    before_text = source.get("before") or ""
    if not before_text and now is None:
        raise HTTPException(400, "the confirmation's cut-off time is missing: confirm again")
    try:
        before = params.parse_time(before_text) if before_text else now
        assert before is not None
        if since:
            _ = before - SINCE[since]  # in range, or OverflowError
    except (ValueError, OverflowError) as exc:
        raise HTTPException(400, "bad time in the selection: confirm again") from exc
    return Selection(action, [], str(target), source.get("reason") or None, since, before)


def _filter_of(sel: Selection) -> PoisonFilter:
    after = sel.before - SINCE[sel.since] if sel.since in SINCE and sel.before else None
    return PoisonFilter(after=after, before=sel.before, reason=sel.reason)


def cli_command(sel: Selection) -> str | None:
    """The `pgqueue poison` command that does what a filter's selection does, quoted for a shell."""
    if sel.queue is None:
        return None
    argv = ["pgqueue", "poison", sel.action, sel.queue, "--all"]
    if sel.reason:
        argv += ["--reason", sel.reason]
    if sel.since:
        argv += ["--since", sel.since]
    return formats.command(*argv)


async def poison_confirm(request: Request) -> Response:
    """Say exactly how many messages an action will change before it does."""
    client = await client_of(_state(request))
    now: datetime = await client.run(queries.NOW)
    sel = _selection(request.query_params, now)
    if sel.ids:
        count = len(sel.ids)
    else:
        assert sel.queue is not None
        try:
            count = await client.poison_count(sel.queue, _filter_of(sel))
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
    st = _state(request)
    client = await client_of(st)
    sel = _selection(form, None)
    if sel.ids:
        changed = await _act_on_ids(client, sel)
        target: dict[str, Any] = {"ids": [f"{q}:{i}" for q, i in sel.ids]}
    else:
        target = {"queue": sel.queue, "reason": sel.reason, "since": sel.since}
        target["before"] = sel.before.isoformat() if sel.before else None
        changed = await _act_on_filter(request, client, sel, target)
    _log_action(request, f"poison.{sel.action}", changed=changed, **target)
    flash = st.signer.sign("flash", f"{sel.action}:{changed}")
    return _redirect(request, "/poison", done=flash)


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
    where = _filter_of(sel)
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
        _log_action(
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


def _barrier_id(request: Request) -> str:
    bid = request.query_params.get("id")
    if not bid:
        raise HTTPException(400, "name a barrier: ?id=...")
    return bid


async def barrier_list(request: Request) -> Response:
    """Barriers newest first with their progress, by keyset; filter by state."""
    client = await client_of(_state(request))
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
    client = await client_of(_state(request))
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


async def workflow_list(request: Request) -> Response:
    """Workflows newest first, filtered by state."""
    client = await client_of(_state(request))
    state = request.query_params.get("state") or None
    if state not in (None, "running", "succeeded", "failed", "cancelled"):
        raise HTTPException(400, "state must be running, succeeded, failed or cancelled")
    flows = await client.run(_workflow.list_workflows(state, 100))
    return await render(request, "workflows.html", flows=flows, state=state or "")


async def workflow_page(request: Request) -> Response:
    """One workflow: its DAG with each step's state, and the steps' figures."""
    client = await client_of(_state(request))
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


async def workers_page(request: Request) -> Response:
    """Every registered worker: host, pid, queues, concurrency, in flight, last seen."""
    client = await client_of(_state(request))
    workers = await client.list_workers()
    return await render(request, "workers.html", workers=workers)


async def healthz(request: Request) -> Response:
    """Up: says only that."""
    return PlainTextResponse("ok")


async def login(request: Request) -> Response:
    """Exchange the token for a signed session cookie (GET shows the form)."""
    st = _state(request)
    if request.method == "GET":
        return templates.TemplateResponse(
            request, "login.html", {"error": None, "root": request.scope.get("root_path", "")}
        )
    form = await request.form()
    token = str(form.get("token") or "")
    if not st.creds.bearer(token):
        log.warning("web.login_refused", client=request.client.host if request.client else None)
        return templates.TemplateResponse(
            request,
            "login.html",
            {"error": "wrong token", "root": request.scope.get("root_path", "")},
            status_code=403,
        )
    response = _redirect(request, "/")
    response.set_cookie(
        SESSION_COOKIE,
        st.signer.sign("session", st.creds.session_subject()),
        max_age=SESSION_TTL_SECONDS,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path=request.scope.get("root_path", "") or "/",
    )
    return response


def _redirect(request: Request, path: str, **params: str) -> RedirectResponse:
    root = request.scope.get("root_path", "")
    query = ("?" + urlencode(params)) if params else ""
    return RedirectResponse(f"{root}{path}{query}", status_code=303)


def _log_action(request: Request, action: str, **fields: Any) -> None:
    log.info(
        "web.action",
        action=action,
        actor=request.state.actor,
        address=request.client.host if request.client else None,
        **fields,
    )


# -- middleware ----------------------------------------------------------------


class Guard(BaseHTTPMiddleware):
    """Authenticate, refuse NUL characters, and check CSRF on every POST (headers: headers.py)."""

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        """Refuse what must not pass; let the rest through."""
        st = _state(request)
        if st.hosts is not None and _host_name(request) not in st.hosts:
            # a page on 127.0.0.1 must not answer a name that only resolves there
            # (DNS rebinding: another site's pages reading this one's)
            return PlainTextResponse("unknown host name; use 127.0.0.1", 400)
        path = request.url.path[len(request.scope.get("root_path", "")) :]
        open_paths = path in ("/healthz", "/login") or path.startswith("/static/")
        actor = await authenticate(request, st.creds, st.signer, st.auth)
        if actor is None and not open_paths:
            if st.creds.token is not None and not st.creds.users and request.method == "GET":
                response: Response = _redirect(request, "/login")
            else:
                response = PlainTextResponse(
                    "authentication required", 401, {"WWW-Authenticate": 'Basic realm="pgqueue"'}
                )
            return response
        request.state.actor = actor or "anonymous"
        if request.method not in ("GET", "HEAD") and not same_origin(request):
            return _refuse(request, "the request came from another site")
        if (problem := params.nul_problem(request.query_params.multi_items())) is not None:
            return await _error_page(request, 400, problem)
        try:
            response = await call_next(request)
        except _Refused:
            response = _refuse(
                request, "missing or stale form token; reload the page and try again"
            )
        except RefusedRole as exc:
            response = PlainTextResponse(str(exc), 503)
        except (ConnectionLost, psycopg.OperationalError) as exc:
            log.warning("web.database_unreachable", error=str(exc).strip())
            response = PlainTextResponse(
                "the database does not answer; the page will work again once it does", 503
            )
        except InvalidArgument as exc:
            response = await _error_page(request, 400, str(exc))
        return response


def _host_name(request: Request) -> str:
    host = request.headers.get("host", "")
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _refuse(request: Request, reason: str) -> Response:
    log.warning(
        "web.csrf_refused",
        path=request.url.path,
        reason=reason,
        actor=getattr(request.state, "actor", None),
        address=request.client.host if request.client else None,
    )
    return PlainTextResponse(f"refused: {reason}", 403)


class _Refused(Exception):
    """A state-changing request without a valid form token."""


async def checked_form(request: Request) -> FormData:
    """The POSTed form, once its CSRF token is proven to be this actor's, fresh, and signed here."""
    form = await request.form()
    token = form.get("csrf")
    st = _state(request)
    if (
        not isinstance(token, str)
        or st.signer.verify("csrf", token, CSRF_TTL_SECONDS) != request.state.actor
    ):
        raise _Refused
    if (problem := params.nul_problem(form.multi_items())) is not None:
        raise params.BadParameter(problem)
    return form


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code in (404, 405, 409, 400):
        return await _error_page(request, exc.status_code, exc.detail, exc.headers)
    return PlainTextResponse(exc.detail, exc.status_code, exc.headers)


async def _error_page(
    request: Request, status: int, detail: str, headers: Mapping[str, str] | None = None
) -> Response:
    if not hasattr(request.state, "actor"):
        return PlainTextResponse(detail, status, headers)
    response = await render(request, "error.html", status=status, detail=detail)
    response.status_code = status
    response.headers.update(headers or {})  # a 405's Allow
    return response


def create_app(
    dsn: str | None = None,
    *,
    client: AsyncClient | None = None,
    read_only: bool = False,
    auth: AuthCallable | None = None,
    secret: str | None = None,
    allow_owner: bool = False,
    allowed_hosts: Sequence[str] | None = None,
) -> Starlette:
    """The dashboard as an ASGI app, to serve alone or mount under a path of your own app.

    allowed_hosts: the host names requests may name (their Host header); None for any.
    """
    st = State(
        dsn=dsn,
        read_only=read_only,
        signer=Signer.from_env(secret),
        creds=Credentials.from_env(),
        auth=auth,
        allow_owner=allow_owner,
        hosts=None if allowed_hosts is None else frozenset(allowed_hosts),
        client=client,
    )
    if client is None:
        web_dsn(dsn, read_only)  # fail now on a missing DSN, not on the first request
    routes: list[Route | Mount] = [
        Route("/", overview),
        Route("/queue", queue_page),
        Route("/poison", poison_list),
        Route("/poison/message", poison_message),
        Route("/barriers", barrier_list),
        Route("/barrier", barrier_page),
        Route("/workflows", workflow_list),
        Route("/workflow", workflow_page),
        Route("/workers", workers_page),
        Route("/healthz", healthz),
        Route("/login", login, methods=["GET", "POST"]),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    if not read_only:
        routes += [
            Route("/queue/{action:str}", queue_action, methods=["POST"]),
            Route("/poison/confirm", poison_confirm),
            Route("/poison/act", poison_act, methods=["POST"]),
        ]

    @asynccontextmanager
    async def closing(app: Starlette) -> AsyncIterator[None]:
        try:  # the first page should not wait for the overview's query
            await refresh_snapshot(st)
        except (psycopg.Error, PgQueueError) as exc:
            log.warning("web.snapshot_failed", error=str(exc).strip())
        yield
        task = st.snapshot.task
        if task is not None and not task.done():
            await asyncio.wait([task], timeout=5)  # a refresh under way ends before its pool
        if st.client is not None and st.owns_client:
            await st.client.close()

    app = Dashboard(
        routes=routes,
        middleware=[Middleware(Guard)],
        exception_handlers={HTTPException: _http_error},
        lifespan=closing,
    )
    app.state.pgqueue = st
    return app


__all__ = ["create_app"]
