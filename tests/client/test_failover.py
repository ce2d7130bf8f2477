"""Failover: clients follow the read-write node (docs/design/failover.md, section 3).

Every test runs on a private primary with a hot standby of its own
(support/standby.py), never on the shared server: one test turns its
primary read-only, another promotes its standby. So the file runs in
parallel with the rest of the suite.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from support.db import wait_until
from support.extras import needs_extra
from support.processes import count, prepare
from support.standby import Pair, SwitchProxy, primary_with_standby, server_port

from pgqueue import (
    App,
    AsyncClient,
    Client,
    ConnectionLost,
    Message,
    RetryPolicy,
    Worker,
    WorkerSettings,
)
from pgqueue._pool import PoolSpec
from pgqueue._primary import asks_read_only
from pgqueue._retry import (
    is_dead_connection,
    is_read_only_server,
    is_retryable,
    is_server_not_ready,
)
from pgqueue._settings import UNSET, describe_dsn
from pgqueue._worker.listener import Listener

pytestmark = pytest.mark.slow

QUEUES = ("aurora", "deadline", "conn", "async_q", "proxy", "promoted", "multi", "listen", "tx")
PATIENT = RetryPolicy(attempts=1000, deadline_seconds=20, initial_wait_seconds=0.02)


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    """A primary and its hot standby, with this file's queues created and replayed."""
    with primary_with_standby() as p:
        with Client.from_dsn(p.primary_dsn) as client:
            for q in QUEUES:
                client.create_queue(q, max_attempts=3)
        caught_up(p)
        yield p


def caught_up(p: Pair) -> None:
    with psycopg.connect(p.primary.dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert row is not None
    with psycopg.connect(p.standby.dsn, autocommit=True) as conn:
        wait_until(
            lambda: bool(
                conn.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (row[0],)).fetchone()[
                    0
                ]  # type: ignore[index]
            )
        )


def set_read_only(dsn: str, on: bool) -> None:
    """Turn the whole server read-only (or back) without closing a socket: Aurora's flip."""
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("SET default_transaction_read_only = off")
        value = "on" if on else "off"
        admin.execute(f"ALTER SYSTEM SET default_transaction_read_only = {value}")
        admin.execute("SELECT pg_reload_conf()")
    # The postmaster and then each backend reload on a signal, a moment later.
    # Seen by a new session; an idle one reloads before it runs its next command.
    wait_until(lambda: _new_session_reads(dsn) == value)
    time.sleep(0.2)


def _new_session_reads(dsn: str) -> str | None:
    with psycopg.connect(dsn, autocommit=True) as probe:
        return probe.info.parameter_status("default_transaction_read_only")


@pytest.fixture
def read_only_primary(pair: Pair) -> Iterator[Any]:
    """flip(on): the primary's read-only switch; always left off at the end."""

    def flip(on: bool) -> None:
        set_read_only(pair.primary.dsn, on)

    try:
        yield flip
    finally:
        flip(False)


def later(seconds: float, action: Any) -> threading.Timer:
    timer = threading.Timer(seconds, action)
    timer.start()
    return timer


def live_count(dsn: str, queue: str) -> int:
    with Client.from_dsn(dsn) as c:
        return c.metrics(queue).queue_length


# -- what counts as a read-only server, and how a DSN is labelled ---------------------


def test_is_read_only_server_knows_a_standby_and_nothing_else(pair: Pair) -> None:
    with psycopg.connect(pair.standby_dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.Error) as write:
            conn.execute("SELECT pgqueue.create_queue('nope')")
        with pytest.raises(psycopg.Error) as unlogged:
            conn.execute("SELECT count(*) FROM pgqueue.waiter")
        with pytest.raises(psycopg.Error) as missing:
            conn.execute("SELECT * FROM no_such_table")
    assert write.value.sqlstate == "25006"
    assert unlogged.value.sqlstate == "0A000"
    for exc in (write.value, unlogged.value):
        assert is_read_only_server(exc) and is_dead_connection(exc) and is_retryable(exc)
    assert not is_read_only_server(missing.value) and not is_retryable(missing.value)
    other = psycopg.errors.FeatureNotSupported("cannot do that with a domain")
    assert not is_read_only_server(other) and not is_dead_connection(other)
    assert not is_read_only_server(psycopg.OperationalError("connection refused"))
    # libpq refusing a standby at connect time: worth waiting for, the new primary is near
    for attrs in ("read-write", "primary"):
        with pytest.raises(psycopg.OperationalError) as refused:
            psycopg.connect(pair.standby_dsn + f" target_session_attrs={attrs}", connect_timeout=2)
        assert is_server_not_ready(refused.value), str(refused.value)


def test_describe_dsn_labels_every_host_of_a_multi_host_dsn() -> None:
    kv = "host=h1,h2 port=5433,5434 user=u password=secret dbname=app"
    assert describe_dsn(kv) == "u@h1:5433,h2:5434/app"
    assert describe_dsn("host=h1,h2 port=6000 dbname=app") == "h1:6000,h2:6000/app"
    uri = "postgresql://u:secret@h1:5433,h2:5434/app?target_session_attrs=read-write"
    assert describe_dsn(uri) == "u@h1:5433,h2:5434/app"
    assert describe_dsn("postgresql://u@h1,h2:5434/app") == "u@h1:5432,h2:5434/app"
    assert describe_dsn("postgresql://u@h1/app") == "u@h1:5432/app"
    assert "secret" not in describe_dsn(kv) + describe_dsn(uri)


def test_a_multi_host_dsn_is_logged_with_a_warning_when_it_may_settle_on_a_standby(
    captured_logs: list[dict[str, Any]],
) -> None:
    def resolve(dsn: str) -> None:
        PoolSpec.resolve(dsn, 1, 2, 5.0, UNSET)

    resolve("host=a,b port=1,2 dbname=x")
    resolve("host=a,b port=1,2 dbname=x target_session_attrs=read-write")
    resolve("host=a port=1 dbname=x")
    lines = [e for e in captured_logs if e["event"] == "dsn.multi_host"]
    assert [(e["log_level"], e["hosts"]) for e in lines] == [
        ("warning", ["a:1", "b:2"]),
        ("info", ["a:1", "b:2"]),
    ]
    assert "target_session_attrs=read-write" in lines[0]["advice"]
    assert lines[0]["dsn"] == "a:1,b:2/x"


# -- a primary that turns read-only under live connections (Aurora) ------------------


def test_calls_retry_through_a_read_only_window_and_keep_no_read_only_connection(
    pair: Pair, read_only_primary: Any
) -> None:
    with Client.from_dsn(pair.primary_dsn, min_size=3, max_size=3, retry=PATIENT) as client:
        client.pool.wait(10)
        client.send("aurora", "warm")
        read_only_primary(True)
        later(1.5, lambda: read_only_primary(False))
        started = time.monotonic()
        sent = client.send_batch("aurora", ["during 1", "during 2"])
        waited = time.monotonic() - started
        assert waited > 1.0, "the window was not met: nothing tested"
        got = client.read("aurora", vt=30, qty=10)
        assert sorted(m.message for m in got) == ["during 1", "during 2", "warm"]
        assert client.delete_many("aurora", [m.msg_id for m in got]) == [m.msg_id for m in got]
        assert len(sent) == 2
        conns = [client.pool.getconn(timeout=5) for _ in range(3)]
        try:
            for conn in conns:
                assert conn.execute("SHOW default_transaction_read_only").fetchone() == ("off",)
        finally:
            for conn in conns:
                client.pool.putconn(conn)


def test_a_read_only_window_past_the_deadline_raises_connection_lost_and_writes_nothing(
    pair: Pair, read_only_primary: Any
) -> None:
    short = RetryPolicy(attempts=100, deadline_seconds=1.0, initial_wait_seconds=0.02)
    with Client.from_dsn(pair.primary_dsn, max_size=2, retry=short) as client:
        client.send("deadline", "before")
        read_only_primary(True)
        started = time.monotonic()
        with pytest.raises(ConnectionLost) as lost:
            client.send_batch("deadline", ["a", "b", "c"])
        # its 1 s deadline, not 100 attempts' backoff: a bound far above what load adds
        assert time.monotonic() - started < 20
        text = str(lost.value)
        assert "read-only server" in text and "target_session_attrs=read-write" in text, text
        read_only_primary(False)
    assert live_count(pair.primary_dsn, "deadline") == 1


def test_client_connection_closes_a_connection_that_met_a_read_only_server(
    pair: Pair, read_only_primary: Any
) -> None:
    with Client.from_dsn(pair.primary_dsn, min_size=1, max_size=1, retry=PATIENT) as client:
        with client.connection() as conn:
            before = conn.info.backend_pid
        read_only_primary(True)
        with pytest.raises((ConnectionLost, psycopg.Error)):  # noqa: SIM117
            with client.connection() as conn, conn.transaction():
                assert conn.info.backend_pid == before
                client.send("conn", "in my transaction", conn=conn)
        read_only_primary(False)
        with client.connection() as conn:
            assert conn.info.backend_pid != before, "the read-only connection was given back"
            assert conn.execute("SHOW default_transaction_read_only").fetchone() == ("off",)
        client.send("conn", "after")
    assert live_count(pair.primary_dsn, "conn") == 1


def test_async_client_retries_through_a_read_only_window(
    pair: Pair, read_only_primary: Any
) -> None:
    async def scenario() -> list[str]:
        client = await AsyncClient.from_dsn(pair.primary_dsn, min_size=2, retry=PATIENT)
        try:
            await client.send("async_q", "warm")
            read_only_primary(True)
            later(1.0, lambda: read_only_primary(False))
            await client.send("async_q", "during")
            got = await client.read("async_q", vt=30, qty=10)
            await client.delete_many("async_q", [m.msg_id for m in got])
            return sorted(m.message for m in got)
        finally:
            await client.close()

    assert asyncio.run(scenario()) == ["during", "warm"]


def test_read_or_wait_counts_a_server_turned_read_only_as_a_wake_up(
    pair: Pair, read_only_primary: Any, captured_logs: list[dict[str, Any]]
) -> None:
    def waiters() -> int:
        with psycopg.connect(pair.primary_dsn, autocommit=True) as conn:
            row = conn.execute("SELECT count(*) FROM pgqueue.waiter").fetchone()
        return int(row[0]) if row else -1

    def lost() -> bool:
        return any(e["event"] == "wait.connection_lost" for e in captured_logs)

    # Each flip on an event, not a guessed moment: read-only once the wait is
    # registered, writable again once its UNLISTEN has met the read-only server.
    turning_back = threading.Event()

    def flips() -> None:
        wait_until(lambda: waiters() >= 1)
        read_only_primary(True)
        wait_until(lost)
        turning_back.set()
        read_only_primary(False)

    flipper = threading.Thread(target=flips)
    with Client.from_dsn(pair.primary_dsn, max_size=2, retry=PATIENT) as client:
        flipper.start()
        try:
            # the wait ends at 8 s (room for the flip to land inside it on a loaded
            # machine); its UNLISTEN meets the read-only server
            assert client.read_or_wait("listen", vt=30, max_wait_seconds=8) == []
            # and the read after it retried until the server took writes again
            assert turning_back.is_set()
        finally:
            flipper.join(120)
    assert lost(), captured_logs


# -- a standby first: a moved endpoint, a promotion, a multi-host DSN -----------------


def standby_sessions(p: Pair) -> int:
    with psycopg.connect(p.standby.dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgqueue'"
        ).fetchone()
    return int(row[0]) if row else -1


def test_sends_reads_and_acks_follow_an_endpoint_moved_from_the_standby_to_the_primary(
    pair: Pair,
) -> None:
    proxy = SwitchProxy(pair.standby_dsn)
    try:
        with Client.from_dsn(proxy.dsn, min_size=2, max_size=3, retry=PATIENT) as client:
            client.pool.wait(10)
            assert standby_sessions(pair) >= 2  # the pool filled up on the standby
            later(1.0, lambda: proxy.point_at(pair.primary_dsn))
            msg_id = client.send("proxy", {"n": 1})
            [m] = client.read("proxy", vt=30)
            assert m.msg_id == msg_id
            assert client.delete("proxy", msg_id) is True
            with client.connection() as conn:
                assert server_port(conn) == pair.primary.port
            # Every idle connection left on the standby is dropped when the pool hands it out.
            wait_until(lambda: client.list_queues() and standby_sessions(pair) == 0)
        with Client.from_dsn(pair.primary_dsn) as direct:
            assert direct.metrics("proxy").total_messages == 1
            assert direct.metrics("proxy").queue_length == 0
    finally:
        proxy.close()


def test_a_pool_on_the_standby_writes_once_the_standby_is_promoted() -> None:
    with primary_with_standby() as p:
        with Client.from_dsn(p.primary_dsn) as c:
            c.create_queue("promoted")
        caught_up(p)
        with Client.from_dsn(p.standby_dsn, min_size=2, max_size=2, retry=PATIENT) as client:
            client.pool.wait(10)
            later(1.0, p.promote)
            started = time.monotonic()
            msg_id = client.send("promoted", "after the failover")
            assert time.monotonic() - started > 0.5
            [m] = client.read("promoted", vt=30)
            assert m.msg_id == msg_id and client.delete("promoted", msg_id)
            conns = [client.pool.getconn(timeout=5) for _ in range(2)]
            try:
                for conn in conns:
                    assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (False,)
            finally:
                for conn in conns:
                    client.pool.putconn(conn)


def test_client_and_async_client_reach_the_primary_through_a_multi_host_dsn(
    pair: Pair, captured_logs: list[dict[str, Any]]
) -> None:
    dsn = pair.multi_host_dsn(pair.standby, pair.primary)
    label = f"postgres@127.0.0.1:{pair.standby.port},127.0.0.1:{pair.primary.port}/app"
    with Client.from_dsn(dsn) as client:
        msg_id = client.send("multi", "sync")
        assert client.delete("multi", msg_id)
        with client.connection() as conn:
            assert server_port(conn) == pair.primary.port

    async def via_async() -> int:
        client = await AsyncClient.from_dsn(dsn)
        try:
            msg_id = await client.send("multi", "async")
            assert await client.delete("multi", msg_id)
            async with client.connection() as conn:
                row = await (await conn.execute("SELECT current_setting('port')::int")).fetchone()
                return int(row[0]) if row else -1
        finally:
            await client.close()

    assert asyncio.run(via_async()) == pair.primary.port
    logged = [e for e in captured_logs if e["event"] == "dsn.multi_host"]
    assert len(logged) == 2 and all(e["dsn"] == label for e in logged), logged


def pgqueue_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pgqueue", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={k: v for k, v in os.environ.items() if k not in ("PGQUEUE_DSN", "DATABASE_URL")},
    )


def test_the_cli_reaches_the_primary_through_a_multi_host_dsn_and_says_what_is_missing(
    pair: Pair,
) -> None:
    good = pair.multi_host_dsn(pair.standby, pair.primary)
    listed = pgqueue_cli("queue", "list", "--json", "--dsn", good)
    assert listed.returncode == 0, listed.stderr
    assert "multi" in listed.stdout and json.loads(listed.stdout)
    created = pgqueue_cli("queue", "create", "cli_made", "--dsn", good)
    assert created.returncode == 0, created.stderr
    # Without target_session_attrs libpq keeps the standby: a clear error, not a traceback.
    bad = good.replace(" target_session_attrs=read-write", "")
    refused = pgqueue_cli("queue", "create", "never", "--dsn", bad)
    assert refused.returncode == 1
    assert "dsn.multi_host" in refused.stderr
    assert "read-only server" in refused.stderr, refused.stderr
    assert "target_session_attrs=read-write" in refused.stderr
    assert "Traceback" not in refused.stderr


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=15) as r:
        return str(r.read().decode())


def test_the_exporter_scrapes_through_a_multi_host_dsn_and_answers_fast_in_an_outage(
    pair: Pair,
) -> None:
    needs_extra("prometheus")
    proxy = SwitchProxy(pair.primary_dsn)
    multi = pair.multi_host_dsn(pair.standby, pair.primary)
    # through a multi-host DSN whose first host is the standby
    for dsn, closes in ((multi, False), (proxy.dsn, True)):
        port = free_port()
        exporter = subprocess.Popen(
            [sys.executable, "-m", "pgqueue", "exporter", "--port", str(port), "--dsn", dsn],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            # a loaded machine once took 30 s to start it and reach the primary;
            # one that exited fails at once, with what it said
            wait_until(lambda port=port, e=exporter: _scrapes(port, e), timeout=90)
            text = scrape(port)
            assert "pgqueue_exporter_scrape_success 1.0" in text, text
            assert 'pgqueue_queue_paused{queue="multi"}' in text
            if closes:
                proxy.close()  # the database is away: cut, and refused from now on
                started = time.monotonic()
                text = scrape(port)
                assert "pgqueue_exporter_scrape_success 0.0" in text
                # within Prometheus's default scrape timeout (10 s), the requirement
                # itself (its retry budget is 2 s, pgqueue/_cli/exporter.py): the room
                # left above that budget is for a loaded machine
                assert time.monotonic() - started < 10.0, time.monotonic() - started
        finally:
            exporter.terminate()
            exporter.wait(10)
    proxy.close()


def _scrapes(port: int, exporter: subprocess.Popen[bytes]) -> bool:
    if exporter.poll() is not None:
        _, err = exporter.communicate()
        raise AssertionError(f"the exporter exited {exporter.returncode}: {err.decode()}")
    try:
        scrape(port)
    except OSError:
        return False
    return True


def test_a_worker_on_a_multi_host_dsn_listens_and_works_on_the_primary(
    pair: Pair, spawn: Any
) -> None:
    dsn = pair.multi_host_dsn(pair.standby, pair.primary)
    prepare(dsn).close()
    w = spawn(dsn, "--queue", "jobs")
    with Client.from_dsn(pair.primary_dsn) as client:
        client.send("jobs", {"n": 1})
        wait_until(lambda: count(pair.primary_dsn, "done") >= 1, timeout=120)

    def listening(target: str) -> int:
        """Live sessions registered as waiters (the waiter table is UNLOGGED)."""
        with psycopg.connect(target, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(DISTINCT w.pid) FROM pgqueue.waiter w"
                " JOIN pg_stat_activity a ON a.pid = w.pid"
            ).fetchone()
        return int(row[0]) if row else -1

    def sessions(target: str) -> int:
        """Other sessions of the database on that server (a standby cannot read the waiters)."""
        with psycopg.connect(target, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
            ).fetchone()
        return int(row[0]) if row else -1

    wait_until(lambda: listening(pair.primary_dsn) >= 1)
    assert sessions(pair.standby_dsn) == 0
    [line] = w.events("dsn.multi_host")
    assert line["hosts"] == [f"127.0.0.1:{pair.standby.port}", f"127.0.0.1:{pair.primary.port}"]


# -- the worker's wake-ups and transactions across a failover --------------------------


def test_the_listener_reconnects_within_a_second_and_registers_on_the_new_primary(
    pair: Pair, captured_logs: list[dict[str, Any]]
) -> None:
    from pgqueue._log import get_logger

    proxy = SwitchProxy(pair.standby_dsn)
    stopping = threading.Event()
    listener = Listener(proxy.dsn, ("listen",), stopping, get_logger())
    # Each wait below is given 60 s: ending within 30 (a second's work, and room for a
    # loaded machine) shows it did not wait that out.
    try:
        started = time.monotonic()
        listener.idle(60.0)  # LISTEN on a standby: 25006
        assert time.monotonic() - started < 30, "waited a poll interval, not a second"
        assert [e for e in captured_logs if e["event"] == "listen.reconnecting"]
        proxy.point_at(pair.primary_dsn)
        started = time.monotonic()
        listener.idle(60.0)  # connects and registers: returns for one more read
        assert listener.registered and time.monotonic() - started < 30
        assert listener.conn is not None and server_port(listener.conn) == pair.primary.port
        # the listening connection dies (a failover, a restart) in the middle of a wait
        pid = listener.conn.info.backend_pid
        later(0.5, lambda: _terminate(pair.primary.dsn, pid))
        started = time.monotonic()
        listener.idle(60.0)
        assert time.monotonic() - started < 30 and not listener.registered
        assert len([e for e in captured_logs if e["event"] == "listen.reconnecting"]) == 2
        listener.idle(60.0)  # registered again on a fresh connection
        assert listener.registered
        with Client.from_dsn(pair.primary_dsn) as client:
            later(0.5, lambda: client.send("listen", "wake up"))
            started = time.monotonic()
            listener.idle(60.0)
            assert time.monotonic() - started < 30, "the send did not wake the listener"
            client.pop("listen", qty=10)
    finally:
        listener.close()
        proxy.close()


def _terminate(dsn: str, pid: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))


def test_a_transactional_run_that_meets_a_read_only_server_is_given_back_without_a_nack(
    pair: Pair, captured_logs: list[dict[str, Any]]
) -> None:
    app = App()
    runs: list[int] = []

    @app.handler("tx", transactional=True)
    def tx(msg: Message, conn: psycopg.Connection[Any]) -> None:
        runs.append(msg.read_ct)
        if msg.read_ct == 1:
            # what a failover does to this connection: every write refused (25006)
            conn.execute("SET TRANSACTION READ ONLY")
        conn.execute("INSERT INTO tx_effect VALUES (%s)", (msg.msg_id,))

    with psycopg.connect(pair.primary_dsn, autocommit=True) as admin:
        admin.execute("CREATE TABLE IF NOT EXISTS tx_effect (msg_id bigint)")
    with (
        Client.from_dsn(pair.primary_dsn, max_size=4) as client,
        Client.from_dsn(pair.primary_dsn, max_size=8) as wclient,
    ):
        msg_id = client.send("tx", "work")
        settings = WorkerSettings(queues=("tx",), poll_interval=0.2, vt=30, shutdown_grace=5)
        worker = Worker(app, wclient, settings)
        t = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
        t.start()
        try:
            wait_until(lambda: client.metrics("tx").queue_length == 0, timeout=120)
        finally:
            worker.stop()
            t.join(15)
        assert runs == [1, 2]
        assert client.metrics("tx").poison_length == 0
        with psycopg.connect(pair.primary_dsn) as conn:
            rows = conn.execute("SELECT msg_id FROM tx_effect").fetchall()
        assert rows == [(msg_id,)]
    events = [e["event"] for e in captured_logs]
    assert "message.failed" not in events, "counted as the handler's failure (a nack)"
    released = [e for e in captured_logs if e["event"] == "message.released"]
    assert released and "read-only" in released[0]["why"], released


@pytest.mark.parametrize(
    ("options", "asked"),
    [
        ("-c default_transaction_read_only=on", True),
        ("-c statement_timeout=15000 -cdefault_transaction_read_only = TRUE", True),
        ("--default_transaction_read_only=1", True),
        ("-c default_transaction_read_only=off", False),
        ("-c statement_timeout=15000", False),
        (None, False),
    ],
)
def test_a_dsn_that_asks_for_read_only_sessions_is_told_apart(
    options: str | None, asked: bool
) -> None:
    dsn = "host=a dbname=b" + (f" options='{options}'" if options else "")
    assert asks_read_only(dsn) is asked


def test_a_client_that_asks_for_read_only_sessions_is_served_on_a_writable_server(
    dsn: str, client: Client
) -> None:
    # the read-only dashboard's sessions: refused as "a read-only server" they
    # would never get a connection at all
    client.create_queue("seen")
    asking = make_conninfo(dsn, options="-c default_transaction_read_only=on")
    with Client.from_dsn(asking, retry=RetryPolicy(deadline_seconds=1)) as reader:
        assert [q.queue_name for q in reader.list_queues()] == ["seen"]
        with pytest.raises(ConnectionLost, match="read-only"):
            reader.send("seen", {"n": 1})
    assert client.metrics("seen").total_messages == 0
