"""PGMQ's per-queue settings (notify-on-insert, topic bindings), carried over by the facade."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from pgqueue._errors import sql_literal
from pgqueue._pgmq.model import PgmqImportRefused, QueueImport
from pgqueue._pgmq.sources import Source


@dataclass(frozen=True, slots=True)
class Settings:
    """PGMQ's per-queue settings, by PGMQ's table name stem (the name lowercased)."""

    patterns: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Topic patterns bound to each queue (PGMQ 1.11 and later)."""
    bound_at: dict[tuple[str, str], Any] = field(default_factory=dict)
    """When each (pattern, queue) was bound."""
    throttles: dict[str, int] = field(default_factory=dict)
    """Queues with notify-on-insert on, and their throttles in ms."""

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
        return out


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
