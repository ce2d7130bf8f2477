"""A server that cannot write its files (53100 disk full, 58030 I/O error) is one clear error.

The server itself raises each state here (a DO block with that ERRCODE, the
same class psycopg builds for the real thing); the disk really filling up is
tests/ops/test_disk_full.py. The call is not retried: the statement rolled
back, and running it again fails the same way until someone frees space.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
import pytest

from pgqueue import AsyncClient, Client, PgQueueError, RetryPolicy
from pgqueue._calls import Call
from pgqueue._errors import StorageError, translate
from pgqueue._retry import is_retryable

# What Postgres says when it cannot extend a table's file (md.c), and its hint.
DISK_FULL = 'could not extend file "base/16384/16385": No space left on device'
IO_ERROR = 'could not read block 7 in file "base/16384/16385": Input/output error'

# Counts its attempts in a sequence (nextval is not rolled back with the error).
ATTEMPTS = "disk_attempts"


def raising(state: str, text: str, hint: str = "Check free disk space.") -> str:
    return (
        f"DO $$ BEGIN PERFORM nextval('{ATTEMPTS}');"
        f" RAISE EXCEPTION USING MESSAGE = '{text}', ERRCODE = '{state}', HINT = '{hint}'; END $$"
    )


def caught(conn: psycopg.Connection[Any], statement: str) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as info:
        conn.execute(statement)
    return info.value


@pytest.fixture
def attempts(sql: psycopg.Connection[Any]) -> Any:
    sql.execute(f"CREATE SEQUENCE {ATTEMPTS}")

    def made() -> int:
        row = sql.execute(f"SELECT last_value, is_called FROM {ATTEMPTS}").fetchone()
        assert row is not None
        return int(row[0]) if row[1] else 0

    return made


def test_disk_full_says_nothing_was_written_and_to_free_space(
    sql: psycopg.Connection[Any], attempts: Any
) -> None:
    exc = caught(sql, raising("53100", DISK_FULL))
    assert isinstance(exc, psycopg.errors.DiskFull)
    error = translate(exc)
    assert type(error) is StorageError and isinstance(error, PgQueueError)
    assert str(error) == (
        f"the database is out of disk space (SQLSTATE 53100: {DISK_FULL}); nothing was written:"
        " free space on the server, then retry"
    )
    assert error.what == f"the database is out of disk space (SQLSTATE 53100: {DISK_FULL})"
    assert "\n" not in str(error) and "Check free disk space" not in str(error)


def test_an_io_error_says_nothing_was_written_and_to_check_the_disk(
    sql: psycopg.Connection[Any], attempts: Any
) -> None:
    exc = caught(sql, raising("58030", IO_ERROR, hint=""))
    assert isinstance(exc, psycopg.errors.IoError)
    error = translate(exc)
    assert type(error) is StorageError
    assert str(error) == (
        "the database server could not read or write its files"
        f" (SQLSTATE 58030: {IO_ERROR}); nothing was written:"
        " check the server's disk and its log, then retry"
    )


@pytest.mark.parametrize("state", ["53100", "58030"])
def test_a_storage_error_is_not_retried(
    dsn: str, sql: psycopg.Connection[Any], attempts: Any, state: str
) -> None:
    retries: list[str] = []
    # A policy that would retry for ten seconds, were the error retryable.
    policy = RetryPolicy(attempts=50, deadline_seconds=10, initial_wait_seconds=0.05)
    with Client.from_dsn(dsn, max_size=2, retry=policy) as client:
        client.observers.retried.append(retries.append)
        started = time.monotonic()
        with pytest.raises(StorageError):
            client.run(Call("disk", raising(state, DISK_FULL), (), lambda rows: None))
        took = time.monotonic() - started
    assert (attempts(), retries) == (1, [])
    # the counts above say no retry; this bound (far above what load adds) still catches
    # a wait through the 10 s budget
    assert took < 8.0
    assert not is_retryable(caught(sql, raising(state, DISK_FULL)))


def test_the_async_client_raises_the_same_error_once(dsn: str, attempts: Any) -> None:
    async def run() -> None:
        policy = RetryPolicy(attempts=50, deadline_seconds=10)
        async with await AsyncClient.from_dsn(dsn, max_size=2, retry=policy) as client:
            with pytest.raises(StorageError, match=r"out of disk space \(SQLSTATE 53100"):
                await client.run(Call("disk", raising("53100", DISK_FULL), (), lambda rows: None))

    asyncio.run(run())
    assert attempts() == 1
