"""The PGMQ fixtures (a plugin of tests/conftest.py): real PGMQ and pgqueue's facade side by side.

`real_pgmq_dsn` is a fresh database holding PGMQ itself, installed from the
`pgmq.sql` that ships inside the PyPI `pgmq` package (the version the clients
under test were released with). `facade_dsn` is a fresh database migrated by
pgqueue with the `pgmq` facade installed over it. A differential test runs
the same client calls against both and compares the results.

Each test still gets databases of its own, cloned from a template, but the
clone a test takes was made while the test before it ran, and the databases it
used are dropped after it in the background (`Clones`): creating two databases
and dropping them cost more than half a second a test, which the tests no
longer wait for.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
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


class Clones:
    """Fresh databases cloned from one template: each made one test ahead, each dropped
    after its test, in a background thread of the test process.

    A clone is taken once; a database is never handed out twice. At the end, the
    clone made ahead for a test that never came is dropped, and any failure of a
    background create or drop fails the session's teardown instead of passing unseen.
    """

    def __init__(self, server_dsn: str, template: str) -> None:
        self._server_dsn = server_dsn
        self._template = template
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"clones-{template}")
        self._ahead: Future[str] | None = None
        self._drops: list[Future[None]] = []

    def _create(self) -> Future[str]:
        return self._pool.submit(create_database, self._server_dsn, self._template)

    def take(self) -> str:
        """The name of a fresh clone of the template, this caller's alone."""
        ahead, self._ahead = self._ahead, None
        name = (ahead or self._create()).result()
        self._ahead = self._create()
        return name

    def drop(self, name: str) -> None:
        """Drop a clone taken earlier, in the background."""
        self._drops.append(self._pool.submit(drop_database, self._server_dsn, name))

    def close(self) -> None:
        """Drop the clone made ahead, wait for every drop; raise the first failure."""
        try:
            if self._ahead is not None:
                self.drop(self._ahead.result())
        finally:
            self._pool.shutdown(wait=True)
        for done in self._drops:
            done.result()


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


@pytest.fixture(scope="session")
def real_pgmq_clones(server_dsn: str, real_pgmq_template: str) -> Iterator[Clones]:
    """Clones of the real-PGMQ template, made one test ahead."""
    clones = Clones(server_dsn, real_pgmq_template)
    yield clones
    clones.close()


@pytest.fixture
def real_pgmq_dsn(server_dsn: str, real_pgmq_clones: Clones) -> Iterator[str]:
    """A DSN to a fresh database of this test's own, holding real PGMQ."""
    name = real_pgmq_clones.take()
    yield with_dbname(server_dsn, name)
    real_pgmq_clones.drop(name)


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


@pytest.fixture(scope="session")
def facade_clones(server_dsn: str, facade_template: str) -> Iterator[Clones]:
    """Clones of the facade template, made one test ahead."""
    clones = Clones(server_dsn, facade_template)
    yield clones
    clones.close()


@pytest.fixture
def facade_dsn(server_dsn: str, facade_clones: Clones) -> Iterator[str]:
    """A DSN to a fresh database of this test's own: pgqueue migrated, the facade installed."""
    name = facade_clones.take()
    yield with_dbname(server_dsn, name)
    facade_clones.drop(name)


@pytest.fixture(params=["real", "facade"])
def either_dsn(request: pytest.FixtureRequest) -> str:
    """Each test that takes it runs twice: on real PGMQ, and on pgqueue's facade."""
    fixture = "real_pgmq_dsn" if request.param == "real" else "facade_dsn"
    dsn: Any = request.getfixturevalue(fixture)
    return str(dsn)


def queue_views(conn: psycopg.Connection[Any]) -> set[str]:
    """The queues' views in schema pgmq: every view but meta and notify_insert_throttle."""
    cur = conn.execute("SELECT viewname FROM pg_views WHERE schemaname = 'pgmq'")
    return {r[0] for r in cur.fetchall()} - {"meta", "notify_insert_throttle"}
