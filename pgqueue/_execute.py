"""Running one call on one connection, as psycopg would, whatever a framework set on it.

The bottom of the connection plumbing: the connection types every layer
names, and the one way a `Call` meets a connection (the caller's own, or one
the pool lent), inside whatever transaction that connection has.
"""

from __future__ import annotations

from typing import Any, TypeVar

import psycopg
from psycopg import pq
from psycopg.adapt import AdaptersMap
from psycopg.rows import tuple_row
from psycopg.types.json import JsonbLoader, JsonLoader

from pgqueue._calls import Call

JSON_OID = 114
JSONB_OID = 3802
T = TypeVar("T")

Connection = psycopg.Connection[Any]
AsyncConnection = psycopg.AsyncConnection[Any]


def _as_psycopg_loads(adapters: AdaptersMap) -> None:
    """JSON loaded as psycopg does it, on a cursor of a connection a framework configured.

    Django and SQLAlchemy load json and jsonb as text on their connections, to
    parse it themselves; pgqueue's calls expect values. Only the cursor's own
    copy of the adapters changes, never the connection's.
    """
    for oid, loader in ((JSONB_OID, JsonbLoader), (JSON_OID, JsonLoader)):
        if adapters.get_loader(oid, pq.Format.TEXT) is not loader:
            adapters.register_loader(oid, loader)


def execute(conn: Connection, call: Call[T]) -> T:
    """Run one call on the given connection, inside whatever transaction it has.

    The cursor is psycopg's own, whatever cursor class or loaders a framework
    set on the connection (a connection from Django or SQLAlchemy).
    """
    with psycopg.Cursor(conn, row_factory=tuple_row) as cur:
        _as_psycopg_loads(cur.adapters)
        cur.execute(call.sql, call.params)
        # In pipeline mode the result has not arrived yet (no description):
        # fetching syncs the pipeline, and raises the call's error here.
        piped = conn.info.pipeline_status != pq.PipelineStatus.OFF
        rows = cur.fetchall() if piped or cur.description is not None else []
    return call.result(rows)


async def execute_async(conn: AsyncConnection, call: Call[T]) -> T:
    """Run one call on the given async connection, inside whatever transaction it has."""
    async with psycopg.AsyncCursor(conn, row_factory=tuple_row) as cur:
        _as_psycopg_loads(cur.adapters)
        await cur.execute(call.sql, call.params)
        piped = conn.info.pipeline_status != pq.PipelineStatus.OFF  # as execute()
        rows = await cur.fetchall() if piped or cur.description is not None else []
    return call.result(rows)
