"""Everything through PgBouncer in transaction pooling mode, with server connections churning.

The PgBouncer here closes idle server connections after 1 s and every server
connection after 2 s, so the calls below keep landing on different server
sessions: nothing may rely on session state. Clients use prepare_threshold=None
(PgBouncer before 1.21 has no prepared statements in transaction mode), and
consumers LISTEN on a direct connection (`listen_dsn`) or poll.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict
from support import pgbouncer
from support.db import wait_until

from pgqueue import App, Client, Message, Worker, WorkerSettings

pytestmark = pytest.mark.skipif(
    pgbouncer.binary() is None, reason="needs pgbouncer (apt-get install pgbouncer)"
)


@pytest.fixture(scope="module")
def bouncer(server_dsn: str) -> Iterator[pgbouncer.Bouncer]:
    b = pgbouncer.start(server_dsn, server_idle_timeout="1", server_lifetime="2")
    yield b
    b.stop()


@pytest.fixture
def pooled(bouncer: pgbouncer.Bouncer, dsn: str) -> str:
    """This test's database, through PgBouncer."""
    return bouncer.dsn(str(conninfo_to_dict(dsn)["dbname"]))


def client_for(dsn: str, size: int = 4) -> Client:
    return Client.from_dsn(dsn, max_size=size, prepare_threshold=None)


def test_migrate_through_pgbouncer(bouncer: pgbouncer.Bouncer, empty_dsn: str) -> None:
    with client_for(bouncer.dsn(str(conninfo_to_dict(empty_dsn)["dbname"]))) as c:
        assert c.migrate()[0] == "0001_core"
        assert c.migrate() == []  # applied once, recorded


def test_queue_calls_through_pgbouncer(pooled: str) -> None:
    with client_for(pooled) as c:
        c.create_queue("jobs", max_attempts=2)
        first = c.send("jobs", {"n": 1}, dedupe_key="k")
        assert c.send("jobs", {"n": 1}, dedupe_key="k") == first  # single flight
        ids = c.send_batch(
            "jobs", [{"n": i} for i in range(2, 6)], headers=[{"h": i} for i in range(4)]
        )
        assert len(ids) == 4
        got = c.read("jobs", vt=30, qty=10)
        assert sorted(m.msg_id for m in got) == sorted([first, *ids])
        assert c.read("jobs", vt=30, qty=10) == []  # leased
        assert c.set_vt("jobs", ids[0], 0) is not None  # nack
        assert c.delete_many("jobs", [first, ids[1]]) == sorted([first, ids[1]])
        assert c.archive("jobs", ids[2]) is True
        again = c.read("jobs", vt=0, qty=10)
        assert [m.msg_id for m in again] == [ids[0]]
        # the third read of ids[0] exceeds max_attempts 2: it is poisoned, not delivered
        c.read("jobs", vt=0, qty=10)
        assert c.metrics("jobs").poison_length == 1
        assert [p.msg_id for p in c.poison_list("jobs")] == [ids[0]]
        last = c.send("jobs", {"n": 6})
        assert [m.msg_id for m in c.pop("jobs")] == [last]  # ids[3] is still leased
        assert [m.msg_id for m in c.peek("jobs")] == [ids[3]]


def test_workers_through_pgbouncer_complete_a_fan_out_and_the_callback_fires_once(
    pooled: str, dsn: str
) -> None:
    handled: Counter[int] = Counter()
    callbacks: list[Message] = []
    lock = threading.Lock()
    app = App()

    @app.handler("work")
    def work(msg: Message) -> Any:
        with lock:
            handled[msg.msg_id] += 1
        return {"n": msg.message["n"]}

    @app.handler("done")
    def done(msg: Message) -> None:
        with lock:
            callbacks.append(msg)

    with client_for(pooled) as c:
        c.create_queue("work")
        c.create_queue("done")
        bid = c.fan_out(
            "work", [{"n": i} for i in range(120)], callback_queue="done", callback_message={}
        )
        workers = []
        for listen in (True, False):  # one LISTENs on a direct connection, one polls
            settings = WorkerSettings(
                concurrency=4, batch=20, poll_interval=0.2, listen=listen, listen_dsn=dsn
            )
            wc = client_for(pooled, size=8)
            w = Worker(app, wc, settings)
            t = threading.Thread(target=w.run, kwargs={"install_signals": False}, daemon=True)
            t.start()
            workers.append((w, t, wc))
        try:
            wait_until(lambda: len(callbacks) == 1, timeout=120)
            # a second callback would be a second message on `done`: once it is empty,
            # it has been handled (counted below) or was never sent; no pause to guess
            wait_until(lambda: c.metrics("done").queue_length == 0)
            status = c.barrier_status(bid)
            assert (status.state, status.succeeded, status.failed) == ("fired", 120, 0)
            assert len(callbacks) == 1 and callbacks[0].is_callback
            assert len(handled) == 120
            assert [r.result for r in c.barrier_results(bid)] == [{"n": i} for i in range(120)]
        finally:
            for w, t, wc in workers:
                w.stop()
                t.join(15)
                wc.close()


def test_a_consumer_loses_no_ack_when_pgbouncer_reconnects_and_kills(
    bouncer: pgbouncer.Bouncer, pooled: str, dsn: str
) -> None:
    """RECONNECT closes server connections under the worker; KILL drops its client
    connections too. Acks are retried on fresh connections: every message is
    handled once and acked (vt 30 s: a lost ack would leave it in the queue)."""
    handled: Counter[int] = Counter()
    lock = threading.Lock()
    app = App()

    @app.handler("slow")
    def slow(msg: Message) -> None:
        time.sleep(0.02)
        with lock:
            handled[msg.msg_id] += 1

    dbname = str(conninfo_to_dict(dsn)["dbname"])
    with client_for(pooled) as c:
        c.create_queue("slow")
        ids = c.send_batch("slow", [{"n": i} for i in range(400)])
        wc = client_for(pooled, size=8)
        w = Worker(
            app, wc, WorkerSettings(concurrency=4, batch=10, vt=30, listen=False, poll_interval=0.1)
        )
        t = threading.Thread(target=w.run, kwargs={"install_signals": False}, daemon=True)
        t.start()
        try:
            wait_until(lambda: len(handled) > 50)
            bouncer.admin("RECONNECT")
            wait_until(lambda: len(handled) > 150)
            bouncer.admin(f"KILL {dbname}")
            time.sleep(0.3)
            bouncer.admin(f"RESUME {dbname}")
            # Connections opened while the database was killed can hang in
            # PgBouncer until their connect_timeout (5 s), even after RESUME:
            # the consumer resumes after a few of those, well inside the vt.
            wait_until(lambda: c.metrics("slow").queue_length == 0, timeout=120)
            assert t.is_alive()
        finally:
            w.stop()
            t.join(15)
            wc.close()
    assert sorted(handled) == sorted(ids)
    # A handler that ran while KILL cut its read's commit may run again (at
    # least once), but no ack was lost: the queue emptied well inside the vt.
    assert sum(handled.values()) - len(ids) <= 40, handled.most_common(3)
