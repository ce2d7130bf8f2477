"""SQLAlchemy: pgqueue's migrations on an SQLAlchemy connection (an Alembic revision's).

Sends need nothing from here: `conn=` takes a Session, a Connection, an
AsyncSession or an AsyncConnection (docs/integrations.md).
"""

from __future__ import annotations

from typing import Any

from psycopg import pq

from pgqueue import _migrate
from pgqueue._adapt import psycopg_of


def migrate(connection: Any) -> list[str]:
    """Apply pgqueue's pending migrations inside the connection's transaction; names applied.

    For an Alembic revision: `migrate(op.get_bind())`. The migrations commit
    or roll back with the revision; running them again is a no-op.
    """
    raw = psycopg_of(connection)
    if not raw.autocommit and raw.info.transaction_status == pq.TransactionStatus.IDLE:
        # Start the caller's transaction now: each migration's block is then a
        # savepoint in it, not a transaction that psycopg would commit alone.
        raw.execute("SELECT 1")
    return [m.name for m in _migrate.migrate(raw)]
