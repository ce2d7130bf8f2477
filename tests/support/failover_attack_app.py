"""The app of tests/client/test_failover_attacks.py, run as `pgqueue worker`.

Its handlers record every start and finish in a file (PGQUEUE_ATTACK_LOG,
one JSON line each), never in the database: the database is the thing the
tests turn read-only or fail over, and a record that needs it would fail with
it and be counted as the handler's failure.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from pgqueue import App, Message

app = App()

# How long a handler waits at a gate nobody opens (a failed test): then it fails.
GATE_BOUND = 300.0


def record(msg: Message, event: str) -> None:
    line = json.dumps(
        {"msg_id": msg.msg_id, "read_ct": msg.read_ct, "event": event, "pid": os.getpid()}
    )
    with open(os.environ["PGQUEUE_ATTACK_LOG"], "a") as out:
        out.write(line + "\n")


def wait_at_gate(path: str) -> None:
    """Hold the handler until the test creates the file at `path` (a file, not a row:
    the database is what the tests break); give up after GATE_BOUND seconds."""
    deadline = time.monotonic() + GATE_BOUND
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise RuntimeError(f"gate {path} was never opened")
        time.sleep(0.05)


def handle(msg: Message) -> Any:
    record(msg, "start")
    payload: dict[str, Any] = msg.message if isinstance(msg.message, dict) else {}
    if payload.get("gate"):
        wait_at_gate(str(payload["gate"]))
    time.sleep(float(payload.get("sleep", 0)))
    record(msg, "done")
    return {"n": payload.get("n")}


for _queue in ("ro_jobs", "moved_jobs"):
    app.handler(_queue)(handle)
