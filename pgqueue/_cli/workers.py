"""`pgqueue workers list`: the workers registered by their heartbeats."""

from __future__ import annotations

from datetime import datetime

from pgqueue._cli._connect import connection_options, open_client, server_now
from pgqueue._cli._exits import expected_errors
from pgqueue._cli._json_output import emit_json, json_option, shape
from pgqueue._cli._main import main
from pgqueue._cli._table import Column, echo_table
from pgqueue._cli._text import ago
from pgqueue.types import WorkerInfo

WORKER_FIELDS = {
    "worker_id": "worker_id",
    "host": "host",
    "pid": "pid",
    "queues": "queues",
    "concurrency": "concurrency",
    "in_flight": "in_flight",
    "started_at": "started_at",
    "last_seen_at": "last_seen_at",
    "stopping": "stopping",
    "alive": "alive",
}


@main.group()
def workers() -> None:
    """The workers that run now (each registers itself while it runs)."""


@workers.command("list")
@json_option
@connection_options
def workers_list(as_json: bool, dsn: str | None, connect_timeout: float) -> None:
    """List registered workers, newest started first.

    STATE is alive (a heartbeat within 15 s), stopping (finishing what it
    holds after SIGTERM) or lost (no heartbeat for 15 s: killed, frozen or
    cut off; its row goes after 10 minutes).
    """
    with expected_errors(), open_client(dsn, connect_timeout) as client:
        now = server_now(client)
        found = client.list_workers()
    if as_json:
        emit_json([{**shape(w, WORKER_FIELDS), "worker_id": str(w.worker_id)} for w in found])
        return
    echo_table(
        [
            Column("ID"),
            Column("HOST"),
            Column("PID", right=True),
            Column("QUEUES", fit="wrap"),
            Column("CONCURRENCY", right=True),
            Column("IN_FLIGHT", right=True),
            Column("STARTED"),
            Column("LAST_SEEN"),
            Column("STATE"),
        ],
        [_row(w, now) for w in found],
        empty="no workers registered; a `pgqueue worker` registers itself as it starts",
    )


def _row(w: WorkerInfo, now: datetime) -> tuple[object, ...]:
    return (
        str(w.worker_id)[:8],
        w.host,
        w.pid,
        ",".join(w.queues),
        w.concurrency,
        w.in_flight,
        ago(w.started_at, now),
        ago(w.last_seen_at, now),
        state(w),
    )


def state(w: WorkerInfo) -> str:
    """alive, stopping (alive and shutting down) or lost (no heartbeat for 15 s)."""
    if not w.alive:
        return "lost"
    return "stopping" if w.stopping else "alive"
