"""Races and faults through the pgmq facade: pgqueue's fencing and poison guarantees hold for
messages that PGMQ's functions read (pgmq.read, read_with_poll, pop, read_grouped*).

Real concurrent connections (a thread each, its own psycopg connection), repeated;
the assertions are on what the database and the readers saw afterwards. Times
compared across connections are the server's (last_read_at, vt, clock_timestamp()).
"""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb
from support.db import expire_all, run_threads

# Each read function of the facade as a client calls it (vt, qty; the polls for 1 s every
# 10 ms), with the server's clock once the read has its rows: when the reader held them.
_POLL = ", 1, 10"
READS = {
    name: f"SELECT r.*, clock_timestamp() FROM pgmq.{name}(%(q)s, %(vt)s, %(qty)s{extra}) r"
    for name, extra in [
        ("read", ""),
        ("read_with_poll", _POLL),
        ("read_grouped", ""),
        ("read_grouped_rr", ""),
        ("read_grouped_head", ""),
        ("read_grouped_with_poll", _POLL),
        ("read_grouped_rr_with_poll", _POLL),
    ]
}
GROUPED_READS = [name for name in READS if name.startswith("read_grouped")]


@dataclass(frozen=True, slots=True)
class Lease:
    """One message handed out to one reader, as the reader got it."""

    reader: int
    msg_id: int
    read_ct: int
    last_read_at: datetime
    vt: datetime
    held_at: datetime  # the server's clock once the read had returned it
    group: str | None
    got_at: float  # time.monotonic() when the reader had it (after the call returned)


def read(conn: psycopg.Connection[Any], how: str, queue: str, vt: int, qty: int) -> list[Any]:
    """One facade read; its rows: (msg_id, read_ct, enqueued_at, last_read_at, vt, message,
    headers, the clock once read)."""
    return conn.execute(READS[how], {"q": queue, "vt": vt, "qty": qty}).fetchall()


def leases_of(reader: int, rows: list[Any]) -> list[Lease]:
    """The rows of one read as leases."""
    now = time.monotonic()
    return [
        Lease(reader, r[0], r[1], r[3], r[4], r[7], (r[6] or {}).get("x-pgmq-group"), now)
        for r in rows
    ]


def scalar(conn: psycopg.Connection[Any], query: str, params: Any = ()) -> Any:
    """The first column of the first row."""
    row = conn.execute(query, params).fetchone()
    return None if row is None else row[0]


@pytest.fixture
def conn(facade_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to a fresh database with the facade."""
    with psycopg.connect(facade_dsn, autocommit=True) as c:
        yield c


def connect(dsn: str, name: str = "pgmq_race") -> psycopg.Connection[Any]:
    """A reader's own connection."""
    return psycopg.connect(dsn, autocommit=True, application_name=name)


# -- (1) no message is leased twice at once -------------------------------------------


@pytest.mark.parametrize("round_", range(2))
def test_concurrent_readers_never_hold_one_message_at_once(facade_dsn: str, round_: int) -> None:
    """8 readers, each with its own read function; 1 s leases, ~30% abandoned to expire."""
    n = 300
    with connect(facade_dsn) as c:
        c.execute("SELECT pgmq.create('q')")
        c.execute(
            "SELECT pgmq.send_batch('q', %s::jsonb[])", ([Jsonb({"i": i}) for i in range(n)],)
        )
    hows = ["read", "read_with_poll", "read_grouped", "read_grouped_rr", "pop"]
    seen: list[Lease] = []
    popped: list[tuple[int, datetime]] = []  # (msg_id, the clock once the pop returned)
    done: set[int] = set()
    lock = threading.Lock()
    deadline = time.monotonic() + 60

    def reader(i: int) -> None:
        rng = random.Random(i * 1000 + round_)
        how = hows[i % len(hows)]
        with connect(facade_dsn) as c:
            while time.monotonic() < deadline:
                if how == "pop":
                    rows = c.execute(
                        "SELECT r.msg_id, clock_timestamp() FROM pgmq.pop('q', 2) r"
                    ).fetchall()
                    with lock:
                        popped.extend((r[0], r[1]) for r in rows)
                        done.update(r[0] for r in rows)
                else:
                    rows = read(c, how, "q", 1, rng.randint(1, 5))
                    got = leases_of(i, rows)
                    with lock:
                        seen.extend(got)
                    for lease in got:
                        if rng.random() < 0.7 and scalar(
                            c, "SELECT pgmq.delete('q', %s::bigint)", (lease.msg_id,)
                        ):
                            with lock:
                                done.add(lease.msg_id)
                if not rows:
                    with lock:
                        if len(done) == n:
                            return
                    time.sleep(0.02)

    run_threads(8, reader)
    assert len(done) == n, "some messages were never acked before the deadline"
    keys = [(s.msg_id, s.read_ct) for s in seen]
    assert len(keys) == len(set(keys)), "one lease (msg_id, read_ct) handed out twice"
    by_msg: dict[int, list[Lease]] = defaultdict(list)
    for s in seen:
        by_msg[s.msg_id].append(s)
    for msg_id, leases in by_msg.items():
        leases.sort(key=lambda s: s.read_ct)
        for before, after in itertools.pairwise(leases):
            # the next lease begins only once the one before ended (its vt passed)
            assert after.last_read_at >= before.vt, (msg_id, before, after)
    popped_ids = [m for m, _ in popped]
    assert len(popped_ids) == len(set(popped_ids)), "a message popped twice"
    for msg_id, at in popped:
        # a pop takes a message no lease holds: every lease of it had ended
        assert all(s.vt <= at for s in by_msg[msg_id]), (msg_id, at, by_msg[msg_id])
    assert len(seen) + len(popped) >= n


# -- (2) a stale lease: fenced calls change nothing, PGMQ's unfenced set_vt does ---------


def _message(conn: psycopg.Connection[Any], msg_id: int) -> tuple[Any, ...]:
    row = conn.execute(
        "SELECT read_ct, vt, last_error, last_read_at FROM pgqueue.message WHERE msg_id = %s",
        (msg_id,),
    ).fetchone()
    assert row is not None
    return tuple(row)


@pytest.mark.parametrize("how", list(READS))
def test_a_stale_lease_from_a_pgmq_read_is_fenced_out(facade_dsn: str, how: str) -> None:
    """Read through the facade, overrun the vt, be taken over: the stale read_ct is refused."""
    with connect(facade_dsn) as stale, connect(facade_dsn) as worker:
        stale.execute("SELECT pgmq.create('q')")
        stale.execute("SELECT pgmq.send('q', '{}', %s)", (Jsonb({"x-pgmq-group": "g"}),))
        ((msg_id, old_ct, *_),) = read(stale, how, "q", 30, 1)
        assert old_ct == 1
        expire_all(stale)  # the stale reader stalled past its vt
        ((same_id, new_ct, *_),) = read(worker, "read", "q", 30, 1)  # another reader takes it over
        assert (same_id, new_ct) == (msg_id, 2)
        before = _message(worker, msg_id)

        # pgqueue's fenced calls, with the stale read_ct: nothing changes
        stale_calls = [
            ("SELECT count(*) FROM pgqueue.set_vt('q', %s, 0, 'stale', %s)", 0),
            ("SELECT pgqueue.nack('q', %s, %s, 0, 'stale')", None),
            ("SELECT pgqueue.poison('q', %s, 'stale', %s)", False),
            (
                "SELECT count(*) FROM pgqueue.set_vt('q', ARRAY[%s]::bigint[], 0, ARRAY[%s])",
                0,
            ),
            (
                "SELECT count(*)"
                "  FROM pgqueue.extend_leases('q', ARRAY[%s]::bigint[], ARRAY[%s], 0)",
                0,
            ),
        ]
        for query, nothing in stale_calls:
            assert scalar(stale, query, (msg_id, old_ct)) == nothing, query
            assert _message(worker, msg_id) == before, query
        assert scalar(worker, "SELECT count(*) FROM pgqueue.poison") == 0

        # the current lease's fenced call works
        assert scalar(worker, "SELECT pgqueue.nack('q', %s, %s, 30, 'boom')", (msg_id, new_ct)) == (
            "retry"
        )
        before = _message(worker, msg_id)
        assert before[2] == "boom"

        # PGMQ's set_vt is unfenced (PGMQ's contract): the stale reader moves the
        # current lease's vt, and a third reader can take the message at once
        assert scalar(stale, "SELECT count(*) FROM pgmq.set_vt('q', %s::bigint, 0)", (msg_id,)) == 1
        assert _message(worker, msg_id)[1] < before[1]
        ((again, third, *_),) = read(worker, "read", "q", 30, 1)
        assert (again, third) == (msg_id, 3)


def test_stale_fenced_nacks_never_win_against_a_newer_lease(facade_dsn: str) -> None:
    """8 readers read through pgmq.read with 1 s leases, sometimes stall past them, then
    nack (fenced) with their read_ct: a nack that a newer lease had already superseded
    (its reader had it in hand before the nack began) must return NULL."""
    n = 6  # fewer messages than readers: an idle reader takes an expired lease over at once
    with connect(facade_dsn) as c:
        c.execute("SELECT pgmq.create('q')")
        c.execute(
            "SELECT pgmq.send_batch('q', %s::jsonb[])", ([Jsonb({"i": i}) for i in range(n)],)
        )
    seen: list[Lease] = []
    nacks: list[tuple[int, int, float, float, str | None]] = []
    lock = threading.Lock()
    deadline = time.monotonic() + 15

    def reader(i: int) -> None:
        rng = random.Random(i)
        with connect(facade_dsn) as c:
            while time.monotonic() < deadline:
                got = leases_of(i, read(c, "read", "q", 1, 1))
                with lock:
                    seen.extend(got)
                if not got:
                    time.sleep(0.02)
                for lease in got:
                    time.sleep(rng.choice([0, 0, 0.3, 2.5]))  # sometimes well past the vt
                    began = time.monotonic()
                    verdict = scalar(
                        c, "SELECT pgqueue.nack('q', %s, %s, 0)", (lease.msg_id, lease.read_ct)
                    )
                    with lock:
                        nacks.append(
                            (lease.msg_id, lease.read_ct, began, time.monotonic(), verdict)
                        )

    run_threads(8, reader)
    newer: dict[int, list[Lease]] = defaultdict(list)
    for s in seen:
        newer[s.msg_id].append(s)
    superseded_refused = 0
    for msg_id, read_ct, began, _, verdict in nacks:
        superseded = any(s.read_ct > read_ct and s.got_at < began for s in newer[msg_id])
        if superseded:
            assert verdict is None, (msg_id, read_ct)
            superseded_refused += 1
    assert superseded_refused > 0, "no stale nack happened: the test proved nothing"
    assert {v for *_, v in nacks} <= {"retry", None}


# -- (3) max_attempts: poison through the facade, and never for pgmq.create's queues -----


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pgqueue", *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("how", ["read", "read_with_poll", "read_grouped"])
def test_the_fourth_read_poison_drops_when_pgqueue_set_max_attempts_3(
    facade_dsn: str, how: str
) -> None:
    notices: list[str | None] = []  # a Diagnostic is valid only inside the handler
    with connect(facade_dsn) as c:
        c.add_notice_handler(lambda d: notices.append(d.sqlstate))
        c.execute("SELECT pgqueue.create_queue('p', 3)")
        msg_id = scalar(c, "SELECT * FROM pgmq.send('p', %s)", (Jsonb({"job": 1}),))
        cts = [row[1] for _ in range(3) for row in read(c, how, "p", 0, 1)]
        assert cts == [1, 2, 3]
        assert read(c, how, "p", 0, 1) == []  # the 4th read drops it instead
        reason = scalar(c, "SELECT reason FROM pgqueue.poison WHERE msg_id = %s", (msg_id,))
        assert reason == "max_attempts exceeded (read 3 times)"
        assert [n for n in notices if n == "PGQ10"] == ["PGQ10"]
        assert scalar(c, "SELECT count(*) FROM pgqueue.message") == 0
    listed = _cli("poison", "list", "p", "--json", "--dsn", facade_dsn)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [(r["queue"], r["msg_id"], r["read_ct"], r["reason"]) for r in rows] == [
        ("p", msg_id, 3, "max_attempts exceeded (read 3 times)")
    ]
    table = _cli("poison", "list", "p", "--dsn", facade_dsn)
    assert "max_attempts exceeded" in table.stdout


def _read_until_poisoned(dsn: str, queue: str, readers: int, n: int) -> list[tuple[int, int]]:
    """`readers` connections reading (vt 0, qty 2) until the n messages are all poisoned (or
    10 s passed); every (msg_id, read_ct) handed out."""
    got: list[tuple[int, int]] = []
    lock = threading.Lock()
    deadline = time.monotonic() + 10

    def reader(_: int) -> None:
        with connect(dsn) as c:
            while time.monotonic() < deadline:
                rows = read(c, "read", queue, 0, 2)
                with lock:
                    got.extend((r[0], r[1]) for r in rows)
                if not rows and scalar(c, "SELECT count(*) FROM pgqueue.poison") == n:
                    return

    run_threads(readers, reader)
    return got


def test_racing_readers_deliver_each_attempt_once_then_poison_once(facade_dsn: str) -> None:
    for _ in range(5):  # repeated
        with connect(facade_dsn) as c:
            c.execute("SELECT pgqueue.drop_queue('p'), pgqueue.create_queue('p', 3)")
            c.execute("SELECT pgmq.send_batch('p', ARRAY['1', '2', '3']::jsonb[])")
        got = _read_until_poisoned(facade_dsn, "p", readers=6, n=3)
        assert sorted(got) == [(m, ct) for m in (1, 2, 3) for ct in (1, 2, 3)]
        with connect(facade_dsn) as c:
            poisoned = c.execute("SELECT msg_id, read_ct FROM pgqueue.poison ORDER BY 1").fetchall()
        assert poisoned == [(1, 3), (2, 3), (3, 3)]


def test_a_queue_created_through_pgmq_never_poison_drops(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT pgmq.create('never')")
    conn.execute("SELECT pgmq.send('never', '{}')")
    for how in ["read", "read_with_poll", "read_grouped"] * 10:
        assert len(read(conn, how, "never", 0, 1)) == 1
    assert scalar(conn, "SELECT read_ct FROM pgqueue.message") == 30
    assert scalar(conn, "SELECT count(*) FROM pgqueue.poison") == 0
    assert scalar(conn, "SELECT max_attempts FROM pgqueue.queue WHERE queue_name = 'never'") == (
        2_147_483_647
    )
    # an operator sets a limit on the existing queue: from then on reads poison-drop
    conn.execute("SELECT pgqueue.create_queue('never', 31)")
    assert [r[1] for r in read(conn, "read", "never", 0, 1)] == [31]
    assert read(conn, "read", "never", 0, 1) == []
    assert scalar(conn, "SELECT read_ct FROM pgqueue.poison") == 31


# -- (4) FIFO groups: one holder per group, in order, under expiry and poison ------------


@pytest.mark.parametrize("how", ["read_grouped", "read_grouped_rr", "read_grouped_with_poll"])
def test_grouped_readers_never_hold_one_group_at_once_and_keep_its_order(
    facade_dsn: str, how: str
) -> None:
    """8 readers; 6 groups of 15; 1 s leases; 25% of leases abandoned (they expire), and
    max_attempts 2, so a message abandoned twice is poison-dropped."""
    groups = [f"g{i}" for i in range(6)]
    per_group = 15
    with connect(facade_dsn) as c:
        c.execute("SELECT pgqueue.create_queue('g', 2)")
        for n in range(per_group):  # the groups interleaved in msg_id order
            c.execute(
                "SELECT pgmq.send_batch('g', %s::jsonb[], %s::jsonb[])",
                (
                    [Jsonb({"n": n, "g": g}) for g in groups],
                    [Jsonb({"x-pgmq-group": g}) for g in groups],
                ),
            )
        sent = {
            g: [
                r[0]
                for r in c.execute(
                    "SELECT msg_id FROM pgqueue.message WHERE group_key = %s ORDER BY msg_id", (g,)
                )
            ]
            for g in groups
        }
    # A lease is held from when its reader has it (held_at), not from last_read_at: a read
    # stamps its leases with a clock it reads before the statement that picks them, so under
    # load last_read_at can fall before the ack that freed the group committed (seen: 40 ms
    # to 0.9 s). It is held until its vt, or until the message is acked, by whoever acks it:
    # acks are unfenced (PGMQ's contract, and pgqueue's), so a reader that overran its vt
    # and acks anyway ends the turn of the reader that took the message over.
    leases: list[Lease] = []
    acked_at: dict[int, datetime] = {}
    lock = threading.Lock()
    deadline = time.monotonic() + 90
    total = per_group * len(groups)

    def reader(i: int) -> None:
        rng = random.Random(i)
        with connect(facade_dsn) as c:
            while time.monotonic() < deadline:
                got = leases_of(i, read(c, how, "g", 1, rng.randint(1, 3)))
                with lock:
                    leases.extend(got)
                if not got:
                    if scalar(c, "SELECT count(*) FROM pgqueue.message") == 0:
                        return
                    time.sleep(0.02)
                for s in got:
                    time.sleep(rng.random() * 0.01)
                    if rng.random() < 0.75:  # else abandoned: the lease expires
                        row = c.execute(
                            "SELECT pgmq.archive('g', %s::bigint), clock_timestamp()", (s.msg_id,)
                        ).fetchone()
                        assert row is not None
                        if row[0]:
                            with lock:
                                acked_at[s.msg_id] = row[1]

    run_threads(8, reader)
    with connect(facade_dsn) as c:
        assert scalar(c, "SELECT count(*) FROM pgqueue.message") == 0, "not drained in time"
        poisoned = {r[0] for r in c.execute("SELECT msg_id FROM pgqueue.poison")}
        archived = {r[0] for r in c.execute("SELECT msg_id FROM pgqueue.archive")}
    assert poisoned, "no poison drop happened: the test proved less than it says"
    assert archived == set(acked_at) and not (archived & poisoned)
    assert len(archived) + len(poisoned) == total
    for g in groups:
        spans = sorted(
            (s.held_at, min(s.vt, acked_at.get(s.msg_id, s.vt)), s.msg_id, s.read_ct, s.reader)
            for s in leases
            if s.group == g
        )
        # a grouped read hands one reader several of a group's messages: no two readers
        for a, b in itertools.combinations(spans, 2):
            if a[4] != b[4]:
                assert b[0] >= a[1], f"group {g}: lease {b} began while lease {a} was held"
        firsts: dict[int, datetime] = {}
        for start, _, msg_id, *_ in spans:
            firsts.setdefault(msg_id, start)
        assert sorted(firsts, key=firsts.__getitem__) == sent[g], f"group {g} out of order"


def test_a_stale_ack_ends_the_group_turn_of_the_reader_that_took_over(
    conn: psycopg.Connection[Any],
) -> None:
    """Acks are unfenced (PGMQ's contract): a reader that overran its vt and archives anyway
    removes the message the next reader is working on, and the group's next message goes
    out. pgqueue.hold_leases lets a careful reader ack only while its lease is current."""
    conn.execute("SELECT pgmq.create('g')")
    conn.execute(
        "SELECT pgmq.send_batch('g', ARRAY['1', '2']::jsonb[], %s::jsonb[])",
        ([Jsonb({"x-pgmq-group": "g"})] * 2,),
    )
    ((first, ct1, *_),) = read(conn, "read_grouped", "g", 30, 1)
    expire_all(conn)  # the first reader stalls past its vt
    ((again, ct2, *_),) = read(conn, "read_grouped", "g", 30, 1)  # a second reader takes over
    assert (again, ct2) == (first, ct1 + 1)
    assert read(conn, "read_grouped", "g", 30, 5) == []  # the group is the second reader's
    # a careful stale reader asks first, in its ack's transaction: its lease is gone
    with conn.transaction(force_rollback=True):
        held = conn.execute(
            "SELECT * FROM pgqueue.hold_leases('g', ARRAY[%s]::bigint[], ARRAY[%s])", (first, ct1)
        ).fetchall()
        assert held == []
    # an unfenced ack from the stale reader succeeds, and frees the group
    assert scalar(conn, "SELECT pgmq.archive('g', %s::bigint)", (first,)) is True
    ((nxt, *_),) = read(conn, "read_grouped", "g", 30, 1)
    assert nxt == first + 1  # while the second reader still thinks it holds message 1


# -- (5) a reader killed mid-read ---------------------------------------------------------


def test_readers_killed_mid_read_lose_nothing(facade_dsn: str) -> None:
    """6 readers (read and read_with_poll, 2 s leases); a killer terminates their backends
    every ~50 ms. Every message is acked at least once in the end; no lease is half given."""
    n = 200
    with connect(facade_dsn) as c:
        c.execute("SELECT pgmq.create('k')")
        c.execute(
            "SELECT pgmq.send_batch('k', %s::jsonb[])", ([Jsonb({"i": i}) for i in range(n)],)
        )
    acked: set[int] = set()
    seen: list[tuple[int, int]] = []
    kills = 0
    broken: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()
    deadline = time.monotonic() + 60

    def reader(i: int) -> None:
        how = "read" if i % 2 else "read_with_poll"
        c: psycopg.Connection[Any] | None = None
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                if c is None or c.closed:
                    c = connect(facade_dsn, "pgmq_victim")
                rows = read(c, how, "k", 2, 5)
                with lock:
                    seen.extend((r[0], r[1]) for r in rows)
                for r in rows:
                    if scalar(c, "SELECT pgmq.delete('k', %s::bigint)", (r[0],)):
                        with lock:
                            acked.add(r[0])
                if not rows:
                    time.sleep(0.05)
            except psycopg.OperationalError:
                if c is not None:
                    c.close()
                c = None  # killed: connect again, as a client's pool would
        if c is not None:
            c.close()

    def killer() -> None:
        nonlocal kills
        with connect(facade_dsn, "pgmq_killer") as admin:
            while not stop.is_set() and time.monotonic() < deadline:
                kills += int(
                    scalar(
                        admin,
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                        " WHERE datname = current_database() AND application_name = 'pgmq_victim'"
                        "   AND random() < 0.5",
                    )
                )
                # a lease is the row's read_ct, last_read_at and vt together, or none of them
                bad = admin.execute(
                    "SELECT msg_id FROM pgqueue.message"
                    " WHERE read_ct > 0 AND (last_read_at IS NULL OR vt < last_read_at)"
                ).fetchall()
                if bad:
                    broken.append(f"half-given leases: {bad}")
                time.sleep(random.random() * 0.1)
                with lock:
                    if len(acked) == n:
                        stop.set()

    killer_thread = threading.Thread(target=killer)
    killer_thread.start()
    try:
        run_threads(6, reader)
    finally:
        stop.set()
        killer_thread.join()
    assert broken == []
    assert kills > 0, "no reader was killed: the test proved nothing"
    assert acked == set(range(1, n + 1)), f"{n - len(acked)} messages never acked"
    assert len(seen) == len(set(seen)), "a lease handed out twice"
    with connect(facade_dsn) as c:
        assert scalar(c, "SELECT count(*) FROM pgqueue.message") == 0


# -- (6) acks raced: exactly one wins ------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "second"),
    [("delete", "delete"), ("archive", "archive"), ("delete", "archive")],
)
def test_racing_acks_of_one_message_exactly_one_wins(
    facade_dsn: str, first: str, second: str
) -> None:
    n = 150
    with connect(facade_dsn) as c:
        c.execute("SELECT pgmq.create('a')")
        c.execute(
            "SELECT pgmq.send_batch('a', %s::jsonb[])", ([Jsonb({"i": i}) for i in range(n)],)
        )
        read(c, "read", "a", 30, n)  # leased: acks do not care
    wins: dict[int, list[str]] = defaultdict(list)
    lock = threading.Lock()
    ops = [first, second]

    def acker(i: int) -> None:
        op = ops[i % 2]
        with connect(facade_dsn) as c:
            for msg_id in range(1, n + 1):
                if scalar(c, f"SELECT pgmq.{op}('a', %s::bigint)", (msg_id,)):
                    with lock:
                        wins[msg_id].append(op)

    run_threads(2, acker)
    assert sorted(wins) == list(range(1, n + 1))
    assert all(len(w) == 1 for w in wins.values()), {m: w for m, w in wins.items() if len(w) != 1}
    with connect(facade_dsn) as c:
        archived = scalar(c, "SELECT count(*) FROM pgqueue.archive")
        assert archived == sum(w == ["archive"] for w in wins.values())
        assert scalar(c, "SELECT count(*) FROM pgqueue.message") == 0
        # and once more, alone: nothing left to ack
        assert scalar(c, "SELECT pgmq.delete('a', 1::bigint)") is False
        assert scalar(c, "SELECT pgmq.archive('a', 1::bigint)") is False


def test_racing_array_acks_return_each_id_once(facade_dsn: str) -> None:
    n = 200
    with connect(facade_dsn) as c:
        c.execute("SELECT pgmq.create('a')")
        c.execute(
            "SELECT pgmq.send_batch('a', %s::jsonb[])", ([Jsonb({"i": i}) for i in range(n)],)
        )
    returned: list[int] = []
    lock = threading.Lock()

    def acker(i: int) -> None:
        rng = random.Random(i)
        op = ["delete", "archive", "delete", "archive"][i]
        with connect(facade_dsn) as c:
            for _ in range(10):
                ids = rng.sample(range(1, n + 1), 60)
                rows = c.execute(f"SELECT * FROM pgmq.{op}('a', %s::bigint[])", (ids,)).fetchall()
                with lock:
                    returned.extend(r[0] for r in rows)

    run_threads(4, acker)
    assert len(returned) == len(set(returned))
    with connect(facade_dsn) as c:
        left = {r[0] for r in c.execute("SELECT msg_id FROM pgqueue.message")}
        archived = scalar(c, "SELECT count(*) FROM pgqueue.archive")
    assert set(returned) | left == set(range(1, n + 1)) and not (set(returned) & left)
    assert archived <= len(returned)
