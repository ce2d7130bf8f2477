"""The pgmq facade itself: what holds schema pgmq, and installing, refreshing, removing it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from pgqueue._errors import MigrationError, NotMigrated
from pgqueue._pgmq.files import facade_digest, facade_files, latest_migration
from pgqueue._pgmq.model import COMMENT_PREFIX, FACADE_VERSION, PgmqConflict, PgmqStatus
from pgqueue._roles import GROUP_ROLES
from pgqueue._schema import MIGRATION_LOCK_KEY, current_version

_MOVE_ADVICE = "move its queues into pgqueue with `pgqueue pgmq import` (docs/pgmq.md)"


# -- inspecting the database ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Found:
    """What holds schema pgmq, as the catalogs say: read once, under the migrators' lock."""

    schema: bool
    comment: str | None
    extension: str | None  # the installed extension pgmq's version
    meta_table: bool  # pgmq.meta is a table: PGMQ's own catalogue of queues

    @property
    def ours(self) -> bool:
        """Schema pgmq is pgqueue's facade (its comment says so)."""
        return self.schema and (self.comment or "").startswith(COMMENT_PREFIX)

    @property
    def version(self) -> str | None:
        """The PGMQ API version the installed facade emulates; None when it is not ours."""
        words = (self.comment or "")[len(COMMENT_PREFIX) :].split()
        return words[0] if self.ours and words else None

    @property
    def real_pgmq(self) -> str | None:
        """None, or what holds schema pgmq when it is not ours, in words."""
        if self.ours or not (self.schema or self.extension):
            return None
        if self.extension is not None:
            return f"the pgmq extension {self.extension}"
        if self.meta_table:
            return "PGMQ installed as SQL in schema pgmq"
        return "a schema pgmq that is neither PGMQ's nor pgqueue's"


def inspect_schema(conn: psycopg.Connection[Any]) -> Found:
    """What holds schema pgmq now (the facade, a real PGMQ, a stranger, nothing)."""
    row = conn.execute(
        "SELECT (SELECT obj_description(n.oid, 'pg_namespace') FROM pg_namespace n"
        "         WHERE n.nspname = 'pgmq'),"
        "       EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'pgmq'),"
        "       (SELECT extversion FROM pg_extension WHERE extname = 'pgmq'),"
        "       EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        "                WHERE n.nspname = 'pgmq' AND c.relname = 'meta' AND c.relkind = 'r')"
    ).fetchone()
    assert row is not None
    return Found(schema=bool(row[1]), comment=row[0], extension=row[2], meta_table=bool(row[3]))


def lock_migrations(conn: psycopg.Connection[Any]) -> None:
    """The migrators' lock: installs, imports and migrations never interleave."""
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))


def require_migrated(conn: psycopg.Connection[Any], then: str) -> None:
    """Raise NotMigrated unless this pgqueue's latest migration is applied; `then` is advice."""
    have = current_version(conn)
    need = latest_migration()
    if have is None:
        raise NotMigrated(
            f"pgqueue's schema is not in this database: run `pgqueue migrate` first, then {then}"
        )
    if have < need:
        raise NotMigrated(
            f"pgqueue's schema here is at migration {have:04d}, and the pgmq facade needs"
            f" {need:04d}: run `pgqueue migrate` first"
        )


def _refuse_beside(found: Found) -> None:
    """Raise when schema pgmq is not ours to replace."""
    if found.extension is not None and found.ours:
        raise PgmqConflict(
            f"pgqueue's pgmq facade is installed here as the extension pgmq {found.extension}:"
            " to install it with `pgqueue pgmq install` instead, run `pgqueue pgmq uninstall`"
            " (DROP EXTENSION pgmq CASCADE) first; to upgrade the extension, install this"
            " pgqueue's files (`make -C extension install`), then drop and create it again"
        )
    if found.real_pgmq is not None:
        raise PgmqConflict(
            f"this database has {found.real_pgmq}, and the pgmq facade cannot live beside it;"
            f" {_MOVE_ADVICE}"
        )


def status(conn: psycopg.Connection[Any]) -> PgmqStatus:
    """Whether the facade is installed (and which version), and whether a real PGMQ is here."""
    found = inspect_schema(conn)
    queues = 0
    if found.meta_table and not found.ours:
        row = conn.execute("SELECT count(*) FROM pgmq.meta").fetchone()
        queues = int(row[0]) if row else 0
    return PgmqStatus(
        installed=found.ours,
        version=found.version,
        as_extension=found.ours and found.extension is not None,
        real_pgmq=found.real_pgmq,
        pgmq_queues=queues,
    )


# -- install and uninstall --------------------------------------------------------


def install(conn: psycopg.Connection[Any], *, directory: Path | None = None) -> str:
    """Install (or reinstall) the pgmq facade in one transaction; the PGMQ version it emulates.

    Needs pgqueue migrated to this version's latest migration, and refuses,
    changing nothing, when a real PGMQ holds schema pgmq. A facade already
    installed is replaced, its own tables' rows (topic bindings) kept.
    `directory` overrides where the facade's SQL is read from (tests).
    """
    files = facade_files(directory)
    with conn.transaction():
        lock_migrations(conn)
        require_migrated(conn, "install the pgmq facade")
        found = inspect_schema(conn)
        _refuse_beside(found)
        install_in_transaction(conn, files, replace=found.ours)
    return FACADE_VERSION


def refresh(conn: psycopg.Connection[Any]) -> bool:
    """Reinstall a facade installed by `pgqueue pgmq install` from other SQL than this pgqueue's.

    `pgqueue migrate` calls it after migrating, so an upgraded pgqueue's
    facade is the one its queues need; True when it reinstalled. A facade
    installed as the extension is left alone (its files are the server's).
    """
    found = inspect_schema(conn)
    if not found.ours or found.extension is not None:
        return False
    files = facade_files()
    if (found.comment or "").split()[-1:] == [facade_digest(files)]:
        return False
    install(conn)
    return True


def install_in_transaction(
    conn: psycopg.Connection[Any], files: Sequence[Path], *, replace: bool
) -> None:
    """Create schema pgmq from `files` in the caller's transaction, granted to pgqueue's roles.

    With `replace`, the facade there is dropped first, its own tables' rows kept.
    """
    kept = _keep_facade_rows(conn) if replace else []
    if replace:
        conn.execute("DROP SCHEMA pgmq CASCADE")
    conn.execute("CREATE SCHEMA pgmq")
    for path in files:
        try:
            conn.execute(path.read_text().encode())
        except psycopg.Error as exc:
            said = exc.diag.message_primary or str(exc).strip().splitlines()[0]
            raise MigrationError(
                f"the pgmq facade's {path.name} failed: {said}; nothing was changed"
            ) from exc
    conn.execute(
        sql.SQL("COMMENT ON SCHEMA pgmq IS {}").format(
            sql.Literal(f"{COMMENT_PREFIX} {FACADE_VERSION} {facade_digest(files)}")
        )
    )
    _restore_facade_rows(conn, kept)
    roles = [
        r
        for (r,) in conn.execute(
            "SELECT rolname FROM pg_roles WHERE rolname = ANY(%s) ORDER BY rolname",
            (list(GROUP_ROLES),),
        )
    ]
    if roles:
        conn.execute(
            sql.SQL("GRANT USAGE ON SCHEMA pgmq TO {}").format(
                sql.SQL(", ").join(sql.Identifier(r) for r in roles)
            )
        )


def _keep_facade_rows(conn: psycopg.Connection[Any]) -> list[str]:
    """Copy the rows of the facade's own tables aside (ON COMMIT DROP); their names."""
    tables = [
        str(t)
        for (t,) in conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'pgmq' AND c.relkind IN ('r', 'p') ORDER BY c.relname"
        )
    ]
    for t in tables:
        conn.execute(
            sql.SQL("CREATE TEMP TABLE {} ON COMMIT DROP AS TABLE pgmq.{}").format(
                sql.Identifier(f"pgqueue_keep_{t}"), sql.Identifier(t)
            )
        )
    return tables


def _restore_facade_rows(conn: psycopg.Connection[Any], tables: Iterable[str]) -> None:
    """Put the kept rows back into the new facade's tables of the same names (shared columns)."""
    for t in tables:
        cols = [
            str(c)
            for (c,) in conn.execute(
                "SELECT a.attname FROM pg_attribute a"
                " WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped"
                "   AND a.attgenerated = '' AND a.attidentity <> 'a'"
                "   AND a.attname IN (SELECT k.attname FROM pg_attribute k"
                "                      WHERE k.attrelid = to_regclass(%s) AND k.attnum > 0)"
                " ORDER BY a.attnum",
                (f"pgmq.{t}", f"pg_temp.pgqueue_keep_{t}"),
            )
        ]
        if not cols:
            continue
        names = sql.SQL(", ").join(sql.Identifier(c) for c in cols)
        conn.execute(
            sql.SQL(
                "INSERT INTO pgmq.{} ({}) SELECT {} FROM pg_temp.{} ON CONFLICT DO NOTHING"
            ).format(sql.Identifier(t), names, names, sql.Identifier(f"pgqueue_keep_{t}"))
        )


def uninstall(conn: psycopg.Connection[Any]) -> bool:
    """Remove the facade (its queues stay pgqueue's); False when it was not installed.

    Never touches a real PGMQ: that raises PgmqConflict.
    """
    with conn.transaction():
        lock_migrations(conn)
        found = inspect_schema(conn)
        if found.ours:
            if found.extension is not None:
                conn.execute("DROP EXTENSION pgmq CASCADE")
            conn.execute("DROP SCHEMA IF EXISTS pgmq CASCADE")
            # its rows of the one role model go with it (sql/pgmq/10_facade.sql)
            conn.execute("DELETE FROM pgqueue.role_grant WHERE object LIKE 'pgmq.%'")
            return True
        if found.real_pgmq is not None:
            raise PgmqConflict(
                f"this database has {found.real_pgmq}, not pgqueue's facade; nothing was"
                " uninstalled (pgqueue never removes PGMQ but by `pgqueue pgmq import`)"
            )
        return False
