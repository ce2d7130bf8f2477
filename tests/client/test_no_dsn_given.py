"""With no DSN anywhere, the API says what a program can do: pass one, or set PGQUEUE_DSN.

The command line says `--dsn` (tests/ops/test_cli.py); a program has no flag.
"""

from __future__ import annotations

import asyncio

import pytest

from pgqueue import AsyncClient, Client, PgQueueError

SAID = (
    "no database given: pass a DSN to from_dsn(), e.g. 'postgresql://user@localhost:5432/dbname',"
    " or set PGQUEUE_DSN (or DATABASE_URL)"
)


@pytest.fixture
def no_dsn_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGQUEUE_DSN", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)


def test_client_from_dsn_without_a_dsn_names_no_command_line_flag(no_dsn_env: None) -> None:
    with pytest.raises(PgQueueError) as info:
        Client.from_dsn()
    assert str(info.value) == SAID
    assert "--dsn" not in str(info.value)


def test_async_client_from_dsn_without_a_dsn_says_the_same(no_dsn_env: None) -> None:
    with pytest.raises(PgQueueError) as info:
        asyncio.run(AsyncClient.from_dsn())
    assert str(info.value) == SAID


def test_the_command_lines_source_keeps_its_flag(no_dsn_env: None) -> None:
    with pytest.raises(PgQueueError, match=r"pass a DSN \(--dsn\)"):
        Client.from_dsn(dsn_source="--dsn")
