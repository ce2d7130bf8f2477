"""The PGMQ fixtures (a plugin of tests/conftest.py): real PGMQ and pgqueue's facade side by side.

`real_pgmq_dsn` is a fresh database holding PGMQ itself, installed from the
`pgmq.sql` that ships inside the PyPI `pgmq` package (the version the clients
under test were released with). `facade_dsn` is a fresh database migrated by
pgqueue with the `pgmq` facade installed over it. A differential test runs
the same client calls against both and compares the results.
"""

from __future__ import annotations

from collections.abc import Iterator
from importlib import resources
from typing import Any

import psycopg
import pytest

from support.db import create_database, drop_database, with_dbname


def pgmq_sql() -> str:
    """The text of PGMQ's own install script, from the installed `pgmq` package."""
    return resources.files("pgmq").joinpath("sql/pgmq.sql").read_text()


def pgmq_version() -> str:
    """The PGMQ version that script installs (e.g. 1.13.0)."""
    return resources.files("pgmq").joinpath("sql/VERSION").read_text().strip()


@pytest.fixture(scope="session")
def real_pgmq_template(server_dsn: str) -> Iterator[str]:
    """A database with real PGMQ installed once per test process, cloned by every test."""
    pytest.importorskip("pgmq")
    name = create_database(server_dsn)
    try:
        with psycopg.connect(with_dbname(server_dsn, name), autocommit=True) as conn:
            conn.execute(pgmq_sql().encode())
        yield name
    finally:
        drop_database(server_dsn, name)


@pytest.fixture
def real_pgmq_dsn(server_dsn: str, real_pgmq_template: str) -> Iterator[str]:
    """A DSN to a fresh database of this test's own, holding real PGMQ."""
    name = create_database(server_dsn, template=real_pgmq_template)
    yield with_dbname(server_dsn, name)
    drop_database(server_dsn, name)


@pytest.fixture(scope="session")
def facade_template(server_dsn: str, template_db: str) -> Iterator[str]:
    """A migrated database with pgqueue's `pgmq` facade installed, once per test process."""
    from pgqueue._pgmq import install

    name = create_database(server_dsn, template=template_db)
    try:
        with psycopg.connect(with_dbname(server_dsn, name), autocommit=True) as conn:
            install(conn)
        yield name
    finally:
        drop_database(server_dsn, name)


@pytest.fixture
def facade_dsn(server_dsn: str, facade_template: str) -> Iterator[str]:
    """A DSN to a fresh database of this test's own: pgqueue migrated, the facade installed."""
    name = create_database(server_dsn, template=facade_template)
    yield with_dbname(server_dsn, name)
    drop_database(server_dsn, name)


@pytest.fixture(params=["real", "facade"])
def either_dsn(request: pytest.FixtureRequest) -> str:
    """Each test that takes it runs twice: on real PGMQ, and on pgqueue's facade."""
    fixture = "real_pgmq_dsn" if request.param == "real" else "facade_dsn"
    dsn: Any = request.getfixturevalue(fixture)
    return str(dsn)
