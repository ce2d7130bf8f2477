"""A connection that fails says what happened: no answer, an answer that refused, or a bad DSN.

A server that did not answer (a refused port, a timeout, an unknown host) is
reported with the attempts and the time they really took, and the hint to check
that the server is running. A server that answered but refused (no such
database or role, a password, pg_hba.conf) is reported as such, with what to do
and no "is it running" hint. A DSN that does not parse never reaches a server.
Each names where the DSN came from: the argument, PGQUEUE_DSN or DATABASE_URL.
"""

from __future__ import annotations

import asyncio
import re
import socket
import time
from collections.abc import Iterator

import psycopg
import pytest
from support.db import refused_dsn, with_dbname

from pgqueue import AsyncClient, Client, ConnectionLost, InvalidArgument

MISSING_DB = "pgqueue_no_such_db"


def _error(dsn: str | None = None, **kwargs: object) -> str:
    with pytest.raises(ConnectionLost) as info:
        Client.from_dsn(dsn, **kwargs)  # type: ignore[arg-type]
    return str(info.value)


@pytest.fixture
def no_dsn_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGQUEUE_DSN", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A port that accepts connections and never says a word."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield int(s.getsockname()[1])


def test_a_refused_port_says_refused_with_the_attempts_and_time_it_took() -> None:
    dsn = refused_dsn()
    start = time.monotonic()
    text = _error(dsn, connect_timeout=5)
    took = time.monotonic() - start
    match = re.fullmatch(
        r"could not connect to nobody@127\.0\.0\.1:\d+/x: connection refused"
        r" \(after 1 attempt in (under 0\.1|\d+\.\d)s\); check that the server is running"
        r" and that the DSN \(from the dsn argument\) is right",
        text,
    )
    assert match, text
    assert match.group(1) == "under 0.1" or float(match.group(1)) <= took + 0.05
    assert "within" not in text and "5s" not in text


def test_waiting_for_a_refused_port_counts_every_attempt() -> None:
    text = _error(refused_dsn(), wait_seconds=1.5)
    match = re.search(r"connection refused \(after (\d+) attempts in (\d+\.\d)s", text)
    assert match, text
    # stopped at its 1.5 s (a loaded machine adds to the last attempt, not 30 s of them)
    assert int(match.group(1)) >= 2 and 1.5 <= float(match.group(2)) < 20


def test_a_server_that_never_answers_is_reported_as_a_timeout(silent_server: int) -> None:
    text = _error(f"postgresql://x@127.0.0.1:{silent_server}/db", connect_timeout=1)
    assert re.search(r": no answer \(timed out after 1 attempt in \d+\.\ds\); check that", text)
    assert "server is running" in text


def test_an_unknown_host_is_reported_as_no_answer(no_dsn_env: None) -> None:
    text = _error("postgresql://x@nosuchhost.invalid/db")
    assert text.startswith(
        "could not connect to x@nosuchhost.invalid:5432/db: cannot resolve host name"
        " nosuchhost.invalid (after 1 attempt in"
    ), text
    assert "check that the server is running" in text


def test_a_missing_database_is_refused_by_a_server_that_answered(server_dsn: str) -> None:
    params = psycopg.conninfo.conninfo_to_dict(server_dsn)
    start = time.monotonic()
    text = _error(with_dbname(server_dsn, MISSING_DB), wait_seconds=60)
    # refused is final: never waited for (60 s); a bound far above what load adds
    assert time.monotonic() - start < 30
    host, port = params.get("host") or "localhost", params.get("port") or 5432
    server = f"socket {host}/.s.PGSQL.{port}" if host.startswith("/") else f"{host}:{port}"
    assert text == (
        f"the server at {server} answered but refused the connection: database '{MISSING_DB}'"
        f" does not exist; create it (CREATE DATABASE {MISSING_DB}) or fix the database name"
        " in the DSN (from the dsn argument)"
    ), text
    assert "running" not in text


def test_a_missing_role_is_refused_by_a_server_that_answered(server_dsn: str) -> None:
    text = _error(with_dbname(server_dsn, "postgres", user="pgqueue_no_such_role"))
    assert "answered but refused the connection: " in text
    assert (
        "role 'pgqueue_no_such_role' does not exist; create the role" in text
        or "password authentication failed for user 'pgqueue_no_such_role'" in text
    ), text
    assert "running" not in text


@pytest.mark.parametrize(
    ("server_says", "advice"),
    [
        (
            'FATAL:  password authentication failed for user "app"',
            "check the user name and password in the DSN (from PGQUEUE_DSN)",
        ),
        (
            'FATAL:  no pg_hba.conf entry for host "10.0.0.7", user "app", database "db",'
            " no encryption",
            "add a line for this host, user and database to the server's pg_hba.conf",
        ),
        (
            "fe_sendauth: no password supplied",
            "the server asks for a password: give it in the DSN (from PGQUEUE_DSN)",
        ),
        (
            'FATAL:  role "app" is not permitted to log in',
            "give it LOGIN (ALTER ROLE app LOGIN), or use another user in the DSN"
            " (from PGQUEUE_DSN)",
        ),
        (
            'FATAL:  permission denied for database "db"',
            "GRANT CONNECT ON DATABASE db TO app",
        ),
        (
            'FATAL:  role "Mixed Case" does not exist',
            'CREATE ROLE "Mixed Case" LOGIN',
        ),
    ],
)
def test_each_refusal_says_what_to_do(server_says: str, advice: str) -> None:
    from pgqueue._settings import connect_failed

    exc = psycopg.OperationalError(
        f'connection failed: connection to server at "10.1.2.3", port 6432 failed: {server_says}'
    )
    error = connect_failed("app@db.example:6432/db", "PGQUEUE_DSN", exc, attempts=1, elapsed=0.01)
    text = str(error)
    reason = server_says.removeprefix("FATAL:  ").replace('"', "'")
    assert text.startswith(
        f"the server at 10.1.2.3:6432 answered but refused the connection: {reason}; "
    ), text
    assert advice in text and "running" not in text


def test_the_hint_names_where_the_dsn_came_from(
    monkeypatch: pytest.MonkeyPatch, no_dsn_env: None, server_dsn: str
) -> None:
    for var in ("PGQUEUE_DSN", "DATABASE_URL"):
        monkeypatch.setenv(var, refused_dsn())
        assert f"the DSN (from {var}) is right" in _error(), var
        monkeypatch.setenv(var, with_dbname(server_dsn, MISSING_DB))
        assert f"database name in the DSN (from {var})" in _error(), var
        monkeypatch.delenv(var)
    assert "the DSN (from the dsn argument) is right" in _error(refused_dsn())
    assert "the DSN (from --dsn) is right" in _error(refused_dsn(), dsn_source="--dsn")
    monkeypatch.setenv("PGQUEUE_DSN", refused_dsn())
    # A label only names an explicit DSN; one from the environment is named by its variable.
    assert "the DSN (from PGQUEUE_DSN) is right" in _error(None, dsn_source="--dsn")


@pytest.mark.parametrize(
    ("dsn", "reason"),
    [
        ("nonsense", 'missing "=" after "nonsense" in connection info string'),
        ("host=localhost port=abc", "port 'abc' is not a number from 1 to 65535"),
        ("postgresql://x@h:99999/db", "port '99999' is not a number from 1 to 65535"),
        ("postgresql://x:y@/?bad=1", 'invalid URI query parameter: "bad"'),
        ("postgresql://x:bad@/?bad=1", 'invalid URI query parameter: "***"'),
        (
            "postgresql://x@h/db?connect_timeout=soon",
            "connect_timeout 'soon' is not a number of seconds",
        ),
    ],
)
def test_a_malformed_dsn_is_refused_before_any_connection(dsn: str, reason: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        Client.from_dsn(dsn)
    text = str(info.value)
    assert text.startswith(f"malformed DSN (from the dsn argument): {reason}; use "), text
    assert "refused" not in text and "could not connect" not in text


@pytest.mark.parametrize(
    "dsn",
    [
        "u:Qx7kw9@host",
        "postgresql://u:Qx7kw9@[::1/db",
        "postgresql://u:Qx7kw9@h:abc/db",
        "postgresql://u:Qx7kw9%zz@h/db",
        "postgresql://u:Qx7@kw9@[::1/db",
        "host=h password=Qx7kw9 port=x",
        "host=h password='Qx7 kw9' nonsense",
        "postgresql://u:Qx7/kw9@h/db",
        "postgresql://u:Qx7@kw9:1@h/db",
    ],
)
def test_a_malformed_dsn_never_echoes_its_password(dsn: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        Client.from_dsn(dsn)
    text = str(info.value)
    assert "Qx7" not in text and "kw9" not in text, text
    assert text.startswith("malformed DSN (from the dsn argument): ")


def test_the_async_client_says_the_same(server_dsn: str) -> None:
    async def refused() -> str:
        with pytest.raises(ConnectionLost) as info:
            await AsyncClient.from_dsn(with_dbname(server_dsn, MISSING_DB), dsn_source="--dsn")
        return str(info.value)

    text = asyncio.run(refused())
    assert f"answered but refused the connection: database '{MISSING_DB}' does not exist" in text
    assert text.endswith("fix the database name in the DSN (from --dsn)")
    with pytest.raises(InvalidArgument, match=r"^malformed DSN \(from the dsn argument\): "):
        asyncio.run(AsyncClient.from_dsn("nonsense"))
