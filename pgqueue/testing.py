"""Testing mode for your own tests: a migrated throwaway database per test, drain(), assertions.

A pytest plugin: enable it with `pytest_plugins = ["pgqueue.testing"]` in your
root conftest.py, or `pytest -p pgqueue.testing`. Importing it connects to
nothing; the first test that asks for `pgqueue_dsn` or `pgqueue_client`
migrates one template database per test process, and every such test gets a
database cloned from it (`CREATE DATABASE ... TEMPLATE`), dropped after the
test. The server comes from `--pgqueue-dsn`, else `$PGQUEUE_TEST_DSN`; with
neither, those tests are skipped and say why. Safe under pytest-xdist: each
process has its own template and every database has a random name.

`drain()` runs an App's handlers in this process, one message (or one batch)
at a time, acking as the worker does, until nothing is visible; the first
handler error is re-raised. `assert_enqueued()` / `assert_not_enqueued()` /
`enqueued()` look at what is live in a queue (peek: nothing is leased).
docs/integrations/testing.md shows them in use.
This module is the plugin; drain() and the assertions live in pgqueue/_testing/.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgqueue._client import Client
from pgqueue._errors import PgQueueError
from pgqueue._migrate import migrate
from pgqueue._testing.asserts import assert_enqueued, assert_not_enqueued, enqueued
from pgqueue._testing.drain import Drained, DrainLimitReached, drain

__all__ = [
    "DrainLimitReached",
    "Drained",
    "assert_enqueued",
    "assert_not_enqueued",
    "drain",
    "enqueued",
    "pgqueue_client",
    "pgqueue_dsn",
    "pgqueue_server_dsn",
    "pgqueue_template",
]

DSN_ENV = "PGQUEUE_TEST_DSN"
DSN_OPTION = "--pgqueue-dsn"
# Every database this plugin creates starts so: one left behind by a killed
# run is easy to find (`SELECT datname FROM pg_database WHERE datname LIKE 'pgqueue_t%'`).
TEMPLATE_PREFIX = "pgqueue_tpl_"
DATABASE_PREFIX = "pgqueue_test_"


# -- the plugin: a throwaway migrated database per test ---------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    """--pgqueue-dsn: the server the tests' throwaway databases are created on."""
    parser.getgroup("pgqueue").addoption(
        DSN_OPTION,
        dest="pgqueue_dsn",
        default=None,
        help=(
            "a Postgres server (any database on it; the role needs CREATEDB) for pgqueue's"
            f" per-test databases; default: ${DSN_ENV}"
        ),
    )


def _with_dbname(dsn: str, dbname: str) -> str:
    params: dict[str, Any] = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo("", **params)


def _admin(server_dsn: str) -> psycopg.Connection[Any]:
    return psycopg.connect(server_dsn, autocommit=True, connect_timeout=10)


def _create_database(server_dsn: str, prefix: str, template: str | None = None) -> str:
    name = f"{prefix}{uuid.uuid4().hex[:12]}"
    clause = f" TEMPLATE {template}" if template else ""
    try:
        with _admin(server_dsn) as conn:
            conn.execute(f"CREATE DATABASE {name}{clause}")
    except psycopg.errors.InsufficientPrivilege as exc:
        raise PgQueueError(
            f"pgqueue.testing could not create a test database: {exc}".strip()
            + "; the login role of the test server needs CREATEDB (ALTER ROLE ... CREATEDB)"
        ) from exc
    return name


def _drop_database(server_dsn: str, name: str) -> None:
    # FORCE: a connection the test leaked (a client it never closed) must not keep it alive.
    with _admin(server_dsn) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(scope="session")
def pgqueue_server_dsn(pytestconfig: pytest.Config) -> str:
    """The server's DSN: --pgqueue-dsn, else $PGQUEUE_TEST_DSN; skips the test when neither is set.

    The flag wins over the variable, as a worker's flags do over its
    environment. A server that does not answer fails the test (it was asked for).
    """
    dsn = pytestconfig.getoption("pgqueue_dsn", default=None) or os.environ.get(DSN_ENV)
    if not dsn:
        pytest.skip(
            f"pgqueue.testing needs a Postgres server: set {DSN_ENV} or pass {DSN_OPTION}=DSN"
        )
    try:
        with _admin(dsn):
            pass
    except psycopg.OperationalError as exc:
        source = DSN_OPTION if pytestconfig.getoption("pgqueue_dsn", default=None) else DSN_ENV
        pytest.fail(f"pgqueue.testing: the server of {source} did not answer: {exc}", pytrace=False)
    return str(dsn)


@pytest.fixture(scope="session")
def pgqueue_template(pgqueue_server_dsn: str) -> Iterator[str]:
    """A database migrated once per test process; every test's database is a copy of it."""
    name = _create_database(pgqueue_server_dsn, TEMPLATE_PREFIX)
    try:  # dropped even when migrating it fails
        with psycopg.connect(_with_dbname(pgqueue_server_dsn, name), autocommit=True) as conn:
            migrate(conn)
        yield name
    finally:
        _drop_database(pgqueue_server_dsn, name)


@pytest.fixture
def pgqueue_dsn(pgqueue_server_dsn: str, pgqueue_template: str) -> Iterator[str]:
    """A DSN to a fresh, migrated database of this test's own, dropped after it."""
    name = _create_database(pgqueue_server_dsn, DATABASE_PREFIX, template=pgqueue_template)
    try:
        yield _with_dbname(pgqueue_server_dsn, name)
    finally:
        _drop_database(pgqueue_server_dsn, name)


@pytest.fixture
def pgqueue_client(pgqueue_dsn: str) -> Iterator[Client]:
    """A Client on this test's database, closed after the test."""
    with Client.from_dsn(pgqueue_dsn, max_size=4) as client:
        yield client
