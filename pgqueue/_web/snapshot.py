"""The overview's figures: one query shared by every viewer, refreshed behind the pages.

A page is served the figures at hand while one refresh runs in the
background; only figures never taken, or invalidated by an action (taken =
0), make a request wait for the query. The refresh also samples the sent
totals that the rate sparklines are drawn from.
"""

from __future__ import annotations

import asyncio
import time

import psycopg

from pgqueue._async_client import AsyncClient
from pgqueue._errors import PgQueueError
from pgqueue._log import get_logger
from pgqueue._web import queries
from pgqueue._web.state import Snapshot, State, client_of

log = get_logger("pgqueue.web")

SAMPLE_EVERY = 30.0  # seconds between the app's samples of sent totals


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
