"""Schema migrations: numbered SQL files applied in order, once, under an advisory lock."""

from __future__ import annotations

from typing import Any

import psycopg

from pgqueue._errors import MigrationError
from pgqueue._log import get_logger
from pgqueue._pgmq.facade import refresh

# The migration files, the version and the lock are shared with the pgmq
# facade (pgqueue._schema); they stay importable from here.
from pgqueue._schema import (
    MIGRATION_LOCK_KEY,
    Migration,
    available,
    current_version,
    sql_dir,
)

__all__ = [
    "MIGRATION_LOCK_KEY",
    "Migration",
    "available",
    "current_version",
    "migrate",
    "sql_dir",
]

log = get_logger()


def _applied(conn: psycopg.Connection[Any]) -> dict[int, str]:
    rows = conn.execute("SELECT version, checksum FROM pgqueue.schema_version").fetchall()
    return {int(v): str(c) for v, c in rows}


def _check_unchanged(migrations: list[Migration], applied: dict[int, str]) -> None:
    for m in migrations:
        if m.version in applied and applied[m.version] != m.checksum:
            raise MigrationError(
                f"migration {m.name} was edited after it was applied to this database;"
                " applied migrations must never change: restore it and add a new migration"
            )


def migrate(conn: psycopg.Connection[Any]) -> list[Migration]:
    """Apply every pending migration, each in its own transaction; the ones applied now.

    Safe to call from many processes at once and to call again: a migration
    already recorded in pgqueue.schema_version is never run twice. Changing
    the schema takes the role that owns it; any role of docs/security.md may
    call this to learn that nothing is pending.
    """
    migrations = available()
    done: list[Migration] = []
    # A migration's NOTICEs are for whoever runs it (0007's says which roles it
    # could not create), logged once the run ends: each migration that adds
    # API functions ends with grant_roles(), which repeats its advice, and the
    # latest wording of each is the one to show.
    notices: dict[str | None, tuple[str, str | None]] = {}
    try:
        while True:
            try:
                step = _apply_next(conn, migrations, notices)
            except psycopg.errors.InsufficientPrivilege as exc:
                raise MigrationError(
                    f"role {conn.info.user} may not change schema pgqueue"
                    f" ({exc.diag.message_primary or exc}); run `pgqueue migrate` as the role"
                    " that owns the schema, the one that first migrated this database"
                    " (see docs/security.md)"
                ) from exc
            if step is None:
                # an upgraded pgqueue brings its own pgmq facade (docs/pgmq.md)
                if refresh(conn):
                    log.info("pgmq.facade_reinstalled")
                return done
            log.info("migration.applied", migration=step.name)
            done.append(step)
    finally:
        for message, (name, hint) in notices.items():
            log.warning("migration.notice", migration=name, message=message, hint=hint)


def _apply_next(
    conn: psycopg.Connection[Any],
    migrations: list[Migration],
    notices: dict[str | None, tuple[str, str | None]],
) -> Migration | None:
    """Apply the first pending migration in one transaction, under the lock; None if none is.

    Its NOTICEs go into `notices`, the latest of each message kept.
    """
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
        # Only when missing: creating (even IF NOT EXISTS) takes a right on the
        # database that the roles which merely check for pending work lack.
        found = conn.execute("SELECT to_regclass('pgqueue.schema_version')").fetchone()
        if found is None or found[0] is None:
            conn.execute("CREATE SCHEMA IF NOT EXISTS pgqueue")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS pgqueue.schema_version ("
                " version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
        applied = _applied(conn)
        _check_unchanged(migrations, applied)
        pending = [m for m in migrations if m.version not in applied]
        if not pending:
            return None
        step = pending[0]

        def notice(diag: psycopg.errors.Diagnostic) -> None:
            notices.pop(diag.message_primary, None)  # keeps the order of the latest
            notices[diag.message_primary] = (step.name, diag.message_hint)

        conn.add_notice_handler(notice)
        try:
            conn.execute(step.sql.encode())
        except psycopg.errors.InsufficientPrivilege:
            raise  # not the owner: said so by migrate()
        except psycopg.Error as exc:
            raise MigrationError(f"migration {step.name} failed: {exc}".strip()) from exc
        finally:
            conn.remove_notice_handler(notice)
        conn.execute(
            "INSERT INTO pgqueue.schema_version (version, name, checksum) VALUES (%s, %s, %s)",
            (step.version, step.name, step.checksum),
        )
    return step
