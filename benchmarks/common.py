"""What every benchmark shares: a throwaway database on the target server, results files."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgqueue import Client

RESULTS = Path(__file__).parent / "results"
DEFAULT_DSN = os.environ.get("PGQUEUE_DSN", "postgresql://postgres@127.0.0.1/test")


def with_db(dsn: str, db: str) -> str:
    """The same server, another database."""
    params: dict[str, Any] = conninfo_to_dict(dsn)
    params["dbname"] = db
    return make_conninfo("", **params)


@contextmanager
def scratch_database(dsn: str, prefix: str, *, migrate: bool = True) -> Iterator[str]:
    """A fresh database (migrated unless told not to), dropped afterwards; its DSN."""
    db = f"{prefix}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {db}")
    target = with_db(dsn, db)
    try:
        if migrate:
            with Client.from_dsn(target) as client:
                client.migrate()
        yield target
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


def write_results(name: str, table: str) -> None:
    """Print a result table and keep it in benchmarks/results/<name>.md."""
    print(table)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.md").write_text(table + "\n")
