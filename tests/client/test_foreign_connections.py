"""`conn=` on the caller's own transaction: SQLAlchemy Session and AsyncSession, and bad input.

A send on the caller's connection commits and rolls back with the caller's
business write: no second connection, no commit of its own, no retry.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from pgqueue import AsyncClient, Client, InvalidArgument

sqlalchemy = pytest.importorskip("sqlalchemy", reason="needs pgqueue-py[sqlalchemy]")

from sqlalchemy import create_engine, text  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

QUEUE = "orders"
TABLE = "CREATE TABLE IF NOT EXISTS orders (id serial PRIMARY KEY, item text NOT NULL)"


@pytest.fixture
def shop(dsn: str, client: Client) -> str:
    """A queue and the application's own table."""
    client.create_queue(QUEUE)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(TABLE)
    return dsn


def books(dsn: str) -> tuple[int, int]:
    """(orders, messages) as another session sees them: only what committed."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        orders = conn.execute("SELECT count(*) FROM orders").fetchone()
        messages = conn.execute(
            "SELECT count(*) FROM pgqueue.message m JOIN pgqueue.queue q USING (queue_id)"
            " WHERE q.queue_name = %s",
            (QUEUE,),
        ).fetchone()
    assert orders is not None and messages is not None
    return int(orders[0]), int(messages[0])


def engine(dsn: str) -> Any:
    """An SQLAlchemy engine over psycopg 3 on the test database."""
    return create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(dsn))


def test_a_session_commits_the_send_with_its_write(shop: str, client: Client) -> None:
    eng = engine(shop)
    with Session(eng) as session:
        session.execute(text("INSERT INTO orders (item) VALUES ('book')"))
        msg_id = client.send(QUEUE, {"item": "book"}, conn=session)
        assert books(shop) == (0, 0), "nothing is visible before the session commits"
        session.commit()
    assert books(shop) == (1, 1)
    (msg,) = client.read(QUEUE)
    assert (msg.msg_id, msg.message) == (msg_id, {"item": "book"})
    eng.dispose()


def test_a_session_rolled_back_leaves_no_message(shop: str, client: Client) -> None:
    eng = engine(shop)
    with Session(eng) as session:
        session.execute(text("INSERT INTO orders (item) VALUES ('book')"))
        client.send_batch(QUEUE, [{"n": 1}, {"n": 2}], conn=session)
        client.fan_out(QUEUE, [{"m": 1}], callback_queue=QUEUE, callback_message={}, conn=session)
        session.rollback()
    assert books(shop) == (0, 0)
    eng.dispose()


def test_a_savepoint_rolled_back_takes_its_send_and_leaves_the_outer_one(
    shop: str, client: Client
) -> None:
    eng = engine(shop)
    with Session(eng) as session, session.begin():
        session.execute(text("INSERT INTO orders (item) VALUES ('outer')"))
        client.send(QUEUE, {"at": "outer"}, conn=session)
        nested = session.begin_nested()
        client.send(QUEUE, {"at": "inner"}, conn=session)
        nested.rollback()
    assert books(shop) == (1, 1)
    assert [m.message for m in client.read(QUEUE, qty=5)] == [{"at": "outer"}]
    eng.dispose()


def test_an_sqlalchemy_connection_is_taken_as_is(shop: str, client: Client) -> None:
    eng = engine(shop)
    with eng.connect() as conn:
        client.send(QUEUE, {"n": 1}, conn=conn)
        conn.rollback()
    with eng.begin() as conn:
        client.send(QUEUE, {"n": 2}, conn=conn)
        # JSON read through the framework's connection comes back as values,
        # though SQLAlchemy loads json as text on its connections
        (got,) = client.read(QUEUE, conn=conn)
        assert got.message == {"n": 2}
    assert books(shop) == (0, 1)
    eng.dispose()


def test_an_error_inside_the_transaction_is_raised_as_is_and_not_retried(
    shop: str, client: Client
) -> None:
    eng = engine(shop)
    with Session(eng) as session:
        with pytest.raises(InvalidArgument):
            client.send(QUEUE, {"n": 1}, delay=-1, conn=session)
        session.rollback()
    assert books(shop) == (0, 0)
    eng.dispose()


def test_an_async_session_commits_and_rolls_back_with_the_send(shop: str) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    async def main() -> None:
        eng = create_async_engine(
            "postgresql+psycopg://",
            async_creator=lambda: psycopg.AsyncConnection.connect(shop),
        )
        async with await AsyncClient.from_dsn(shop) as client:
            async with AsyncSession(eng) as session:
                await session.execute(text("INSERT INTO orders (item) VALUES ('kept')"))
                await client.send(QUEUE, {"item": "kept"}, conn=session)
                await session.commit()
            async with AsyncSession(eng) as session:
                await session.execute(text("INSERT INTO orders (item) VALUES ('dropped')"))
                await client.send(QUEUE, {"item": "dropped"}, conn=session)
                await session.rollback()
            async with AsyncSession(eng) as session, session.begin():
                nested = await session.begin_nested()
                await client.send(QUEUE, {"item": "inner"}, conn=session)
                await nested.rollback()
                async with eng.connect() as conn:  # an AsyncConnection, outside that session
                    await client.send(QUEUE, {"item": "other"}, conn=conn)
                    await conn.commit()
            got = await client.read(QUEUE, qty=10)
        await eng.dispose()
        assert sorted(str(m.message["item"]) for m in got) == ["kept", "other"]

    asyncio.run(main())
    assert books(shop) == (1, 2)  # both messages were read (leased), not acked: still there


def test_a_send_on_a_connection_outside_a_transaction_commits_with_its_commit(
    shop: str, client: Client
) -> None:
    eng = engine(shop)
    with eng.connect() as conn:
        client.send(QUEUE, {"n": 1}, conn=conn)  # begins the connection's transaction
        assert conn.in_transaction()
        conn.commit()
    with eng.connect() as conn:
        client.send(QUEUE, {"n": 2}, conn=conn)  # closed without a commit: rolled back
    assert books(shop) == (0, 1)
    eng.dispose()


@pytest.mark.parametrize("wrong", [object(), "dbname=x", 42])
def test_a_conn_of_an_unknown_kind_is_refused_in_one_line(
    shop: str, client: Client, wrong: object
) -> None:
    with pytest.raises(InvalidArgument, match="conn must be a psycopg Connection"):
        client.send(QUEUE, {"n": 1}, conn=wrong)
    assert books(shop) == (0, 0)


def test_a_conn_of_the_other_kind_of_client_is_refused(shop: str, client: Client) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    eng = engine(shop)
    with Session(eng) as session:

        async def main() -> None:
            aeng = create_async_engine(
                "postgresql+psycopg://",
                async_creator=lambda: psycopg.AsyncConnection.connect(shop),
            )
            async with await AsyncClient.from_dsn(shop) as aclient:
                with pytest.raises(InvalidArgument, match="pass it to Client, not AsyncClient"):
                    await aclient.send(QUEUE, {"n": 1}, conn=session)
                async with AsyncSession(aeng) as asession:
                    with pytest.raises(InvalidArgument, match="pass it to AsyncClient"):
                        client.send(QUEUE, {"n": 1}, conn=asession)
            await aeng.dispose()

        asyncio.run(main())
    assert books(shop) == (0, 0)
    eng.dispose()


def test_migrations_run_in_an_sqlalchemy_transaction_and_roll_back_with_it(
    empty_dsn: str,
) -> None:
    from pgqueue._migrate import available
    from pgqueue.contrib.sqlalchemy import migrate

    eng = engine(empty_dsn)
    with eng.connect() as conn:
        names = migrate(conn)
        assert names == [m.name for m in available()]
        conn.rollback()
    with psycopg.connect(empty_dsn) as check:
        assert check.execute("SELECT to_regclass('pgqueue.queue')").fetchone() == (None,)
    with eng.begin() as conn:  # as an Alembic revision runs
        assert len(migrate(conn)) == len(available())
    with eng.begin() as conn:
        assert migrate(conn) == []
    with Client.from_dsn(empty_dsn) as client:
        client.create_queue(QUEUE)
        assert client.migrate() == []
    eng.dispose()


def test_a_session_on_another_driver_is_refused_in_one_line(shop: str, client: Client) -> None:
    other = create_engine("sqlite://")
    with Session(other) as session, pytest.raises(InvalidArgument, match="not psycopg 3"):
        client.send(QUEUE, {"n": 1}, conn=session)
    other.dispose()
    assert books(shop) == (0, 0)
