"""pgqueue's SQL migrations, applied on a Django connection by `manage.py migrate`."""

from __future__ import annotations

from typing import Any

from pgqueue._migrate import migrate
from pgqueue.contrib.django.conf import get_settings, psycopg_connection


def migrate_if_configured(connection: Any) -> list[str]:
    """Apply pgqueue's pending migrations if `connection` is PGQUEUE's database; names applied.

    Another alias, or PGQUEUE["MIGRATE"] = False (the schema left to `pgqueue
    migrate` run as its owner role), applies nothing.
    """
    conf = get_settings()
    if not conf.migrate or connection.alias != conf.database:
        return []
    raw = psycopg_connection(connection)
    if connection.in_atomic_block:
        # psycopg's transaction() commits a transaction it sees idle-begun
        # (autocommit off, nothing run yet) as if it were its own: run one
        # statement first, so that each migration is a savepoint of Django's
        # transaction and commits or rolls back with it.
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    return [m.name for m in migrate(raw)]
