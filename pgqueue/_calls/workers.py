"""The worker registry and the per-minute rates its heartbeats feed, as calls."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime

from pgqueue._calls import Call, Row, int32, scalar
from pgqueue._errors import InvalidArgument
from pgqueue.types import QueueMinute, WorkerInfo

# What a worker did to its queues since its last heartbeat: (acked, nacked, poisoned) by queue.
Tallies = Mapping[str, tuple[int, int, int]]


def worker_heartbeat(
    worker_id: uuid.UUID,
    host: str,
    pid: int,
    queues: Sequence[str],
    concurrency: int,
    in_flight: int,
    stopping: bool,
    tallies: Tallies,
    started_at: datetime | None = None,
) -> Call[dict[str, bool]]:
    """Upsert the worker's row and add its tallies to this minute; its queues -> paused.

    Not retried: a retry after a lost commit reply would add the tallies twice.
    started_at None: the time of the row's first heartbeat, on the database's clock.
    """
    names = list(tallies)
    return Call(
        "worker_heartbeat",
        "SELECT queue_name, paused FROM pgqueue.worker_heartbeat("
        "%s, %s, %s, %s::text[], %s, %s, %s::timestamptz, %s,"
        " %s::text[], %s::bigint[], %s::bigint[], %s::bigint[])",
        (
            worker_id,
            host,
            int32("pid", pid),
            list(queues),
            int32("concurrency", concurrency),
            int32("in_flight", in_flight),
            started_at,
            stopping,
            names,
            [tallies[q][0] for q in names],
            [tallies[q][1] for q in names],
            [tallies[q][2] for q in names],
        ),
        lambda rows: {str(q): bool(p) for q, p in rows},
        retryable=False,
    )


def worker_deregister(worker_id: uuid.UUID) -> Call[bool]:
    """Remove the worker's row; False if it had none."""
    return Call("worker_deregister", "SELECT pgqueue.worker_deregister(%s)", (worker_id,), scalar)


def _workers(rows: list[Row]) -> list[WorkerInfo]:
    return [WorkerInfo(*r) for r in rows]


def list_workers() -> Call[list[WorkerInfo]]:
    """Every registered worker, newest started first."""
    return Call(
        "list_workers",
        "SELECT worker_id, host, pid, queues, concurrency, in_flight, started_at, last_seen_at,"
        " stopping, alive FROM pgqueue.list_workers()",
        (),
        _workers,
    )


def sample_rates() -> Call[int]:
    """Sample every queue's sends for this minute, unless sampled already; the rows written."""
    return Call("sample_rates", "SELECT pgqueue.sample_rates()", (), scalar)


def queue_rates(queues: Sequence[str] | None, minutes: int) -> Call[list[QueueMinute]]:
    """Per queue and minute of the last `minutes`: sent, acked, nacked, poisoned."""
    if isinstance(queues, str):
        raise InvalidArgument(f"queues must be a list of queue names, got the string {queues!r}")
    return Call(
        "queue_rates",
        "SELECT queue_name, minute, sent, acked, nacked, poisoned"
        " FROM pgqueue.queue_rates(%s::text[], %s)",
        (None if queues is None else list(queues), int32("minutes", minutes)),
        lambda rows: [QueueMinute(*r) for r in rows],
    )
