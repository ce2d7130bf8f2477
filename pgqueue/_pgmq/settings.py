"""PGMQ's per-queue settings (notify-on-insert, topics, partitions), carried over by the facade."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from pgqueue._errors import sql_literal
from pgqueue._pgmq.model import PgmqImportRefused, QueueImport
from pgqueue._pgmq.sources import Source


@dataclass(frozen=True, slots=True)
class Partitions:
    """How pg_partman keeps one PGMQ queue's tables: each as (interval, retention, premake)."""

    queue: tuple[str, str | None, int] | None
    """The queue table's, when it is partitioned (create_partitioned)."""
    archive: tuple[str, str | None, int] | None
    """The archive's (create_partitioned, or convert_archive_partitioned alone)."""
    anchor: Any
    """Where its time partitions start (the oldest partition's lower bound), or None."""

    def describe(self) -> str:
        """What is kept, in a line: each table's partitions and retention."""
        said = []
        for what, kept in (("messages", self.queue), ("archive", self.archive)):
            if kept is not None:
                interval, retention, _ = kept
                keep = "for ever" if retention is None else f"retention {retention}"
                said.append(f"{what}: partitions of {interval}, {keep}")
        return "; ".join(said)


@dataclass(frozen=True, slots=True)
class Settings:
    """PGMQ's per-queue settings, by PGMQ's table name stem (the name lowercased)."""

    patterns: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Topic patterns bound to each queue (PGMQ 1.11 and later)."""
    bound_at: dict[tuple[str, str], Any] = field(default_factory=dict)
    """When each (pattern, queue) was bound."""
    throttles: dict[str, int] = field(default_factory=dict)
    """Queues with notify-on-insert on, and their throttles in ms."""
    partitions: dict[str, Partitions] = field(default_factory=dict)
    """Queues whose tables pg_partman partitions, and what it keeps of them."""

    @classmethod
    def read(cls, conn: psycopg.Connection[Any]) -> Settings:
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
        out.partitions.update(_partitions(conn))
        return out


def _partitions(conn: psycopg.Connection[Any]) -> dict[str, Partitions]:
    """pg_partman's configuration of PGMQ's tables, by queue (nothing without pg_partman)."""
    row = conn.execute(
        "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace"
        " WHERE e.extname = 'pg_partman'"
    ).fetchone()
    if row is None:
        return {}
    partman = sql.Identifier(str(row[0]))
    found: dict[str, dict[str, Any]] = {}
    # the oldest partition's lower bound: where pg_partman's time partitions start
    for parent, interval, retention, premake, anchor in conn.execute(
        sql.SQL(
            "SELECT c.parent_table, c.partition_interval, c.retention, c.premake,"
            " (SELECT min(i.child_start_time) FROM {p}.show_partitions(c.parent_table) s,"
            "   LATERAL {p}.show_partition_info("
            "     s.partition_schemaname || '.' || s.partition_tablename,"
            "     c.partition_interval, c.parent_table) i)"
            " FROM {p}.part_config c"
            " WHERE c.parent_table LIKE 'pgmq.q\\_%' OR c.parent_table LIKE 'pgmq.a\\_%'"
        ).format(p=partman)
    ):
        kind, table = str(parent)[len("pgmq.") :].split("_", 1)
        entry = found.setdefault(table, {})
        entry[kind] = (str(interval), None if retention is None else str(retention), int(premake))
        entry.setdefault("anchor", anchor)
        if kind == "q":
            entry["anchor"] = anchor
    return {
        t: Partitions(e.get("q"), e.get("a"), e.get("anchor"))
        for t, e in found.items()
        if "q" in e or "a" in e
    }


def _exists(conn: psycopg.Connection[Any], relation: str) -> bool:
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (relation,)).fetchone()
    return bool(row and row[0])


def _has_function(conn: psycopg.Connection[Any], signature: str) -> bool:
    row = conn.execute("SELECT to_regprocedure(%s) IS NOT NULL", (signature,)).fetchone()
    return bool(row and row[0])


def not_carried(moved: Sequence[QueueImport]) -> list[str]:
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
        if q.retention:
            lost.append(f"its retention ({q.retention})")
        if lost:
            notes.append(
                f"queue {sql_literal(q.queue_name)} moves without "
                + "; ".join(lost)
                + ": set them again through the facade once the last queue moves"
            )
    return notes


def carry_over(
    conn: psycopg.Connection[Any], sources: Sequence[Source], settings: Settings
) -> list[str]:
    """Notify-on-insert, topics and partitions, set again through the facade; notes for the rest.

    A setting the facade refuses raises PgmqImportRefused.
    """
    notes = []
    throttled = [
        (s, settings.throttles[s.table_name]) for s in sources if s.table_name in settings.throttles
    ]
    bound = [(p, s) for s in sources for p in settings.patterns.get(s.table_name, ())]
    parted = [(s, p) for s in sources if (p := settings.partitions.get(s.table_name))]
    try:
        for s, parts in parted:
            _partition(conn, s, parts)
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
            "the facade refused a setting carried over from PGMQ (a topic binding, a notify"
            f" throttle or a partitioned queue's retention): {exc.diag.message_primary or exc};"
            " nothing was changed"
        ) from exc
    return notes


def _partition(conn: psycopg.Connection[Any], s: Source, parts: Partitions) -> None:
    """Keep what pg_partman kept of the queue: its partitions' retention, as PGMQ had it."""
    if parts.queue is not None:
        interval, retention, premake = parts.queue
        conn.execute(
            "SELECT pgmq.create_partitioned(%s, %s, %s, %s)", (s.name, interval, retention, premake)
        )
    if parts.archive is not None:
        interval, retention, _ = parts.archive
        if parts.queue is None:
            conn.execute(
                "SELECT pgmq.convert_archive_partitioned(%s, %s, %s)", (s.name, interval, retention)
            )
        conn.execute(
            "UPDATE pgmq.partition_config SET archive_interval = %s, archive_retention = %s"
            " WHERE queue_name = %s",
            (interval, retention, s.target),
        )
    if parts.anchor is not None:
        conn.execute(
            "UPDATE pgmq.partition_config SET anchor = %s WHERE queue_name = %s",
            (parts.anchor, s.target),
        )
