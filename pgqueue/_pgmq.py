"""The `pgmq` facade: install it over pgqueue, and move a real PGMQ's queues into pgqueue.

The facade is schema `pgmq`, holding functions with PGMQ's names and
signatures over pgqueue's own (sql/pgmq/*.sql). It is not a numbered
migration: `install` applies those files in name order, in one transaction,
under the migrators' advisory lock, and marks the schema as pgqueue's by its
comment. It never replaces a real PGMQ; `import_pgmq` moves one's queues and
archives into pgqueue, then removes it and installs the facade in its place,
all in one transaction, so a PGMQ client keeps running on the same database.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from pgqueue._errors import MigrationError, NotMigrated, PgQueueError, sql_literal
from pgqueue._migrate import MIGRATION_LOCK_KEY, available, current_version, sql_dir
from pgqueue._roles import GROUP_ROLES
from pgqueue._words import one_or_many

# The PGMQ API version the facade emulates (its signatures, defaults, types).
FACADE_VERSION = "1.13.0"
# The comment that marks schema pgmq as pgqueue's facade (then its version).
COMMENT_PREFIX = "pgqueue pgmq facade"
# PGMQ never poison-drops: an imported queue gets the most attempts there are.
NEVER_POISON = 2_147_483_647
# The header PGMQ's FIFO groups read; the facade sends it as the group key.
GROUP_HEADER = "x-pgmq-group"
_MOVE_ADVICE = "move its queues into pgqueue with `pgqueue pgmq import` (docs/pgmq.md)"


class PgmqConflict(PgQueueError):
    """A real PGMQ (or a stranger's schema pgmq) is here: the facade cannot go beside it."""


class PgmqImportRefused(PgQueueError):
    """`pgqueue pgmq import` found something it cannot move as it is; nothing was changed."""


@dataclass(frozen=True, slots=True)
class PgmqStatus:
    """What holds the `pgmq` schema of a database."""

    installed: bool
    """pgqueue's facade is installed."""
    version: str | None
    """The PGMQ API version the installed facade emulates."""
    as_extension: bool
    """Installed as the extension pgmq (extension/), not by `pgqueue pgmq install`."""
    real_pgmq: str | None
    """None, or what else holds schema pgmq: a real PGMQ (extension or SQL), or a stranger."""
    pgmq_queues: int
    """How many queues a real PGMQ holds (what `pgqueue pgmq import` would move)."""
    available_version: str = FACADE_VERSION
    """The version this pgqueue's facade would install."""


@dataclass(frozen=True, slots=True)
class QueueImport:
    """One PGMQ queue as the import moved it (or would, in a dry run)."""

    queue_name: str
    """The pgqueue queue: PGMQ's name lowercased (as PGMQ's tables and the facade have it)."""
    pgmq_name: str
    """The name in pgmq.meta."""
    live: int
    """Live messages (read or not, delayed or not) copied, ids and read counts kept."""
    archived: int
    """Archived messages copied, with their archived_at."""
    partitioned: bool
    unlogged: bool
    """An unlogged PGMQ queue becomes an ordinary (logged) pgqueue queue."""
    last_msg_id: int
    """The highest msg_id PGMQ ever handed out for it; pgqueue's next is above it."""
    grouped: int
    """Live messages whose x-pgmq-group header became their group key."""
    notify_throttle_ms: int | None
    """PGMQ's notify-on-insert throttle, carried over; None when it was off."""
    topic_patterns: tuple[str, ...]
    """Topic patterns bound to it, carried over (or reported: docs/pgmq.md)."""
    null_payloads: int
    """Messages (live or archived) whose payload was SQL NULL, stored as JSON null."""
    max_attempts: int
    """The pgqueue queue's: 2147483647 (never poison, as PGMQ) unless it existed (empty) before."""


@dataclass(frozen=True, slots=True)
class ImportReport:
    """What `pgqueue pgmq import` moved, or would move in a dry run."""

    dry_run: bool
    pgmq: str
    """What held the queues: "extension 1.13.0" or "schema" (PGMQ installed as SQL)."""
    queues: tuple[QueueImport, ...]
    left_in_pgmq: tuple[str, ...]
    """PGMQ queues not selected (--queue): PGMQ stays for them, without the facade."""
    facade_version: str | None
    """The facade installed in PGMQ's place; None while PGMQ keeps queues (or in a dry run)."""
    notes: tuple[str, ...]
    """What the import could not carry as is, one line each."""


# -- the facade's files ---------------------------------------------------------


def facade_dir() -> Path:
    """The folder holding the facade's SQL: pgmq/ beside the migrations (in the wheel or sql/)."""
    return sql_dir() / "pgmq"


def facade_files(directory: Path | None = None) -> list[Path]:
    """The facade's SQL files in the order they apply (by name)."""
    folder = directory or facade_dir()
    files = sorted(p for p in folder.glob("*.sql") if p.is_file()) if folder.is_dir() else []
    if not files:
        raise MigrationError(f"no pgmq facade SQL found in {folder}; reinstall pgqueue")
    return files


def facade_digest(files: Sequence[Path]) -> str:
    """A short digest of the facade's SQL: a facade installed from other files has another."""
    h = hashlib.sha256()
    for path in files:
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def latest_migration() -> int:
    """The number of the newest migration this pgqueue ships (the facade needs it applied)."""
    return available()[-1].version


# -- inspecting the database ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Found:
    schema: bool
    comment: str | None
    extension: str | None  # the installed extension pgmq's version
    meta_table: bool  # pgmq.meta is a table: PGMQ's own catalogue of queues

    @property
    def ours(self) -> bool:
        return self.schema and (self.comment or "").startswith(COMMENT_PREFIX)

    @property
    def version(self) -> str | None:
        words = (self.comment or "")[len(COMMENT_PREFIX) :].split()
        return words[0] if self.ours and words else None

    @property
    def real_pgmq(self) -> str | None:
        if self.ours or not (self.schema or self.extension):
            return None
        if self.extension is not None:
            return f"the pgmq extension {self.extension}"
        if self.meta_table:
            return "PGMQ installed as SQL in schema pgmq"
        return "a schema pgmq that is neither PGMQ's nor pgqueue's"


def _inspect(conn: psycopg.Connection[Any]) -> _Found:
    row = conn.execute(
        "SELECT (SELECT obj_description(n.oid, 'pg_namespace') FROM pg_namespace n"
        "         WHERE n.nspname = 'pgmq'),"
        "       EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'pgmq'),"
        "       (SELECT extversion FROM pg_extension WHERE extname = 'pgmq'),"
        "       EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        "                WHERE n.nspname = 'pgmq' AND c.relname = 'meta' AND c.relkind = 'r')"
    ).fetchone()
    assert row is not None
    return _Found(schema=bool(row[1]), comment=row[0], extension=row[2], meta_table=bool(row[3]))


def _lock(conn: psycopg.Connection[Any]) -> None:
    """The migrators' lock: installs, imports and migrations never interleave."""
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))


def _require_migrated(conn: psycopg.Connection[Any], then: str) -> None:
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


def _refuse_beside(found: _Found) -> None:
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
    found = _inspect(conn)
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
        _lock(conn)
        _require_migrated(conn, "install the pgmq facade")
        found = _inspect(conn)
        _refuse_beside(found)
        _install_in_transaction(conn, files, replace=found.ours)
    return FACADE_VERSION


def refresh(conn: psycopg.Connection[Any]) -> bool:
    """Reinstall a facade installed by `pgqueue pgmq install` from other SQL than this pgqueue's.

    `pgqueue migrate` calls it after migrating, so an upgraded pgqueue's
    facade is the one its queues need; True when it reinstalled. A facade
    installed as the extension is left alone (its files are the server's).
    """
    found = _inspect(conn)
    if not found.ours or found.extension is not None:
        return False
    files = facade_files()
    if (found.comment or "").split()[-1:] == [facade_digest(files)]:
        return False
    install(conn)
    return True


def _install_in_transaction(
    conn: psycopg.Connection[Any], files: Sequence[Path], *, replace: bool
) -> None:
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
        _lock(conn)
        found = _inspect(conn)
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


# -- import ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Source:
    """One PGMQ queue: its name in pgmq.meta, its tables, and the pgqueue queue it becomes."""

    name: str
    partitioned: bool
    unlogged: bool
    created_at: Any
    target: str = ""
    """The pgqueue queue, as the facade names it (pgmq._name): set by _facade_names."""

    @property
    def table_name(self) -> str:
        """PGMQ's table name stem: the name lowercased (format_table_name)."""
        return self.name.lower()

    @property
    def q(self) -> sql.Composed:
        return sql.SQL("{}.{}").format(
            sql.Identifier("pgmq"), sql.Identifier(f"q_{self.table_name}")
        )

    @property
    def a(self) -> sql.Composed:
        return sql.SQL("{}.{}").format(
            sql.Identifier("pgmq"), sql.Identifier(f"a_{self.table_name}")
        )

    def rows(self, conn: psycopg.Connection[Any], kind: str) -> sql.Composed:
        """Its queue ("q") or archive ("a") table as a row source with PGMQ 1.13's columns.

        Older PGMQs lack some (headers came in 1.5, last_read_at later): NULL there.
        """
        table = f"{kind}_{self.table_name}"
        have = {
            str(c)
            for (c,) in conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass"
                " AND attnum > 0 AND NOT attisdropped",
                (
                    sql.SQL("{}.{}")
                    .format(sql.Identifier("pgmq"), sql.Identifier(table))
                    .as_string(conn),
                ),
            )
        }
        wanted = [("msg_id", "bigint"), ("read_ct", "integer"), ("enqueued_at", "timestamptz")]
        wanted += [("last_read_at", "timestamptz"), ("vt", "timestamptz")]
        wanted += [("archived_at", "timestamptz")] if kind == "a" else []
        wanted += [("message", "jsonb"), ("headers", "jsonb")]
        columns = [
            sql.Identifier(c) if c in have else sql.SQL(f"NULL::{t} AS {c}") for c, t in wanted
        ]
        return sql.SQL("(SELECT {} FROM {}.{}) AS src").format(
            sql.SQL(", ").join(columns), sql.Identifier("pgmq"), sql.Identifier(table)
        )


def import_pgmq(
    conn: psycopg.Connection[Any],
    *,
    queues: Sequence[str] | None = None,
    dry_run: bool = False,
    lock_timeout_seconds: float = 60.0,
) -> ImportReport:
    """Move a real PGMQ's queues and archives into pgqueue, nothing lost, in one transaction.

    Every live message keeps its msg_id, read_ct, enqueued_at, last_read_at,
    vt, payload and headers (its x-pgmq-group header becoming its group key);
    every archived one also its archived_at. The queue tables are locked
    (EXCLUSIVE) first, so producers and readers wait, then find the facade.
    PGMQ is then removed and the facade installed in its place; with `queues`
    only those move, and PGMQ stays (without the facade) while it holds
    others. A dry run reports the same counts and changes nothing. Anything
    that cannot move as it is raises PgmqImportRefused, and nothing changes.
    """
    with conn.transaction():
        _lock(conn)
        _require_migrated(conn, "`pgqueue pgmq import`")
        found = _inspect(conn)
        if found.ours:
            raise PgmqImportRefused(
                "schema pgmq here is pgqueue's facade already: there is no PGMQ to import"
            )
        if not found.meta_table:
            what = found.real_pgmq or "no schema pgmq"
            raise PgmqImportRefused(f"no PGMQ to import here ({what}: pgmq.meta is missing)")
        kind = f"extension {found.extension}" if found.extension else "schema"
        # For this import only: a caller's own transaction gets its setting back.
        row = conn.execute(
            "SELECT current_setting('lock_timeout'), set_config('lock_timeout', %s, true)",
            (f"{int(lock_timeout_seconds * 1000)}ms",),
        ).fetchone()
        assert row is not None
        report = _import_locked(conn, found, kind, queues, dry_run)
        conn.execute("SELECT set_config('lock_timeout', %s, true)", (row[0],))
        return report


def _import_locked(
    conn: psycopg.Connection[Any],
    found: _Found,
    kind: str,
    queues: Sequence[str] | None,
    dry_run: bool,
) -> ImportReport:
    """The import, in the caller's transaction, under the migrators' lock."""
    if not dry_run:
        # Queue creations (rows of meta) and every send, read and ack wait from here.
        _lock_tables(conn, [sql.SQL("pgmq.meta")])
    sources, left = _select_sources(conn, queues)
    if not dry_run:
        _lock_tables(conn, [t for s in sources for t in (s.q, s.a)])
    settings = _Settings.read(conn)
    sources = _facade_names(conn, found, sources, settings)
    _check_importable(conn, sources)
    _refuse_dependents(conn, sources, whole=not left)
    existed = {
        str(name): int(limit)
        for name, limit in conn.execute(
            "SELECT queue_name, max_attempts FROM pgqueue.queue WHERE queue_name = ANY(%s)",
            ([s.target for s in sources],),
        )
    }
    if dry_run:  # nothing was written: it only read (and rehearsed, rolled back)
        moved = [_import_queue(conn, s, settings, existed.get(s.target), True) for s in sources]
        return ImportReport(True, kind, tuple(moved), tuple(left), None, tuple(_notes(moved, left)))
    if left:
        # PGMQ stays for the other queues, and so the facade cannot come yet.
        moved = [_import_queue(conn, s, settings, existed.get(s.target), False) for s in sources]
        _remove_pgmq_queues(conn, sources)
        notes = _notes(moved, left) + _not_carried(moved)
        return ImportReport(False, kind, tuple(moved), tuple(left), None, tuple(notes))
    # The rows move in, PGMQ goes, the facade takes schema pgmq, names each
    # queue as its PGMQ client knows it (pgmq.create on a queue that exists
    # records the name and changes nothing else), and the settings follow.
    moved = [_import_queue(conn, s, settings, existed.get(s.target), False) for s in sources]
    _remove_pgmq(conn, found, sources)
    _install_in_transaction(conn, facade_files(), replace=False)
    for s in sources:
        conn.execute("SELECT pgmq.create(%s)", (s.name,))
    notes = _notes(moved, left) + _carry_over(conn, sources, settings)
    return ImportReport(False, kind, tuple(moved), tuple(left), FACADE_VERSION, tuple(notes))


# Where a rehearsal moves PGMQ's schema, for the facade to take its name.
_ASIDE = "pgqueue_pgmq_importing"


def _step_aside(conn: psycopg.Connection[Any], found: _Found) -> None:
    """Free schema pgmq for the facade, in a savepoint to be rolled back.

    PGMQ installed as SQL is renamed (no table lock: producers go on); an
    extension is dropped (a facade installed beside an extension named pgmq
    would take itself for it), which locks its tables until the rollback.
    """
    if found.extension is not None:
        conn.execute("DROP EXTENSION pgmq CASCADE")
        conn.execute("DROP SCHEMA IF EXISTS pgmq CASCADE")
        return
    taken = conn.execute("SELECT to_regnamespace(%s)", (_ASIDE,)).fetchone()
    if taken is not None and taken[0] is not None:
        raise PgmqImportRefused(
            f"a schema {_ASIDE} exists, which the import needs for a moment; drop or rename it"
            " first; nothing was changed"
        )
    conn.execute(sql.SQL("ALTER SCHEMA pgmq RENAME TO {}").format(sql.Identifier(_ASIDE)))


def _facade_names(
    conn: psycopg.Connection[Any], found: _Found, sources: Sequence[_Source], settings: _Settings
) -> list[_Source]:
    """Each source with the pgqueue queue the facade makes of it, found by a rehearsal.

    In a savepoint rolled back whatever happens: PGMQ out of the way, the
    facade installed, each queue created through it, its settings carried over.
    A name the facade refuses, or a setting, raises PgmqImportRefused.
    """
    names: dict[str, str] = {}
    problems: list[str] = []
    with conn.transaction():
        _step_aside(conn, found)
        _install_in_transaction(conn, facade_files(), replace=False)
        for s in sources:
            try:
                with conn.transaction():
                    conn.execute("SELECT pgmq.create(%s)", (s.name,))
            except psycopg.Error as exc:
                said = exc.diag.message_primary or str(exc)
                problems.append(f"queue {sql_literal(s.name)}: the pgmq facade refuses it ({said})")
                continue
            row = conn.execute("SELECT pgmq._name(%s)", (s.name,)).fetchone()
            assert row is not None
            names[s.name] = str(row[0])
        if not problems:
            _carry_over(conn, [replace(s, target=names[s.name]) for s in sources], settings)
        raise psycopg.Rollback()
    if problems:
        raise PgmqImportRefused("cannot import: " + "; ".join(problems) + "; nothing was changed")
    return [replace(s, target=names[s.name]) for s in sources]


def _lock_tables(conn: psycopg.Connection[Any], tables: Sequence[sql.Composable]) -> None:
    """LOCK them IN EXCLUSIVE MODE: selects go on, writers (sends, reads, acks) wait."""
    if not tables:
        return
    try:
        conn.execute(sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(sql.SQL(", ").join(tables)))
    except psycopg.errors.LockNotAvailable as exc:
        raise PgmqImportRefused(
            "could not lock PGMQ's tables within the lock timeout: a long transaction holds"
            " them (see pg_stat_activity); nothing was changed"
        ) from exc
    except psycopg.errors.UndefinedTable as exc:
        raise PgmqImportRefused(
            f"PGMQ is incomplete here: {exc.diag.message_primary}; nothing was changed"
        ) from exc


def _select_sources(
    conn: psycopg.Connection[Any], wanted: Sequence[str] | None
) -> tuple[list[_Source], list[str]]:
    """The PGMQ queues to move (all, or the named ones), and the ones left in PGMQ."""
    # Two names differing in case name one queue in PGMQ (one pair of tables).
    every = list(
        {
            s.table_name: s
            for s in (
                _Source(str(name), bool(part), bool(unlogged), created)
                for name, part, unlogged, created in conn.execute(
                    "SELECT queue_name, is_partitioned, is_unlogged, created_at FROM pgmq.meta"
                    " ORDER BY queue_name DESC"
                )
            )
        }.values()
    )
    every.sort(key=lambda s: s.table_name)
    if wanted is None:
        return every, []
    names = {s.table_name for s in every}
    unknown = [n for n in dict.fromkeys(wanted) if n.lower() not in names]
    if unknown:
        shown = ", ".join(sql_literal(n) for n in unknown)
        raise PgmqImportRefused(
            f"PGMQ has no queue {shown} (pgmq.meta lists {len(every)}); nothing was changed"
        )
    chosen = {n.lower() for n in wanted}
    return [s for s in every if s.table_name in chosen], [
        s.name for s in every if s.table_name not in chosen
    ]


# Headers pgqueue would refuse on a send: not an object, or a reserved _pg_ key.
# The rules every entry applies to what it is given (sql/schema/queue.sql):
# the header rule's first half, and no document nested beyond readers.
_BAD_HEADERS = "pgqueue._headers_problem(headers) IS NOT NULL"
_UNDECODABLE = "(pgqueue._undecodable(message) OR pgqueue._undecodable(headers)) IS TRUE"
_GROUP = f"headers->>'{GROUP_HEADER}'"
_BAD_GROUP = f"({_GROUP} = '' OR length({_GROUP}) > 200)"


def _check_importable(conn: psycopg.Connection[Any], sources: Sequence[_Source]) -> None:
    """Raise PgmqImportRefused naming everything that cannot move as it is."""
    problems: list[str] = []
    for s in sources:
        name = sql_literal(s.name)
        row = conn.execute(
            "SELECT q.queue_id,"
            " EXISTS (SELECT 1 FROM pgqueue.message m WHERE m.queue_id = q.queue_id"
            " AND pgqueue._keyed(m.read_ct, m.vt, m.enqueued_at, m.group_key)),"
            " EXISTS (SELECT 1 FROM pgqueue.archive a WHERE a.queue_id = q.queue_id),"
            " EXISTS (SELECT 1 FROM pgqueue.poison p WHERE p.queue_id = q.queue_id)"
            " FROM pgqueue.queue q WHERE q.queue_name = %s",
            (s.target,),
        ).fetchone()
        if row is not None and any(row[1:]):
            problems.append(
                f"queue {name}: pgqueue already has a queue of that name holding messages"
                " (live, archived or poisoned); drop or rename one of them first"
            )
        for kind, label in (("q", "live"), ("a", "archived")):
            bad = conn.execute(
                sql.SQL("SELECT count(*), min(msg_id) FROM {} WHERE " + _BAD_HEADERS).format(
                    s.rows(conn, kind)
                )
            ).fetchone()
            if bad is not None and bad[0]:
                problems.append(
                    f"queue {name}: {bad[0]} {label} message(s) (the first msg_id {bad[1]}) have"
                    " headers pgqueue refuses: not a JSON object, or a key starting with _pg_"
                    " (reserved); fix them in PGMQ first"
                )
            bad = conn.execute(
                sql.SQL("SELECT count(*), min(msg_id) FROM {} WHERE " + _UNDECODABLE).format(
                    s.rows(conn, kind)
                )
            ).fetchone()
            if bad is not None and bad[0]:
                problems.append(
                    f"queue {name}: {bad[0]} {label} message(s) (the first msg_id {bad[1]}) hold"
                    " a document nested more than 255 levels deep, which readers cannot decode"
                    " and no pgqueue entry takes; fix them in PGMQ first"
                )
        bad = conn.execute(
            sql.SQL("SELECT count(*), min(msg_id) FROM {} WHERE " + _BAD_GROUP).format(
                s.rows(conn, "q")
            )
        ).fetchone()
        if bad is not None and bad[0]:
            problems.append(
                f"queue {name}: {bad[0]} message(s) (the first msg_id {bad[1]}) have an"
                f" {GROUP_HEADER} header that is empty or longer than 200 characters,"
                " which pgqueue cannot hold as a group key"
            )
    if problems:
        raise PgmqImportRefused("cannot import: " + "; ".join(problems) + "; nothing was changed")


def _refuse_dependents(
    conn: psycopg.Connection[Any], sources: Sequence[_Source], *, whole: bool
) -> None:
    """Raise when objects outside schema pgmq (a view, a foreign key, a function) use PGMQ's
    tables: dropping PGMQ would drop them too, so the operator moves them first."""
    rows = conn.execute(
        # What PGMQ's removal drops: everything in schema pgmq, or the moved
        # queues' tables and their partitions.
        "WITH sel AS ("
        "  SELECT 'pg_class'::regclass AS cat, c.oid FROM pg_class c"
        "   WHERE c.relnamespace = 'pgmq'::regnamespace AND (%(whole)s OR c.relname = ANY(%(t)s))"
        "  UNION ALL SELECT 'pg_type'::regclass, y.oid FROM pg_type y"
        "   WHERE %(whole)s AND y.typnamespace = 'pgmq'::regnamespace"
        "  UNION ALL SELECT 'pg_proc'::regclass, f.oid FROM pg_proc f"
        "   WHERE %(whole)s AND f.pronamespace = 'pgmq'::regnamespace"
        " ), gone AS ("
        "  SELECT cat, oid FROM sel"
        "  UNION SELECT 'pg_class'::regclass, i.inhrelid FROM pg_inherits i"
        "   WHERE i.inhparent IN (SELECT oid FROM sel WHERE cat = 'pg_class'::regclass)"
        " ), users AS ("
        "  SELECT d.classid, d.objid,"
        "   CASE d.classid"
        "    WHEN 'pg_rewrite'::regclass THEN"
        "     (SELECT c.relnamespace FROM pg_rewrite r JOIN pg_class c ON c.oid = r.ev_class"
        "       WHERE r.oid = d.objid)"
        "    WHEN 'pg_constraint'::regclass THEN"
        "     (SELECT coalesce(c.relnamespace, k.connamespace) FROM pg_constraint k"
        "       LEFT JOIN pg_class c ON c.oid = k.conrelid WHERE k.oid = d.objid)"
        "    WHEN 'pg_proc'::regclass THEN"
        "     (SELECT f.pronamespace FROM pg_proc f WHERE f.oid = d.objid)"
        "    WHEN 'pg_class'::regclass THEN"
        "     (SELECT c.relnamespace FROM pg_class c WHERE c.oid = d.objid)"
        "    WHEN 'pg_type'::regclass THEN"
        "     (SELECT y.typnamespace FROM pg_type y WHERE y.oid = d.objid)"
        "    WHEN 'pg_attrdef'::regclass THEN"
        "     (SELECT c.relnamespace FROM pg_attrdef a JOIN pg_class c ON c.oid = a.adrelid"
        "       WHERE a.oid = d.objid)"
        "    WHEN 'pg_trigger'::regclass THEN"
        "     (SELECT c.relnamespace FROM pg_trigger g JOIN pg_class c ON c.oid = g.tgrelid"
        "       WHERE g.oid = d.objid)"
        "   END AS nsp"
        "  FROM pg_depend d JOIN gone ON d.refclassid = gone.cat AND d.refobjid = gone.oid"
        "  WHERE d.deptype = 'n')"
        " SELECT DISTINCT pg_describe_object(classid, objid, 0) FROM users"
        "  WHERE nsp IS DISTINCT FROM 'pgmq'::regnamespace ORDER BY 1",
        {"whole": whole, "t": [f"{p}_{s.table_name}" for s in sources for p in ("q", "a")]},
    ).fetchall()
    if rows:
        raise PgmqImportRefused(
            f"objects outside schema pgmq use PGMQ's tables, and removing PGMQ would drop them:"
            f" {', '.join(str(r[0]) for r in rows)}; drop them first and create them again"
            " after the import (the facade's pgmq.q_<name> and pgmq.a_<name> views have PGMQ's"
            " columns); nothing was changed"
        )


@dataclass(frozen=True, slots=True)
class _Settings:
    """PGMQ's per-queue settings, by PGMQ's table name stem (the name lowercased)."""

    patterns: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Topic patterns bound to each queue (PGMQ 1.11 and later)."""
    bound_at: dict[tuple[str, str], Any] = field(default_factory=dict)
    """When each (pattern, queue) was bound."""
    throttles: dict[str, int] = field(default_factory=dict)
    """Queues with notify-on-insert on, and their throttles in ms."""

    @classmethod
    def read(cls, conn: psycopg.Connection[Any]) -> _Settings:
        """What PGMQ holds (nothing of what its version lacks)."""
        out = cls()
        if _exists(conn, "pgmq.topic_bindings"):
            found: dict[str, list[str]] = {}
            for pattern, queue, at in conn.execute(
                "SELECT pattern, lower(queue_name), bound_at FROM pgmq.topic_bindings ORDER BY 2, 1"
            ):
                found.setdefault(str(queue), []).append(str(pattern))
                out.bound_at[(str(pattern), str(queue))] = at
            out.patterns.update({k: tuple(v) for k, v in found.items()})
        if _exists(conn, "pgmq.notify_insert_throttle"):
            for queue, ms in conn.execute(
                "SELECT lower(queue_name), throttle_interval_ms FROM pgmq.notify_insert_throttle"
            ):
                out.throttles[str(queue)] = int(ms)
        return out


def _exists(conn: psycopg.Connection[Any], relation: str) -> bool:
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (relation,)).fetchone()
    return bool(row and row[0])


def _has_function(conn: psycopg.Connection[Any], signature: str) -> bool:
    row = conn.execute("SELECT to_regprocedure(%s) IS NOT NULL", (signature,)).fetchone()
    return bool(row and row[0])


def _import_queue(
    conn: psycopg.Connection[Any],
    s: _Source,
    settings: _Settings,
    existed: int | None,
    dry_run: bool,
) -> QueueImport:
    """Copy one queue's live and archived messages (or count them, in a dry run).

    `existed` is the max_attempts of a pgqueue queue of that name before the
    import, None when the import creates it.
    """
    q_rows, a_rows = s.rows(conn, "q"), s.rows(conn, "a")
    live, grouped, max_live, nulls = _one(
        conn,
        sql.SQL(
            "SELECT count(*), count(*) FILTER (WHERE " + _GROUP + " IS NOT NULL),"
            " coalesce(max(msg_id), 0), count(*) FILTER (WHERE message IS NULL) FROM {}"
        ).format(q_rows),
    )
    archived, max_archived, null_archived = _one(
        conn,
        sql.SQL(
            "SELECT count(*), coalesce(max(msg_id), 0), count(*) FILTER (WHERE message IS NULL)"
            " FROM {}"
        ).format(a_rows),
    )
    seq = conn.execute(
        "SELECT pg_get_serial_sequence(%s, 'msg_id')", (s.q.as_string(conn),)
    ).fetchone()
    handed_out = 0
    if seq is not None and seq[0] is not None:
        (handed_out,) = _one(
            conn,
            sql.SQL("SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM {}").format(
                sql.SQL(seq[0])
            ),
        )
    last = max(handed_out, max_live, max_archived)
    result = QueueImport(
        s.target,
        s.name,
        live,
        archived,
        s.partitioned,
        s.unlogged,
        last,
        grouped,
        settings.throttles.get(s.table_name),
        settings.patterns.get(s.table_name, ()),
        nulls + null_archived,
        NEVER_POISON if existed is None else existed,
    )
    if dry_run:
        return result
    created = existed is None
    if not created:
        # Its producers may be sending now, with ids of its own sequence that
        # PGMQ's may share. A message is in one half of the key or the other
        # (sql/schema/queue.sql), and neither refuses an id the other holds:
        # writes wait until this commits, and a clash is looked for in both.
        conn.execute("LOCK TABLE pgqueue.message IN SHARE ROW EXCLUSIVE MODE")
        (clashes,) = _one(
            conn,
            sql.SQL(
                "SELECT count(*) FROM {} WHERE EXISTS (SELECT 1 FROM pgqueue.message m"
                " JOIN pgqueue.queue q ON q.queue_id = m.queue_id"
                " WHERE q.queue_name = %s AND m.msg_id = src.msg_id"
                " AND pgqueue._keyed(m.read_ct, m.vt, m.enqueued_at, m.group_key))"
            ).format(q_rows),
            (s.target,),
        )
        if clashes:
            raise PgmqImportRefused(
                f"queue {sql_literal(s.name)}: {clashes} of its msg_ids are taken by live"
                f" messages of pgqueue queue {sql_literal(s.target)}; drain or purge that"
                " queue, or import into another name; nothing was changed"
            )
    # the facade made it already, unless PGMQ stays (an import of some queues)
    conn.execute(
        "SELECT pgqueue.create_queue(%s, %s) WHERE NOT EXISTS"
        " (SELECT 1 FROM pgqueue.queue WHERE queue_name = %s)",
        (s.target, NEVER_POISON, s.target),
    )
    (queue_id,) = _one(
        conn,
        sql.SQL(
            "UPDATE pgqueue.queue SET created_at = CASE WHEN {} THEN %s ELSE created_at END,"
            " has_groups = has_groups OR %s WHERE queue_name = %s RETURNING queue_id"
        ).format(sql.Literal(created)),
        (s.created_at, grouped > 0, s.target),
    )
    copied = conn.execute(
        sql.SQL(
            "INSERT INTO pgqueue.message (queue_id, msg_id, read_ct, enqueued_at, last_read_at,"
            " vt, message, headers, group_key)"
            " SELECT %s, msg_id, read_ct, enqueued_at, last_read_at, vt,"
            " coalesce(message, 'null'), headers, " + _GROUP + " FROM {}"
        ).format(q_rows),
        (queue_id,),
    ).rowcount
    if created:
        # Rows written with a vt in the past are listed in pgqueue.recheck by
        # a trigger, for reads whose lane floors passed them; a queue created
        # now has its floors at the bottom (its first read starts its lanes
        # over), so every row is in reach, and a backlog left listed would be
        # probed row by row by every read until it drained.
        conn.execute("DELETE FROM pgqueue.recheck WHERE queue_id = %s", (queue_id,))
    kept = conn.execute(
        sql.SQL(
            "INSERT INTO pgqueue.archive (queue_id, msg_id, read_ct, enqueued_at, archived_at,"
            " vt, message, headers, last_read_at)"
            " SELECT %s, msg_id, read_ct, enqueued_at, archived_at, vt,"
            " coalesce(message, 'null'), headers, last_read_at FROM {}"
        ).format(a_rows),
        (queue_id,),
    ).rowcount
    if (copied, kept) != (live, archived):  # the tables are locked: never, but never lose one
        raise PgmqImportRefused(
            f"queue {sql_literal(s.name)} changed while it was copied ({live} live and"
            f" {archived} archived counted, {copied} and {kept} copied); nothing was changed"
        )
    if last > 0:
        conn.execute(
            # pgqueue's next id is above PGMQ's last, and above its own (a
            # queue that existed empty): an id is never handed out twice.
            "SELECT setval(q.msg_seq, greatest(%s, (SELECT coalesce(s.last_value, 0)"
            " FROM pg_sequences s WHERE"
            " format('%%I.%%I', s.schemaname, s.sequencename)::regclass = q.msg_seq)), true)"
            " FROM pgqueue.queue q WHERE q.queue_id = %s",
            (last, queue_id),
        )
    return result


def _one(
    conn: psycopg.Connection[Any], query: sql.Composed, params: Sequence[Any] = ()
) -> tuple[int, ...]:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return tuple(row)


def _notes(moved: Sequence[QueueImport], left: Sequence[str]) -> list[str]:
    notes = []
    for q in moved:
        name = sql_literal(q.queue_name)
        if q.unlogged:
            notes.append(f"queue {name} was UNLOGGED in PGMQ; in pgqueue it is crash-safe")
        if q.max_attempts != NEVER_POISON:
            notes.append(
                f"queue {name} was in pgqueue already (empty), with max_attempts"
                f" {q.max_attempts}: its messages are poison-dropped after that many reads,"
                " which PGMQ never did (`pgqueue queue create` sets another)"
            )
        if q.null_payloads:
            notes.append(
                f"queue {name}: {q.null_payloads} message(s) had an SQL NULL payload, kept as"
                " JSON null (a client reads None either way)"
            )
        if q.partitioned:
            notes.append(
                f"queue {name} was partitioned (pg_partman) in PGMQ; in pgqueue it is one queue"
                " like any other, and its pg_partman configuration is removed with PGMQ"
            )
    if left:
        notes.append(
            f"PGMQ keeps {len(left)} {one_or_many(left, 'queue', 'queues')}"
            f" ({', '.join(sql_literal(n) for n in left)}), so it"
            " stays installed and the facade is not: import them too to finish the move"
        )
    return notes


def _remove_pgmq(conn: psycopg.Connection[Any], found: _Found, sources: Sequence[_Source]) -> None:
    """Drop PGMQ, and pg_partman's configuration of its partitioned queues."""
    _forget_partitions(conn, sources)
    if found.extension is not None:
        conn.execute("DROP EXTENSION pgmq CASCADE")
    conn.execute("DROP SCHEMA IF EXISTS pgmq CASCADE")


def _forget_partitions(conn: psycopg.Connection[Any], sources: Sequence[_Source]) -> None:
    """pg_partman's maintenance would go on looking for the partitioned queues' tables."""
    partman = conn.execute(
        "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace"
        " WHERE e.extname = 'pg_partman'"
    ).fetchone()
    parted = [s for s in sources if s.partitioned]
    if partman is not None and parted:
        conn.execute(
            sql.SQL("DELETE FROM {}.part_config WHERE parent_table = ANY(%s)").format(
                sql.Identifier(partman[0])
            ),
            ([f"pgmq.{p}_{s.table_name}" for s in parted for p in ("q", "a")],),
        )


def _remove_pgmq_queues(conn: psycopg.Connection[Any], sources: Sequence[_Source]) -> None:
    """Drop the moved queues' tables and rows from a PGMQ that stays for its other queues."""
    _forget_partitions(conn, sources)
    for s in sources:
        for table in (s.q, s.a):
            member = conn.execute(
                sql.SQL(
                    "SELECT EXISTS (SELECT 1 FROM pg_depend WHERE classid = 'pg_class'::regclass"
                    " AND objid = {}::regclass AND deptype = 'e')"
                ).format(sql.Literal(table.as_string(conn)))
            ).fetchone()
            if member and member[0]:
                conn.execute(sql.SQL("ALTER EXTENSION pgmq DROP TABLE {}").format(table))
            conn.execute(sql.SQL("DROP TABLE {} CASCADE").format(table))
        conn.execute("DELETE FROM pgmq.meta WHERE lower(queue_name) = %s", (s.table_name,))


def _not_carried(moved: Sequence[QueueImport]) -> list[str]:
    """What an import of some queues leaves behind: the facade is not there to hold it."""
    notes = []
    for q in moved:
        lost = []
        if q.pgmq_name != q.queue_name:
            lost.append(f"its PGMQ name {sql_literal(q.pgmq_name)} in listings")
        if q.notify_throttle_ms is not None:
            lost.append(f"notify-on-insert ({q.notify_throttle_ms} ms)")
        if q.topic_patterns:
            lost.append("its topic bindings " + ", ".join(map(sql_literal, q.topic_patterns)))
        if lost:
            notes.append(
                f"queue {sql_literal(q.queue_name)} moves without "
                + "; ".join(lost)
                + ": set them again through the facade once the last queue moves"
            )
    return notes


def _carry_over(
    conn: psycopg.Connection[Any], sources: Sequence[_Source], settings: _Settings
) -> list[str]:
    """Notify-on-insert and topic bindings, set again through the facade; notes for the rest.

    A setting the facade refuses raises PgmqImportRefused.
    """
    notes = []
    throttled = [
        (s, settings.throttles[s.table_name]) for s in sources if s.table_name in settings.throttles
    ]
    bound = [(p, s) for s in sources for p in settings.patterns.get(s.table_name, ())]
    try:
        if throttled and _has_function(conn, "pgmq.enable_notify_insert(text,integer)"):
            for s, ms in throttled:
                conn.execute("SELECT pgmq.enable_notify_insert(%s, %s)", (s.name, ms))
        elif throttled:
            notes.append(
                "notify-on-insert was on for "
                + ", ".join(sql_literal(s.name) for s, _ in throttled)
                + " in PGMQ; this facade has no notify-on-insert, so it is off"
            )
        if bound and _has_function(conn, "pgmq.bind_topic(text,text)"):
            for pattern, s in bound:
                conn.execute("SELECT pgmq.bind_topic(%s, %s)", (pattern, s.name))
                at = settings.bound_at.get((pattern, s.table_name))
                if at is not None:  # when it was bound, as PGMQ says
                    conn.execute(
                        "UPDATE pgmq.topic_bindings SET bound_at = %s"
                        " WHERE pattern = %s AND queue_name = %s",
                        (at, pattern, s.target),
                    )
        elif bound:
            notes.append(
                f"{len(bound)} topic binding(s) were not carried over (this facade has no"
                " topics): "
                + ", ".join(f"{sql_literal(p)} -> {sql_literal(s.name)}" for p, s in bound)
            )
    except psycopg.Error as exc:
        raise PgmqImportRefused(
            "the facade refused a setting carried over from PGMQ (a topic binding or a notify"
            f" throttle): {exc.diag.message_primary or exc}; nothing was changed"
        ) from exc
    return notes
