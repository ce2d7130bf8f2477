"""A worker process meets a message Python cannot decode: it poisons that one and goes on.

Before, `pgqueue worker` exited 1 with a traceback at every restart, and after
max_attempts restarts the healthy messages leased beside it were poisoned
without having run.
"""

from __future__ import annotations

import signal
from typing import Any

import psycopg
from support.db import plant, wait_until
from support.processes import count, prepare

DEEP = "[" * 10000 + "]" * 10000  # past every Python's json: 3.13 reads 3,000 levels


def test_the_worker_runs_the_rest_poisons_it_alone_and_never_exits(dsn: str, spawn: Any) -> None:
    with prepare(dsn) as client:
        first = client.send("jobs", {"n": 1})
        with psycopg.connect(dsn, autocommit=True) as sql:
            deep = plant(sql, "jobs", DEEP)
        last = client.send("jobs", {"n": 2})
        w = spawn(dsn, "--concurrency", "2", "--vt", "30")
        wait_until(lambda: count(dsn, "done") == 2, timeout=60)
        wait_until(lambda: client.poison_count("jobs") == 1, timeout=60)
        [poisoned] = client.poison_list("jobs")
        assert poisoned.msg_id == deep and poisoned.read_ct == 1
        assert poisoned.reason.startswith("undecodable message")
        # the handlers' "done" comes before the worker's (batched) ack: wait for the acks
        wait_until(lambda: client.metrics("jobs").queue_length == 0, timeout=60)
        assert client.delete_many("jobs", [first, last]) == []  # both acked
        assert w.p.poll() is None  # still running
        w.signal(signal.SIGTERM)
        assert w.wait() == 0
        log = w.log.read_text()
        assert log.count('"event": "message.undecodable"') == 1
        assert "Traceback" not in log
