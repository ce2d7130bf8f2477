"""The handlers the soak runs, as `pgqueue worker soak_app:app`.

What a handler does is written in its payload, so the checker can tell a
designed outcome from one the faults caused:

- ``ms``: work time in milliseconds; ``slow``: seconds, longer than the vt, so
  only heartbeats keep the lease;
- ``fail``: fail this many reads, then succeed (transient);
- ``perm``: ``"raise"`` fails every read until the queue poison-drops it,
  ``"poison"`` raises `Poison` at once.

Callbacks run transactionally: a guard makes their effect (a row in
``soak_callback``, and for nested ones a child fan-out; for a workflow's final
callback a row in ``soak_workflow_callback``) commit once with the ack.

Every execution appends a line to ``$SOAK_LOG_DIR/handlers-<pid>.jsonl``, a
log of its own outside the database: ``start``, then ``done`` or ``fail``,
with the read count it was delivered with.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import psycopg

from pgqueue import App, Message, Poison, guard

app = App()

WORK, CALLBACKS, JOBS = "soak_work", "soak_cb", "soak_jobs"
_fd: int | None = None


def log(msg: Message, event: str) -> None:
    """Append one line about this execution; a small O_APPEND write is atomic."""
    global _fd
    if _fd is None:
        path = os.path.join(os.environ["SOAK_LOG_DIR"], f"handlers-{os.getpid()}.jsonl")
        _fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    line = json.dumps(
        {"e": event, "q": msg.queue, "id": msg.msg_id, "rc": msg.read_ct, "t": time.time()}
    )
    os.write(_fd, line.encode() + b"\n")


def _work(msg: Message) -> Any:
    p: dict[str, Any] = msg.message if isinstance(msg.message, dict) else {}
    log(msg, "start")
    try:
        if p.get("slow"):
            time.sleep(float(p["slow"]))
        elif p.get("ms"):
            time.sleep(float(p["ms"]) / 1000)
        if p.get("perm") == "poison":
            raise Poison("designed to be poison")
        if p.get("perm") == "raise":
            raise RuntimeError("designed to fail every time")
        if msg.read_ct <= int(p.get("fail", 0)):
            raise RuntimeError(f"designed transient failure on read {msg.read_ct}")
    except BaseException:
        log(msg, "fail")
        raise
    log(msg, "done")
    return {"rc": msg.read_ct}


@app.handler(WORK)
def work(msg: Message) -> Any:
    """Singles and barrier members."""
    return _work(msg)


@app.handler(JOBS)
def jobs(msg: Message) -> Any:
    """The scenarios' uniform jobs."""
    return _work(msg)


@app.handler(CALLBACKS, transactional=True)
def callback(msg: Message, conn: psycopg.Connection[Any]) -> None:
    """Record the barrier's outcome once; a nested callback fans out a child batch."""
    log(msg, "start")
    cb = msg.callback
    assert cb is not None, "a callback queue's message that no firing wrote"
    p: dict[str, Any] = msg.message if isinstance(msg.message, dict) else {}
    if msg.workflow_id is not None:  # a workflow's final callback
        if guard(conn, f"soak-workflow:{msg.workflow_id}"):
            conn.execute(
                "INSERT INTO soak_workflow_callback (workflow_id, msg_id, state)"
                " VALUES (%s, %s, %s)",
                (msg.workflow_id, msg.msg_id, cb.state),
            )
        log(msg, "done")
        return
    if guard(conn, f"soak-callback:{msg.barrier_id}"):
        conn.execute(
            "INSERT INTO soak_callback (barrier_id, msg_id, total, succeeded, failed)"
            " VALUES (%s, %s, %s, %s, %s)",
            (msg.barrier_id, msg.msg_id, cb.total, cb.succeeded, cb.failed),
        )
        children = p.get("children") or []
        if children:
            conn.execute(
                "SELECT pgqueue.fan_out(%s, %s::jsonb[], %s, %s::jsonb, %s)",
                (
                    WORK,
                    [json.dumps(c) for c in children],
                    CALLBACKS,
                    json.dumps(p.get("child_callback") or {}),
                    f"{msg.barrier_id}/child",
                ),
            )
    log(msg, "done")
