"""The name mapping: which pgqueue queue the facade makes of each PGMQ name, by a rehearsal."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import psycopg
from psycopg import sql

from pgqueue._errors import sql_literal
from pgqueue._pgmq.facade import Found, install_in_transaction
from pgqueue._pgmq.files import facade_files
from pgqueue._pgmq.model import PgmqImportRefused
from pgqueue._pgmq.settings import Settings, carry_over
from pgqueue._pgmq.sources import Source

# Where a rehearsal moves PGMQ's schema, for the facade to take its name.
_ASIDE = "pgqueue_pgmq_importing"


def _step_aside(conn: psycopg.Connection[Any], found: Found) -> None:
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


def facade_names(
    conn: psycopg.Connection[Any], found: Found, sources: Sequence[Source], settings: Settings
) -> list[Source]:
    """Each source with the pgqueue queue the facade makes of it, found by a rehearsal.

    In a savepoint rolled back whatever happens: PGMQ out of the way, the
    facade installed, each queue created through it, its settings carried over.
    A name the facade refuses, or a setting, raises PgmqImportRefused.
    """
    names: dict[str, str] = {}
    problems: list[str] = []
    with conn.transaction():
        _step_aside(conn, found)
        install_in_transaction(conn, facade_files(), replace=False)
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
            carry_over(conn, [replace(s, target=names[s.name]) for s in sources], settings)
        raise psycopg.Rollback()
    if problems:
        raise PgmqImportRefused("cannot import: " + "; ".join(problems) + "; nothing was changed")
    return [replace(s, target=names[s.name]) for s in sources]
