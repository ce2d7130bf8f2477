"""Migrations: ordered, recorded, idempotent, safe to run concurrently, never edited."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

from pgqueue import Client, MigrationError, NotMigrated
from pgqueue._migrate import available, current_version, migrate


def test_migrate_twice_is_a_no_op(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert current_version(conn) is None
        first = migrate(conn)
        assert [m.version for m in first] == [m.version for m in available()]
        assert migrate(conn) == []
        assert current_version(conn) == available()[-1].version


def test_concurrent_migrators_apply_each_migration_once(empty_dsn: str) -> None:
    applied: list[list[Any]] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def run() -> None:
        try:
            with psycopg.connect(empty_dsn, autocommit=True) as conn:
                barrier.wait()
                applied.append(migrate(conn))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    total = sorted(m.version for batch in applied for m in batch)
    assert total == [m.version for m in available()]
    with psycopg.connect(empty_dsn) as conn:
        rows = conn.execute("SELECT version FROM pgqueue.schema_version ORDER BY 1").fetchall()
    assert [r[0] for r in rows] == total


def test_edited_migration_is_refused(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE pgqueue.schema_version SET checksum = 'tampered' WHERE version = 1")
        with pytest.raises(MigrationError, match="edited after it was applied"):
            migrate(conn)


def test_unmigrated_database_gives_a_clear_error(empty_dsn: str) -> None:
    with Client.from_dsn(empty_dsn) as client, pytest.raises(NotMigrated, match="pgqueue migrate"):
        client.send("q", 1)


def test_client_migrate_reports_applied_names(empty_dsn: str) -> None:
    with Client.from_dsn(empty_dsn) as client:
        assert client.migrate() == [m.name for m in available()]
        assert client.migrate() == []
