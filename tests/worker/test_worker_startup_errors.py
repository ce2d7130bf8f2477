"""A worker waits at startup for a server that is down, never for one that answered and refused."""

from __future__ import annotations

import time

import pytest
from psycopg_pool import ConnectionPool
from support.db import with_dbname

from pgqueue import App, Client, ConnectionLost, RetryPolicy, Worker, WorkerSettings

MISSING_DB = "pgqueue_no_such_db"


def test_a_worker_over_a_database_that_does_not_exist_fails_at_once(server_dsn: str) -> None:
    app = App()
    app.handler("jobs")(lambda msg: None)
    # A pool handed in as is: no probe at from_dsn caught the missing database first.
    pool = ConnectionPool(
        with_dbname(server_dsn, MISSING_DB),
        min_size=0,
        max_size=8,
        timeout=1,
        kwargs={"autocommit": True},
        open=True,
    )
    client = Client(pool, owns_pool=True, retry=RetryPolicy(attempts=2, deadline_seconds=2))
    start = time.monotonic()
    try:
        with pytest.raises(ConnectionLost) as info:
            Worker(app, client, WorkerSettings(startup_timeout=300)).run(install_signals=False)
    finally:
        client.close()
    # not startup_timeout's 300 s of waiting: a bound far above what load adds
    assert time.monotonic() - start < 60
    text = str(info.value)
    assert f"answered but refused the connection: database '{MISSING_DB}' does not exist" in text
    assert "running" not in text and "gave up after waiting" not in text


def test_the_worker_command_fails_at_once_on_a_database_that_does_not_exist(
    server_dsn: str,
) -> None:
    from click.testing import CliRunner

    from pgqueue._cli import main

    start = time.monotonic()
    result = CliRunner().invoke(
        main,
        ["worker", "examples.albums:app", "--dsn", with_dbname(server_dsn, MISSING_DB)],
        env={"PGQUEUE_STARTUP_TIMEOUT": "300"},
    )
    # at once, not after the 300 s a server that is down is waited for (load adds seconds)
    assert time.monotonic() - start < 60
    assert result.exit_code == 1
    [line] = result.stderr.splitlines()
    assert line.startswith("pgqueue: error: the server at ")
    assert f"database '{MISSING_DB}' does not exist" in line
    assert line.endswith("fix the database name in the DSN (from --dsn)")
