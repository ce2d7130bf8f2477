"""Prometheus metrics: the worker's counters, histograms and gauges, and the exporter's collector.

Only imported when metrics are on (`--metrics-port`, `pgqueue exporter`): it
imports prometheus_client, an optional dependency (`pgqueue-py[prometheus]`).
Each worker or exporter gets a registry of its own, never the process-wide
default one, so two in one process (tests, an app embedding a worker) do not
collide. The worker's duties hold `metrics: WorkerMetrics | None` and pay a
branch when it is None. Every metric is described in docs/observability.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

try:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - what the CLI turns into one line
    raise ImportError(
        "metrics need prometheus_client: pip install 'pgqueue-py[prometheus]'"
    ) from exc

import psycopg

from pgqueue._calls import Call, Row
from pgqueue._errors import PgQueueError
from pgqueue._listen import DEFAULT_HOST, CannotListen
from pgqueue._log import get_logger
from pgqueue.types import Message

log = get_logger()

# What becomes of a message a worker held (pgqueue_messages_total's outcome).
OUTCOMES = ("acked", "nacked", "poisoned", "released", "lease_lost")

# Handlers run from milliseconds to minutes; claims wait from a millisecond
# (a busy worker) to hours (a backlog).
HANDLER_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
CLAIM_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600)


class WorkerMetrics:
    """One worker's metrics on a registry of its own; serve() starts its /metrics endpoint."""

    def __init__(self, queues: tuple[str, ...]) -> None:
        """Metrics for a worker consuming `queues` (their series exist from the start, at 0)."""
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.messages = Counter(
            "pgqueue_messages",
            "Messages this worker held, by what became of them.",
            ["queue", "outcome"],
            registry=r,
        )
        self.handler_seconds = Histogram(
            "pgqueue_handler_duration_seconds",
            "How long a handler call ran (a batch handler's call counts once).",
            ["queue"],
            buckets=HANDLER_BUCKETS,
            registry=r,
        )
        self.claim_seconds = Histogram(
            "pgqueue_claim_latency_seconds",
            "From a message becoming visible to its handler starting"
            " (first delivery: from its send; redelivery: from its read).",
            ["queue"],
            buckets=CLAIM_BUCKETS,
            registry=r,
        )
        self.retries = Counter(
            "pgqueue_connection_retries",
            "Calls retried on a fresh connection after a dead one (or a rolled-back transaction).",
            registry=r,
        )
        self.up = Gauge(
            "pgqueue_worker_up", "1 while the worker runs, 0 once it is stopping.", registry=r
        )
        for q in queues:
            for outcome in OUTCOMES:
                self.messages.labels(q, outcome)
            self.handler_seconds.labels(q)
            self.claim_seconds.labels(q)
        self._server: Any = None

    def count(self, queue: str, outcome: str, n: int = 1) -> None:
        """n messages of queue had that outcome."""
        self.messages.labels(queue, outcome).inc(n)

    def handler_ran(self, queue: str, seconds: float) -> None:
        """A handler call of queue took that long."""
        self.handler_seconds.labels(queue).observe(seconds)

    def claimed(self, msg: Message, read_at: float, started_at: float) -> None:
        """A message's handler started; read_at and started_at on the worker's clock.

        A first delivery waited since its send (enqueued_at, on the server's
        clock: a skew between the two clocks shows here, clamped at 0; a
        delayed send counts its delay too). A redelivery's previous lease end
        is not known, so its wait counts from this read.
        """
        if msg.read_ct <= 1:
            waited = max(0.0, time.time() - msg.enqueued_at.timestamp())
        else:
            waited = max(0.0, started_at - read_at)
        self.claim_seconds.labels(msg.queue).observe(waited)

    def watch(self, in_flight: Callable[[], dict[str, int]], acks: Callable[[], int]) -> None:
        """Gauges read at scrape time: messages held by queue, and finished ones awaiting acks."""
        self.registry.register(_HeldCollector(in_flight, acks))

    def retried(self, what: str) -> None:
        """A call of the worker's client was retried on a fresh connection."""
        self.retries.inc()

    def read_poisoned(self, queue: str) -> None:
        """A read of the worker's client poison-dropped a message of queue."""
        self.count(queue, "poisoned")

    def serve(self, port: int, host: str = DEFAULT_HOST) -> None:
        """Serve /metrics on host:port from a thread of its own until close(); else CannotListen."""
        self._server = serve_registry(self.registry, port, host)

    def close(self) -> None:
        """Stop serving /metrics."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class _HeldCollector(Collector):
    """pgqueue_worker_in_flight and pgqueue_acks_pending, counted when scraped (not per message)."""

    def __init__(self, in_flight: Callable[[], dict[str, int]], acks: Callable[[], int]) -> None:
        self.in_flight = in_flight
        self.acks = acks

    def collect(self) -> Iterator[GaugeMetricFamily]:
        held = GaugeMetricFamily(
            "pgqueue_worker_in_flight",
            "Messages the worker holds: waiting for a handler thread or running.",
            labels=["queue"],
        )
        for queue, n in sorted(self.in_flight().items()):
            held.add_metric([queue], n)
        yield held
        yield GaugeMetricFamily(
            "pgqueue_acks_pending",
            "Finished messages whose ack has not committed yet.",
            value=self.acks(),
        )


def _rows(rows: list[Row]) -> list[Row]:
    return rows


# Every queue's figures in one statement (sql/schema/queue.sql, exporter_metrics).
EXPORTER_METRICS: Call[list[Row]] = Call(
    "exporter_metrics",
    "SELECT queue_name, visible, leased, delayed, oldest_visible_age_seconds, poison,"
    " barriers_open, barrier_oldest_open_age_seconds, sent_total, paused"
    " FROM pgqueue.exporter_metrics()",
    (),
    _rows,
)


class QueueCollector(Collector):
    """The queue-level gauges of `pgqueue exporter`, from one SQL round trip per scrape."""

    def __init__(self, run: Callable[[Call[list[Row]]], list[Row]]) -> None:
        """Figures from `run` (a Client's run) of pgqueue.exporter_metrics()."""
        self.run = run

    def describe(self) -> Iterator[Any]:
        # Nothing up front: registering must not query the database.
        return iter(())

    def collect(self) -> Iterator[Any]:
        started = time.monotonic()
        try:
            rows = self.run(EXPORTER_METRICS)
        except (PgQueueError, psycopg.Error) as exc:
            # The scrape still answers, saying it failed: an alert on
            # pgqueue_exporter_scrape_success == 0 tells a database away from
            # an exporter away (up == 0).
            log.error("exporter.scrape_failed", error=str(exc))
            rows, ok = [], 0
        else:
            ok = 1
        yield from _queue_families(rows)
        yield GaugeMetricFamily(
            "pgqueue_exporter_scrape_success",
            "1 if the last scrape read the database, else 0.",
            value=ok,
        )
        yield GaugeMetricFamily(
            "pgqueue_exporter_scrape_duration_seconds",
            "How long the scrape's query took.",
            value=time.monotonic() - started,
        )


def _queue_families(rows: list[Row]) -> Iterator[Any]:
    messages = GaugeMetricFamily(
        "pgqueue_queue_messages",
        "Live messages by state: visible (can be read now), leased (hidden after a read:"
        " held, or waiting out a nack's backoff), delayed (sent with a delay, never read).",
        labels=["queue", "state"],
    )
    oldest = GaugeMetricFamily(
        "pgqueue_queue_oldest_message_age_seconds",
        "Age since send of the oldest visible message (0 when none is visible).",
        labels=["queue"],
    )
    poison = GaugeMetricFamily(
        "pgqueue_queue_poison_messages", "Messages in the poison table.", labels=["queue"]
    )
    barriers = GaugeMetricFamily(
        "pgqueue_barriers_open", "Open barriers whose members are in the queue.", labels=["queue"]
    )
    barrier_age = GaugeMetricFamily(
        "pgqueue_barrier_oldest_open_age_seconds",
        "Age of the oldest open barrier (0 when none is open).",
        labels=["queue"],
    )
    sent = CounterMetricFamily(
        "pgqueue_messages_sent",
        "Message ids handed out by the queue's sequence (sends; a rolled-back send counts too).",
        labels=["queue"],
    )
    paused = GaugeMetricFamily(
        "pgqueue_queue_paused",
        "1 while the queue is paused (reads hand out nothing), else 0.",
        labels=["queue"],
    )
    for name, visible, leased, delayed, age, dead, n_open, open_age, sent_total, is_paused in rows:
        for state, n in (("visible", visible), ("leased", leased), ("delayed", delayed)):
            messages.add_metric([name, state], n)
        oldest.add_metric([name], age or 0.0)
        poison.add_metric([name], dead)
        barriers.add_metric([name], n_open)
        barrier_age.add_metric([name], open_age or 0.0)
        sent.add_metric([name], sent_total)
        paused.add_metric([name], 1 if is_paused else 0)
    yield from (messages, oldest, poison, barriers, barrier_age, sent, paused)


def exporter_registry(run: Callable[[Call[list[Row]]], list[Row]]) -> CollectorRegistry:
    """A registry of its own holding the queue collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector(run))
    return registry


def serve_registry(registry: CollectorRegistry, port: int, host: str = DEFAULT_HOST) -> Any:
    """Serve registry's /metrics on host:port from a thread; the server, else CannotListen."""
    try:
        server, _ = start_http_server(port, host, registry=registry)
    except OSError as exc:
        raise CannotListen(host, port, exc) from exc
    return server
