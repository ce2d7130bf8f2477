"""Poison drop: after max_attempts deliveries a message moves to the poison table, never lost."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from support.db import expire_all

from pgqueue import Client, InvalidArgument, QueueNotFound


def _deliver_until_gone(client: Client, queue: str, sql: Any) -> list[int]:
    reads = []
    for _ in range(20):
        batch = client.read(queue, vt=30, qty=10)
        if not batch:
            expire_all(sql)
            batch = client.read(queue, vt=30, qty=10)
            if not batch:
                return reads
        reads.extend(m.read_ct for m in batch)
        expire_all(sql)
    raise AssertionError("message was never poison-dropped")


def test_message_is_delivered_max_attempts_times_then_poisoned(
    client: Client, queue: str, sql: Any
) -> None:
    msg_id = client.send(queue, {"boom": True}, headers={"h": 1})
    assert _deliver_until_gone(client, queue, sql) == [1, 2, 3]
    [p] = client.poison_list(queue)
    assert (p.queue_name, p.msg_id, p.read_ct, p.message, p.headers) == (
        queue,
        msg_id,
        3,
        {"boom": True},
        {"h": 1},
    )
    assert "max_attempts exceeded" in p.reason
    m = client.metrics(queue)
    assert (m.queue_length, m.poison_length) == (0, 1)


def test_poison_drop_happens_in_the_reading_statement_with_healthy_neighbours(
    client: Client, queue: str, sql: Any
) -> None:
    bad = client.send(queue, "bad")
    for _ in range(3):
        client.read(queue, vt=0, qty=1)
    good = client.send(queue, "good")
    got = client.read(queue, vt=30, qty=10)
    assert [m.msg_id for m in got] == [good]
    assert [p.msg_id for p in client.poison_list(queue)] == [bad]


def test_pop_also_poisons_exhausted_messages(client: Client, queue: str) -> None:
    msg_id = client.send(queue, "bad")
    for _ in range(3):
        client.read(queue, vt=0, qty=1)
    assert client.pop(queue, qty=5) == []
    assert [p.msg_id for p in client.poison_list(queue)] == [msg_id]


def test_explicit_poison_moves_message_with_reason(client: Client, queue: str) -> None:
    msg_id = client.send(queue, {"n": 1})
    client.read(queue, vt=30, qty=1)
    assert client.poison(queue, msg_id, "schema v1 payload, cannot handle") is True
    assert client.poison(queue, msg_id, "again") is False
    [p] = client.poison_list(queue)
    assert (p.msg_id, p.read_ct, p.reason) == (msg_id, 1, "schema v1 payload, cannot handle")


def test_poison_needs_a_reason(client: Client, queue: str) -> None:
    msg_id = client.send(queue, 1)
    with pytest.raises(InvalidArgument, match="reason must not be empty"):
        client.poison(queue, msg_id, "")
    assert client.metrics(queue).queue_length == 1


def test_requeue_gives_a_fresh_start_with_read_ct_zero_under_a_new_id(
    client: Client, queue: str
) -> None:
    a = client.send(queue, "a")
    b = client.send(queue, "b")
    client.poison(queue, a, "x")
    client.poison(queue, b, "y")
    [again] = client.poison_requeue(queue, [a, 424242])
    assert again > b  # a new id: no lease of its earlier life can name it
    [m] = client.read(queue, vt=30, qty=10)
    assert (m.msg_id, m.read_ct, m.message) == (again, 1, "a")
    assert [p.msg_id for p in client.poison_list(queue)] == [b]


def test_requeue_keeps_dedupe_key_unless_a_live_message_holds_it(
    client: Client, queue: str
) -> None:
    first = client.send(queue, 1, dedupe_key="k")
    client.poison(queue, first, "x")
    holder = client.send(queue, 2, dedupe_key="k")
    [again] = client.poison_requeue(queue, [first])
    assert client.send(queue, 3, dedupe_key="k") == holder
    client.delete(queue, holder)
    second = client.send(queue, 3, dedupe_key="k")
    assert second not in (first, holder, again)


def test_purge_selected_and_all(client: Client, queue: str) -> None:
    ids = client.send_batch(queue, [1, 2, 3])
    for i in ids:
        client.poison(queue, i, "bad")
    assert client.poison_purge(queue, [ids[0], 99]) == 1
    assert client.poison_purge(queue) == 2
    assert client.poison_list(queue) == []


def test_poison_list_all_queues_newest_first_and_limited(client: Client) -> None:
    client.create_queue("a")
    client.create_queue("b")
    x = client.send("a", 1)
    y = client.send("b", 2)
    client.poison("a", x, "first")
    client.poison("b", y, "second")
    assert [(p.queue_name, p.reason) for p in client.poison_list()] == [
        ("b", "second"),
        ("a", "first"),
    ]
    assert len(client.poison_list(qty=1)) == 1
    with pytest.raises(QueueNotFound):
        client.poison_requeue("zzz", [1])


def test_requeue_of_rows_sharing_a_dedupe_key_loses_none(client: Client, queue: str) -> None:
    a = client.send(queue, "a", dedupe_key="k")
    client.poison(queue, a, "x")
    b = client.send(queue, "b", dedupe_key="k")
    client.poison(queue, b, "y")
    requeued = client.poison_requeue(queue, [a, b])
    assert len(requeued) == 2 and client.metrics(queue).queue_length == 2
    # exactly one of them holds the key again
    assert client.send(queue, "c", dedupe_key="k") in requeued


def test_requeue_racing_drop_queue_leaves_no_orphan(client: Client, queue: str, dsn: str) -> None:
    import threading

    import psycopg

    msg_id = client.send(queue, "x")
    client.poison(queue, msg_id, "bad")
    requeuer = psycopg.connect(dsn)
    requeuer.execute("SELECT pgqueue.poison_requeue(%s, ARRAY[%s]::bigint[])", (queue, msg_id))
    t = threading.Thread(target=lambda: client.drop_queue(queue))
    t.start()
    t.join(0.3)
    assert t.is_alive(), "drop_queue must wait for the requeue holding the queue"
    requeuer.commit()
    requeuer.close()
    t.join()
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM pgqueue.message").fetchone() == (0,)


def test_the_last_error_of_a_nack_is_quoted_in_the_poison_reason(
    client: Client, queue: str
) -> None:
    msg_id = client.send(queue, {"order": 1})
    for attempt in range(1, 4):
        [msg] = client.read(queue, vt=30, qty=1)
        client.set_vt(queue, msg.msg_id, 0, error=f"TimeoutError: try {attempt}")
    client.set_vt(queue, msg_id, 0)  # a nack without an error keeps the last one
    assert client.read(queue, vt=30, qty=1) == []
    [p] = client.poison_list(queue)
    assert p.reason == "max_attempts exceeded (read 3 times); last error: TimeoutError: try 3"


def test_a_single_attempt_is_counted_in_the_singular(client: Client) -> None:
    client.create_queue("once", max_attempts=1)
    [msg_id] = client.send_batch("once", [{"order": 1}])
    [msg] = client.read("once", vt=30, qty=1)
    assert client.nack("once", msg.msg_id, read_ct=msg.read_ct, delay=0, error="E") == "poisoned"
    [p] = client.poison_list("once")
    assert (p.msg_id, p.reason) == (msg_id, "max_attempts exceeded (read 1 time); last error: E")


def test_a_huge_error_is_clipped_not_refused(client: Client, queue: str) -> None:
    client.send(queue, {})
    [msg] = client.read(queue, vt=30, qty=1)
    client.set_vt(queue, msg.msg_id, 0, error="x" * 100_000)
    [peeked] = client.peek(queue)
    assert peeked.last_error is not None
    assert len(peeked.last_error) < 2100 and peeked.last_error.endswith(" [...]")


def test_peek_changes_nothing_and_pages_by_msg_id(client: Client, queue: str, sql: Any) -> None:
    ids = client.send_batch(queue, [{"n": n} for n in range(5)])
    client.read(queue, vt=60, qty=2)
    before = sql.execute("SELECT * FROM pgqueue.message ORDER BY msg_id").fetchall()
    first = client.peek(queue, qty=3)
    rest = client.peek(queue, qty=3, after_msg_id=first[-1].msg_id)
    assert [m.msg_id for m in first + rest] == ids
    assert [m.read_ct for m in first + rest] == [1, 1, 0, 0, 0]
    assert sql.execute("SELECT * FROM pgqueue.message ORDER BY msg_id").fetchall() == before
    with pytest.raises(QueueNotFound):
        client.peek("nope")
    with pytest.raises(InvalidArgument):
        client.peek(queue, qty=-1)


def test_purge_in_chunks_keeps_messages_sent_after_it_began(client: Client, queue: str) -> None:
    client.send_batch(queue, [{} for _ in range(7)])
    bound = client.metrics(queue).total_messages
    later = client.send(queue, {"late": True})
    removed = []
    while n := client.purge_queue_chunk(queue, up_to_msg_id=bound, qty=3):
        removed.append(n)
    assert removed == [3, 3, 1]
    assert [m.msg_id for m in client.peek(queue)] == [later]


def test_poison_filters_count_and_page(client: Client, queue: str, sql: Any) -> None:
    from pgqueue.types import PoisonFilter

    ids = client.send_batch(queue, [{"n": n} for n in range(6)])
    for msg_id in ids:
        client.poison(queue, msg_id, "timeout" if msg_id % 2 else "Bad Payload")
    sql.execute(
        "UPDATE pgqueue.poison SET poisoned_at = poisoned_at - interval '1 day' WHERE msg_id <= 3"
    )
    now = sql.execute("SELECT clock_timestamp()").fetchone()[0]
    recent = PoisonFilter(after=now - timedelta(hours=1))
    assert client.poison_count(queue) == 6
    assert client.poison_count(queue, recent) == 3
    assert client.poison_count(None, PoisonFilter(reason="bad payload")) == 3
    assert client.poison_ids(queue, qty=2) == ids[:2]
    assert client.poison_ids(queue, after_msg_id=ids[1], qty=10, where=recent) == ids[3:]
    old = PoisonFilter(before=now - timedelta(hours=1), reason="TIME")
    assert client.poison_ids(queue, qty=10, where=old) == [1, 3]
    assert [p.msg_id for p in client.poison_list(queue, since=now - timedelta(hours=1))] == [
        6,
        5,
        4,
    ]
    assert client.poison_get(queue, 4) is not None and client.poison_get(queue, 99) is None
