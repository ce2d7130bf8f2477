"""What refuses an import before anything changes: rows pgqueue cannot hold, objects in the way."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from pgqueue._errors import sql_literal
from pgqueue._pgmq.model import PgmqImportRefused
from pgqueue._pgmq.sources import Source

# Headers pgqueue would refuse on a send: not an object, or a reserved _pg_ key.
# The rules every entry applies to what it is given (sql/schema/queue.sql):
# the header rule's first half, and no document nested beyond readers.
_BAD_HEADERS = "pgqueue._headers_problem(headers) IS NOT NULL"
_UNDECODABLE = "(pgqueue._undecodable(message) OR pgqueue._undecodable(headers)) IS TRUE"


def check_importable(conn: psycopg.Connection[Any], sources: Sequence[Source]) -> None:
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
    if problems:
        raise PgmqImportRefused("cannot import: " + "; ".join(problems) + "; nothing was changed")


def refuse_dependents(
    conn: psycopg.Connection[Any], sources: Sequence[Source], *, whole: bool
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
