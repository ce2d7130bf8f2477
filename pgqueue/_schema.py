"""pgqueue's schema as shipped and as applied: the migration files, a database's version, the lock.

Shared by the migrator (`_migrate`) and the pgmq facade (`_pgmq`), which both
change the database under the same lock and need the same migrations applied.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from pgqueue._errors import MigrationError, permission_denied

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
