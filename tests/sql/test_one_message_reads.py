"""One-message reads (0025): the four-statement path hands out what a round of _take would.

A read of one message runs pgqueue._take_by_name's own statements when a round
of _take would do nothing else, and _take otherwise. These tests pin that it
takes that path (and not another), that it hands out the message a round
would (a hypothesis model with the round as its oracle), that real readers
hammering it share and lose nothing, that its lazy floors stay within their
bound, and that the delete trigger it relies on fires only for barrier members.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import psycopg
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test
from support.db import run_threads, stateful_settings

from pgqueue import Client

QUEUE = "one"


@pytest.fixture
def one(sql: psycopg.Connection[Any]) -> int:
    """The queue's id, with a queue created (5 attempts)."""
    sql.execute("SELECT pgqueue.create_queue(%s, 5)", (QUEUE,))
    row = sql.execute("SELECT queue_id FROM pgqueue.queue WHERE queue_name = %s", (QUEUE,))
    return int(row.fetchone()[0])  # type: ignore[index]


def function_calls(conn: psycopg.Connection[Any]) -> Counter[str]:
    """Calls of each pgqueue function this session made that the statistics have not taken yet."""
    return Counter(
        dict(
            conn.execute(
                "SELECT funcname, calls FROM pg_stat_xact_user_functions"
                " WHERE schemaname = 'pgqueue'"
            ).fetchall()
        )
    )


def calls_in_transaction(
    conn: psycopg.Connection[Any], statement: str, params: tuple[Any, ...]
) -> tuple[list[tuple[Any, ...]], Counter[str]]:
    """Run statement in a transaction of its own; its rows and the pgqueue functions it called."""
    with conn.transaction():
        conn.execute("SET LOCAL track_functions = 'all'")
        before = function_calls(conn)
        rows = conn.execute(statement, params).fetchall()
        calls = function_calls(conn) - before
    return rows, calls


def quiet(conn: psycopg.Connection[Any], queue_id: int) -> None:
    """No late sweep due for a minute, as between two sweeps of a busy queue."""
    conn.execute(
        f"SELECT setval('pgqueue.lane_{queue_id}_sweep',"
        " pgqueue._ts_us(clock_timestamp() + interval '1 minute'))"
    )


def test_a_one_message_read_of_a_quiet_queue_runs_no_round_and_a_batch_read_does(
    sql: psycopg.Connection[Any], one: int
) -> None:
    sql.execute("SELECT pgqueue.send_batch(%s, array_fill('{}'::jsonb, ARRAY[5]))", (QUEUE,))
    sql.execute("SELECT * FROM pgqueue.read(%s, 30, 1)", (QUEUE,))  # floors set on this server
    quiet(sql, one)
    for statement in (
        "SELECT msg_id FROM pgqueue.read(%s, 30, 1)",
        "SELECT msg_id FROM pgqueue.pop(%s)",
        "SELECT msg_id FROM pgqueue.read_with_poll(%s, 30, 1, 1, 10)",
    ):
        rows, calls = calls_in_transaction(sql, statement, (QUEUE,))
        assert len(rows) == 1, statement
        assert calls.get("_take_by_name") == 1, (statement, calls)
        assert "_take" not in calls, f"{statement} ran a round: {calls}"
    rows, calls = calls_in_transaction(sql, "SELECT msg_id FROM pgqueue.read(%s, 30, 2)", (QUEUE,))
    assert len(rows) == 1 and calls.get("_take") == 1, calls


@pytest.mark.parametrize(
    ("why", "setup"),
    [
        ("a sweep is due", "SELECT setval('pgqueue.lane_{id}_sweep', 1)"),
        ("a floor is above the clock", "SELECT setval('pgqueue.lane_{id}_fast_t', 9e15::bigint)"),
        ("the floors were set on another server", "SELECT setval('pgqueue.lane_{id}_server', 7)"),
        ("a row is listed for a recheck", "INSERT INTO pgqueue.recheck VALUES ({id}, 424242)"),
        ("the queue has groups", "UPDATE pgqueue.queue SET has_groups = true WHERE queue_id={id}"),
    ],
)
def test_a_one_message_read_runs_a_round_whenever_a_round_has_more_to_do(
    sql: psycopg.Connection[Any], one: int, why: str, setup: str
) -> None:
    (sent,) = sql.execute("SELECT pgqueue.send(%s, '1')", (QUEUE,)).fetchone()  # type: ignore[misc]
    quiet(sql, one)
    sql.execute(setup.format(id=one))
    rows, calls = calls_in_transaction(sql, "SELECT msg_id FROM pgqueue.read(%s, 30, 1)", (QUEUE,))
    assert rows == [(sent,)], why
    assert calls.get("_take") == 1, f"{why}: {calls}"


def test_a_one_message_read_in_a_transaction_that_wrote_runs_a_round(
    sql: psycopg.Connection[Any], one: int
) -> None:
    (sent,) = sql.execute("SELECT pgqueue.send(%s, '1')", (QUEUE,)).fetchone()  # type: ignore[misc]
    quiet(sql, one)
    with sql.transaction():
        sql.execute("SET LOCAL track_functions = 'all'")
        sql.execute("SELECT pgqueue.send(%s, '2')", (QUEUE,))
        before = function_calls(sql)
        rows = sql.execute("SELECT msg_id FROM pgqueue.read(%s, 30, 1)", (QUEUE,)).fetchall()
        calls = function_calls(sql) - before
    assert rows == [(sent,)]
    assert calls.get("_take") == 1, calls


def test_a_first_row_whose_attempts_ran_out_is_poisoned_and_the_next_is_handed_out(
    sql: psycopg.Connection[Any],
) -> None:
    sql.execute("SELECT pgqueue.create_queue('tired', 1)")
    (first,) = sql.execute("SELECT pgqueue.send('tired', '1')").fetchone()  # type: ignore[misc]
    assert sql.execute("SELECT msg_id FROM pgqueue.read('tired', 0, 1)").fetchall() == [(first,)]
    (second,) = sql.execute("SELECT pgqueue.send('tired', '2')").fetchone()  # type: ignore[misc]
    notices: list[str] = []
    sql.add_notice_handler(lambda d: notices.append(d.sqlstate or ""))
    got = sql.execute("SELECT msg_id, read_ct FROM pgqueue.read('tired', 30, 1)").fetchall()
    assert got == [(second, 1)]
    assert notices == ["PGQ10"], "the read told of the message it poison-dropped"
    row = sql.execute("SELECT msg_id FROM pgqueue.poison WHERE msg_id = %s", (first,)).fetchone()
    assert row == (first,)


def test_a_one_message_read_of_a_paused_queue_says_so_and_locks_nothing(
    sql: psycopg.Connection[Any], one: int
) -> None:
    sql.execute("SELECT pgqueue.send(%s, '1')", (QUEUE,))
    sql.execute("SELECT pgqueue.pause_queue(%s)", (QUEUE,))
    notices: list[str] = []
    sql.add_notice_handler(lambda d: notices.append(d.sqlstate or ""))
    assert sql.execute("SELECT * FROM pgqueue.read(%s, 30, 1)", (QUEUE,)).fetchall() == []
    assert sql.execute("SELECT * FROM pgqueue.pop(%s)", (QUEUE,)).fetchall() == []
    assert notices == ["PGQ11", "PGQ11"]
    assert sql.execute("SELECT read_ct FROM pgqueue.message").fetchall() == [(0,)]


def test_one_message_readers_never_share_a_message_and_leave_none_behind(
    client: Client, dsn: str
) -> None:
    client.create_queue("race", max_attempts=5)
    sent = client.send_batch("race", list(range(1200)))
    got: Counter[int] = Counter()
    lock = threading.Lock()

    def reader(i: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while True:
                if i % 2:
                    rows = conn.execute("SELECT msg_id FROM pgqueue.pop('race')").fetchall()
                else:
                    rows = conn.execute("SELECT msg_id FROM pgqueue.read('race', 300, 1)")
                    rows = rows.fetchall()
                    for (msg_id,) in rows:
                        conn.execute("SELECT pgqueue.delete('race', %s::bigint)", (msg_id,))
                if not rows:
                    visible = conn.execute("SELECT visible_length FROM pgqueue.metrics('race')")
                    if visible.fetchone() == (0,):
                        return
                with lock:
                    got.update(r[0] for r in rows)

    run_threads(8, reader)
    assert set(got) == set(sent), "a message was lost"
    assert max(got.values()) == 1, "a message was handed to two readers"
    assert client.metrics("race").queue_length == 0


def test_the_fresh_floor_trails_one_message_pops_by_at_most_8_ids(
    sql: psycopg.Connection[Any], one: int
) -> None:
    ids = [
        r[0]
        for r in sql.execute(
            "SELECT pgqueue.send_batch(%s, array_fill('{}'::jsonb, ARRAY[200]))", (QUEUE,)
        )
    ]
    sql.execute("SELECT pg_sleep(0.06)")  # older than the fresh lane's margin
    sql.execute("SELECT * FROM pgqueue.pop(%s)", (QUEUE,))  # floors set on this server
    quiet(sql, one)
    for n in range(2, 150):
        (popped,) = sql.execute("SELECT msg_id FROM pgqueue.pop(%s)", (QUEUE,)).fetchone()  # type: ignore[misc]
        assert popped == ids[n - 1]
        (floor_id,) = sql.execute(f"SELECT last_value FROM pgqueue.lane_{one}_fast_f_id").fetchone()  # type: ignore[misc]
        assert popped - 9 <= floor_id <= popped, f"after {n} pops the floor is at {floor_id}"


def test_a_delete_that_takes_no_barrier_member_runs_no_trigger_function(
    sql: psycopg.Connection[Any], one: int
) -> None:
    ids = [
        r[0]
        for r in sql.execute(
            "SELECT pgqueue.send_batch(%s, array_fill('{}'::jsonb, ARRAY[4]))", (QUEUE,)
        )
    ]
    for statement, params in (
        ("SELECT pgqueue.delete(%s, %s::bigint)", (QUEUE, ids[0])),
        ("SELECT pgqueue.archive(%s, %s::bigint)", (QUEUE, ids[1])),
        ("SELECT * FROM pgqueue.delete(%s, %s::bigint[])", (QUEUE, ids[2:3])),
        ("SELECT * FROM pgqueue.pop(%s)", (QUEUE,)),
    ):
        rows, calls = calls_in_transaction(sql, statement, params)
        assert rows and rows[0][0] not in (None, False), statement
        assert "_members_gone" not in calls and "_count_gone" not in calls, (statement, calls)


def test_members_deleted_one_by_one_in_batches_and_by_pop_count_once_each(
    sql: psycopg.Connection[Any], one: int
) -> None:
    sql.execute(
        "SELECT pgqueue.fan_out(%s, array_fill('{}'::jsonb, ARRAY[9]), %s, '{}', 'b1')",
        (QUEUE, QUEUE),
    )
    members = [
        r[0]
        for r in sql.execute(
            "SELECT msg_id FROM pgqueue.barrier_member WHERE barrier_id = 'b1'"
            " ORDER BY member_index"
        )
    ]
    assert len(members) == 9
    rows, calls = calls_in_transaction(
        sql, "SELECT pgqueue.delete(%s, %s::bigint)", (QUEUE, members[0])
    )
    assert rows == [(True,)] and calls.get("_count_gone") == 1, calls
    rows, calls = calls_in_transaction(
        sql, "SELECT * FROM pgqueue.delete(%s, %s::bigint[])", (QUEUE, members[1:5])
    )
    assert len(rows) == 4
    assert calls.get("_members_gone") == 4 and calls.get("_count_gone") == 1, calls
    sql.execute("SELECT pgqueue.archive(%s, %s::bigint)", (QUEUE, members[5]))
    # a pop of the rest, then a second delete of one already gone: no double count
    left = {r[0] for r in sql.execute("SELECT msg_id FROM pgqueue.pop(%s, 10)", (QUEUE,))}
    assert left == set(members[6:])
    assert sql.execute("SELECT pgqueue.delete(%s, %s::bigint)", (QUEUE, members[0])).fetchone() == (
        False,
    )
    done = sql.execute(
        "SELECT remaining, succeeded, state FROM pgqueue.barrier WHERE barrier_id = 'b1'"
    ).fetchone()
    assert done == (0, 9, "fired")
    callbacks = sql.execute(
        "SELECT count(*) FROM pgqueue.message WHERE headers ? '_pg_transport'"
    ).fetchone()
    assert callbacks == (1,)


class OneMessageReads(RuleBasedStateMachine):
    """One-message reads against the round they stand for.

    Before each read, the same read is made by _take itself (a round) in a
    transaction that is rolled back: the read must hand out the message the
    round did. Only the lanes' fast floors survive a rollback (sequences), and
    a round moves them only up to rows that it locked first, so the read
    meets the queue the round met.
    """

    conn: psycopg.Connection[Any]

    def __init__(self) -> None:
        super().__init__()
        self.conn.execute("SELECT pgqueue.drop_queue(%s)", (QUEUE,))
        self.conn.execute("SELECT pgqueue.create_queue(%s, 2)", (QUEUE,))
        self.leased: list[tuple[int, int]] = []

    def _round(self, vt: int, remove: bool) -> list[Any]:
        with self.conn.transaction(force_rollback=True):
            return self.conn.execute(
                "SELECT t.msg_id FROM pgqueue.queue q,"
                " LATERAL pgqueue._take(q, %s, 1, %s) t WHERE q.queue_name = %s",
                (vt, remove, QUEUE),
            ).fetchall()

    @rule(n=st.integers(1, 3), delay=st.sampled_from([0, 0, 1]))
    def send(self, n: int, delay: int) -> None:
        self.conn.execute(
            "SELECT pgqueue.send_batch(%s, array_fill('{}'::jsonb, ARRAY[%s]), NULL, %s)",
            (QUEUE, n, delay),
        )

    @rule(vt=st.sampled_from([0, 0, 30]))
    def read(self, vt: int) -> None:
        expected = self._round(vt, False)
        got = self.conn.execute(
            "SELECT msg_id, read_ct FROM pgqueue.read(%s, %s, 1)", (QUEUE, vt)
        ).fetchall()
        assert [r[0] for r in got] == [r[0] for r in expected]
        self.leased += got

    @rule()
    def pop(self) -> None:
        expected = self._round(0, True)
        got = self.conn.execute("SELECT msg_id FROM pgqueue.pop(%s)", (QUEUE,)).fetchall()
        assert got == expected

    @rule(data=st.data())
    def nack(self, data: st.DataObject) -> None:
        if self.leased:
            msg_id, read_ct = data.draw(st.sampled_from(self.leased))
            self.conn.execute("SELECT pgqueue.nack(%s, %s, %s, 0, 'no')", (QUEUE, msg_id, read_ct))

    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        if self.leased:
            msg_id, _ = data.draw(st.sampled_from(self.leased))
            self.conn.execute("SELECT pgqueue.delete(%s, %s::bigint)", (QUEUE, msg_id))

    @rule()
    def wait(self) -> None:
        self.conn.execute("SELECT pg_sleep(0.06)")


def test_a_one_message_read_hands_out_what_a_round_would(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        OneMessageReads.conn = conn
        run_state_machine_as_test(OneMessageReads, settings=stateful_settings(30, 40))
