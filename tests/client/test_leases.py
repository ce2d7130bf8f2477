"""Fenced leases: only the holder of the current lease can extend, nack, release or poison it.

A reader that stalled past its vt (a GC pause, SIGSTOP, a frozen container)
comes back holding a lease that another reader has taken over. Every lease
change names the read_ct its read returned, and a stale one changes nothing:
None/False in Python, no row in SQL. Acks are not fenced, on purpose: the
tests at the end pin what a stale holder's ack does, and why it is safe.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from support.db import expire_all

from pgqueue import Client, InvalidArgument


def take_over(client: Client, sql: Any, queue: str, vt: int = 30) -> tuple[Any, Any]:
    """A reads, its lease runs out, B reads: (A's stale message, B's current one)."""
    [a] = client.read(queue, vt=30, qty=1)
    expire_all(sql)  # A stalled past its vt
    [b] = client.read(queue, vt=vt, qty=1)
    assert (a.msg_id, a.read_ct, b.read_ct) == (b.msg_id, 1, 2)
    return a, b


def vt_of(sql: Any, msg_id: int) -> Any:
    row = sql.execute("SELECT vt FROM pgqueue.message WHERE msg_id = %s", (msg_id,)).fetchone()
    return row[0] if row else None


def test_a_stale_heartbeat_does_not_shorten_the_new_holders_lease(
    client: Client, sql: Any, queue: str
) -> None:
    client.send(queue, "job")
    a, b = take_over(client, sql, queue)
    before = vt_of(sql, b.msg_id)
    assert client.set_vt(queue, a.msg_id, 1, read_ct=a.read_ct) is None
    assert vt_of(sql, b.msg_id) == before
    extended = client.set_vt(queue, b.msg_id, 60, read_ct=b.read_ct)
    assert extended is not None and extended.vt > before  # the holder's own heartbeat works


def test_a_stale_nack_or_release_does_not_let_a_third_reader_in(
    client: Client, sql: Any, queue: str
) -> None:
    client.send(queue, "job")
    a, b = take_over(client, sql, queue)
    assert client.set_vt(queue, a.msg_id, 0, read_ct=a.read_ct) is None  # release
    assert client.nack(queue, a.msg_id, read_ct=a.read_ct, delay=0, error="late") is None
    assert client.read(queue, vt=30, qty=1) == []  # B's 30 s lease holds
    assert client.nack(queue, b.msg_id, read_ct=b.read_ct, delay=0) == "retry"
    [c] = client.read(queue, vt=30, qty=1)
    assert c.read_ct == 3


def test_a_stale_poison_changes_nothing(client: Client, sql: Any, queue: str) -> None:
    client.send(queue, "job")
    a, b = take_over(client, sql, queue)
    assert client.poison(queue, a.msg_id, "stale verdict", read_ct=a.read_ct) is False
    assert client.metrics(queue).poison_length == 0 and vt_of(sql, b.msg_id) is not None
    assert client.poison(queue, b.msg_id, "holder's verdict", read_ct=b.read_ct) is True
    [p] = client.poison_list(queue)
    assert (p.msg_id, p.reason) == (b.msg_id, "holder's verdict")


def test_the_nack_of_the_last_attempt_poisons_at_once_with_its_error(
    client: Client, queue: str
) -> None:
    msg_id = client.send(queue, "job")  # max_attempts 3
    for attempt in (1, 2):
        [m] = client.read(queue, vt=30, qty=1)
        assert (
            client.nack(queue, msg_id, read_ct=m.read_ct, delay=0, error=f"e{attempt}") == "retry"
        )
    [m] = client.read(queue, vt=30, qty=1)
    assert client.nack(queue, msg_id, read_ct=m.read_ct, delay=60, error="e3") == "poisoned"
    [p] = client.poison_list(queue)
    assert p.reason == "max_attempts exceeded (read 3 times); last error: e3"
    assert client.nack(queue, msg_id, read_ct=m.read_ct, delay=0) is None  # gone: no news


def test_a_holder_stalled_through_a_poison_and_a_requeue_cannot_name_the_new_lease(
    client: Client, sql: Any, queue: str
) -> None:
    client.send(queue, "job")
    a, b = take_over(client, sql, queue)
    assert client.poison(queue, b.msg_id, "bad", read_ct=b.read_ct)
    [again] = client.poison_requeue(queue, [b.msg_id])
    [c] = client.read(queue, vt=30, qty=1)
    assert (c.msg_id, c.read_ct) == (again, 1)  # read_ct 1 again, as A's was
    assert client.set_vt(queue, a.msg_id, 0, read_ct=a.read_ct) is None
    assert client.nack(queue, a.msg_id, read_ct=a.read_ct, delay=0) is None
    assert client.poison(queue, a.msg_id, "stale", read_ct=a.read_ct) is False
    assert client.read(queue, vt=30, qty=1) == []  # C's lease holds


def test_the_sql_api_offers_the_fenced_forms(sql: Any, client: Client, queue: str) -> None:
    client.send(queue, "job")
    a, _ = take_over(client, sql, queue)
    stale = (queue, a.msg_id)
    assert sql.execute("SELECT * FROM pgqueue.set_vt(%s, %s, 0, NULL, 1)", stale).fetchall() == []
    assert sql.execute("SELECT pgqueue.nack(%s, %s, 1, 0)", stale).fetchone() == (None,)
    assert sql.execute("SELECT pgqueue.poison(%s, %s, 'x', 1)", stale).fetchone() == (False,)
    assert sql.execute(
        "SELECT pgqueue.complete_member(%s, %s, 'failed', NULL, 1)", stale
    ).fetchone() == (None,)
    assert (
        sql.execute(
            "SELECT * FROM pgqueue.hold_leases(%s, ARRAY[%s]::bigint[], '{1}')", stale
        ).fetchall()
        == []
    )
    assert (
        len(sql.execute("SELECT * FROM pgqueue.set_vt(%s, %s, 0, NULL, 2)", stale).fetchall()) == 1
    )
    with pytest.raises(psycopg.errors.NullValueNotAllowed, match="read_ct must not be NULL"):
        sql.execute("SELECT pgqueue.nack(%s, %s, NULL, 0)", stale)


def test_a_fenced_call_without_a_usable_read_ct_is_refused_in_one_line(
    client: Client, queue: str
) -> None:
    msg_id = client.send(queue, "job")
    with pytest.raises(InvalidArgument, match="read_ct must fit"):
        client.nack(queue, msg_id, read_ct=2**40, delay=0)


def test_hold_leases_locks_only_current_leases_until_commit(
    client: Client, sql: Any, dsn: str, queue: str
) -> None:
    client.send_batch(queue, ["x", "y"])
    [x] = client.read(queue, vt=30, qty=1)
    expire_all(sql)
    msgs = client.read(queue, vt=30, qty=2)
    y = next(m for m in msgs if m.msg_id != x.msg_id)
    with psycopg.connect(dsn) as tx:
        held = tx.execute(
            "SELECT * FROM pgqueue.hold_leases(%s, %s::bigint[], %s::integer[])",
            (queue, [x.msg_id, y.msg_id], [x.read_ct, y.read_ct]),
        ).fetchall()
        assert held == [(y.msg_id,)]  # x's lease (read_ct 1) was taken over
        with pytest.raises(psycopg.errors.LockNotAvailable):
            sql.execute("SET lock_timeout = '200ms'")
            sql.execute("SELECT pgqueue.delete(%s, %s::bigint)", (queue, y.msg_id))
        sql.execute("RESET lock_timeout")
    assert client.delete(queue, y.msg_id)


def test_set_vt_of_many_leases_moves_only_the_current_ones_in_one_call(
    client: Client, sql: Any, queue: str
) -> None:
    client.send_batch(queue, ["x", "y", "z"])
    [x] = client.read(queue, vt=30, qty=1)
    expire_all(sql)
    msgs = {m.msg_id: m for m in client.read(queue, vt=30, qty=3)}
    others = [m for i, m in msgs.items() if i != x.msg_id]
    ids = [x.msg_id, *(m.msg_id for m in others)]
    read_cts = [x.read_ct, *(m.read_ct for m in others)]  # x's lease (read_ct 1) is stale
    rows = sql.execute(
        "SELECT msg_id, read_ct FROM pgqueue.set_vt(%s, %s::bigint[], 0, %s::integer[])",
        (queue, ids, read_cts),
    ).fetchall()
    assert sorted(rows) == sorted((m.msg_id, m.read_ct) for m in others)
    visible = {m.msg_id for m in client.read(queue, vt=30, qty=3)}
    assert visible == {m.msg_id for m in others}  # x stays with its current holder


@pytest.mark.parametrize(
    ("ids", "read_cts", "vt", "error"),
    [
        ("{1,2}", "{1}", 0, "msg_ids and read_cts must be given, with the same length"),
        ("{1}", None, 0, "msg_ids and read_cts must be given, with the same length"),
        ("{1}", "{NULL}", 0, "read_ct must not be NULL"),
        ("{1}", "{1}", -1, "vt"),
    ],
)
def test_set_vt_of_many_leases_refuses_what_names_no_lease(
    sql: Any, queue: str, ids: str, read_cts: str | None, vt: int, error: str
) -> None:
    with pytest.raises(psycopg.Error, match=error):
        sql.execute(
            "SELECT * FROM pgqueue.set_vt(%s, %s::bigint[], %s, %s::integer[])",
            (queue, ids, vt, read_cts),
        )


def seconds_left(sql: Any, msg_id: int) -> float:
    row = sql.execute(
        "SELECT extract(epoch FROM vt - clock_timestamp()) FROM pgqueue.message WHERE msg_id = %s",
        (msg_id,),
    ).fetchone()
    return float(row[0])


EXTEND = "SELECT * FROM pgqueue.extend_leases(%s, %s::bigint[], %s::integer[], %s)"


def test_extend_leases_extends_the_current_skips_the_locked_and_omits_the_lost(
    client: Client, sql: Any, dsn: str, queue: str
) -> None:
    """The heartbeat's call: never waits for a lock, and says which leases to try again."""
    client.send_batch(queue, ["lost", "locked", "free"])
    [lost] = client.read(queue, vt=30, qty=1)
    expire_all(sql)
    msgs = {m.msg_id: m for m in client.read(queue, vt=30, qty=3)}
    locked, free = (m for i, m in sorted(msgs.items()) if i != lost.msg_id)
    leases = [lost, locked, free]
    with psycopg.connect(dsn) as ack:  # an ack still running holds its row
        ack.execute("DELETE FROM pgqueue.message WHERE msg_id = %s", (locked.msg_id,))
        sql.execute("SET lock_timeout = '5s'")  # a wait would fail the test, not hang it
        rows = sql.execute(
            EXTEND, (queue, [m.msg_id for m in leases], [m.read_ct for m in leases], 600)
        ).fetchall()
        sql.execute("RESET lock_timeout")
        assert sorted(rows) == [(locked.msg_id, False), (free.msg_id, True)]
    assert seconds_left(sql, free.msg_id) > 590
    assert seconds_left(sql, lost.msg_id) < 31  # the second reader's lease, untouched
    rows = sql.execute(EXTEND, (queue, [locked.msg_id], [locked.read_ct], 600)).fetchall()
    assert rows == []  # the ack committed: gone, not to be tried again


@pytest.mark.parametrize(
    ("ids", "read_cts", "vt", "error"),
    [
        ("{1,2}", "{1}", 30, "msg_ids and read_cts must be given, with the same length"),
        ("{1}", "{NULL}", 30, "read_ct must not be NULL"),
        ("{1}", "{1}", -1, "vt"),
    ],
)
def test_extend_leases_refuses_what_names_no_lease(
    sql: Any, queue: str, ids: str, read_cts: str | None, vt: int, error: str
) -> None:
    with pytest.raises(psycopg.Error, match=error):
        sql.execute(EXTEND, (queue, ids, read_cts, vt))


# -- acks are unfenced: what a stale holder's ack does, and why that is safe ---


def test_a_stale_holders_ack_ends_the_message_and_the_holders_ack_finds_nothing(
    client: Client, sql: Any, queue: str
) -> None:
    # The stale run finished the work: the message's job is done, whoever
    # acks first. The current run was a duplicate from the moment the first
    # overran its vt (at-least-once); its ack says the message is gone.
    client.send(queue, "job")
    a, b = take_over(client, sql, queue)
    assert client.delete(queue, a.msg_id) is True
    assert client.delete(queue, b.msg_id) is False
    assert client.set_vt(queue, b.msg_id, 30, read_ct=b.read_ct) is None  # B's heartbeat: lost
    assert client.metrics(queue).queue_length == 0


def test_a_barrier_member_acked_by_a_stale_and_a_current_holder_counts_once(
    client: Client, sql: Any
) -> None:
    client.create_queue("work")
    client.create_queue("done")
    bid = client.fan_out("work", ["m"], callback_queue="done", callback_message={})
    a, b = take_over(client, sql, "work")
    first = client.complete_member("work", a.msg_id, result={"by": "a"})
    assert first is not None and first.state == "fired" and first.succeeded == 1
    client.complete_member("work", b.msg_id, result={"by": "b"})
    s = client.barrier_status(bid)
    assert (s.succeeded, s.failed, s.remaining) == (1, 0, 0)
    assert [r.result for r in client.barrier_results(bid)] == [{"by": "a"}]
    assert len(client.read("done", vt=30, qty=10)) == 1


def test_a_stale_failure_verdict_on_a_member_is_refused_when_fenced(
    client: Client, sql: Any
) -> None:
    client.create_queue("work")
    client.create_queue("done")
    bid = client.fan_out("work", ["m"], callback_queue="done", callback_message={})
    a, b = take_over(client, sql, "work")
    assert client.complete_member("work", a.msg_id, outcome="failed", read_ct=a.read_ct) is None
    assert client.barrier_status(bid).remaining == 1  # not counted, not acked
    done = client.complete_member("work", b.msg_id, read_ct=b.read_ct)
    assert done is not None and (done.state, done.succeeded, done.failed) == ("fired", 1, 0)
