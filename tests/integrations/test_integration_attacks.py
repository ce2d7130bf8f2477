"""Hostile uses of `conn=` (psycopg, SQLAlchemy, Django) and of pgqueue.testing.drain.

The promise under attack (docs/integrations.md): a call given the caller's
connection runs on it as is, inside the caller's transaction, with no second
connection, no commit and no retry; a rolled-back transaction leaves no
message, a committed one exactly one; errors come out as pgqueue's errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import textwrap
import time
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row, namedtuple_row
from support.db import wait_until
from support.extras import needs_extra

import pgqueue
from pgqueue import AsyncClient, Client, InvalidArgument, PgQueueError
from pgqueue.testing import DrainLimitReached, drain

sqlalchemy = pytest.importorskip("sqlalchemy", reason="needs pgqueue-py[sqlalchemy]")

from sqlalchemy import create_engine, text  # noqa: E402
from sqlalchemy.orm import (  # noqa: E402
    DeclarativeBase,
    Mapped,
    Session,
    mapped_column,
    scoped_session,
    sessionmaker,
)

QUEUE = "orders"


@pytest.fixture
def shop(dsn: str, client: Client) -> str:
    client.create_queue(QUEUE)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS orders (id serial PRIMARY KEY, item text)")
    return dsn


def committed(dsn: str) -> int:
    """Messages in QUEUE as another session sees them: only what committed."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pgqueue.message m JOIN pgqueue.queue q USING (queue_id)"
            " WHERE q.queue_name = %s",
            (QUEUE,),
        ).fetchone()
    assert row is not None
    return int(row[0])


def backends(dsn: str) -> int:
    """Client backends connected to the test database (pgqueue's pool and everyone's)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND backend_type = 'client backend'"
            " AND pid <> pg_backend_pid()"
        ).fetchone()
    assert row is not None
    return int(row[0])


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    item: Mapped[str]


class Other(DeclarativeBase):
    pass


def engine(dsn: str, **kw: Any) -> Any:
    return create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(dsn), **kw)


# -- psycopg connections configured by their owner ---------------------------


@pytest.mark.parametrize("row_factory", [dict_row, namedtuple_row])
def test_a_connection_with_another_row_factory_gets_right_results(
    shop: str, client: Client, row_factory: Any
) -> None:
    with psycopg.connect(shop, row_factory=row_factory) as conn:
        msg_id = client.send(QUEUE, {"n": 1}, conn=conn)
        assert isinstance(msg_id, int)
        (msg,) = client.read(QUEUE, conn=conn)
        assert (msg.msg_id, msg.message) == (msg_id, {"n": 1})
        conn.rollback()
    assert committed(shop) == 0


def test_a_client_cursor_connection_gets_right_results(shop: str, client: Client) -> None:
    with psycopg.connect(shop, cursor_factory=psycopg.ClientCursor) as conn:
        ids = client.send_batch(QUEUE, [{"n": 1}, {"n": 2}], conn=conn)
        got = client.read(QUEUE, qty=5, conn=conn)
        assert [(m.msg_id, m.message) for m in got] == list(
            zip(ids, [{"n": 1}, {"n": 2}], strict=True)
        )
        conn.commit()
    assert committed(shop) == 2


def test_a_send_in_pipeline_mode_returns_its_msg_id(shop: str, client: Client) -> None:
    with psycopg.connect(shop) as conn:
        with conn.pipeline():
            msg_id = client.send(QUEUE, {"n": 1}, conn=conn)
        assert isinstance(msg_id, int)
        conn.commit()
    (msg,) = client.read(QUEUE)
    assert msg.msg_id == msg_id


def test_a_failed_call_in_pipeline_mode_raises_pgqueues_error_at_the_call(
    shop: str, client: Client
) -> None:
    with psycopg.connect(shop) as conn:
        with pytest.raises(pgqueue.QueueNotFound), conn.pipeline():
            client.send("no_such_queue", {"n": 1}, conn=conn)
        conn.rollback()
    assert committed(shop) == 0


def test_a_connection_in_a_failed_transaction_raises_and_sends_nothing(
    shop: str, client: Client
) -> None:
    with psycopg.connect(shop) as conn:
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1/0")
        with pytest.raises(PgQueueError):
            client.send(QUEUE, {"n": 1}, conn=conn)
        conn.rollback()
        client.send(QUEUE, {"n": 2}, conn=conn)
        conn.commit()
    assert [m.message for m in client.read(QUEUE, qty=5)] == [{"n": 2}]


def test_a_dead_connection_raises_once_without_retry_or_hang(shop: str, client: Client) -> None:
    client.send(QUEUE, {"warm": True})  # the pool's connection exists before we count
    with psycopg.connect(shop) as conn:
        conn.execute("SELECT 1")
        pid = conn.info.backend_pid
        terminated(shop, pid)
        before = backends(shop)
        started = time.monotonic()
        with pytest.raises(pgqueue.ConnectionLost):
            client.send(QUEUE, {"n": 1}, conn=conn)
        # a retry would wait out its backoff and then its budget (30 s): the room below
        # it is for a loaded machine
        assert time.monotonic() - started < 20, "no retry, no wait"
        assert backends(shop) == before, "no second connection was opened for it"
    assert committed(shop) == 1


# -- SQLAlchemy --------------------------------------------------------------


def test_a_session_whose_transaction_failed_raises_and_sends_nothing(
    shop: str, client: Client
) -> None:
    eng = engine(shop)
    with Session(eng) as session:
        session.execute(text("INSERT INTO orders (item) VALUES ('book')"))
        with pytest.raises(sqlalchemy.exc.DataError):
            session.execute(text("SELECT 1/0"))
        with pytest.raises(PgQueueError):
            client.send(QUEUE, {"n": 1}, conn=session)
        session.rollback()
        client.send(QUEUE, {"n": 2}, conn=session)
        session.commit()
    assert [m.message for m in client.read(QUEUE, qty=5)] == [{"n": 2}]
    eng.dispose()


def test_a_session_without_autobegin_is_refused_in_one_line_or_joined(
    shop: str, client: Client
) -> None:
    eng = engine(shop)
    with Session(eng, autobegin=False) as session:
        with session.begin():
            client.send(QUEUE, {"in": "begin"}, conn=session)
        try:
            client.send(QUEUE, {"out": "of begin"}, conn=session)
        except InvalidArgument:
            pass
        except Exception as exc:
            pytest.fail(f"not pgqueue's error: {type(exc).__module__}.{type(exc).__name__}: {exc}")
        else:
            session.rollback()
    assert committed(shop) == 1
    eng.dispose()


def test_a_scoped_session_is_taken_as_its_session(shop: str, client: Client) -> None:
    eng = engine(shop)
    scoped = scoped_session(sessionmaker(eng))
    scoped.execute(text("INSERT INTO orders (item) VALUES ('a')"))
    client.send(QUEUE, {"n": 1}, conn=scoped)
    scoped.rollback()
    client.send(QUEUE, {"n": 2}, conn=scoped)
    assert committed(shop) == 0
    scoped.commit()
    assert committed(shop) == 1
    scoped.remove()
    eng.dispose()


def test_a_session_with_two_engines_and_no_default_bind(shop: str, client: Client) -> None:
    one, two = engine(shop), engine(shop)
    with Session(binds={Base: one, Other: two}) as session:
        session.add(Order(item="x"))
        session.flush()
        try:
            client.send(QUEUE, {"n": 1}, conn=session)
        except InvalidArgument:
            pass  # refused, saying so: fine
        except Exception as exc:
            pytest.fail(f"not pgqueue's error: {type(exc).__module__}.{type(exc).__name__}: {exc}")
        session.rollback()
    assert committed(shop) == 0
    one.dispose()
    two.dispose()


def test_an_autocommit_sqlalchemy_connection_sends_at_once(shop: str, client: Client) -> None:
    eng = engine(shop, isolation_level="AUTOCOMMIT")
    with eng.connect() as conn:
        client.send(QUEUE, {"n": 1}, conn=conn)
        assert committed(shop) == 1
    eng.dispose()


def terminated(dsn: str, pid: int) -> None:
    """pg_terminate_backend, then wait until the backend has left the server's list
    (not a guess of how long that takes on a loaded machine)."""
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        wait_until(
            lambda: (
                admin.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)
                ).fetchone()
                == (0,)
            )
        )


def test_a_dead_session_connection_raises_and_the_engine_recovers(
    shop: str, client: Client
) -> None:
    eng = engine(shop, pool_size=1, max_overflow=0)
    with Session(eng) as session:
        pid = session.execute(text("SELECT pg_backend_pid()")).scalar_one()
        terminated(shop, pid)
        with pytest.raises(pgqueue.ConnectionLost):
            client.send(QUEUE, {"n": 1}, conn=session)
        with contextlib.suppress(sqlalchemy.exc.DBAPIError):
            session.rollback()
    with Session(eng) as session:  # the pool must not serve the dead connection again
        client.send(QUEUE, {"n": 2}, conn=session)
        session.commit()
    assert committed(shop) == 1
    eng.dispose()


def test_a_two_phase_session_prepared_then_rolled_back_leaves_no_message(
    shop: str, client: Client
) -> None:
    with psycopg.connect(shop) as c:
        row = c.execute("SHOW max_prepared_transactions").fetchone()
    if row is None or int(row[0]) == 0:
        pytest.skip("the server has max_prepared_transactions = 0")
    eng = engine(shop)
    with Session(eng, twophase=True) as session:
        client.send(QUEUE, {"n": 1}, conn=session)
        session.prepare()
        session.rollback()
    assert committed(shop) == 0
    eng.dispose()


def test_json_through_sqlalchemy_comes_back_as_values(shop: str, client: Client) -> None:
    eng = engine(shop)
    with Session(eng) as session:
        barrier = client.open_barrier(
            QUEUE, callback_queue=QUEUE, callback_message={"done": True}, conn=session
        )
        client.add_members(barrier, [{"m": [1, 2]}], conn=session)
        status = client.seal(barrier, conn=session)
        assert status.total == 1
        (msg,) = client.read(QUEUE, conn=session)
        assert msg.message == {"m": [1, 2]}
        assert isinstance(msg.headers, (dict, type(None)))
        session.commit()
    eng.dispose()


def test_an_async_session_in_a_failed_transaction_raises_pgqueues_error(shop: str) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    async def main() -> None:
        eng = create_async_engine(
            "postgresql+psycopg://",
            async_creator=lambda: psycopg.AsyncConnection.connect(shop),
        )
        async with await AsyncClient.from_dsn(shop) as aclient, AsyncSession(eng) as session:
            with pytest.raises(sqlalchemy.exc.DataError):
                await session.execute(text("SELECT 1/0"))
            with pytest.raises(PgQueueError):
                await aclient.send(QUEUE, {"n": 1}, conn=session)
            await session.rollback()
        await eng.dispose()

    asyncio.run(main())
    assert committed(shop) == 0


# -- Django, in a subprocess (its settings are global to a process) ----------

DJANGO = """
import sys, json
import django
from django.conf import settings
from psycopg.conninfo import conninfo_to_dict
p = conninfo_to_dict(sys.argv[1])
settings.configure(
    DATABASES={"default": {
        "ENGINE": "django.db.backends.postgresql", "NAME": p["dbname"],
        "USER": p.get("user", ""), "PASSWORD": p.get("password", ""),
        "HOST": p.get("host", ""), "PORT": p.get("port", ""),
    }},
    INSTALLED_APPS=["django.contrib.contenttypes", "pgqueue.contrib.django"],
    USE_TZ=True,
)
django.setup()
from django.db import connection, transaction
import pgqueue
from pgqueue.contrib.django import client, send
c = client()
"""


def django(dsn: str, body: str) -> str:
    """Run `body` in a Django process configured on `dsn`; its stdout."""
    needs_extra("django")
    done = subprocess.run(
        [sys.executable, "-c", DJANGO + textwrap.dedent(body), dsn],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_django_durable_atomic_and_on_commit(shop: str) -> None:
    out = django(
        shop,
        """
        try:
            with transaction.atomic(durable=True):
                send("orders", {"n": "rolled back"})
                raise ValueError
        except ValueError:
            pass
        with transaction.atomic(durable=True):
            send("orders", {"n": "durable"})
            transaction.on_commit(lambda: send("orders", {"n": "on_commit"}))
        print(sorted(m.message["n"] for m in c.read("orders", qty=10)))
        """,
    )
    assert out == "['durable', 'on_commit']"


def test_django_json_results_come_back_as_values(shop: str) -> None:
    out = django(
        shop,
        """
        with transaction.atomic():
            b = c.open_barrier("orders", callback_queue="orders",
                               callback_message={"done": 1}, conn=connection)
            c.add_members(b, [{"m": {"x": [1]}}], conn=connection)
            st = c.seal(b, conn=connection)
            (m,) = c.read("orders", conn=connection)
            print(json.dumps([st.total, m.message]))
        """,
    )
    assert out == '[1, {"m": {"x": [1]}}]'


def test_django_connection_in_a_failed_atomic_raises_pgqueues_error(shop: str) -> None:
    out = django(
        shop,
        """
        from django.db import DatabaseError
        try:
            with transaction.atomic():
                try:
                    with connection.cursor() as cur:
                        cur.execute("SELECT 1/0")
                except DatabaseError:
                    pass
                try:
                    send("orders", {"n": 1})
                except pgqueue.PgQueueError as e:
                    print("pgqueue", type(e).__name__)
                except Exception as e:
                    print("other", type(e).__module__, type(e).__name__)
                raise ValueError
        except ValueError:
            pass
        print(len(c.read("orders")))
        """,
    )
    assert out.splitlines()[0].startswith("pgqueue"), out
    assert out.splitlines()[-1] == "0"


def test_async_client_refuses_a_django_connection_in_one_line(shop: str) -> None:
    out = django(
        shop,
        """
        import asyncio
        async def main():
            async with await pgqueue.AsyncClient.from_dsn(c.conninfo()) as ac:
                try:
                    await ac.send("orders", {"n": 1}, conn=connection)
                except pgqueue.InvalidArgument as e:
                    print("refused:", e)
        asyncio.run(main())
        """,
    )
    assert out.startswith("refused:") and "\n" not in out, out


# -- pgqueue.testing.drain ---------------------------------------------------


def test_drain_runs_what_handlers_send_and_a_callback_chain(client: Client) -> None:
    for q in ("a", "b", "cb"):
        client.create_queue(q)
    app = pgqueue.App()
    seen: list[str] = []

    @app.handler("a")
    def on_a(msg: pgqueue.Message) -> None:
        seen.append("a")
        client.fan_out("b", [{"i": 1}, {"i": 2}], callback_queue="cb", callback_message={})

    @app.handler("b")
    def on_b(msg: pgqueue.Message) -> int:
        seen.append("b")
        return int(msg.message["i"])

    @app.handler("cb")
    def on_cb(msg: pgqueue.Message) -> None:
        seen.append("cb")
        if len([s for s in seen if s == "cb"]) == 1:
            client.send("a", {"again": True})

    client.send("a", {})
    drained = drain(client, app)
    assert seen.count("a") == 2 and seen.count("b") == 4 and seen.count("cb") == 2
    assert len(drained.acked) == 8


def test_drain_stops_a_handler_that_sends_to_itself(client: Client) -> None:
    client.create_queue("loop")
    app = pgqueue.App()

    @app.handler("loop")
    def again(msg: pgqueue.Message) -> None:
        client.send("loop", {})

    client.send("loop", {})
    with pytest.raises(DrainLimitReached):
        drain(client, app, max_messages=20)


def test_drain_with_a_handler_that_hangs_past_timeout(client: Client) -> None:
    client.create_queue("slow")
    app = pgqueue.App()

    @app.handler("slow")
    def slow(msg: pgqueue.Message) -> None:
        time.sleep(1.2)

    client.send_batch("slow", [{}, {}])
    started = time.monotonic()
    with pytest.raises(DrainLimitReached):
        drain(client, app, timeout=1.0)
    # it stopped at its 1 s (and the running handler), not after both: a bound far above
    # what load adds, which still catches a drain that hangs
    assert time.monotonic() - started < 30
    # the message not run is live again for the next test step, not leased for 300 s
    assert len(client.read("slow")) == 1


def test_an_async_read_in_pipeline_mode_returns_what_it_leased(shop: str, client: Client) -> None:
    client.send(QUEUE, {"n": 1})

    async def main() -> list[Any]:
        async with await AsyncClient.from_dsn(shop) as aclient:
            conn = await psycopg.AsyncConnection.connect(shop)
            async with conn:
                async with conn.pipeline():
                    got = await aclient.read(QUEUE, vt=600, conn=conn)
                await conn.commit()
            return got

    got = asyncio.run(main())
    assert [m.message for m in got] == [{"n": 1}]


def test_a_read_in_pipeline_mode_leases_nothing_it_does_not_return(
    shop: str, client: Client
) -> None:
    client.send_batch(QUEUE, [{"n": 1}, {"n": 2}])
    with psycopg.connect(shop) as conn:
        with conn.pipeline():
            got = client.read(QUEUE, qty=10, vt=600, conn=conn)
        conn.commit()
    leased = len(got)
    assert leased + len(client.read(QUEUE, qty=10)) == 2, "every message is returned or live"


def test_a_session_with_per_mapper_binds_sends_beside_the_business_write(
    shop: str, client: Client
) -> None:
    one, two = engine(shop), engine(shop)
    with Session(bind=two, binds={Order: one}) as session:
        session.add(Order(item="x"))
        session.flush()
        write_pid = (
            session.connection(bind_arguments={"mapper": Order})
            .execute(text("SELECT pg_backend_pid()"))
            .scalar_one()
        )
        try:
            client.send(QUEUE, {"n": 1}, conn=session)
        except InvalidArgument:
            pass  # refused as ambiguous: fine
        else:
            send_pid = session.connection().execute(text("SELECT pg_backend_pid()")).scalar_one()
            assert send_pid == write_pid, "the send joined another transaction than the write"
        session.rollback()
    one.dispose()
    two.dispose()


def test_a_dead_caller_connection_says_the_transaction_is_lost(shop: str, client: Client) -> None:
    with psycopg.connect(shop) as conn:
        conn.execute("SELECT 1")
        terminated(shop, conn.info.backend_pid)
        with pytest.raises(pgqueue.ConnectionLost) as caught:
            client.send(QUEUE, {"n": 1}, conn=conn)
    said = str(caught.value)
    assert "could not get a working one back" not in said and "call again" not in said, said
