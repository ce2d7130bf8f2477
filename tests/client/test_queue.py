"""The queue contract through the Python client."""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Any

import psycopg
import pytest
from support.db import expire_all

import pgqueue
from pgqueue import Client, InvalidArgument, InvalidMessage, Message, QueueNotFound


def test_create_queue_is_idempotent_and_updates_max_attempts(client: Client) -> None:
    client.create_queue("orders", max_attempts=2)
    client.create_queue("orders", max_attempts=7)
    [info] = client.list_queues()
    assert (info.queue_name, info.max_attempts) == ("orders", 7)


@pytest.mark.parametrize("name", ["", "Orders", "1abc", "a-b", "a;drop table x", "x" * 49, 'q"'])
def test_invalid_queue_names_are_rejected(client: Client, name: str) -> None:
    with pytest.raises(InvalidArgument, match="queue name"):
        client.create_queue(name)
    assert client.list_queues() == []


def test_max_attempts_below_one_is_rejected(client: Client) -> None:
    with pytest.raises(InvalidArgument, match="max_attempts must be >= 1"):
        client.create_queue("q", max_attempts=0)


def test_drop_queue_removes_everything_and_reports_absence(client: Client, queue: str) -> None:
    client.send(queue, {"a": 1})
    [m] = client.read(queue, vt=0, qty=1)
    client.poison(queue, m.msg_id, "bad")
    client.send(queue, {"a": 2})
    assert client.drop_queue(queue) is True
    assert client.drop_queue(queue) is False
    assert client.list_queues() == []
    with pytest.raises(QueueNotFound):
        client.send(queue, {})


def test_purge_queue_counts_removed_messages(client: Client, queue: str) -> None:
    client.send_batch(queue, [1, 2, 3])
    assert client.purge_queue(queue) == 3
    assert client.read(queue, vt=1, qty=10) == []


def test_send_then_read_returns_typed_message(client: Client, queue: str) -> None:
    msg_id = client.send(queue, {"order": 7}, headers={"trace": "abc"})
    [m] = client.read(queue, vt=30, qty=5)
    assert isinstance(m, Message)
    assert (m.queue, m.msg_id, m.read_ct, m.message, m.headers) == (
        queue,
        msg_id,
        1,
        {"order": 7},
        {"trace": "abc"},
    )
    assert m.vt > m.enqueued_at + dt.timedelta(seconds=29)


def test_read_hides_message_until_vt_passes(client: Client, queue: str, sql: Any) -> None:
    client.send(queue, "x")
    assert len(client.read(queue, vt=60, qty=1)) == 1
    assert client.read(queue, vt=60, qty=1) == []
    expire_all(sql)
    [again] = client.read(queue, vt=60, qty=1)
    assert again.read_ct == 2


def test_short_vt_makes_message_visible_again_by_real_time(client: Client, queue: str) -> None:
    client.send(queue, "x")
    client.read(queue, vt=1, qty=1)
    time.sleep(1.1)
    [again] = client.read(queue, vt=1, qty=1)
    assert again.read_ct == 2


def test_read_qty_limits_and_orders_by_arrival(client: Client, queue: str) -> None:
    ids = client.send_batch(queue, list(range(10)))
    first = client.read(queue, vt=30, qty=4)
    second = client.read(queue, vt=30, qty=100)
    assert [m.msg_id for m in first] == ids[:4]
    assert [m.msg_id for m in second] == ids[4:]


def test_delayed_message_is_invisible_until_due(client: Client, queue: str, sql: Any) -> None:
    client.send(queue, "later", delay=120)
    client.send(queue, "now")
    assert [m.message for m in client.read(queue, vt=600, qty=10)] == ["now"]
    expire_all(sql, 121)
    assert [m.message for m in client.read(queue, vt=30, qty=10)] == ["later"]


def test_send_batch_returns_ids_in_input_order_with_headers(client: Client, queue: str) -> None:
    ids = client.send_batch(queue, ["a", "b", "c"], headers=[{"n": 1}, None, {"n": 3}])
    assert ids == sorted(ids) and len(set(ids)) == 3
    got = {m.msg_id: (m.message, m.headers) for m in client.read(queue, vt=30, qty=10)}
    assert got == {ids[0]: ("a", {"n": 1}), ids[1]: ("b", None), ids[2]: ("c", {"n": 3})}


def test_send_batch_with_mismatched_headers_inserts_nothing(client: Client, queue: str) -> None:
    with pytest.raises(InvalidArgument, match="headers has 1 elements but messages has 2"):
        client.send_batch(queue, ["a", "b"], headers=[{}])
    assert client.metrics(queue).queue_length == 0


def test_send_batch_of_nothing_is_empty(client: Client, queue: str) -> None:
    assert client.send_batch(queue, []) == []


def test_pop_deletes_what_it_returns(client: Client, queue: str) -> None:
    client.send_batch(queue, [1, 2, 3])
    popped = client.pop(queue, qty=2)
    assert [m.message for m in popped] == [1, 2]
    assert client.metrics(queue).queue_length == 1


def test_delete_is_idempotent(client: Client, queue: str) -> None:
    msg_id = client.send(queue, 1)
    assert client.delete(queue, msg_id) is True
    assert client.delete(queue, msg_id) is False
    assert client.delete(queue, 999_999) is False


def test_delete_many_returns_only_ids_still_live(client: Client, queue: str) -> None:
    a, b, c = client.send_batch(queue, [1, 2, 3])
    client.delete(queue, b)
    assert sorted(client.delete_many(queue, [a, b, c, 12345])) == [a, c]
    assert client.delete_many(queue, [a, c]) == []


def test_archive_moves_message_and_is_idempotent(client: Client, queue: str, sql: Any) -> None:
    a, b = client.send_batch(queue, [{"x": 1}, {"x": 2}])
    client.read(queue, vt=30, qty=1)
    assert client.archive(queue, a) is True
    assert client.archive(queue, a) is False
    assert client.archive_many(queue, [a, b]) == [b]
    rows = sql.execute("SELECT msg_id, read_ct, message FROM pgqueue.archive ORDER BY 1").fetchall()
    assert rows == [(a, 1, {"x": 1}), (b, 0, {"x": 2})]
    assert client.metrics(queue).queue_length == 0


def test_set_vt_extends_a_lease(client: Client, queue: str) -> None:
    msg_id = client.send(queue, 1)
    client.read(queue, vt=0, qty=1)
    extended = client.set_vt(queue, msg_id, 300)
    assert extended is not None and extended.msg_id == msg_id
    assert client.read(queue, vt=30, qty=1) == []


def test_set_vt_zero_is_a_nack_that_redelivers_now(client: Client, queue: str) -> None:
    msg_id = client.send(queue, 1)
    client.read(queue, vt=300, qty=1)
    client.set_vt(queue, msg_id, 0)
    [again] = client.read(queue, vt=300, qty=1)
    assert (again.msg_id, again.read_ct) == (msg_id, 2)


def test_set_vt_on_acked_message_returns_none(client: Client, queue: str) -> None:
    msg_id = client.send(queue, 1)
    client.delete(queue, msg_id)
    assert client.set_vt(queue, msg_id, 10) is None


def test_metrics_report_lengths_ages_and_totals(client: Client, queue: str) -> None:
    client.send_batch(queue, [1, 2, 3])
    client.send(queue, 4, delay=600)
    client.read(queue, vt=60, qty=1)
    m = client.metrics(queue)
    assert (m.queue_name, m.queue_length, m.visible_length, m.total_messages) == (queue, 4, 2, 4)
    assert m.poison_length == 0
    assert m.oldest_msg_age_sec is not None and m.oldest_msg_age_sec >= 0
    client.create_queue("other")
    assert [x.queue_name for x in client.metrics_all()] == [queue, "other"]
    empty = client.metrics("other")
    assert (empty.queue_length, empty.oldest_msg_age_sec, empty.total_messages) == (0, None, 0)


def notified_before_a_sentinel(
    listener: psycopg.Connection[Any], dsn: str, channel: str
) -> list[str]:
    """The payloads `listener` got on `channel` before a sentinel notified now.

    Notifications arrive in commit order: one that a send committed before
    this made comes first. So "none" is known when the sentinel comes, not
    guessed from a quiet half second (which a loaded machine fills).
    """
    with psycopg.connect(dsn, autocommit=True) as other:
        other.execute("SELECT pg_notify(%s, 'sentinel')", (channel,))
    got: list[str] = []
    for n in listener.notifies(timeout=60):
        if n.channel == channel and n.payload == "sentinel":
            return got
        got.append(n.payload)
    raise AssertionError(f"the sentinel never came (got {got})")


def test_read_with_poll_waits_for_a_message(client: Client, queue: str, dsn: str) -> None:
    start = time.monotonic()
    assert client.read_with_poll(queue, vt=30, qty=1, max_poll_seconds=1) == []
    assert time.monotonic() - start >= 0.9
    client.send(queue, "soon", delay=1)
    # an outer bound: it returns when the message shows, a second after the send
    got = client.read_with_poll(queue, vt=30, qty=1, max_poll_seconds=60, poll_interval_ms=50)
    assert [m.message for m in got] == ["soon"]


def test_send_notifies_sessions_waiting_on_the_queue(client: Client, queue: str, dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as listener:
        channel = listener.execute("SELECT pgqueue.listen(%s)", (queue,)).fetchone()[0]
        assert channel == pgqueue.channel(queue) == f"pgqueue_{queue}"
        client.send(queue, 1)
        notes = list(listener.notifies(timeout=60, stop_after=1))
        assert [n.channel for n in notes] == [channel]
        listener.execute("SELECT pgqueue.unlisten(%s)", (queue,))
        listener.execute(f"LISTEN {channel}")
        client.send(queue, 2)
        assert notified_before_a_sentinel(listener, dsn, channel) == []


def test_send_without_waiters_does_not_notify(client: Client, queue: str, dsn: str) -> None:
    # A plain LISTEN without pgqueue.listen() is not a declared waiter: busy
    # queues must not pay the commit-serializing NOTIFY.
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(f"LISTEN {pgqueue.channel(queue)}")
        client.send(queue, 1)
        client.send_batch(queue, [2, 3])
        assert notified_before_a_sentinel(listener, dsn, pgqueue.channel(queue)) == []


def test_read_or_wait_wakes_on_a_send_within_milliseconds(client: Client, queue: str) -> None:
    def later() -> None:
        time.sleep(0.5)
        client.send(queue, "wake up")

    t = threading.Thread(target=later)
    start = time.monotonic()
    t.start()
    got = client.read_or_wait(queue, vt=30, qty=1, max_wait_seconds=300)
    waited = time.monotonic() - start
    t.join()
    assert [m.message for m in got] == ["wake up"]
    # a bound far above what load adds, far below the 300 s it would otherwise wait
    assert 0.45 < waited < 60, "woken by the notification, not by the 300 s timeout"


def test_read_or_wait_gives_up_after_max_wait_and_unregisters(
    client: Client, queue: str, sql: Any
) -> None:
    start = time.monotonic()
    assert client.read_or_wait(queue, vt=30, qty=1, max_wait_seconds=0.5) == []
    assert time.monotonic() - start >= 0.45
    assert sql.execute("SELECT count(*) FROM pgqueue.waiter").fetchone()[0] == 0


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda c, q: c.read(q, vt=-1, qty=1), "vt must be >= 0"),
        (lambda c, q: c.read(q, vt=1, qty=-5), "qty must be >= 0"),
        (lambda c, q: c.send(q, 1, delay=-1), "delay must be >= 0"),
        (lambda c, q: c.set_vt(q, 1, -3), "vt must be >= 0"),
        (lambda c, q: c.pop(q, qty=-1), "qty must be >= 0"),
        (lambda c, q: c.read_with_poll(q, max_poll_seconds=-1), "max_poll_seconds must be >= 0"),
    ],
)
def test_negative_numbers_are_rejected_with_a_clear_error(
    client: Client, queue: str, call: Any, match: str
) -> None:
    client.send(queue, "keep")
    with pytest.raises(InvalidArgument, match=match):
        call(client, queue)
    assert client.metrics(queue).queue_length == 1


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.send("nope", 1),
        lambda c: c.send_batch("nope", [1]),
        lambda c: c.read("nope"),
        lambda c: c.delete("nope", 1),
        lambda c: c.archive("nope", 1),
        lambda c: c.set_vt("nope", 1, 1),
        lambda c: c.metrics("nope"),
        lambda c: c.purge_queue("nope"),
        lambda c: c.poison_list("nope"),
    ],
)
def test_unknown_queue_raises_queue_not_found(client: Client, call: Any) -> None:
    with pytest.raises(QueueNotFound, match='queue "nope" does not exist'):
        call(client)


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        ({"x": float("nan")}, "not valid JSON"),
        ({"x": object()}, "not valid JSON"),
        ({"x": "nul\x00byte"}, "NUL character"),
    ],
)
def test_unencodable_messages_are_rejected_and_nothing_is_sent(
    client: Client, queue: str, payload: Any, match: str
) -> None:
    with pytest.raises(InvalidMessage, match=match):
        client.send(queue, payload)
    with pytest.raises(InvalidMessage, match=r"messages\[1\]"):
        client.send_batch(queue, [1, payload])
    assert client.metrics(queue).total_messages == 0


def test_send_in_callers_transaction_rolls_back_with_it(
    client: Client, queue: str, dsn: str
) -> None:
    with psycopg.connect(dsn) as conn:
        client.send(queue, "kept", conn=conn)
        conn.commit()
        client.send(queue, "dropped", conn=conn)
        client.send_batch(queue, ["dropped too"], conn=conn)
        conn.rollback()
    assert [m.message for m in client.read(queue, vt=30, qty=10)] == ["kept"]


def test_dedupe_key_gives_single_flight_until_acked(client: Client, queue: str) -> None:
    first = client.send(queue, {"root": "A"}, dedupe_key="orchestrate:A")
    assert client.send(queue, {"root": "A"}, dedupe_key="orchestrate:A") == first
    [m] = client.read(queue, vt=30, qty=5)
    # still unfinished while being processed: no second run may be scheduled
    assert client.send(queue, {"root": "A"}, dedupe_key="orchestrate:A") == first
    client.delete(queue, m.msg_id)
    second = client.send(queue, {"root": "A"}, dedupe_key="orchestrate:A")
    assert second != first
    assert client.send(queue, {"root": "B"}, dedupe_key="orchestrate:B") not in (first, second)


def test_dedupe_key_is_per_queue(client: Client, queue: str) -> None:
    client.create_queue("other")
    a = client.send(queue, 1, dedupe_key="k")
    b = client.send("other", 1, dedupe_key="k")
    assert client.metrics(queue).queue_length == 1
    assert client.metrics("other").queue_length == 1
    assert (a, b) == (1, 1)


def test_retried_dedupe_send_after_consumption_does_not_send_again(
    client: Client, queue: str, sql: Any
) -> None:
    # The first attempt committed, its reply was lost, the message was consumed
    # and acked; the client's retry presents the same send token.
    token = "2b1f6a8e-0000-4000-8000-000000000001"
    first = sql.execute(
        "SELECT pgqueue.send(%s, '1', NULL, 0, 'k', %s)", (queue, token)
    ).fetchone()[0]
    client.delete(queue, first)
    retry = sql.execute(
        "SELECT pgqueue.send(%s, '1', NULL, 0, 'k', %s)", (queue, token)
    ).fetchone()[0]
    assert retry == first
    assert client.metrics(queue).total_messages == 1
    # a new send (new token) with the same key is a new run
    assert client.send(queue, 1, dedupe_key="k") != first


def test_retried_keyed_send_returns_its_own_id_when_another_sender_holds_the_key_now(
    client: Client, queue: str, sql: Any
) -> None:
    # The first attempt committed and its reply was lost; its message was
    # consumed, and another producer's message with the same key is live now.
    token = "2b1f6a8e-0000-4000-8000-000000000002"
    first = sql.execute(
        "SELECT pgqueue.send(%s, '1', NULL, 0, 'k', %s)", (queue, token)
    ).fetchone()[0]
    client.delete(queue, first)
    other = client.send(queue, 2, dedupe_key="k")
    retry = sql.execute(
        "SELECT pgqueue.send(%s, '1', NULL, 0, 'k', %s)", (queue, token)
    ).fetchone()[0]
    assert (retry, other) == (first, first + 1)  # its own receipt, not the other's message
    assert client.metrics(queue).total_messages == 2


def test_header_keys_starting_with_pg_are_refused_and_nothing_is_sent(
    client: Client, queue: str
) -> None:
    for headers in ({"_pg_transport": True}, {"ok": 1, "_pg_": 0}, {"_pg_x": None}):
        with pytest.raises(InvalidArgument, match="reserved: keys starting with _pg_"):
            client.send(queue, 1, headers=headers)
        with pytest.raises(InvalidArgument, match="reserved"):
            client.send(queue, 1, headers=headers, dedupe_key="k")
        with pytest.raises(InvalidArgument, match="reserved"):
            client.send_batch(queue, [1, 2], headers=[{"a": 1}, headers])
    assert client.metrics(queue).total_messages == 0
    # near misses are the sender's own
    for headers in ({"_pg": 1}, {"pg_transport": True}, {"x": "_pg_transport"}, {"_PG_x": 1}):
        assert client.send(queue, 1, headers=headers) > 0


def test_async_client_sends_and_reads(dsn: str, queue: str) -> None:
    import asyncio

    from pgqueue import AsyncClient

    async def main() -> list[Any]:
        async with await AsyncClient.from_dsn(dsn, max_size=2) as ac:
            await ac.send(queue, {"a": 1}, dedupe_key="one")
            await ac.send(queue, {"a": 1}, dedupe_key="one")
            await ac.send_batch(queue, [2, 3])
            return [m.message for m in await ac.read(queue, vt=30, qty=10)]

    assert asyncio.run(main()) == [{"a": 1}, 2, 3]


def test_read_with_poll_returns_at_once_after_a_poison_drop(client: Client, queue: str) -> None:
    client.send(queue, "bad")
    for _ in range(3):
        client.read(queue, vt=0, qty=1)
    start = time.monotonic()
    assert client.read_with_poll(queue, vt=30, qty=1, max_poll_seconds=300) == []
    # a bound far above what load adds, far below the 300 s poll it would sleep through
    assert time.monotonic() - start < 60, "it slept holding the poison move uncommitted"
    assert client.metrics(queue).poison_length == 1


def test_headers_must_be_a_json_object(sql: Any, queue: str) -> None:
    for call in (
        "SELECT pgqueue.send('jobs', '1', '[1]')",
        "SELECT pgqueue.send_batch('jobs', ARRAY['1']::jsonb[], ARRAY['\"x\"']::jsonb[])",
    ):
        with pytest.raises(psycopg.Error, match="headers must be a JSON object"):
            sql.execute(call)
    assert sql.execute("SELECT queue_length FROM pgqueue.metrics('jobs')").fetchone() == (0,)


def test_send_batch_pairs_headers_with_messages_whatever_the_array_bounds(
    sql: Any, client: Client, queue: str
) -> None:
    sql.execute(
        "SELECT pgqueue.send_batch('jobs', '[0:1]={1,2}'::jsonb[],"
        ' \'[0:1]={"{\\"a\\": 0}","{\\"a\\": 1}"}\'::jsonb[])'
    )
    got = [(m.message, m.headers) for m in client.read(queue, vt=30, qty=5)]
    assert got == [(1, {"a": 0}), (2, {"a": 1})]


def test_overlong_dedupe_key_is_rejected(client: Client, queue: str) -> None:
    with pytest.raises(InvalidArgument, match="dedupe_key is 1001 characters"):
        client.send(queue, 1, dedupe_key="k" * 1001)
