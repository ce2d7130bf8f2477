"""The key of pgqueue.message in two halves (0027), and the watermarks of the fresh lane (0026).

A fresh message (never read, sent without delay) is in message_fresh_idx, every
other one in message_rest_idx; the table has no primary key. What the primary
key gave must still hold: logical replication of the table, a purge that races
consumers, and reads inside a prepared transaction (a read takes a watermark's
advisory lock and gives it back within the call).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest
from support.db import migrated_database, wait_until

QUEUE = "halves"


def test_the_table_is_in_a_publication_and_reads_and_acks_still_work(
    sql: psycopg.Connection[Any],
) -> None:
    """Without a primary key, a published table needs a replica identity for updates and
    deletes: REPLICA IDENTITY FULL (a publication FOR ALL TABLES is common with CDC)."""
    sql.execute("SELECT pgqueue.create_queue(%s)", (QUEUE,))
    sql.execute("CREATE PUBLICATION halves_pub FOR TABLE pgqueue.message")
    try:
        (msg_id,) = sql.execute("SELECT pgqueue.send(%s, '1')", (QUEUE,)).fetchone()  # type: ignore[misc]
        rows = sql.execute("SELECT msg_id FROM pgqueue.read(%s, 30, 1)", (QUEUE,)).fetchall()
        assert rows == [(msg_id,)]
        assert sql.execute("SELECT pgqueue.delete(%s, %s::bigint)", (QUEUE, msg_id)).fetchone() == (
            True,
        )
    finally:
        sql.execute("DROP PUBLICATION halves_pub")


def test_purge_in_chunks_racing_consumers_leaves_nothing_and_says_0_only_at_the_end(
    dsn: str, sql: psycopg.Connection[Any]
) -> None:
    """Leases move messages from one half of the key to the other while a chunked purge
    locks them one by one: a message moved under it is purged by a later chunk, and a
    chunk returns 0 only when nothing up to its bound is left."""
    sql.execute("SELECT pgqueue.create_queue(%s)", (QUEUE,))
    sql.execute("SELECT pgqueue.send_batch(%s, array_fill('1'::jsonb, ARRAY[3000]))", (QUEUE,))
    (up_to,) = sql.execute("SELECT max(msg_id) FROM pgqueue.message").fetchone()  # type: ignore[misc]
    stop = threading.Event()
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                while not stop.is_set():
                    with conn.transaction():
                        # leased and given back: each moves its messages between halves
                        conn.execute("SELECT * FROM pgqueue.read(%s, 30, 5)", (QUEUE,))
        except BaseException as exc:
            errors.append(exc)

    consumers = [threading.Thread(target=consume) for _ in range(3)]
    for t in consumers:
        t.start()
    purged = 0
    try:
        while True:
            (n,) = sql.execute(
                "SELECT pgqueue.purge_queue_chunk(%s, %s, 50)", (QUEUE, up_to)
            ).fetchone()  # type: ignore[misc]
            if n == 0:
                break
            purged += n
    finally:
        stop.set()
        for t in consumers:
            t.join()
    assert not errors, errors[0]
    assert purged == 3000
    assert sql.execute("SELECT count(*) FROM pgqueue.message").fetchone() == (0,)


def test_a_read_in_a_prepared_transaction_commits_prepared(own_cluster: Any) -> None:
    """The first read of a queue records a watermark under a session-level advisory lock,
    given back before the read returns: PREPARE TRANSACTION refuses a transaction holding
    one, and must not refuse this one."""
    with own_cluster({"max_prepared_transactions": "5"}) as cluster:
        dsn = migrated_database(cluster.dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pgqueue.create_queue(%s)", (QUEUE,))
            (msg_id,) = conn.execute("SELECT pgqueue.send(%s, '1')", (QUEUE,)).fetchone()  # type: ignore[misc]
            conn.execute("BEGIN")
            rows = conn.execute("SELECT msg_id FROM pgqueue.read(%s, 30, 1)", (QUEUE,)).fetchall()
            assert rows == [(msg_id,)]
            (marked,) = conn.execute(
                "SELECT pg_sequence_last_value('pgqueue.lane_1_mark_f_id') IS NOT NULL"
            ).fetchone()  # type: ignore[misc]
            assert marked, "the read recorded the queue's first watermark"
            conn.execute("PREPARE TRANSACTION 'read_then_prepare'")
            conn.execute("COMMIT PREPARED 'read_then_prepare'")
            (read_ct,) = conn.execute(
                "SELECT read_ct FROM pgqueue.message WHERE msg_id = %s", (msg_id,)
            ).fetchone()  # type: ignore[misc]
            assert read_ct == 1


@pytest.mark.parametrize("qty", [1, 10])
def test_no_advisory_lock_outlives_a_read(sql: psycopg.Connection[Any], qty: int) -> None:
    """Every read that records a watermark gives its lock back before it returns."""
    sql.execute("SELECT pgqueue.create_queue(%s)", (QUEUE,))
    sql.execute("SELECT pgqueue.send_batch(%s, array_fill('1'::jsonb, ARRAY[20]))", (QUEUE,))
    for _ in range(5):
        sql.execute("SELECT * FROM pgqueue.read(%s, 30, %s)", (QUEUE, qty))
        sql.execute("SELECT pg_sleep(0.06)")  # past the fast watermark's margin
    held = sql.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
    ).fetchone()
    assert held == (0,)


def test_a_watermark_writer_stalled_with_the_lock_slows_the_fresh_floors_and_loses_nothing(
    dsn: str, sql: psycopg.Connection[Any]
) -> None:
    """A process stopped (SIGSTOP) inside _mark holds its queue's watermark lock: no read
    records a watermark while it does, so the fresh floors only move to rows older than the
    margin. Messages are still all delivered, once; once the lock is free the floors
    move by watermarks again."""
    sql.execute("SELECT pgqueue.create_queue(%s)", (QUEUE,))
    (qid,) = sql.execute(
        "SELECT queue_id FROM pgqueue.queue WHERE queue_name = %s", (QUEUE,)
    ).fetchone()  # type: ignore[misc]
    sent: list[int] = []
    got: list[int] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                while not stop.is_set():
                    sent.extend(
                        r[0]
                        for r in conn.execute(
                            "SELECT pgqueue.send_batch(%s, array_fill('1'::jsonb, ARRAY[5]))",
                            (QUEUE,),
                        )
                    )
        except BaseException as exc:
            errors.append(exc)

    def consume(qty: int) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                while not stop.is_set() or len(got) < len(sent):
                    ids = [
                        r[0]
                        for r in conn.execute(
                            "SELECT msg_id FROM pgqueue.read(%s, 30, %s)", (QUEUE, qty)
                        )
                    ]
                    if ids:
                        conn.execute("SELECT pgqueue.delete(%s, %s::bigint[])", (QUEUE, ids))
                        got.extend(ids)
        except BaseException as exc:
            errors.append(exc)

    with psycopg.connect(dsn, autocommit=True) as stalled:
        stalled.execute("SELECT pg_advisory_lock(pgqueue._mark_lock_key(%s))", (qid,))
        threads = [threading.Thread(target=produce, daemon=True)] + [
            threading.Thread(target=consume, args=(q,), daemon=True) for q in (1, 10)
        ]
        for t in threads:
            t.start()
        time.sleep(2)
        (mark,) = sql.execute(
            f"SELECT pg_sequence_last_value('pgqueue.lane_{qid}_mark_f_id')"
        ).fetchone()  # type: ignore[misc]
        assert mark is None, "no watermark recorded while the lock was held"
        stalled.execute("SELECT pg_advisory_unlock(pgqueue._mark_lock_key(%s))", (qid,))

        def marked() -> bool:  # a watermark recorded again (and enough sent to count)
            (mark,) = sql.execute(
                f"SELECT pg_sequence_last_value('pgqueue.lane_{qid}_mark_f_id')"
            ).fetchone()  # type: ignore[misc]
            return bool(errors) or (mark is not None and len(sent) > 100)

        wait_until(marked)
        stop.set()
        # the consumers drain what was sent before they stop: on a loaded
        # machine that took longer than the 30 s this join once gave them
        for t in threads:
            t.join(300)
        assert not any(t.is_alive() for t in threads), "the consumers did not drain in 300 s"
    assert not errors, errors[0]
    assert sorted(got) == sorted(sent) and len(sent) > 100
    (mark,) = sql.execute(
        f"SELECT pg_sequence_last_value('pgqueue.lane_{qid}_mark_f_id')"
    ).fetchone()  # type: ignore[misc]
    assert mark is not None, "watermarks are recorded again once the lock is free"
