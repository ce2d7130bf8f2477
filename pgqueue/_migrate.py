"""Schema migrations: numbered SQL files applied in order, once, under an advisory lock."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from pgqueue._errors import MigrationError, permission_denied
from pgqueue._log import get_logger

log = get_logger()

# Every process that migrates takes this transaction-level advisory lock, so
# two migrators never interleave, and a transaction-level lock (unlike a session
# one) also works through PgBouncer in transaction mode.
MIGRATION_LOCK_KEY = 7_077_617_565_001
_FILE_RE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    """One numbered migration file."""

    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        """The sha256 of the file's text, to detect a migration edited after it landed."""
        return hashlib.sha256(self.sql.encode()).hexdigest()


def sql_dir() -> Path:
    """The folder holding the migrations: inside the wheel, or sql/ of a source checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "sql", here.parent / "sql"):
        if candidate.is_dir():
            return candidate
    raise MigrationError(f"no migrations found next to {here}; reinstall pgqueue")


def available() -> list[Migration]:
    """All migrations shipped with this version of pgqueue, in order."""
    found = []
    for path in sorted(sql_dir().iterdir()):
        match = _FILE_RE.match(path.name)
        if match:
            found.append(Migration(int(match.group(1)), path.stem, path.read_text()))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"two migrations share a number in {sql_dir()}")
    return found


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
                from pgqueue._pgmq import refresh

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


def current_version(conn: psycopg.Connection[Any]) -> int | None:
    """The newest applied migration number, or None when pgqueue was never migrated here.

    Works for the owner and for every role of docs/security.md; any other role
    gets a PermissionDenied that names the roles to grant.
    """
    try:
        exists = conn.execute("SELECT to_regclass('pgqueue.schema_version') IS NOT NULL").fetchone()
        if not exists or not exists[0]:
            return None
        row = conn.execute("SELECT max(version) FROM pgqueue.schema_version").fetchone()
    except psycopg.errors.InsufficientPrivilege as exc:
        raise permission_denied(exc.diag.message_primary or str(exc), conn.info.user) from exc
    return None if row is None or row[0] is None else int(row[0])
