"""Importing a real PGMQ: its queues and archives moved into pgqueue, the facade in its place."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from pgqueue._errors import sql_literal
from pgqueue._pgmq.checks import check_importable, refuse_dependents
from pgqueue._pgmq.copying import import_queue, remove_pgmq, remove_pgmq_queues
from pgqueue._pgmq.facade import (
    Found,
    inspect_schema,
    install_in_transaction,
    lock_migrations,
    require_migrated,
)
from pgqueue._pgmq.files import facade_files
from pgqueue._pgmq.model import (
    FACADE_VERSION,
    NEVER_POISON,
    ImportReport,
    PgmqImportRefused,
    QueueImport,
)
from pgqueue._pgmq.names import facade_names
from pgqueue._pgmq.settings import Settings, carry_over, not_carried
from pgqueue._pgmq.sources import select_sources
from pgqueue._words import one_or_many


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
        lock_migrations(conn)
        require_migrated(conn, "`pgqueue pgmq import`")
        found = inspect_schema(conn)
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
    found: Found,
    kind: str,
    queues: Sequence[str] | None,
    dry_run: bool,
) -> ImportReport:
    """The import, in the caller's transaction, under the migrators' lock."""
    if not dry_run:
        # Queue creations (rows of meta) and every send, read and ack wait from here.
        _lock_tables(conn, [sql.SQL("pgmq.meta")])
    sources, left = select_sources(conn, queues)
    if not dry_run:
        _lock_tables(conn, [t for s in sources for t in (s.q, s.a)])
    settings = Settings.read(conn)
    sources = facade_names(conn, found, sources, settings)
    check_importable(conn, sources)
    refuse_dependents(conn, sources, whole=not left)
    existed = {
        str(name): int(limit)
        for name, limit in conn.execute(
            "SELECT queue_name, max_attempts FROM pgqueue.queue WHERE queue_name = ANY(%s)",
            ([s.target for s in sources],),
        )
    }
    if dry_run:  # nothing was written: it only read (and rehearsed, rolled back)
        moved = [import_queue(conn, s, settings, existed.get(s.target), True) for s in sources]
        return ImportReport(True, kind, tuple(moved), tuple(left), None, tuple(_notes(moved, left)))
    if left:
        # PGMQ stays for the other queues, and so the facade cannot come yet.
        moved = [import_queue(conn, s, settings, existed.get(s.target), False) for s in sources]
        remove_pgmq_queues(conn, sources)
        notes = _notes(moved, left) + not_carried(moved)
        return ImportReport(False, kind, tuple(moved), tuple(left), None, tuple(notes))
    # The rows move in, PGMQ goes, the facade takes schema pgmq, names each
    # queue as its PGMQ client knows it (pgmq.create on a queue that exists
    # records the name and changes nothing else), and the settings follow.
    moved = [import_queue(conn, s, settings, existed.get(s.target), False) for s in sources]
    remove_pgmq(conn, found, sources)
    install_in_transaction(conn, facade_files(), replace=False)
    for s in sources:
        conn.execute("SELECT pgmq.create(%s)", (s.name,))
    notes = _notes(moved, left) + carry_over(conn, sources, settings)
    return ImportReport(False, kind, tuple(moved), tuple(left), FACADE_VERSION, tuple(notes))


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
        if q.retention:
            notes.append(
                f"queue {name} was partitioned by pg_partman in PGMQ ({q.retention}); the facade"
                " keeps the same: schedule `SELECT pgmq.run_maintenance()` where"
                " partman.run_maintenance() runs (docs/pgmq.md)"
            )
    if left:
        notes.append(
            f"PGMQ keeps {len(left)} {one_or_many(left, 'queue', 'queues')}"
            f" ({', '.join(sql_literal(n) for n in left)}), so it"
            " stays installed and the facade is not: import them too to finish the move"
        )
    return notes
