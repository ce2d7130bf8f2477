"""Copying one PGMQ queue's rows into pgqueue, and removing what was copied from PGMQ."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from pgqueue._errors import sql_literal
from pgqueue._pgmq.facade import Found
from pgqueue._pgmq.model import GROUP_KEY, NEVER_POISON, PgmqImportRefused, QueueImport
from pgqueue._pgmq.settings import Settings
from pgqueue._pgmq.sources import Source


def import_queue(
    conn: psycopg.Connection[Any],
    s: Source,
    settings: Settings,
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
            "SELECT count(*), count(*) FILTER (WHERE " + GROUP_KEY + " IS NOT NULL),"
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
        parts.describe() if (parts := settings.partitions.get(s.table_name)) else "",
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
            " coalesce(message, 'null'), headers, " + GROUP_KEY + " FROM {}"
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


def remove_pgmq(conn: psycopg.Connection[Any], found: Found, sources: Sequence[Source]) -> None:
    """Drop PGMQ, and pg_partman's configuration of its partitioned queues."""
    _forget_partitions(conn, sources)
    if found.extension is not None:
        conn.execute("DROP EXTENSION pgmq CASCADE")
    conn.execute("DROP SCHEMA IF EXISTS pgmq CASCADE")


def _forget_partitions(conn: psycopg.Connection[Any], sources: Sequence[Source]) -> None:
    """pg_partman's maintenance would go on looking for the queues' partitioned tables."""
    partman = conn.execute(
        "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace"
        " WHERE e.extname = 'pg_partman'"
    ).fetchone()
    if partman is not None and sources:
        conn.execute(
            sql.SQL("DELETE FROM {}.part_config WHERE parent_table = ANY(%s)").format(
                sql.Identifier(partman[0])
            ),
            ([f"pgmq.{p}_{s.table_name}" for s in sources for p in ("q", "a")],),
        )


def remove_pgmq_queues(conn: psycopg.Connection[Any], sources: Sequence[Source]) -> None:
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
