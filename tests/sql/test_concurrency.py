"""Races with real connections: readers, single-flight sends and queue creation, hammered."""

from __future__ import annotations

import random
import threading
from collections import Counter
from typing import Any

import psycopg
import pytest
from support.db import run_threads

from pgqueue import Client
from pgqueue._calls import queue as q

READERS = 8


def drain(dsn: str, queue: str, vt: int, ack: bool) -> Counter[int]:
    """READERS connections read the queue until it is empty; how often each id was handed out."""
    seen: Counter[int] = Counter()
    lock = threading.Lock()

    def reader(i: int) -> None:
        rnd = random.Random(i)
        with psycopg.connect(dsn, autocommit=True) as conn:
            cur = conn.cursor()
            while True:
                cur.execute(
                    "SELECT msg_id FROM pgqueue.read(%s, %s, %s)", (queue, vt, rnd.randint(1, 25))
                )
                ids = [r[0] for r in cur.fetchall()]
                if not ids:
                    # Empty: done only if nothing is visible (rows locked by
                    # another reader right now are visible, so keep going).
                    cur.execute("SELECT visible_length FROM pgqueue.metrics(%s)", (queue,))
                    if cur.fetchone()[0] == 0:  # type: ignore[index]
                        return
                with lock:
                    seen.update(ids)
                if ack and ids:
                    cur.execute("SELECT * FROM pgqueue.delete(%s, %s::bigint[])", (queue, ids))

    run_threads(READERS, reader)
    return seen


@pytest.mark.parametrize("round_", range(3))
def test_concurrent_readers_never_share_a_message_inside_its_vt(
    client: Client, dsn: str, round_: int
) -> None:
    client.create_queue("race", max_attempts=5)
    ids = client.send_batch("race", list(range(1500)))
    seen = drain(dsn, "race", vt=300, ack=False)
    assert set(seen) == set(ids), "a message was lost"
    assert max(seen.values()) == 1, "a message was handed to two readers inside its vt"


def test_concurrent_readers_that_ack_leave_nothing_behind(client: Client, dsn: str) -> None:
    client.create_queue("race")
    ids = client.send_batch("race", list(range(1500)))
    seen = drain(dsn, "race", vt=300, ack=True)
    assert sorted(seen) == ids and set(seen.values()) == {1}
    m = client.metrics("race")
    assert (m.queue_length, m.poison_length) == (0, 0)


def test_every_message_is_delivered_exactly_max_attempts_times_then_poisoned(
    client: Client, dsn: str
) -> None:
    # vt=0: a message is visible again the moment its read commits, so readers
    # race for redeliveries; the poison drop must still cut each one off after
    # exactly max_attempts deliveries, and none may vanish.
    client.create_queue("race", max_attempts=3)
    ids = client.send_batch("race", list(range(600)))
    seen = drain(dsn, "race", vt=0, ack=False)
    assert set(seen) == set(ids)
    assert set(seen.values()) == {3}
    with psycopg.connect(dsn) as conn:
        live = conn.execute("SELECT count(*), min(read_ct), max(read_ct) FROM pgqueue.message")
        poisoned = conn.execute("SELECT count(*), min(read_ct), max(read_ct) FROM pgqueue.poison")
        assert (live.fetchone(), poisoned.fetchone()) == ((0, None, None), (600, 3, 3))


def test_concurrent_sends_with_one_dedupe_key_create_one_message(client: Client, dsn: str) -> None:
    client.create_queue("flight")
    for attempt in range(5):
        key = f"root-{attempt}"
        got: list[int] = []

        def send(i: int, key: str = key, got: list[int] = got) -> None:
            with psycopg.connect(dsn, autocommit=True) as conn:
                got.append(Client.run(client, q.send("flight", {"i": i}, dedupe_key=key), conn))

        run_threads(16, send)
        assert len(set(got)) == 1
    assert client.metrics("flight").queue_length == 5


def test_dedupe_key_is_single_flight_while_holders_are_acked_concurrently(
    client: Client, dsn: str
) -> None:
    # Producers keep sending key K while consumers keep acking it: at no point
    # may two live messages hold K (the unique index), and no send may fail.
    client.create_queue("flight")
    stop = threading.Event()
    sent: list[int] = []

    def producer(i: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for _ in range(150):
                sent.append(Client.run(client, q.send("flight", i, dedupe_key="K"), conn))

    def consumer() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not stop.is_set():
                for m in Client.run(client, q.read("flight", 30, 5), conn).messages:
                    Client.run(client, q.delete("flight", m.msg_id), conn)

    consumers = [threading.Thread(target=consumer) for _ in range(2)]
    for t in consumers:
        t.start()
    try:
        run_threads(6, producer)
    finally:
        stop.set()
        for t in consumers:
            t.join()
    assert len(sent) == 900
    with psycopg.connect(dsn) as conn:
        live = conn.execute("SELECT count(*) FROM pgqueue.message WHERE dedupe_key = 'K'")
        assert live.fetchone()[0] <= 1


def test_concurrent_create_queue_of_one_name_makes_one_queue(client: Client, dsn: str) -> None:
    def create(i: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pgqueue.create_queue('same', %s)", (i + 1,))

    run_threads(8, create)
    queues: list[Any] = client.list_queues()
    assert [x.queue_name for x in queues] == ["same"]
    assert client.send("same", 1) == 1
