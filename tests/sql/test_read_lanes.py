"""Read lanes (0005, 0026): nothing a fast floor passes over is lost, under real races.

A read starts at its lane's fast floor and skips what lies below it; the late
sweep, about once a second, finds what the fast floors passed over and raises
the safe floors. Each test here first makes the floors pass over a row that
is not deliverable yet (a send not committed, a claim or an ack not rolled
back yet), checks that they did, then makes the row deliverable and checks
that a read still finds it.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections import Counter
from typing import Any

import psycopg
import pytest
from support.db import wait_until

QUEUE = "lanes"


@pytest.fixture
def lanes(sql: psycopg.Connection[Any]) -> int:
    """The queue's id, with a queue created."""
    sql.execute("SELECT pgqueue.create_queue(%s, 50)", (QUEUE,))
    row = sql.execute("SELECT queue_id FROM pgqueue.queue WHERE queue_name = %s", (QUEUE,))
    return int(row.fetchone()[0])  # type: ignore[index]


def floor(conn: psycopg.Connection[Any], queue_id: int, which: str) -> float:
    """A floor or watermark time of the queue, in seconds since the epoch."""
    row = conn.execute(
        f"SELECT extract(epoch FROM pgqueue._us_ts(last_value))::float8"
        f" FROM pgqueue.lane_{queue_id}_{which}"
    ).fetchone()
    assert row is not None
    return float(row[0])


def floor_id(conn: psycopg.Connection[Any], queue_id: int, which: str) -> int:
    """A floor of the fresh lane (fast_f_id, safe_f_id): no message below it is read there."""
    row = conn.execute(f"SELECT last_value FROM pgqueue.lane_{queue_id}_{which}").fetchone()
    assert row is not None
    return int(row[0])


def last_id(conn: psycopg.Connection[Any]) -> int:
    """The last msg_id the queue has handed out, sent or not."""
    row = conn.execute(
        "SELECT coalesce(pg_sequence_last_value(msg_seq), 0) FROM pgqueue.queue"
        " WHERE queue_name = %s",
        (QUEUE,),
    ).fetchone()
    assert row is not None
    return int(row[0])


def epoch(conn: psycopg.Connection[Any], msg_id: int) -> float:
    """The vt of a message, in seconds since the epoch, as another session sees it."""
    row = conn.execute(
        "SELECT extract(epoch FROM vt)::float8 FROM pgqueue.message WHERE msg_id = %s", (msg_id,)
    ).fetchone()
    assert row is not None, f"message {msg_id} is not visible"
    return float(row[0])


class Traffic:
    """Background sends and reads of `qty` messages, each acked, that keep the floors moving.

    qty 1 reads take pgqueue._take_by_name's one-message path (0025); larger
    ones run _take's rounds.
    """

    def __init__(self, dsn: str, consumers: int = 2, qty: int = 10) -> None:
        self.dsn = dsn
        self.qty = qty
        self.stop = threading.Event()
        self.got: Counter[int] = Counter()
        self.lock = threading.Lock()
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._produce)] + [
            threading.Thread(target=self._consume) for _ in range(consumers)
        ]

    def __enter__(self) -> Traffic:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()
        if self.errors:
            raise self.errors[0]

    def _produce(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self.stop.is_set():
                    conn.execute(
                        "SELECT pgqueue.send_batch(%s, array_fill('{}'::jsonb, ARRAY[20]))",
                        (QUEUE,),
                    )
                    time.sleep(0.01)
        except BaseException as exc:
            self.errors.append(exc)

    def _consume(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self.stop.is_set():
                    ids = [
                        r[0]
                        for r in conn.execute(
                            "SELECT msg_id FROM pgqueue.read(%s, 30, %s)", (QUEUE, self.qty)
                        ).fetchall()
                    ]
                    with self.lock:
                        self.got.update(ids)
                    if ids:
                        conn.execute("SELECT pgqueue.delete(%s, %s::bigint[])", (QUEUE, ids))
                    else:
                        time.sleep(0.005)
        except BaseException as exc:
            self.errors.append(exc)

    def saw(self, msg_id: int) -> int:
        """How often the traffic's consumers were handed this message."""
        with self.lock:
            return self.got[msg_id]


def send(conn: psycopg.Connection[Any]) -> tuple[int, float]:
    """Send one message in the connection's open transaction; its id and vt (epoch seconds)."""
    (msg_id,) = conn.execute("SELECT pgqueue.send(%s, '{}')", (QUEUE,)).fetchone()  # type: ignore[misc]
    return msg_id, epoch(conn, msg_id)


def passes_over(sql: psycopg.Connection[Any], queue_id: int, which: str, msg_id: int) -> None:
    """Wait until the fresh lane's floor (fast or safe) is above msg_id: the row lies below it."""
    wait_until(lambda: floor_id(sql, queue_id, which) > msg_id, timeout=120)


def late_sweeps(sql: psycopg.Connection[Any], queue_id: int, seconds: float) -> None:
    """Wait until the late sweeps have gone on for `seconds` from now (about one a second).

    Seen, not guessed from a pause a loaded machine may fill with nothing: a sweep
    sets the queue's next one a second after its own start (the lane's `sweep`).
    """
    (now,) = sql.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()  # type: ignore[misc]
    wait_until(lambda: floor(sql, queue_id, "sweep") > now + seconds + 1, timeout=120)


@pytest.mark.parametrize("qty", [1, 10])
def test_a_send_committed_late_is_delivered(
    dsn: str, sql: psycopg.Connection[Any], lanes: int, qty: int
) -> None:
    with psycopg.connect(dsn) as late, Traffic(dsn, qty=qty) as traffic:
        msg_id, _ = send(late)
        passes_over(sql, lanes, "fast_f_id", msg_id)
        late_sweeps(sql, lanes, 1.5)  # a few late sweeps while the send is still open
        safe = floor_id(sql, lanes, "safe_f_id")
        assert safe <= msg_id, "the safe floor passed an open writer's row"
        late.commit()
        wait_until(lambda: traffic.saw(msg_id) == 1)
    assert traffic.saw(msg_id) == 1


@pytest.mark.parametrize("qty", [1, 10])
def test_a_send_whose_transaction_was_idle_before_it_is_delivered(
    dsn: str, sql: psycopg.Connection[Any], lanes: int, qty: int
) -> None:
    """An open transaction with no writes yet holds no floor; its later send must be found."""
    with psycopg.connect(dsn) as late, Traffic(dsn, qty=qty) as traffic:
        late.execute("SELECT 1")  # the transaction begins here, without a transaction id
        began = last_id(sql)
        wait_until(lambda: floor_id(sql, lanes, "safe_f_id") > began, timeout=120)
        msg_id, _ = send(late)
        passes_over(sql, lanes, "fast_f_id", msg_id)
        late_sweeps(sql, lanes, 1.5)
        late.commit()
        wait_until(lambda: traffic.saw(msg_id) == 1)


@pytest.mark.parametrize("qty", [1, 10])
def test_a_rolled_back_claim_is_delivered_again(
    dsn: str, sql: psycopg.Connection[Any], lanes: int, qty: int
) -> None:
    (msg_id,) = sql.execute("SELECT pgqueue.send(%s, '{\"claimed\": 1}')", (QUEUE,)).fetchone()  # type: ignore[misc]
    with psycopg.connect(dsn) as claimer:
        rows = claimer.execute("SELECT msg_id FROM pgqueue.read(%s, 30, 1)", (QUEUE,)).fetchall()
        assert rows == [(msg_id,)]
        with Traffic(dsn, qty=qty) as traffic:
            passes_over(sql, lanes, "fast_f_id", msg_id)
            late_sweeps(sql, lanes, 1.5)
            claimer.rollback()
            wait_until(lambda: traffic.saw(msg_id) == 1)
    row = sql.execute(
        "SELECT count(*) FROM pgqueue.message WHERE msg_id = %s", (msg_id,)
    ).fetchone()
    assert row == (0,)


@pytest.mark.parametrize("qty", [1, 10])
def test_a_row_skipped_while_an_ack_held_it_is_delivered_when_the_ack_rolls_back(
    dsn: str, sql: psycopg.Connection[Any], lanes: int, qty: int
) -> None:
    (msg_id,) = sql.execute("SELECT pgqueue.send(%s, '{\"held\": 1}')", (QUEUE,)).fetchone()  # type: ignore[misc]
    with psycopg.connect(dsn) as acker:
        assert acker.execute(
            "SELECT pgqueue.delete(%s, %s::bigint)", (QUEUE, msg_id)
        ).fetchone() == (True,)
        with Traffic(dsn, qty=qty) as traffic:
            passes_over(sql, lanes, "fast_f_id", msg_id)
            late_sweeps(sql, lanes, 1.5)
            assert traffic.saw(msg_id) == 0
            acker.rollback()
            wait_until(lambda: traffic.saw(msg_id) == 1)


@pytest.mark.parametrize("qty", [1, 10])
def test_a_lease_moved_into_the_past_by_hand_is_found_below_the_floors(
    sql: psycopg.Connection[Any], lanes: int, qty: int, dsn: str
) -> None:
    (msg_id,) = sql.execute("SELECT pgqueue.send(%s, '{\"lease\": 1}')", (QUEUE,)).fetchone()  # type: ignore[misc]
    assert sql.execute("SELECT msg_id FROM pgqueue.read(%s, 3600, 1)", (QUEUE,)).fetchall() == [
        (msg_id,)
    ]
    with Traffic(dsn, qty=qty) as traffic:
        # the safe floor has caught up with the present (a fixed mark: a "now" moving
        # with each look is a target a loaded machine's sweeps may never hit)
        mark = time.time()
        wait_until(lambda: floor(sql, lanes, "safe_t") > mark - 2, timeout=120)
        # far below every floor of the timed lane, where no read looks; the
        # listing is looked at in the same transaction (once committed, the
        # traffic's reads take the row and clear it at once)
        with sql.transaction():
            sql.execute(
                "UPDATE pgqueue.message SET vt = now() - interval '1 day' WHERE msg_id = %s",
                (msg_id,),
            )
            assert sql.execute("SELECT count(*) FROM pgqueue.recheck").fetchone() == (1,)
        wait_until(lambda: traffic.saw(msg_id) == 1)

    def unlisted() -> bool:
        # a read clears listings whose rows are gone (one that a concurrent read
        # held locked is left for the next)
        sql.execute("SELECT count(*) FROM pgqueue.read(%s, 30, 1)", (QUEUE,))
        return sql.execute("SELECT count(*) FROM pgqueue.recheck").fetchone() == (0,)

    wait_until(unlisted)


def test_an_idle_repeatable_read_snapshot_does_not_hold_the_safe_floors(
    dsn: str, sql: psycopg.Connection[Any], lanes: int
) -> None:
    with psycopg.connect(dsn) as holder, Traffic(dsn):
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM pgqueue.message").fetchone()
        time.sleep(1)
        began = last_id(sql)  # drawn a second after the snapshot was taken
        wait_until(lambda: floor_id(sql, lanes, "safe_f_id") > began, timeout=120)
        holder.rollback()


def test_a_writer_holding_a_transaction_id_holds_the_safe_floors(
    dsn: str, sql: psycopg.Connection[Any], lanes: int
) -> None:
    with psycopg.connect(dsn) as writer, Traffic(dsn):
        began_id = last_id(sql)
        writer.execute("SELECT pg_current_xact_id()")  # takes a transaction id
        began = time.time()
        late_sweeps(sql, lanes, 3)  # sweeps run about once a second
        assert last_id(sql) > began_id + 100, "the traffic kept sending"
        # the writer might send a message with any id drawn from now on
        assert floor_id(sql, lanes, "safe_f_id") <= began_id + 1
        assert floor(sql, lanes, "safe_t") < began
        writer.rollback()
        wait_until(lambda: floor_id(sql, lanes, "safe_f_id") > began_id + 1, timeout=120)


def test_late_commits_rolled_back_claims_and_acks_lose_nothing(
    dsn: str, sql: psycopg.Connection[Any], lanes: int
) -> None:
    """Producers that commit late or roll back, consumers that roll back claims and
    acks, an old snapshot held: every committed message is acked exactly once."""
    committed: set[int] = set()
    acked: Counter[int] = Counter()
    lock = threading.Lock()
    stop = threading.Event()
    produced = threading.Event()  # every producer has finished its last transaction
    errors: list[BaseException] = []

    def producer(seed: int) -> None:
        rnd = random.Random(seed)
        with psycopg.connect(dsn) as conn:
            while not stop.is_set():
                ids = [
                    r[0]
                    for r in conn.execute(
                        "SELECT pgqueue.send_batch(%s, array_fill('{}'::jsonb, ARRAY[%s]))",
                        (QUEUE, rnd.randint(1, 20)),
                    ).fetchall()
                ]
                time.sleep(rnd.choice([0, 0, 0.01, 0.2, 1.5]))  # some commit late
                if rnd.random() < 0.1:
                    conn.rollback()
                else:
                    conn.commit()
                    with lock:
                        committed.update(ids)

    def consumer(seed: int) -> None:
        rnd = random.Random(seed)
        with psycopg.connect(dsn) as conn:
            while True:
                ids = [
                    r[0]
                    for r in conn.execute(
                        "SELECT msg_id FROM pgqueue.read(%s, 30, %s)", (QUEUE, rnd.randint(1, 10))
                    ).fetchall()
                ]
                if not ids:
                    conn.rollback()
                    if produced.is_set() and done():
                        return
                    time.sleep(0.01)
                    continue
                time.sleep(rnd.choice([0] * 18 + [0.05, 0.3]))  # a few hold their claims
                roll = rnd.random()
                if roll < 0.1:
                    conn.rollback()  # the claim rolls back
                    continue
                gone = [
                    r[0]
                    for r in conn.execute(
                        "SELECT * FROM pgqueue.delete(%s, %s::bigint[])", (QUEUE, ids)
                    ).fetchall()
                ]
                assert sorted(gone) == sorted(ids), "a claimed message was gone before its ack"
                if roll < 0.2:
                    conn.rollback()  # the ack rolls back, and the claim with it
                    continue
                conn.commit()
                with lock:
                    acked.update(gone)

    def done() -> bool:
        with lock:
            return committed <= set(acked)

    def guarded(target: Any, seed: int) -> None:
        try:
            target(seed)
        except BaseException as exc:
            errors.append(exc)
            stop.set()
            produced.set()

    with psycopg.connect(dsn) as holder:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM pgqueue.message").fetchone()
        producers = [threading.Thread(target=guarded, args=(producer, i)) for i in range(3)]
        threads = producers + [
            threading.Thread(target=guarded, args=(consumer, 100 + i)) for i in range(4)
        ]
        for t in threads:
            t.start()
        # 8 s of it, and more on a loaded machine until enough was sent to count
        started = time.monotonic()
        wait_until(
            lambda: errors or (time.monotonic() - started >= 8 and len(committed) > 200),
            timeout=120,
        )
        stop.set()
        for t in producers:
            t.join()
        produced.set()
        deadline = time.monotonic() + 120
        for t in threads:
            t.join(max(0.1, deadline - time.monotonic()))
        holder.rollback()
    assert not errors, errors[0]
    if any(t.is_alive() for t in threads):
        lost = sorted(committed - set(acked))
        rows = sql.execute(
            "SELECT msg_id, read_ct, enqueued_at, vt FROM pgqueue.message"
            " WHERE msg_id = ANY(%s) ORDER BY msg_id LIMIT 5",
            (lost,),
        ).fetchall()
        floors = {
            w: floor_id(sql, lanes, w) for w in ("fast_f_id", "fast_t", "safe_f_id", "safe_t")
        }
        raise AssertionError(
            f"not drained: {len(lost)} committed messages never acked: {rows}; floors {floors}"
        )
    assert len(committed) > 200
    assert set(acked) == committed
    assert max(acked.values()) == 1
    assert sql.execute("SELECT count(*) FROM pgqueue.message").fetchone() == (0,)


def test_a_clock_that_went_back_does_not_hide_new_messages_below_the_floors(
    sql: psycopg.Connection[Any], lanes: int
) -> None:
    # Every time floor and watermark is at most the time of the read that set
    # it; a clock that steps back (NTP, a failover to a server whose clock is
    # behind) leaves them all in the future, as this does.
    for which in ("mark_f", "fast_t", "smark_f", "safe_t"):
        sql.execute(
            f"SELECT setval('pgqueue.lane_{lanes}_{which}',"
            " pgqueue._ts_us(clock_timestamp() + interval '1 hour'))"
        )
    sql.execute(
        "SELECT setval(%s, pgqueue._ts_us(clock_timestamp() + interval '1 hour'))",
        (f"pgqueue.lane_{lanes}_sweep",),
    )
    (msg_id,) = sql.execute("SELECT pgqueue.send(%s, '1')", (QUEUE,)).fetchone()  # type: ignore[misc]
    got = sql.execute("SELECT msg_id FROM pgqueue.read(%s, 30, 10)", (QUEUE,)).fetchall()
    assert got == [(msg_id,)], "the first read after the clock went back finds the new message"
    for which in ("mark_f", "fast_t", "smark_f", "safe_t"):
        assert floor(sql, lanes, which) < time.time()


def test_a_failover_to_a_clock_behind_hides_nothing_from_a_read_after_it_caught_up(
    sql: psycopg.Connection[Any], lanes: int
) -> None:
    # The floors were set by reads on another server (the old primary), whose
    # clock was 2 s ahead of this one's and whose sends this one never got, so
    # it hands their msg_ids out again. Sends land below the floors; nobody
    # reads until this clock has caught up, so no read starts below a floor.
    sql.execute("SELECT msg_id FROM pgqueue.read(%s, 30, 10)", (QUEUE,))  # floors exist
    ahead = "pgqueue._ts_us(clock_timestamp() + interval '2 seconds')"
    for which in ("mark_f", "fast_t", "smark_f", "safe_t", "sweep"):
        sql.execute(f"SELECT setval('pgqueue.lane_{lanes}_{which}', {ahead})")
    for which in ("fast_f_id", "safe_f_id", "mark_f_id", "smark_f_id"):
        sql.execute(f"SELECT setval('pgqueue.lane_{lanes}_{which}', 1000)")
    sql.execute(
        f"SELECT setval('pgqueue.lane_{lanes}_server',"
        " pgqueue._ts_us(pg_postmaster_start_time() - interval '1 day'))"
    )
    (msg_id,) = sql.execute("SELECT pgqueue.send(%s, '1')", (QUEUE,)).fetchone()  # type: ignore[misc]
    assert epoch(sql, msg_id) < floor(sql, lanes, "safe_t")
    assert msg_id < floor_id(sql, lanes, "safe_f_id")
    time.sleep(2.2)
    assert time.time() > floor(sql, lanes, "smark_f"), "the clock has caught up"
    got = sql.execute("SELECT msg_id FROM pgqueue.read(%s, 30, 10)", (QUEUE,)).fetchall()
    assert got == [(msg_id,)], "the first read on this server found the send below the floors"
    here = sql.execute("SELECT pgqueue._ts_us(pg_postmaster_start_time())").fetchone()
    assert sql.execute(f"SELECT last_value FROM pgqueue.lane_{lanes}_server").fetchone() == here


def test_a_message_prepared_during_a_sweep_is_read_after_commit_prepared(
    own_cluster: Any,
) -> None:
    """Two-phase commit: a PREPARE landing inside a sweep's look at the writers.

    The window is widened as an attacker would: sessions whose last statement
    is a megabyte long make every read of pg_stat_activity take milliseconds.
    A producer keeps a send open past the safe floors' one second margin, then
    PREPAREs while readers sweep back to back, round after round; after COMMIT
    PREPARED every message must be read.
    """
    from support.db import migrated_database

    settings = {"max_prepared_transactions": "20", "track_activity_query_size": "1MB"}
    with own_cluster(settings) as cluster:
        dsn = migrated_database(cluster.dsn)
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute("SELECT pgqueue.create_queue(%s, 50)", (QUEUE,))
            (qid,) = admin.execute("SELECT queue_id FROM pgqueue.queue").fetchone()  # type: ignore[misc]
        idle = [psycopg.connect(dsn, autocommit=True) for _ in range(20)]
        padding = "x" * 1_000_000
        for conn in idle:
            conn.execute(f"SELECT 1 /* {padding} */")
        seen: set[int] = set()
        stop = threading.Event()

        def sweep_and_read() -> None:
            with psycopg.connect(dsn, autocommit=True) as conn:
                while not stop.is_set():
                    conn.execute(f"SELECT setval('pgqueue.lane_{qid}_sweep', 1)")  # sweep now
                    ids = [
                        r[0]
                        for r in conn.execute(
                            "SELECT msg_id FROM pgqueue.read(%s, 30, 10)", (QUEUE,)
                        ).fetchall()
                    ]
                    if ids:
                        seen.update(ids)
                        conn.execute("SELECT pgqueue.delete(%s, %s::bigint[])", (QUEUE, ids))

        readers = [threading.Thread(target=sweep_and_read) for _ in range(2)]
        for t in readers:
            t.start()
        sent: list[int] = []
        try:
            with psycopg.connect(dsn, autocommit=True) as finisher:
                for round_ in range(10):
                    with psycopg.connect(dsn) as producer:
                        (msg_id,) = producer.execute(
                            "SELECT pgqueue.send(%s, '1')", (QUEUE,)
                        ).fetchone()  # type: ignore[misc]
                        time.sleep(1.2 + random.uniform(0, 0.1))  # past the floors' margin
                        producer.execute(f"PREPARE TRANSACTION 'p{round_}'")
                    sent.append(msg_id)
                    time.sleep(0.3)  # the sweeps that looked during the PREPARE are over
                    finisher.execute(f"COMMIT PREPARED 'p{round_}'")
            wait_until(lambda: seen >= set(sent))
        finally:
            stop.set()
            for t in readers:
                t.join()
            for conn in idle:
                conn.close()
        assert set(sent) <= seen


def test_a_message_deleted_and_read_past_in_a_rolled_back_transaction_is_read_at_once(
    dsn: str,
) -> None:
    """The read after the rollback finds it, not the late sweep a second later."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pgqueue.create_queue('q')")
        for _ in range(3):
            (msg_id,) = conn.execute("SELECT pgqueue.send('q', '1')").fetchone() or ()
            time.sleep(0.2)  # older than the fast floor's margin
            with conn.transaction(force_rollback=True):
                assert conn.execute("SELECT pgqueue.delete('q', %s)", (msg_id,)).fetchone() == (
                    True,
                )
                assert conn.execute("SELECT msg_id FROM pgqueue.read('q', 30, 1)").fetchall() == []
            got = conn.execute("SELECT msg_id FROM pgqueue.read('q', 30, 1)").fetchall()
            assert got == [(msg_id,)]
            conn.execute("SELECT pgqueue.delete('q', %s)", (msg_id,))


def test_a_queue_lists_its_lane_sequences_and_a_read_without_the_list_finds_them_by_name(
    sql: psycopg.Connection[Any], lanes: int
) -> None:
    """queue.lane_seqs names the ten sequences in order; a row without it reads by name."""
    names = ["fast_f_id", "mark_f", "fast_t", "safe_f_id", "safe_t", "sweep", "server"]
    names += ["mark_f_id", "smark_f", "smark_f_id"]
    row = sql.execute(
        "SELECT lane_seqs::text[] FROM pgqueue.queue WHERE queue_id = %s", (lanes,)
    ).fetchone()
    assert row is not None
    assert row[0] == [f"pgqueue.lane_{lanes}_{w}" for w in names]

    sql.execute("UPDATE pgqueue.queue SET lane_seqs = NULL WHERE queue_id = %s", (lanes,))
    sent = sql.execute("SELECT pgqueue.send(%s, '{\"n\": 1}')", (QUEUE,)).fetchone()
    assert sent is not None
    time.sleep(0.1)  # older than the fresh lane's margin: the read moves the fast floor to it
    got = sql.execute("SELECT msg_id FROM pgqueue.read(%s, 30, 1)", (QUEUE,)).fetchall()
    assert got == [(sent[0],)]
    assert floor_id(sql, lanes, "fast_f_id") == sent[0]


def test_a_sweep_that_waited_on_a_barrier_row_spaces_the_next_one_by_its_scans_alone(
    dsn: str, sql: psycopg.Connection[Any], lanes: int
) -> None:
    """A slow sweep spaces out the next (20x its duration), but a lock it waited on after its
    scans is no sweep's cost: before, a pop that waited 3 s for a barrier's row put the next
    sweep a minute away, and a lease rolled back under a moved floor waited that long."""
    sql.execute("SELECT pgqueue.create_queue('callbacks')")
    sql.execute(
        "SELECT pgqueue.open_barrier(%s, 'callbacks', '{}', 'b1', messages => ARRAY['{}'::jsonb])",
        (QUEUE,),
    )
    sql.execute(f"SELECT setval('pgqueue.lane_{lanes}_sweep', 1)")  # a sweep is due
    with psycopg.connect(dsn) as holder:
        # a member added in a transaction still open holds the barrier's row
        holder.execute("SELECT pgqueue.add_members('b1', ARRAY['{}'::jsonb])")

        def pop() -> None:  # the sweeping pop takes the first member and counts it: it waits
            with psycopg.connect(dsn, autocommit=True) as conn:
                assert len(conn.execute("SELECT * FROM pgqueue.pop(%s)", (QUEUE,)).fetchall()) == 1

        popper = threading.Thread(target=pop)
        popper.start()
        time.sleep(3)
        holder.commit()
        popper.join()
    (due_in,) = sql.execute(
        f"SELECT (last_value - pgqueue._ts_us(clock_timestamp())) / 1e6::float8"
        f" FROM pgqueue.lane_{lanes}_sweep"
    ).fetchone()  # type: ignore[misc]
    # a minute away before the fix; about a second now (room for a loaded machine's scans)
    assert due_in < 10, f"the next sweep is {due_in:.1f} s away"
    with psycopg.connect(dsn) as reader:  # a one-message lease, rolled back under a moved floor
        rows = reader.execute("SELECT msg_id FROM pgqueue.read(%s, 30, 1)", (QUEUE,)).fetchall()
        assert len(rows) == 1
        (leased,) = rows[0]
        sql.execute("SELECT pgqueue.send(%s, '2')", (QUEUE,))
        time.sleep(0.1)
        assert len(sql.execute("SELECT * FROM pgqueue.pop(%s)", (QUEUE,)).fetchall()) == 1
        reader.rollback()
    wait_until(
        lambda: (
            sql.execute("SELECT msg_id FROM pgqueue.pop(%s)", (QUEUE,)).fetchall() == [(leased,)]
        ),
    )


@pytest.mark.parametrize("qty", [1, 10])
def test_a_watermark_recorded_after_a_read_began_does_not_start_its_lanes_over(
    sql: psycopg.Connection[Any], lanes: int, qty: int
) -> None:
    """A watermark's time is the clock's when another read recorded it, which can be after
    this read began: seen ahead of this read's start, it is no clock gone back. Counted as
    one (as first built), such a race reset the queue's floors to the bottom."""
    sql.execute("SELECT pgqueue.send_batch(%s, array_fill('1'::jsonb, ARRAY[40]))", (QUEUE,))
    time.sleep(0.1)  # older than the fresh lane's margin
    ids = [r[0] for r in sql.execute("SELECT msg_id FROM pgqueue.read(%s, 30, 20)", (QUEUE,))]
    sql.execute("SELECT pgqueue.delete(%s, %s::bigint[])", (QUEUE, ids))
    sql.execute("SELECT msg_id FROM pgqueue.read(%s, 30, 5)", (QUEUE,))  # the floor to the 21st
    assert floor_id(sql, lanes, "fast_f_id") == 21
    # nothing lies below 21 any more: a safe floor there is right, and only a
    # reset (or a sweep raising it) would move it
    sql.execute(f"SELECT setval('pgqueue.lane_{lanes}_safe_f_id', 21)")
    for which in ("mark_f", "smark_f"):
        sql.execute(
            f"SELECT setval('pgqueue.lane_{lanes}_{which}',"
            " pgqueue._ts_us(clock_timestamp() + interval '5 milliseconds'))"
        )
    got = sql.execute("SELECT msg_id FROM pgqueue.read(%s, 30, %s)", (QUEUE, qty)).fetchall()
    assert len(got) == qty
    assert floor_id(sql, lanes, "safe_f_id") >= 21, "the lanes started over from the bottom"


def test_watermarks_ahead_of_the_clock_are_recorded_anew(
    sql: psycopg.Connection[Any], lanes: int
) -> None:
    """A watermark recorded before the clock went back by more than a second would wait
    that long to be used, and the floors with it: it is recorded anew instead."""
    sql.execute("SELECT pgqueue.send_batch(%s, array_fill('1'::jsonb, ARRAY[3]))", (QUEUE,))
    for which in ("mark_f", "smark_f"):
        sql.execute(
            f"SELECT setval('pgqueue.lane_{lanes}_{which}',"
            " pgqueue._ts_us(clock_timestamp() + interval '1 hour'))"
        )
    sql.execute(f"SELECT setval('pgqueue.lane_{lanes}_sweep', 1)")  # a sweep is due
    assert len(sql.execute("SELECT msg_id FROM pgqueue.read(%s, 30, 2)", (QUEUE,)).fetchall()) == 2
    assert len(sql.execute("SELECT msg_id FROM pgqueue.read(%s, 30, 1)", (QUEUE,)).fetchall()) == 1
    for which in ("mark_f", "smark_f"):
        assert floor(sql, lanes, which) < time.time() + 0.01, which


def test_the_safe_floor_keeps_up_while_statements_that_may_write_overlap_without_pause(
    dsn: str, sql: psycopg.Connection[Any], lanes: int
) -> None:
    """Running statements count as writers from their start (_oldest_writer): here two
    sessions run 2 s statements in turn, overlapping, so some statement is always running
    and the oldest began up to 2 s ago. The safe floor must still follow the sends,
    a few seconds behind (those 2 s, the 1 s margin, the watermark's and the sweeps'
    steps), not wait for a pause that never comes."""
    stop = threading.Event()

    def overlap(delay: float) -> None:
        time.sleep(delay)
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not stop.is_set():
                conn.execute("SELECT pg_sleep(2)")

    sleepers = [threading.Thread(target=overlap, args=(d,)) for d in (0, 1.0)]
    for t in sleepers:
        t.start()
    samples: list[tuple[float, int, int]] = []  # (when, last msg_id drawn, safe floor)
    try:
        with Traffic(dsn):
            time.sleep(4)
            for _ in range(16):
                time.sleep(0.5)
                samples.append((time.time(), last_id(sql), floor_id(sql, lanes, "safe_f_id")))
    finally:
        stop.set()
        for t in sleepers:
            t.join()
    rate = (samples[-1][1] - samples[0][1]) / (samples[-1][0] - samples[0][0])
    assert rate > 100, f"the traffic sent {rate:.0f} messages/s"
    lags = [(drawn - safe) / rate for _, drawn, safe in samples]
    # waiting for a pause, it would fall behind by the whole 12 s of traffic;
    # it moves every few seconds (6.3 s behind at most, seen with 3 test
    # workers on 2 CPUs)
    moves = sum(b[2] > a[2] for a, b in itertools.pairwise(samples))
    assert moves >= 2 and max(lags) < 9, f"the safe floor moved {moves} times, behind by {lags} s"
