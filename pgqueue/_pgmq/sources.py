"""The PGMQ queues an import moves: their names, their tables, the pgqueue queues they become."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from pgqueue._errors import sql_literal
from pgqueue._pgmq.model import PgmqImportRefused


@dataclass(frozen=True, slots=True)
class Source:
    """One PGMQ queue: its name in pgmq.meta, its tables, and the pgqueue queue it becomes."""

    name: str
    partitioned: bool
    unlogged: bool
    created_at: Any
    target: str = ""
    """The pgqueue queue, as the facade names it (pgmq._name): set by facade_names."""

    @property
    def table_name(self) -> str:
        """PGMQ's table name stem: the name lowercased (format_table_name)."""
        return self.name.lower()

    @property
    def q(self) -> sql.Composed:
        """Its PGMQ queue table, pgmq.q_<name>."""
        return sql.SQL("{}.{}").format(
            sql.Identifier("pgmq"), sql.Identifier(f"q_{self.table_name}")
        )

    @property
    def a(self) -> sql.Composed:
        """Its PGMQ archive table, pgmq.a_<name>."""
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


def select_sources(
    conn: psycopg.Connection[Any], wanted: Sequence[str] | None
) -> tuple[list[Source], list[str]]:
    """The PGMQ queues to move (all, or the named ones), and the ones left in PGMQ."""
    # Two names differing in case name one queue in PGMQ (one pair of tables).
    every = list(
        {
            s.table_name: s
            for s in (
                Source(str(name), bool(part), bool(unlogged), created)
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
