"""A real `pgqueue worker` never exits for a message Python cannot decode.

Before 0028's readers, one such message raised out of the read: the process
exited, its supervisor restarted it, the read leased the same batch again,
and after max_attempts restarts the healthy messages leased beside it were
poisoned without having run. tests/worker/test_worker_undecodable_message.py
has one plain handler; here every kind of handler (plain, batch, asyncio), a
message and headers too deep in each queue, and the worker going on after.
"""

from __future__ import annotations

import signal
from typing import Any

import psycopg
from support.db import plant, wait_until
from support.processes import count, prepare

DEEP = "[" * 10000 + "]" * 10000  # past every Python's json: 3.13 reads 3,000 levels
QUEUES = ("jobs", "batch_jobs", "async_jobs")  # worker_app: plain, batch, asyncio handlers


def done(dsn: str) -> dict[tuple[str, int], int]:
    """(queue, msg_id) -> how many times a handler finished it (each queue counts its own ids)."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT queue, msg_id, count(*) FROM handled WHERE event = 'done' GROUP BY 1, 2"
        ).fetchall()
    return {(r[0], r[1]): r[2] for r in rows}


def poisoned(dsn: str) -> dict[tuple[str, int], tuple[int, str]]:
    """(queue, msg_id) -> (read_ct, reason) of every poison row."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT q.queue_name, p.msg_id, p.read_ct, p.reason"
            " FROM pgqueue.poison p JOIN pgqueue.queue q USING (queue_id)"
        ).fetchall()
    return {(r[0], r[1]): (r[2], r[3]) for r in rows}


def test_every_handler_kind_runs_the_rest_poisons_each_bad_one_alone_and_goes_on(
    dsn: str, spawn: Any
) -> None:
    with prepare(dsn, "batch_jobs", "async_jobs") as client:  # max_attempts 5 on every queue
        healthy: dict[str, list[int]] = {}
        bad: dict[tuple[str, int], str] = {}
        with psycopg.connect(dsn, autocommit=True) as sql:
            for q in QUEUES:
                healthy[q] = [client.send(q, {"n": i}) for i in range(3)]
                bad[(q, plant(sql, q, DEEP))] = "undecodable message: Python cannot decode it"
                bad[(q, plant(sql, q, '{"n": 9}', '{"h": ' + DEEP + "}"))] = (
                    "undecodable headers: Python cannot decode it"
                )
                healthy[q] += [client.send(q, {"n": i}) for i in range(3, 6)]
        w = spawn(dsn, *(a for q in QUEUES for a in ("--queue", q)), "--vt", "30")

        wait_until(lambda: len(poisoned(dsn)) == len(bad), timeout=120)
        wait_until(lambda: count(dsn, "done") == 18, timeout=120)
        wait_until(lambda: all(client.metrics(q).queue_length == 0 for q in QUEUES), timeout=60)
        ran = done(dsn)
        assert ran == {(q, i): 1 for q in QUEUES for i in healthy[q]}  # every neighbour, once
        gone = poisoned(dsn)
        assert set(gone) == set(bad)  # no neighbour in the poison table
        for key, (read_ct, reason) in gone.items():
            assert read_ct == 1 and reason.startswith(bad[key]), (key, read_ct, reason)
            assert "RecursionError" in reason
        logged = w.events("message.undecodable")
        assert sorted((e["queue"], e["msg_id"]) for e in logged) == sorted(bad)  # once each
        assert w.p.poll() is None  # still running

        # and it goes on: a message sent now runs, another bad one is poisoned
        later = client.send("jobs", {"n": 10})
        with psycopg.connect(dsn, autocommit=True) as sql:
            again = plant(sql, "jobs", DEEP)
        wait_until(lambda: done(dsn).get(("jobs", later)) == 1, timeout=60)
        wait_until(lambda: ("jobs", again) in poisoned(dsn), timeout=60)
        assert len(w.events("worker.started")) == 1
        w.signal(signal.SIGTERM)
        assert w.wait(60) == 0
        log = w.log.read_text()
        assert "Traceback" not in log
        assert len(w.events("message.undecodable")) == len(bad) + 1
