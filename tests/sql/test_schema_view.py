"""sql/schema/ (the schema as it stands) and sql/0*.sql (its history) build the same database.

One database is migrated; another is built from the files of sql/schema/.
Their catalogs must agree on every table, column, constraint, index,
trigger, type and sequence, every function's arguments, result, body,
language, volatility, security and settings, and every grant. A change made
in one place but not the other fails here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
from support.db import create_database, drop_database, with_dbname

from pgqueue._migrate import migrate

SCHEMA = Path(__file__).resolve().parents[2] / "sql" / "schema"
ORDER = [
    "queue",
    "reads",
    "poison",
    "barriers",
    "workflows",
    "single_flight",
    "guard",
    "workers",
    "roles",
]

CATALOG = {
    "columns": """
        SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod),
               a.attnotnull, pg_get_expr(d.adbin, d.adrelid)
          FROM pg_attribute a
          JOIN pg_class c ON c.oid = a.attrelid
          LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
         WHERE c.relnamespace = 'pgqueue'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
           AND c.relkind IN ('r', 'c')""",
    "relations": """
        SELECT relname, relkind, relpersistence, reloptions::text, relacl::text
          FROM pg_class WHERE relnamespace = 'pgqueue'::regnamespace""",
    "constraints": """
        SELECT c.relname, pg_get_constraintdef(k.oid)
          FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
         WHERE k.connamespace = 'pgqueue'::regnamespace""",
    "indexes": "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'pgqueue'",
    "triggers": """
        SELECT tgname, pg_get_triggerdef(t.oid) FROM pg_trigger t
          JOIN pg_class c ON c.oid = t.tgrelid
         WHERE c.relnamespace = 'pgqueue'::regnamespace AND NOT t.tgisinternal""",
    "sequences": """
        SELECT sequencename, data_type::text, start_value, increment_by, max_value, cache_size
          FROM pg_sequences WHERE schemaname = 'pgqueue'""",
    "functions": """
        SELECT p.oid::regprocedure::text, pg_get_function_arguments(p.oid),
               pg_get_function_result(p.oid), l.lanname, p.provolatile, p.proisstrict,
               p.prosecdef, p.proretset, p.proconfig::text, p.proacl::text, p.prosrc
          FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
         WHERE p.pronamespace = 'pgqueue'::regnamespace""",
    "schema": "SELECT nspacl::text FROM pg_namespace WHERE nspname = 'pgqueue'",
    "role_grant": "SELECT object, roles::text, kind FROM pgqueue.role_grant",
}


def catalog(dsn: str) -> dict[str, list[tuple[Any, ...]]]:
    with psycopg.connect(dsn) as conn:
        return {
            name: sorted(conn.execute(sql).fetchall(), key=repr) for name, sql in CATALOG.items()
        }


def build_from_view(dsn: str) -> None:
    """What a fresh `pgqueue migrate` leaves, from sql/schema/ instead of the migrations."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA pgqueue")
        with conn.transaction():
            conn.execute("SET LOCAL check_function_bodies = off")  # bodies name later files
            for area in ORDER:
                conn.execute((SCHEMA / f"{area}.sql").read_text().encode())


def differences(a: dict[str, list[Any]], b: dict[str, list[Any]]) -> list[str]:
    out = []
    for name in CATALOG:
        left, right = set(a[name]), set(b[name])
        out += [
            f"{name} only in the migrations: {row!r}"[:400]
            for row in sorted(left - right, key=repr)
        ]
        out += [f"{name} only in the view: {row!r}"[:400] for row in sorted(right - left, key=repr)]
    return out


@pytest.fixture
def two_builds(server_dsn: str) -> Any:
    names = [create_database(server_dsn), create_database(server_dsn)]
    migrated, viewed = (with_dbname(server_dsn, n) for n in names)
    with psycopg.connect(migrated, autocommit=True) as conn:
        migrate(conn)
    build_from_view(viewed)
    yield migrated, viewed
    for n in names:
        drop_database(server_dsn, n)


def test_the_view_and_the_migrations_build_the_same_schema(two_builds: Any) -> None:
    migrated, viewed = two_builds
    assert differences(catalog(migrated), catalog(viewed)) == []


def test_the_view_lists_its_files_and_every_file_is_listed() -> None:
    assert sorted(p.stem for p in SCHEMA.glob("*.sql")) == sorted(ORDER)


def test_a_queue_made_in_either_build_gets_the_same_sequences(two_builds: Any) -> None:
    for dsn in two_builds:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pgqueue.create_queue('jobs')")
            conn.execute("SELECT pgqueue.send('jobs', '1')")
            assert conn.execute("SELECT msg_id FROM pgqueue.read('jobs', 30, 1)").fetchone() == (1,)
    assert differences(*(catalog(dsn) for dsn in two_builds)) == []
