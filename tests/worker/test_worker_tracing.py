"""The worker's spans: each run continues its message's trace, and a callback links its members.

In-process workers record into the SDK's in-memory exporter; the fan-in test
runs two `pgqueue worker` processes that each write their spans to a file.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from support import worker_app
from support.db import wait_until
from support.processes import count, prepare
from support.traced_app import read_spans

from pgqueue import App, Client, Message, Worker, WorkerSettings

Spans = tuple[TracerProvider, InMemorySpanExporter]


@pytest.fixture
def spans() -> Spans:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


@pytest.fixture
def traced(dsn: str, spans: Spans, monkeypatch: pytest.MonkeyPatch) -> Iterator[Client]:
    monkeypatch.setenv("PGQUEUE_DSN", dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(worker_app.SCHEMA)
    with Client.from_dsn(dsn, tracer_provider=spans[0]) as c:
        for q in ("jobs", "async_jobs", "callbacks", "batch_jobs"):
            c.create_queue(q, max_attempts=3)
        yield c


@pytest.fixture
def run_worker(dsn: str, spans: Spans) -> Iterator[Callable[..., Worker]]:
    started: list[tuple[Worker, threading.Thread, Client]] = []

    def run(app: App = worker_app.app, **settings: Any) -> Worker:
        base: dict[str, Any] = {"poll_interval": 0.2, "vt": 5, "backoff_base": 0.01}
        base.update(settings)
        wclient = Client.from_dsn(dsn, max_size=10)
        w = Worker(app, wclient, WorkerSettings(**base), tracer_provider=spans[0])
        t = threading.Thread(target=w.run, kwargs={"install_signals": False}, daemon=True)
        t.start()
        started.append((w, t, wclient))
        return w

    yield run
    for w, t, c in started:
        w.stop()
        t.join(15)
        c.close()


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


def test_a_run_is_the_child_of_its_send_span_and_its_ack_links_the_run(
    traced: Client, spans: Spans, run_worker: Callable[..., Worker]
) -> None:
    msg_id = traced.send("jobs", {"n": 1})
    [send] = named(spans[1], "send jobs")
    run_worker(queues=("jobs",))
    wait_until(lambda: len(named(spans[1], "settle jobs")) == 1)
    [run] = named(spans[1], "process jobs")
    assert run.kind is SpanKind.CONSUMER
    assert send.context is not None and run.context is not None
    assert run.context.trace_id == send.context.trace_id
    assert run.parent is not None and run.parent.span_id == span_id(send)
    assert [link.context.span_id for link in run.links] == [span_id(send)]
    assert dict(run.attributes or {}) == {
        "messaging.system": "pgqueue",
        "messaging.destination.name": "jobs",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.message.id": str(msg_id),
        "pgqueue.read_ct": 1,
    }
    [settle] = named(spans[1], "settle jobs")
    assert settle.kind is SpanKind.CLIENT
    assert settle.attributes is not None and settle.attributes["pgqueue.call"] == "delete"
    assert [link.context.span_id for link in settle.links] == [span_id(run)]


def test_a_redelivery_is_a_second_run_and_the_failed_one_says_why(
    traced: Client, spans: Spans, run_worker: Callable[..., Worker]
) -> None:
    traced.send("jobs", {"fail_times": 1})
    run_worker(queues=("jobs",))
    wait_until(lambda: len(named(spans[1], "settle jobs")) == 1)
    first, second = named(spans[1], "process jobs")
    assert first.attributes is not None and second.attributes is not None
    assert (first.attributes["pgqueue.read_ct"], second.attributes["pgqueue.read_ct"]) == (1, 2)
    assert first.status.status_code is StatusCode.ERROR
    assert first.attributes["error.type"] == "RuntimeError"
    assert second.status.status_code is StatusCode.UNSET
    assert first.parent is not None and second.parent is not None
    assert first.parent.span_id == second.parent.span_id  # both continue the send


def test_a_batch_run_is_one_span_linking_each_message(
    traced: Client, spans: Spans, run_worker: Callable[..., Worker]
) -> None:
    worker_app.BATCH_SIZES.clear()
    traced.send_batch("batch_jobs", [{"n": i} for i in range(3)])
    [send] = named(spans[1], "send batch_jobs")
    run_worker(queues=("batch_jobs",), batch=3)
    wait_until(lambda: len(named(spans[1], "settle batch_jobs")) >= 1)
    assert worker_app.BATCH_SIZES == [3]
    [run] = named(spans[1], "process batch_jobs")
    assert run.parent is None
    assert run.attributes is not None and run.attributes["messaging.batch.message_count"] == 3
    assert [link.context.span_id for link in run.links] == [span_id(send)] * 3


def test_an_async_handler_runs_inside_its_span(
    traced: Client, spans: Spans, run_worker: Callable[..., Worker]
) -> None:
    seen: list[int] = []
    app = App()

    @app.handler("async_jobs")
    async def handle(msg: Message) -> None:
        await asyncio.sleep(0)
        seen.append(trace.get_current_span().get_span_context().span_id)

    traced.send("async_jobs", {})
    run_worker(app, queues=("async_jobs",))
    wait_until(lambda: len(named(spans[1], "process async_jobs")) == 1)
    [run] = named(spans[1], "process async_jobs")
    assert seen == [span_id(run)]


@pytest.mark.parametrize("cap", [None, 20])
def test_a_callback_links_at_most_the_cap_of_its_members_runs_and_keeps_its_creation_link(
    traced: Client, spans: Spans, run_worker: Callable[..., Worker], cap: int | None
) -> None:
    bid = traced.fan_out(
        "jobs", [{"n": i} for i in range(140)], callback_queue="callbacks", callback_message={}
    )
    settings: dict[str, Any] = {} if cap is None else {"trace_links": cap}
    run_worker(queues=("jobs", "callbacks"), concurrency=8, **settings)
    wait_until(lambda: len(named(spans[1], "process callbacks")) == 1, timeout=60)
    [callback] = named(spans[1], "process callbacks")
    [fan] = named(spans[1], "send jobs")
    assert callback.parent is not None and callback.parent.span_id == span_id(fan)
    expected = 127 if cap is None else cap  # with the creation link: the SDK's 128 by default
    attributes = dict(callback.attributes or {})
    assert attributes["pgqueue.barrier_id"] == bid
    assert attributes["pgqueue.callback"] is True
    assert attributes["pgqueue.barrier.links"] == expected
    runs = {span_id(s): s for s in named(spans[1], "process jobs")}
    members = [link for link in callback.links if link.context.span_id in runs]
    assert [link.attributes["pgqueue.member_index"] for link in members] == list(range(expected))
    assert span_id(fan) in [link.context.span_id for link in callback.links], "creation link kept"


def test_fan_in_across_two_worker_processes_links_all_20_members(
    dsn: str, spawn: Any, tmp_path: Path
) -> None:
    """The issue's test: 20 members across two processes, one callback linking every run."""
    out = tmp_path / "spans"
    out.mkdir()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with prepare(dsn) as plain:
        plain.close()
    with Client.from_dsn(dsn, tracer_provider=provider) as producer:
        with provider.get_tracer("test").start_as_current_span("request"):
            bid = producer.fan_out(
                "jobs",
                [{"sleep": 0.05, "n": i} for i in range(20)],
                callback_queue="callbacks",
                callback_message={"album": 1},
            )
        # a forged trace header is refused; nothing is sent
        forged = {"_pg_traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
        with (
            psycopg.connect(dsn, autocommit=True) as raw,
            pytest.raises(psycopg.errors.InvalidParameterValue, match="reserved"),
        ):
            raw.execute("SELECT pgqueue.send('callbacks', '{}', %s::jsonb)", (json.dumps(forged),))
    [fan] = [s for s in exporter.get_finished_spans() if s.name == "send jobs"]
    assert fan.context is not None
    workers = [
        spawn(
            dsn,
            "--concurrency",
            "1",
            "--batch",
            "5",
            app="support.traced_app:app",
            PGQUEUE_TEST_SPANS=str(out),
        )
        for _ in range(2)
    ]
    wait_until(lambda: count(dsn, "callback") == 1, timeout=60)
    for w in workers:
        w.signal(signal.SIGTERM)
    assert [w.wait() for w in workers] == [0, 0]
    recorded = read_spans(out)
    trace_id = f"{fan.context.trace_id:032x}"
    fan_id = f"{fan.context.span_id:016x}"
    runs = [s for s in recorded if s["name"] == "process jobs"]
    assert len(runs) == 20
    assert len({s["pid"] for s in runs}) == 2, "both workers took members"
    for run in runs:
        assert (run["trace_id"], run["parent_id"], run["kind"]) == (trace_id, fan_id, "CONSUMER")
        assert run["attributes"]["pgqueue.barrier_id"] == bid
        assert run["attributes"]["messaging.system"] == "pgqueue"
        assert run["attributes"]["pgqueue.read_ct"] == 1
    [callback] = [s for s in recorded if s["name"] == "process callbacks"]
    assert (callback["trace_id"], callback["parent_id"]) == (trace_id, fan_id)
    assert callback["attributes"]["pgqueue.barrier_id"] == bid
    assert callback["attributes"]["pgqueue.barrier.links"] == 20
    member_links = [link for link in callback["links"] if link["span_id"] != fan_id]
    assert sorted(link["span_id"] for link in member_links) == sorted(r["span_id"] for r in runs)
    by_run = {r["span_id"]: r for r in runs}
    for link in member_links:
        run = by_run[link["span_id"]]
        assert (
            link["attributes"]["messaging.message.id"] == run["attributes"]["messaging.message.id"]
        )
        assert (
            link["attributes"]["pgqueue.member_index"] == run["attributes"]["pgqueue.member_index"]
        )
    settled = {
        link["span_id"] for s in recorded if s["name"] == "settle jobs" for link in s["links"]
    }
    assert settled == set(by_run), "every run's ack links it"
