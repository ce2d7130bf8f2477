"""FIFO groups: a group's messages are handed out one at a time, in msg_id order.

A message sent with a group key is delivered only while it is the oldest live
message of its group, so no two readers ever hold one group, and a group is
delivered in order, also when a lease expires, a nack delays the head, or the
head is poison-dropped. Threads hammer that with real connections below; the
hypothesis model is in tests/models/test_group_model.py.
"""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict
from typing import Any

import psycopg
import pytest
from support.db import expire_all, run_threads

from pgqueue import Client, InvalidArgument


def read(conn: psycopg.Connection[Any], queue: str, qty: int = 10, vt: int = 30) -> list[Any]:
    """(msg_id, read_ct, message) of what a read hands out, by msg_id."""
    return sorted(
        conn.execute(
            "SELECT msg_id, read_ct, message FROM pgqueue.read(%s, %s, %s)", (queue, vt, qty)
        ).fetchall()
    )


def test_a_read_hands_out_only_the_head_of_each_group(client: Client, sql: Any) -> None:
    client.create_queue("g")
    a1, a2, a3 = (client.send("g", {"a": i}, group="a") for i in range(3))
    b1, b2 = (client.send("g", {"b": i}, group="b") for i in range(2))
    free = client.send("g", {"free": 1})
    assert [r[0] for r in read(sql, "g")] == [a1, b1, free]
    assert read(sql, "g") == []  # a1 and b1 hold their groups
    sql.execute("SELECT pgqueue.delete('g', %s)", (a1,))
    assert [r[0] for r in read(sql, "g")] == [a2]
    sql.execute("SELECT pgqueue.delete('g', ARRAY[%s, %s]::bigint[])", (a2, b1))
    assert [r[0] for r in read(sql, "g")] == [a3, b2]


def test_an_expired_lease_gives_the_head_again_before_the_rest(client: Client, sql: Any) -> None:
    client.create_queue("g")
    first, second = client.send("g", 1, group="k"), client.send("g", 2, group="k")
    assert [r[:2] for r in read(sql, "g")] == [(first, 1)]
    expire_all(sql)
    assert [r[:2] for r in read(sql, "g")] == [(first, 2)]
    sql.execute("SELECT pgqueue.archive('g', %s)", (first,))
    assert [r[:2] for r in read(sql, "g")] == [(second, 1)]


def test_a_nacked_or_delayed_head_holds_its_group_back(client: Client, sql: Any) -> None:
    client.create_queue("g")
    head = client.send("g", 1, group="k", delay=3600)
    client.send("g", 2, group="k")
    assert read(sql, "g") == []  # the head is not due: nothing of its group is
    expire_all(sql)
    [(msg_id, read_ct, _)] = read(sql, "g")
    assert msg_id == head
    assert sql.execute("SELECT pgqueue.nack('g', %s, %s, 3600)", (msg_id, read_ct)).fetchone() == (
        "retry",
    )
    assert read(sql, "g") == []


def test_a_poisoned_head_lets_the_next_one_out_in_the_same_read(client: Client, sql: Any) -> None:
    client.create_queue("g", max_attempts=1)
    head = client.send("g", "bad", group="k")
    nxt = client.send("g", "good", group="k")
    assert [r[0] for r in read(sql, "g")] == [head]
    expire_all(sql)
    assert [r[0] for r in read(sql, "g")] == [nxt]  # head poison-dropped by this read
    assert sql.execute(
        "SELECT count(*) FROM pgqueue.poison WHERE msg_id = %s", (head,)
    ).fetchone() == (1,)


def test_a_requeued_poison_message_goes_to_the_end_of_its_group(client: Client, sql: Any) -> None:
    client.create_queue("g", max_attempts=1)
    head = client.send("g", "bad", group="k")
    nxt = client.send("g", "next", group="k")
    sql.execute("SELECT pgqueue.poison('g', %s, 'by hand')", (head,))
    [new] = sql.execute(
        "SELECT * FROM pgqueue.poison_requeue('g', ARRAY[%s]::bigint[])", (head,)
    ).fetchone()
    assert sql.execute(
        "SELECT group_key FROM pgqueue.message WHERE msg_id = %s", (new,)
    ).fetchone() == ("k",)
    assert [r[0] for r in read(sql, "g")] == [nxt]
    sql.execute("SELECT pgqueue.delete('g', %s)", (nxt,))
    assert [r[0] for r in read(sql, "g")] == [new]


def test_pop_takes_heads_only(client: Client, sql: Any) -> None:
    client.create_queue("g")
    ids = client.send_batch("g", [1, 2, 3, 4], groups=["a", "a", "b", None])
    popped = sorted(r[0] for r in sql.execute("SELECT msg_id FROM pgqueue.pop('g', 10)").fetchall())
    assert popped == [ids[0], ids[2], ids[3]]
    assert [r[0] for r in sql.execute("SELECT msg_id FROM pgqueue.pop('g', 10)").fetchall()] == [
        ids[1]
    ]


def test_last_read_at_is_the_start_of_the_latest_lease(client: Client, sql: Any) -> None:
    client.create_queue("g")
    msg_id = client.send("g", 1)
    assert sql.execute("SELECT last_read_at FROM pgqueue.message").fetchone() == (None,)
    [(vt,)] = sql.execute("SELECT vt FROM pgqueue.read('g', 30, 1)").fetchall()
    (last,) = sql.execute("SELECT last_read_at FROM pgqueue.message").fetchone() or (None,)
    assert last is not None and (vt - last).total_seconds() == pytest.approx(30, abs=0.01)
    sql.execute("SELECT pgqueue.archive('g', %s)", (msg_id,))
    assert sql.execute("SELECT last_read_at FROM pgqueue.archive").fetchone() == (last,)


def test_group_keys_are_checked(client: Client) -> None:
    client.create_queue("g")
    with pytest.raises(InvalidArgument, match="group key must be 1 to 200"):
        client.send("g", 1, group="")
    with pytest.raises(InvalidArgument, match="group key must be 1 to 200"):
        client.send("g", 1, group="x" * 201)
    with pytest.raises(InvalidArgument, match="groups has 1 elements but messages has 2"):
        client.send_batch("g", [1, 2], groups=["a"])
    assert client.metrics("g").queue_length == 0


def test_a_queue_that_never_had_a_group_reads_as_before(client: Client, sql: Any) -> None:
    client.create_queue("g")
    client.send_batch("g", list(range(5)))
    assert sql.execute("SELECT has_groups FROM pgqueue.queue").fetchone() == (False,)
    assert len(read(sql, "g")) == 5
    client.send("g", 1, group="k")
    assert sql.execute("SELECT has_groups FROM pgqueue.queue").fetchone() == (True,)


def test_sends_of_one_group_take_msg_ids_in_commit_order(dsn: str, client: Client) -> None:
    """A send held open in a transaction makes the next send of its group wait, not overtake it."""
    client.create_queue("g")
    with psycopg.connect(dsn) as slow, psycopg.connect(dsn, autocommit=True) as fast:
        slow.execute("SELECT pgqueue.send('g', '1', group_key => 'k')")
        done = threading.Event()

        def second() -> None:
            fast.execute("SELECT pgqueue.send('g', '2', group_key => 'k')")
            done.set()

        t = threading.Thread(target=second)
        t.start()
        assert not done.wait(0.5), "a second send of the group went ahead of an open one"
        slow.commit()
        t.join(10)
        assert done.is_set()
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT msg_id, message FROM pgqueue.message ORDER BY msg_id"
        ).fetchall()
        assert [m for _, m in rows] == [1, 2]


def test_concurrent_readers_never_hold_one_group_at_once_and_keep_its_order(
    dsn: str, client: Client
) -> None:
    """8 readers, 12 groups, some leases abandoned to expire, max_attempts 3 (poison drops)."""
    client.create_queue("g", max_attempts=3)
    groups = [f"g{i}" for i in range(12)]
    per_group = 25
    sent: dict[str, list[int]] = defaultdict(list)
    for n in range(per_group):
        ids = client.send_batch("g", [{"n": n, "g": g} for g in groups], groups=groups)
        for g, i in zip(groups, ids, strict=True):
            sent[g].append(i)
    holders: dict[str, threading.Lock] = {g: threading.Lock() for g in groups}
    deliveries: dict[str, list[int]] = defaultdict(list)
    overlaps: list[str] = []
    acked: set[int] = set()
    record = threading.Lock()
    deadline = time.monotonic() + 60

    def reader(_: int) -> None:
        rng = random.Random()
        with psycopg.connect(dsn, autocommit=True) as conn:
            while time.monotonic() < deadline:
                rows = conn.execute(
                    "SELECT msg_id, message->>'g' FROM pgqueue.read('g', 1, %s)",
                    (rng.randint(1, 4),),
                ).fetchall()
                if not rows:
                    with record:
                        if len(acked) + poisoned(conn) >= per_group * len(groups):
                            return
                    time.sleep(0.01)
                    continue
                for msg_id, g in rows:
                    if not holders[g].acquire(blocking=False):
                        overlaps.append(
                            f"group {g}: {msg_id} handed out while another reader held it"
                        )
                        continue
                    with record:
                        deliveries[g].append(msg_id)
                    time.sleep(rng.random() * 0.003)
                    abandon = rng.random() < 0.1
                    holders[g].release()  # before the ack commits: the group is ours until then
                    if not abandon:
                        (ok,) = conn.execute(
                            "SELECT pgqueue.delete('g', %s)", (msg_id,)
                        ).fetchone() or (None,)
                        if ok:
                            with record:
                                acked.add(msg_id)

    def poisoned(conn: psycopg.Connection[Any]) -> int:
        return int((conn.execute("SELECT count(*) FROM pgqueue.poison").fetchone() or (0,))[0])

    run_threads(8, reader)
    assert overlaps == []
    with psycopg.connect(dsn, autocommit=True) as conn:
        dropped = {r[0] for r in conn.execute("SELECT msg_id FROM pgqueue.poison").fetchall()}
        left = conn.execute("SELECT count(*) FROM pgqueue.message").fetchone()
    assert left == (0,)
    for g in groups:
        # every message acked or poisoned, never both; deliveries never go back in the group
        assert set(sent[g]) == {i for i in sent[g] if i in acked} | {
            i for i in sent[g] if i in dropped
        }
        assert deliveries[g] == sorted(deliveries[g]), g
