"""Login roles for the tests (a plugin of tests/conftest.py): real roles in pgqueue's groups.

Roles are cluster-wide: every role a test makes is named `pgq_t_<id>_<what>`
and dropped after the test, with what it owns in the test's database.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import pgqueue
from pgqueue import Client


def as_user(dsn: str, user: str) -> str:
    """The same database, logged in as `user` (trust auth)."""
    params: dict[str, Any] = conninfo_to_dict(dsn)
    params["user"] = user
    return make_conninfo("", **params)


def drop_roles(server_dsn: str, dsns: list[str], names: list[str]) -> None:
    """Drop test roles: their sessions, what they hold in each database, then the roles."""
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        found = admin.execute("SELECT rolname FROM pg_roles WHERE rolname = ANY(%s)", (names,))
        names = [r[0] for r in found]
        if not names:
            return
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = ANY(%s)",
            (names,),
        )
    idents = pgsql.SQL(", ").join(pgsql.Identifier(n) for n in names)
    for dsn in dsns:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(pgsql.SQL("DROP OWNED BY {}").format(idents))
        except psycopg.OperationalError:
            pass  # that database is gone already
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(pgsql.SQL("DROP ROLE IF EXISTS {}").format(idents))


@pytest.fixture
def make_login(server_dsn: str, dsn: str) -> Iterator[Callable[..., str]]:
    """make_login(label, *groups): a new LOGIN role in those groups; its name."""
    made: list[str] = []

    def make(label: str, *groups: str) -> str:
        name = f"pgq_t_{uuid.uuid4().hex[:10]}_{label}"
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            admin.execute(pgsql.SQL("CREATE ROLE {} LOGIN").format(pgsql.Identifier(name)))
            made.append(name)
            for group in groups:
                admin.execute(
                    pgsql.SQL("GRANT {} TO {}").format(
                        pgsql.Identifier(group), pgsql.Identifier(name)
                    )
                )
        return name

    yield make
    drop_roles(server_dsn, [dsn], made)


@pytest.fixture
def connect_as(dsn: str) -> Iterator[Callable[[str], Client]]:
    """connect_as(role): a Client logged in as that role on this test's database."""
    opened: list[Client] = []

    def connect(role: str) -> Client:
        c = Client.from_dsn(as_user(dsn, role), max_size=4, retry=pgqueue.RetryPolicy(attempts=1))
        opened.append(c)
        return c

    yield connect
    for c in opened:
        c.close()
