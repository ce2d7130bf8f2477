"""Single-flight claims: one holder per key, leases that expire, tombstones that stay."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import psycopg
import pytest
from support.db import run_threads

from pgqueue import Client, InvalidArgument
from pgqueue._calls import single_flight as c


def expire_leases(sql: Any) -> None:
    sql.execute("UPDATE pgqueue.claim SET lease_until = clock_timestamp() - interval '1 second'")


def test_one_owner_at_a_time_until_released(client: Client) -> None:
    assert client.run(c.claim("root:A", "w1", 30)) is True
    assert client.run(c.claim("root:A", "w2", 30)) is False
    assert client.run(c.claim("root:A", "w1", 30)) is True  # re-claim by the holder
    assert client.run(c.release("root:A", "w2")) is False
    assert client.run(c.release("root:A", "w1")) is True
    assert client.run(c.claim("root:A", "w2", 30)) is True


def test_expired_lease_can_be_taken_over_and_old_owner_loses_it(client: Client, sql: Any) -> None:
    assert client.run(c.claim("k", "w1", 30))
    expire_leases(sql)
    assert client.run(c.claim("k", "w2", 30)) is True
    assert client.run(c.renew("k", "w1", 30)) is False
    assert client.run(c.finish("k", "w1")) is False
    assert client.run(c.renew("k", "w2", 30)) is True


def test_finished_claim_is_a_tombstone(client: Client, sql: Any) -> None:
    assert client.run(c.claim("k", "w1", 30))
    assert client.run(c.finish("k", "w1")) is True
    expire_leases(sql)
    assert client.run(c.claim("k", "w2", 30)) is False
    assert client.run(c.claim("k", "w1", 30)) is False
    [rec] = client.list_claims()
    assert (rec.key, rec.owner, rec.state) == ("k", "w1", "finished")
    assert client.purge_claims(older_than_seconds=3600) == 0
    sql.execute("UPDATE pgqueue.claim SET finished_at = finished_at - interval '2 hours'")
    assert client.purge_claims(older_than_seconds=3600) == 1


def test_bad_claim_arguments_are_rejected(client: Client) -> None:
    with pytest.raises(InvalidArgument, match="lease_seconds must be >= 1"):
        client.run(c.claim("k", "w", 0))
    with pytest.raises(InvalidArgument, match="key and owner must be non-empty"):
        client.run(c.claim("", "w", 5))


def test_concurrent_claimers_get_exactly_one_winner(client: Client) -> None:
    for round_ in range(5):
        wins: list[int] = []

        def take(i: int, key: str = f"root:{round_}", wins: list[int] = wins) -> None:
            if client.run(c.claim(key, f"w{i}", 30)):
                wins.append(i)

        run_threads(12, take)
        assert len(wins) == 1


def test_context_manager_renews_while_held_and_releases_on_error(client: Client) -> None:
    with client.claim("job", lease_seconds=1) as held:
        assert held.acquired
        time.sleep(2.5)  # longer than the lease: renewal keeps it ours
        with client.claim("job", lease_seconds=1) as other:
            assert not other.acquired
        assert not held.lost
    with pytest.raises(RuntimeError), client.claim("job", lease_seconds=5) as again:
        assert again.acquired
        raise RuntimeError("work failed")
    with client.claim("job", lease_seconds=5) as after:
        assert after.acquired  # released on the error, so another run may happen


def test_context_manager_finish_leaves_tombstone(client: Client) -> None:
    with client.claim("once") as first:
        assert first.acquired and first.finish()
    with client.claim("once") as late:
        assert not late.acquired


def test_context_manager_notices_a_lost_lease(client: Client, sql: Any) -> None:
    done = threading.Event()
    with client.claim("k", lease_seconds=1) as held:
        sql.execute("UPDATE pgqueue.claim SET owner = 'thief'")
        deadline = time.monotonic() + 60  # an outer bound: it ends when the loss is seen
        while not held.lost and time.monotonic() < deadline:
            time.sleep(0.05)
        assert held.lost
        done.set()
    assert client.list_claims()[0].owner == "thief"


def test_finish_retried_after_a_lost_reply_still_reports_success(client: Client) -> None:
    assert client.run(c.claim("k", "w1", 30))
    assert client.run(c.finish("k", "w1")) is True
    assert client.run(c.finish("k", "w1")) is True
    assert client.run(c.finish("k", "w2")) is False


SEND_KEYED = "SELECT msg_id, sent FROM pgqueue.send_keyed(%s, %s::jsonb, %s, NULL, 0, %s)"


def test_send_keyed_says_whether_this_call_sent_even_when_retried_after_its_message_was_acked(
    client: Client, sql: Any, queue: str
) -> None:
    """A retry (the same send_token) of an attempt that committed is told it sent."""
    first, other = uuid.uuid4(), uuid.uuid4()
    assert sql.execute(SEND_KEYED, (queue, "1", "k", first)).fetchall() == [(1, True)]
    assert sql.execute(SEND_KEYED, (queue, "2", "k", other)).fetchall() == [(1, False)]
    assert sql.execute(SEND_KEYED, (queue, "1", "k", first)).fetchall() == [(1, True)]
    [m] = client.read(queue, vt=30, qty=1)
    assert client.delete(queue, m.msg_id)  # consumed: the key is free, a receipt remains
    assert sql.execute(SEND_KEYED, (queue, "1", "k", first)).fetchall() == [(1, True)]
    assert client.metrics(queue).total_messages == 1
    assert client.send_keyed(queue, 3, dedupe_key="k").sent  # a new call sends again
    without_token = "SELECT msg_id, sent FROM pgqueue.send_keyed(%s, '4', 'k')"
    assert sql.execute(without_token, (queue,)).fetchall() == [(2, False)]


def test_send_keyed_refuses_a_missing_key(sql: Any, queue: str) -> None:
    with pytest.raises(psycopg.errors.NullValueNotAllowed, match="dedupe_key must not be NULL"):
        sql.execute(SEND_KEYED, (queue, "1", None, uuid.uuid4()))
