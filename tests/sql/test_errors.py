"""Errors are declared once: each class names its SQLSTATEs, and the list agrees with the SQL."""

from __future__ import annotations

import re
from pathlib import Path

import psycopg
import pytest

import pgqueue
from pgqueue._errors import _REGISTRY, SQLSTATES, PgQueueError, translate

SQL = Path(__file__).resolve().parents[2] / "sql"


def raised_in_sql() -> set[str]:
    codes: set[str] = set()
    for path in SQL.rglob("*.sql"):
        if path.parent.name == "pgmq":
            # the pgmq facade answers PGMQ's clients, not pgqueue's: its codes
            # are the standard ones a PGMQ client knows (docs/pgmq.md)
            continue
        codes |= set(re.findall(r"ERRCODE = '([0-9A-Z]{5})'", path.read_text()))
    return codes


def test_the_list_of_sqlstates_is_exactly_what_the_sql_raises() -> None:
    assert raised_in_sql() == set(SQLSTATES)


def test_every_sqlstate_the_sql_raises_as_an_error_maps_to_one_class() -> None:
    notices = {"PGQ10", "PGQ11"}
    for state in set(SQLSTATES) - notices:
        assert state in _REGISTRY, f"{state} ({SQLSTATES[state]}) has no error class"
    for state, cls in _REGISTRY.items():
        assert state in cls.sqlstates and issubclass(cls, PgQueueError)
        assert cls.__name__ in pgqueue.__all__, f"{cls.__name__} is not public"


def test_poison_and_retry_are_errors_of_the_public_api() -> None:
    assert issubclass(pgqueue.Poison, Exception) and issubclass(pgqueue.Retry, Exception)
    assert pgqueue.Retry("x", delay=3).delay == 3


@pytest.mark.parametrize(
    ("statement", "error"),
    [
        ("SELECT pgqueue.send('nope', '1')", pgqueue.QueueNotFound),
        ("SELECT pgqueue.barrier_status('nope')", pgqueue.BarrierNotFound),
        ("SELECT pgqueue.read('jobs', -1, 1)", pgqueue.InvalidArgument),
        ("SELECT pgqueue.send('jobs', NULL)", pgqueue.InvalidArgument),
        ("SELECT pgqueue.send('jobs', '1', '{\"_pg_x\": 1}')", pgqueue.InvalidArgument),
        ("SELECT * FROM pgqueue.no_such_function()", pgqueue.NotMigrated),
    ],
)
def test_a_database_error_is_translated_by_its_state(
    sql: psycopg.Connection[object], queue: str, statement: str, error: type[Exception]
) -> None:
    with pytest.raises(psycopg.Error) as caught:
        sql.execute(statement)
    assert type(translate(caught.value)) is error


def test_an_application_error_of_a_shared_state_is_not_taken_for_ours(
    sql: psycopg.Connection[object],
) -> None:
    with pytest.raises(psycopg.Error) as caught:
        sql.execute("SELECT * FROM no_such_table_of_the_application")
    assert translate(caught.value) is None  # 42P01, but not pgqueue's
