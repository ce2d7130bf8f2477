"""Barrier races with real connections: exactly one callback, whatever the interleaving."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from typing import Any

import psycopg
import pytest
from support.db import blocks_another, run_threads, terminate_client_backends, wait_until

from pgqueue import Client
from pgqueue._calls import barrier as b
from pgqueue._calls import queue as q
from pgqueue._calls import single_flight as cl
from pgqueue._execute import execute

MEMBERS = 200
CONNECTIONS = 16


def callback_rows(conn: Any, barrier_id: str) -> int:
    """Callback messages of this barrier anywhere: live, archived or poisoned."""
    return int(
        conn.execute(
            "SELECT (SELECT count(*) FROM pgqueue.message WHERE headers->>'_pg_transport' = 'true'"
            "          AND headers->'_pg_callback'->>'barrier_id' = %(b)s)"
            " + (SELECT count(*) FROM pgqueue.archive"
            "     WHERE headers->'_pg_callback'->>'barrier_id' = %(b)s"
            "          AND headers ? '_pg_transport')",
            {"b": barrier_id},
        ).fetchone()[0]
    )


def overdue_barriers(
    client: Client, sql: Any, *, barriers: int, members: int
) -> tuple[list[str], list[int]]:
    """Barriers past their deadline whose members are all leased; (barrier ids, member ids)."""
    client.create_queue("work")
    client.create_queue("cb")
    bids = [
        client.fan_out(
            "work",
            list(range(members)),
            callback_queue="cb",
            callback_message={},
            deadline_seconds=3600,
        )
        for _ in range(barriers)
    ]
    ids = [m.msg_id for m in client.read("work", vt=300, qty=barriers * members)]
    sql.execute("UPDATE pgqueue.barrier SET deadline = clock_timestamp()")
    return bids, ids


@pytest.mark.parametrize("round_", range(4))
def test_many_connections_completing_members_repeatedly_fire_one_callback(
    client: Client, dsn: str, round_: int
) -> None:
    client.create_queue("work", max_attempts=100)
    client.create_queue("cb")
    bid = client.fan_out("work", list(range(MEMBERS)), callback_queue="cb", callback_message={})
    members = client.read("work", vt=300, qty=MEMBERS)
    rnd = random.Random(round_)
    poisoned = set(rnd.sample([m.msg_id for m in members], 20))
    failed = set(rnd.sample([m.msg_id for m in members if m.msg_id not in poisoned], 30))
    # every member completed 1-3 times, by different connections, in random order
    work = [m.msg_id for m in members for _ in range(rnd.randint(1, 3))]
    rnd.shuffle(work)
    slices = [work[i::CONNECTIONS] for i in range(CONNECTIONS)]

    def worker(i: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for msg_id in slices[i]:
                if msg_id in poisoned:
                    execute(
                        conn,
                        q.Call(
                            "poison",
                            "SELECT pgqueue.poison('work', %s, 'bad')",
                            (msg_id,),
                            lambda r: None,
                        ),
                    )
                else:
                    outcome = "failed" if msg_id in failed else "succeeded"
                    for attempt in range(5):
                        try:
                            execute(conn, b.complete_members("work", [msg_id], [outcome]))
                            break
                        except psycopg.errors.DeadlockDetected:
                            if attempt == 4:
                                raise

    run_threads(CONNECTIONS, worker)
    s = client.barrier_status(bid)
    assert (s.state, s.remaining, s.succeeded, s.failed) == ("fired", 0, MEMBERS - 50, 50)
    with psycopg.connect(dsn) as conn:
        assert callback_rows(conn, bid) == 1
    outcomes = Counter(r.outcome for r in client.barrier_results(bid))
    assert outcomes == {"succeeded": MEMBERS - 50, "failed": 30, "poisoned": 20}
    assert client.metrics("work").queue_length == 0


def test_read_time_poison_drops_race_with_completions(client: Client, dsn: str) -> None:
    # max_attempts=1 and vt=0: readers poison-drop members while others complete them
    client.create_queue("work", max_attempts=1)
    client.create_queue("cb")
    bid = client.fan_out("work", list(range(MEMBERS)), callback_queue="cb", callback_message={})
    ids = [m.msg_id for m in client.read("work", vt=0, qty=MEMBERS)]

    def worker(i: int) -> None:
        rnd = random.Random(i)
        with psycopg.connect(dsn, autocommit=True) as conn:
            if i % 2:
                for _ in range(40):
                    execute(conn, q.read("work", 0, rnd.randint(1, 10)))
            else:
                for msg_id in rnd.sample(ids, 60):
                    execute(conn, b.complete_members("work", [msg_id]))

    run_threads(CONNECTIONS, worker)
    # whatever is left gets poisoned by one more read
    while client.read("work", vt=0, qty=MEMBERS):
        pass
    s = client.barrier_status(bid)
    assert (s.state, s.remaining, s.succeeded + s.failed) == ("fired", 0, MEMBERS)
    with psycopg.connect(dsn) as conn:
        assert callback_rows(conn, bid) == 1


def test_concurrent_sweeps_and_completions_fire_each_barrier_once(
    client: Client, dsn: str, sql: Any
) -> None:
    bids, ids = overdue_barriers(client, sql, barriers=10, members=20)

    def worker(i: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            if i < 6:
                for _ in range(5):
                    execute(conn, b.expire_barriers())
            else:
                for msg_id in ids[i::10]:
                    execute(conn, b.complete_members("work", [msg_id]))

    run_threads(12, worker)
    with psycopg.connect(dsn) as conn:
        for bid in bids:
            s = client.barrier_status(bid)
            assert s.state in ("fired", "expired") and s.remaining == 0
            assert s.succeeded + s.failed == 20
            assert callback_rows(conn, bid) == 1


def test_killed_completion_leaves_old_state_and_retry_converges(
    client: Client, dsn: str, sql: Any
) -> None:
    client.create_queue("work")
    client.create_queue("cb")
    bid = client.fan_out("work", [1, 2], callback_queue="cb", callback_message={})
    m1, m2 = client.read("work", vt=300, qty=2)
    client.complete_member("work", m1.msg_id)
    # Hold the barrier row so the completion blocks mid-transaction, then kill it.
    blocker = psycopg.connect(dsn)
    blocker.execute("SELECT * FROM pgqueue.barrier WHERE barrier_id = %s FOR UPDATE", (bid,))
    outcome: list[BaseException] = []

    def complete() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True, application_name="victim") as conn:
                execute(conn, b.complete_members("work", [m2.msg_id]))
        except psycopg.OperationalError as exc:
            outcome.append(exc)

    t = threading.Thread(target=complete)
    t.start()
    # killed while it waits on the lock, however long a loaded machine takes to get there
    wait_until(
        lambda: sql.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'victim'"
            " AND wait_event_type = 'Lock'"
        ).fetchone()[0]  # type: ignore[index]
    )
    assert terminate_client_backends(dsn, "victim") == 1
    t.join()
    blocker.rollback()
    blocker.close()
    assert outcome, "the completion should have died with its connection"
    # old state: member 2 not counted, its message still there, no callback
    s = client.barrier_status(bid)
    assert (s.state, s.remaining, s.succeeded) == ("open", 1, 1)
    assert client.metrics("work").queue_length == 1
    assert client.metrics("cb").total_messages == 0
    # the retry converges, once
    for _ in range(2):
        client.complete_member("work", m2.msg_id)
    s = client.barrier_status(bid)
    assert (s.state, s.succeeded) == ("fired", 2)
    assert client.metrics("cb").total_messages == 1


def _one_root_step(client: Client, dsn: str, root: str) -> None:
    d = client.fan_out("steps", [1, 2], callback_queue="subdone", callback_message={"root": root})
    e = client.fan_out("steps", [3], callback_queue="subdone", callback_message={"root": root})
    parts: dict[str, list[int]] = {d: [], e: []}
    for m in client.read("steps", vt=300, qty=10):
        parts[str(m.barrier_id)].append(m.msg_id)
    member_sets = list(parts.values())

    # D's and E's last members complete at the same instant
    def finish(i: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            execute(conn, b.complete_members("steps", member_sets[i]))

    run_threads(2, finish)
    callbacks = client.read("subdone", vt=300, qty=10)
    assert sorted(str(cb.barrier_id) for cb in callbacks) == sorted([d, e])

    # each callback handler schedules A's orchestrator, single flight on the root
    scheduled: list[int] = []

    def on_callback(i: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
            key = f"orch:{root}"
            scheduled.append(execute(conn, q.send("orchestrate", {"root": root}, None, 0, key)))
            execute(conn, q.delete("subdone", callbacks[i].msg_id))

    run_threads(2, on_callback)
    assert len(set(scheduled)) == 1, "A's orchestrator was scheduled twice"

    # however many workers pick it up, the orchestrator runs under a claim
    running: list[str] = []
    runs: list[int] = []

    def orchestrator(i: int) -> None:
        owner = f"orchestrator-{i}"
        with psycopg.connect(dsn, autocommit=True) as conn:
            if execute(conn, cl.claim(f"root:{root}", owner, 30)):
                running.append(owner)
                assert len(running) == 1, "two orchestrators ran at once"
                time.sleep(0.05)
                runs.append(i)
                running.remove(owner)
                execute(conn, cl.finish(f"root:{root}", owner))

    run_threads(4, orchestrator)
    assert len(runs) == 1, "the finished step ran again"


def test_seed_scenario_root_orchestrator_runs_once_per_step(client: Client, dsn: str) -> None:
    """Root A waits on sub-workflows D and E, which finish at nearly the same time.

    Each sub-workflow's callback handler schedules "run A's orchestrator" with a
    single-flight key; the orchestrator runs under a claim finished with a
    tombstone. However the callbacks race, A's next step is scheduled once and
    runs once, never twice at the same time.
    """
    for name in ("steps", "subdone", "orchestrate"):
        client.create_queue(name)
    for round_ in range(5):
        _one_root_step(client, dsn, f"A{round_}")
        assert client.metrics("orchestrate").queue_length == round_ + 1


def test_drop_queue_racing_fan_out_never_strands_a_barrier(client: Client, dsn: str) -> None:
    client.create_queue("work")
    client.create_queue("cb")
    dropper = psycopg.connect(dsn)
    dropper.execute("SELECT pgqueue.drop_queue('cb')")  # uncommitted: holds the queue row
    errors: list[BaseException] = []

    def fan() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            try:
                execute(conn, b.fan_out("work", [1], "cb", {}, "raced"))
            except psycopg.Error as exc:
                errors.append(exc)

    t = threading.Thread(target=fan)
    t.start()

    wait_until(lambda: blocks_another(dropper))  # the fan-out waits on the drop's lock
    dropper.commit()
    dropper.close()
    t.join()
    # the fan_out waited for the drop and then found no callback queue
    assert [e.sqlstate for e in errors] == ["PGQ01"]  # type: ignore[attr-defined]
    assert client.list_barriers() == []
    assert client.metrics("work").queue_length == 0


def test_multi_row_acks_and_batch_completions_do_not_deadlock(client: Client, dsn: str) -> None:
    # Members of several barriers acked in arrays, in every order, concurrently
    # with batch completions and poison: barrier rows are always locked in one
    # order, so no transaction may die of a deadlock (no retry here to hide it).
    client.create_queue("work")
    client.create_queue("cb")
    bids = [
        client.fan_out("work", list(range(40)), callback_queue="cb", callback_message={})
        for _ in range(4)
    ]
    ids = [m.msg_id for m in client.read("work", vt=300, qty=1000)]
    rnd = random.Random(7)
    batches = [rnd.sample(ids, 8) for _ in range(80)]

    def worker(i: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for n, batch in enumerate(batches[i::8]):
                kind = (i + n) % 4
                if kind == 0:
                    execute(conn, q.delete_many("work", batch))
                elif kind == 1:
                    execute(conn, q.archive_many("work", list(reversed(batch))))
                elif kind == 2:
                    execute(conn, b.complete_members("work", batch, ["failed"] * len(batch)))
                else:
                    for msg_id in batch[:2]:
                        execute(
                            conn,
                            q.Call(
                                "p",
                                "SELECT pgqueue.poison('work', %s, 'x')",
                                (msg_id,),
                                lambda r: None,
                            ),
                        )

    run_threads(8, worker)
    client.delete_many("work", ids)
    with psycopg.connect(dsn) as conn:
        for bid in bids:
            s = client.barrier_status(bid)
            assert (s.state, s.remaining, s.succeeded + s.failed) == ("fired", 0, 40)
            assert callback_rows(conn, bid) == 1


def test_sweeps_and_batch_completions_do_not_deadlock(client: Client, dsn: str, sql: Any) -> None:
    bids, ids = overdue_barriers(client, sql, barriers=12, members=10)
    rnd = random.Random(3)
    batches = [rnd.sample(ids, 12) for _ in range(30)]

    def worker(i: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            if i < 3:
                for _ in range(4):
                    execute(conn, b.expire_barriers())
            else:
                for batch in batches[i::5]:
                    execute(conn, b.complete_members("work", batch))

    run_threads(8, worker)
    client.expire_barriers()
    with psycopg.connect(dsn) as conn:
        for bid in bids:
            s = client.barrier_status(bid)
            assert s.state in ("fired", "expired") and s.remaining == 0
            assert callback_rows(conn, bid) == 1
