"""Faults: dead connections, lost commit replies, a restarted server, a server that is not there."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support.db import FAST_RETRY, restart_server, terminate_client_backends, wait_until
from support.faultproxy import FaultProxy

import pgqueue._connection
from pgqueue import Client, ConnectionLost, QueueNotFound, RetryPolicy
from pgqueue._calls import Call, scalar


def test_send_is_retried_on_a_fresh_connection_after_terminate(
    client: Client, queue: str, dsn: str
) -> None:
    client.send(queue, "warm up the pool")
    assert terminate_client_backends(dsn) >= 1
    msg_id = client.send(queue, "after the kill")
    assert client.metrics(queue).queue_length == 2
    assert msg_id == 2


def test_ack_is_retried_after_the_connection_died_during_the_task(
    client: Client, queue: str, dsn: str
) -> None:
    msg_id = client.send(queue, "work")
    [m] = client.read(queue, vt=60, qty=1)
    # The handler runs for a long time; meanwhile the idle connection is reaped.
    terminate_client_backends(dsn)
    assert client.delete(queue, m.msg_id) is True
    assert client.delete(queue, msg_id) is False
    assert client.read(queue, vt=60, qty=1) == []


def test_every_call_survives_repeated_terminations(client: Client, queue: str, dsn: str) -> None:
    for i in range(5):
        terminate_client_backends(dsn)
        client.send(queue, i)
        terminate_client_backends(dsn)
        [m] = client.read(queue, vt=60, qty=1)
        terminate_client_backends(dsn)
        assert client.archive(queue, m.msg_id) is True
    assert client.metrics(queue).queue_length == 0


@pytest.fixture
def proxy(dsn: str) -> Iterator[FaultProxy]:
    p = FaultProxy(dsn)
    yield p
    p.close()


def test_dedupe_send_is_exactly_once_when_the_commit_reply_is_lost(
    proxy: FaultProxy, dsn: str
) -> None:
    with Client.from_dsn(proxy.dsn, retry=FAST_RETRY, prepare_threshold=None) as client:
        client.create_queue("q")
        proxy.cut_after_request_containing(b"pgqueue.send(")
        msg_id = client.send("q", {"root": "A"}, dedupe_key="run:A")
        assert proxy.cuts == 1
        assert client.metrics("q").total_messages == 1
        [m] = client.read("q", vt=30, qty=5)
        assert m.msg_id == msg_id


def test_dedupe_send_retry_finds_its_first_attempt_even_after_it_was_acked(
    proxy: FaultProxy, dsn: str
) -> None:
    with Client.from_dsn(proxy.dsn, retry=FAST_RETRY, prepare_threshold=None) as client:
        client.create_queue("q")
        # Slow the retry so a consumer can take and ack the first copy in between.
        slow = RetryPolicy(attempts=3, initial_wait_seconds=1.0, max_wait_seconds=1.0)
        client.retry = slow
        consumed: list[int] = []

        def consumer() -> None:
            with Client.from_dsn(dsn) as other:
                deadline = time.monotonic() + 60  # an outer bound: it ends on the first copy
                while not consumed and time.monotonic() < deadline:
                    for m in other.read("q", vt=30, qty=1):
                        other.delete("q", m.msg_id)
                        consumed.append(m.msg_id)
                    time.sleep(0.01)

        t = threading.Thread(target=consumer)
        t.start()
        proxy.cut_after_request_containing(b"pgqueue.send(")
        msg_id = client.send("q", {"root": "A"}, dedupe_key="run:A")
        t.join()
        assert consumed == [msg_id]
        assert client.metrics("q").total_messages == 1


def test_plain_send_is_at_least_once_when_the_commit_reply_is_lost(
    proxy: FaultProxy, dsn: str
) -> None:
    # Documented behaviour: without a dedupe_key the retry cannot know the first
    # attempt committed, so the message exists twice. Nothing is lost.
    with Client.from_dsn(proxy.dsn, retry=FAST_RETRY, prepare_threshold=None) as client:
        client.create_queue("q")
        proxy.cut_after_request_containing(b"pgqueue.send(")
        client.send("q", "x")
        assert client.metrics("q").queue_length == 2


def test_statement_errors_are_not_retried(client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = pgqueue._connection.execute

    def counting(conn: Any, call: Any) -> Any:
        calls.append(call.name)
        return real(conn, call)

    monkeypatch.setattr(pgqueue._connection, "execute", counting)
    with pytest.raises(QueueNotFound):
        client.send("missing", 1)
    assert calls == ["send"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_dsn_that_does_not_answer_fails_fast_with_one_clear_line() -> None:
    start = time.monotonic()
    with pytest.raises(
        ConnectionLost,
        match=r"could not connect to .*: connection refused \(after 1 attempt in .*s\); check",
    ):
        Client.from_dsn(f"postgresql://nobody@127.0.0.1:{_free_port()}/x", connect_timeout=2)
    # "after 1 attempt" above is the no-retry check; this bound, far above what load adds,
    # still catches a wait through the default retry budget (30 s)
    assert time.monotonic() - start < 25


def test_calls_give_up_with_connection_lost_when_the_server_stays_away(
    proxy: FaultProxy,
) -> None:
    client = Client.from_dsn(
        proxy.dsn, retry=RetryPolicy(attempts=3, deadline_seconds=3), connect_timeout=1
    )
    try:
        proxy.close()
        with pytest.raises(ConnectionLost, match="lost the connection"):
            client.send("q", 1)
    finally:
        client.close()


def _postmaster_start() -> Call[Any]:
    return Call("start_time", "SELECT pg_postmaster_start_time()", (), scalar)


def test_producer_survives_a_server_restart_without_losing_a_send(private_server: Any) -> None:
    dsn = private_server.get_uri()
    with Client.from_dsn(dsn, retry=RetryPolicy(deadline_seconds=30)) as client:
        client.migrate()
        client.create_queue("restart")
        started = client.run(_postmaster_start())
        sent: list[int] = []
        stop = threading.Event()

        def produce() -> None:
            while not stop.is_set():
                sent.append(client.send("restart", len(sent)))

        t = threading.Thread(target=produce)
        t.start()
        wait_until(lambda: len(sent) >= 3)  # sends under way, however slow the machine
        restart_server(private_server)
        at_restart = len(sent)
        wait_until(lambda: len(sent) > at_restart)  # and going on after the restart
        stop.set()
        t.join()
        before = len(sent)
        assert before > 0
        assert client.run(_postmaster_start()) > started, "the server did not restart"
        m = client.metrics("restart")
        # every acknowledged send is there; a send retried across the restart
        # may exist twice (at-least-once without a dedupe_key), never less
        assert m.queue_length >= len(set(sent)) == before


def test_pop_is_not_retried_after_a_lost_reply(proxy: FaultProxy) -> None:
    # pop is at-most-once: a blind retry would take a second batch while the
    # first is gone unseen, so the error surfaces instead.
    with Client.from_dsn(proxy.dsn, retry=FAST_RETRY, prepare_threshold=None) as client:
        client.create_queue("q")
        client.send_batch("q", [1, 2, 3])
        proxy.cut_after_request_containing(b"pgqueue.pop(")
        with pytest.raises(ConnectionLost):
            client.pop("q", qty=1)
        assert client.metrics("q").queue_length == 2
