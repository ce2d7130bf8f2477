"""The app the worker tests run, in-process and as `pgqueue worker worker_app:app`.

Handlers record every start and finish in the table `handled`, through a
connection of their own, so tests can count executions from the database.
What a handler does is driven by its payload.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import psycopg

from pgqueue import App, Message, Poison, guard

app = App()

SCHEMA = """
CREATE TABLE IF NOT EXISTS handled (
    queue text, msg_id bigint, event text, read_ct int, pid int,
    at timestamptz DEFAULT clock_timestamp());
CREATE TABLE IF NOT EXISTS effects (key text, msg_id bigint);
CREATE TABLE IF NOT EXISTS gates (name text PRIMARY KEY);
"""

# How long a handler waits at a gate nobody opens (a failed test): then it fails.
GATE_BOUND = 300.0


def record(msg: Message, event: str) -> None:
    with psycopg.connect(os.environ["PGQUEUE_DSN"], autocommit=True) as conn:
        conn.execute(
            "INSERT INTO handled (queue, msg_id, event, read_ct, pid) VALUES (%s, %s, %s, %s, %s)",
            (msg.queue, msg.msg_id, event, msg.read_ct, os.getpid()),
        )


def open_gate(dsn: str, name: str) -> None:
    """Let every handler waiting at gate `name` (payload {"gate": name}) go on."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO gates VALUES (%s) ON CONFLICT DO NOTHING", (name,))


def wait_at_gate(name: str) -> None:
    """Hold the handler until a test opens the gate: the test, not a guessed sleep,
    decides when it ends (a loaded machine is slow to get anywhere)."""
    deadline = time.monotonic() + GATE_BOUND
    with psycopg.connect(os.environ["PGQUEUE_DSN"], autocommit=True) as conn:
        while time.monotonic() < deadline:
            if conn.execute("SELECT 1 FROM gates WHERE name = %s", (name,)).fetchone():
                return
            time.sleep(0.05)
    raise RuntimeError(f"gate {name!r} was never opened")


def behave(msg: Message) -> None:
    p: dict[str, Any] = msg.message if isinstance(msg.message, dict) else {}
    if p.get("gate"):
        wait_at_gate(str(p["gate"]))
    if p.get("sleep"):
        time.sleep(float(p["sleep"]))
    if p.get("poison"):
        raise Poison("payload cannot be handled")
    if msg.read_ct <= int(p.get("fail_times", 0)):
        raise RuntimeError(f"transient failure on read {msg.read_ct}")


@app.handler("jobs")
def jobs(msg: Message) -> Any:
    record(msg, "start")
    behave(msg)
    record(msg, "done")
    return {"n": msg.message.get("n") if isinstance(msg.message, dict) else None}


@app.handler("async_jobs")
async def async_jobs(msg: Message) -> Any:
    await asyncio.to_thread(record, msg, "start")
    # "first_sleep": how long the first delivery sleeps (one a test stops the
    # worker during); a redelivery sleeps "sleep"
    sleep = msg.message.get("sleep", 0)
    if msg.read_ct == 1:
        sleep = msg.message.get("first_sleep", sleep)
    await asyncio.sleep(float(sleep))
    await asyncio.to_thread(record, msg, "done")
    return "async"


@app.handler("tx", transactional=True)
def tx(msg: Message, conn: psycopg.Connection[Any]) -> None:
    record(msg, "start")
    if guard(conn, f"effect:{msg.message['key']}"):
        conn.execute("INSERT INTO effects VALUES (%s, %s)", (msg.message["key"], msg.msg_id))
    if msg.message.get("fail_first") and msg.read_ct == 1:
        raise RuntimeError("failed after writing: the write must roll back")
    record(msg, "done")


@app.handler("callbacks")
def callbacks(msg: Message) -> None:
    record(msg, "callback" if msg.is_callback else "plain")


BATCH_SIZES: list[int] = []  # of batch_jobs calls, for in-process tests


@app.handler("batch_jobs", batch=True)
def batch_jobs(msgs: list[Message]) -> Any:
    """All or nothing: one failing payload fails (or poisons) the whole batch."""
    BATCH_SIZES.append(len(msgs))
    for msg in msgs:
        record(msg, "start")
    for msg in msgs:
        behave(msg)
    for msg in msgs:
        record(msg, "done")
    if any(isinstance(m.message, dict) and m.message.get("bad_results") for m in msgs):
        return ["only one result"]
    return [{"n": m.message.get("n") if isinstance(m.message, dict) else None} for m in msgs]


@app.handler("async_batch", batch=True)
async def async_batch(msgs: list[Message]) -> None:
    for msg in msgs:
        await asyncio.to_thread(record, msg, "done")


@app.handler("tx_batch", transactional=True, batch=True)
def tx_batch(msgs: list[Message], conn: psycopg.Connection[Any]) -> None:
    for msg in msgs:
        conn.execute("INSERT INTO effects VALUES (%s, %s)", (msg.message["key"], msg.msg_id))
    if any(m.message.get("fail_first") and m.read_ct == 1 for m in msgs):
        raise RuntimeError("failed after writing: every write of the batch must roll back")
    for msg in msgs:
        record(msg, "done")


@app.handler("tx_effects", transactional=True)
def tx_effects(msg: Message, conn: psycopg.Connection[Any]) -> None:
    """Writes its effect first, then works: no guard, so only the runtime keeps it single."""
    record(msg, "start")
    conn.execute("INSERT INTO effects VALUES (%s, %s)", (msg.message["key"], msg.msg_id))
    if msg.message.get("gate"):
        wait_at_gate(str(msg.message["gate"]))
    time.sleep(float(msg.message.get("sleep", 0)))
    record(msg, "done")
