"""Producer spans and the trace context a message carries, on a real database.

Spans go to the OpenTelemetry SDK's in-memory exporter through a provider
given to the client (the global provider can be set once per process).
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags, use_span
from opentelemetry.trace.span import TraceState

from pgqueue import Client, InvalidArgument
from pgqueue._calls.barrier import barrier_links


@pytest.fixture
def spans() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


@pytest.fixture
def traced(dsn: str, spans: tuple[TracerProvider, InMemorySpanExporter]) -> Iterator[Client]:
    with Client.from_dsn(dsn, tracer_provider=spans[0]) as c:
        c.create_queue("jobs")
        c.create_queue("callbacks")
        yield c


def traceparent(span: ReadableSpan) -> str:
    ctx = span.context
    assert ctx is not None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def only(exporter: InMemorySpanExporter) -> ReadableSpan:
    [span] = exporter.get_finished_spans()
    exporter.clear()
    return span


def test_send_span_is_a_producer_and_its_context_travels_in_reserved_headers(
    traced: Client, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    msg_id = traced.send("jobs", {"n": 1}, headers={"who": "me"})
    span = only(spans[1])
    assert span.name == "send jobs"
    assert span.kind is SpanKind.PRODUCER
    assert dict(span.attributes or {}) == {
        "messaging.system": "pgqueue",
        "messaging.destination.name": "jobs",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.message.id": str(msg_id),
    }
    [msg] = traced.read("jobs", vt=30, qty=1)
    assert msg.headers == {"who": "me", "_pg_traceparent": traceparent(span)}


def test_send_keyed_batch_and_fan_out_carry_their_spans_context(
    traced: Client, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    traced.send_keyed("jobs", 1, dedupe_key="k")
    keyed = only(spans[1])
    traced.send_batch("jobs", [2, 3], headers=[None, {"h": 1}])
    batch = only(spans[1])
    assert batch.attributes is not None
    assert batch.attributes["messaging.batch.message_count"] == 2
    bid = traced.fan_out("jobs", [4, 5, 6], callback_queue="callbacks", callback_message={})
    fan = only(spans[1])
    assert fan.attributes is not None
    assert fan.attributes["pgqueue.barrier_id"] == bid
    assert fan.attributes["messaging.batch.message_count"] == 3
    msgs = traced.read("jobs", vt=30, qty=10)
    assert [m.headers.get("_pg_traceparent") if m.headers else None for m in msgs] == [
        traceparent(keyed),
        *[traceparent(batch)] * 2,
        *[traceparent(fan)] * 3,
    ]
    assert msgs[2].headers is not None and msgs[2].headers["h"] == 1


def test_the_callback_continues_the_fan_out_trace_and_its_members_runs_are_kept(
    traced: Client, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    bid = traced.fan_out("jobs", [1, 2], callback_queue="callbacks", callback_message={})
    fan = only(spans[1])
    members = traced.read("jobs", vt=30, qty=2)
    tracer = spans[0].get_tracer("test")
    runs = []
    for m in members:
        with tracer.start_as_current_span("run"):
            traced.complete_member("jobs", m.msg_id)
        runs.append(only(spans[1]))
    [callback] = traced.read("callbacks", vt=30, qty=1)
    assert callback.is_callback
    assert callback.headers is not None
    assert callback.headers["_pg_traceparent"] == traceparent(fan)
    pairs = enumerate(zip(members, runs, strict=True))
    assert traced.run(barrier_links(bid, 128)) == [
        (i, m.msg_id, traceparent(r)) for i, (m, r) in pairs
    ]


def test_a_fan_out_resent_under_another_span_is_a_retry_not_a_conflict(
    traced: Client, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    first = traced.fan_out(
        "jobs", [1], callback_queue="callbacks", callback_message={}, barrier_id="b1"
    )
    again = traced.fan_out(
        "jobs", [1], callback_queue="callbacks", callback_message={}, barrier_id="b1"
    )
    assert first == again == "b1"
    assert traced.metrics("jobs").queue_length == 1


def test_headers_passed_on_from_a_traced_message_carry_the_current_context(
    traced: Client, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    traced.send("jobs", 1, headers={"tenant": "a"})
    only(spans[1])
    [got] = traced.read("jobs", vt=30, qty=1)
    assert got.headers is not None
    traced.send("jobs", 2, headers=got.headers)  # passed on as they came
    second = only(spans[1])
    [again] = traced.read("jobs", vt=30, qty=1)
    assert again.headers == {"tenant": "a", "_pg_traceparent": traceparent(second)}
    with pytest.raises(InvalidArgument, match="_pg_transport"):
        traced.send("jobs", 3, headers={**got.headers, "_pg_transport": True})


def test_with_tracing_off_nothing_is_written_and_no_span_is_made(
    dsn: str, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    with Client.from_dsn(dsn) as plain:  # no provider given, none set globally
        assert plain.tracing is None
        plain.create_queue("jobs")
        plain.send("jobs", 1)
        plain.send_batch("jobs", [2])
        assert [m.headers for m in plain.read("jobs", vt=30, qty=5)] == [None, None]
    assert spans[1].get_finished_spans() == ()


def test_tracing_can_be_switched_off_by_the_environment(
    dsn: str, spans: tuple[TracerProvider, InMemorySpanExporter], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGQUEUE_TRACING", "off")
    with Client.from_dsn(dsn, tracer_provider=spans[0]) as c:
        assert c.tracing is None


@pytest.mark.parametrize(
    ("traceparent_arg", "tracestate"),
    [
        ("not-a-traceparent", None),
        ("00-00000000000000000000000000000000-0000000000000001-01", None),
        ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "x" * 513),
        ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "a=\n"),
    ],
)
def test_a_malformed_trace_context_is_refused_and_nothing_is_sent(
    dsn: str, client: Client, traceparent_arg: str, tracestate: str | None
) -> None:
    client.create_queue("jobs")
    with (
        psycopg.connect(dsn, autocommit=True) as conn,
        pytest.raises(psycopg.errors.InvalidParameterValue, match="trace"),
    ):
        conn.execute(
            "SELECT pgqueue.send('jobs', '1', NULL, 0, NULL, NULL, %s, %s)",
            (traceparent_arg, tracestate),
        )
    assert client.metrics("jobs").queue_length == 0


def test_a_tracestate_travels_beside_the_traceparent(
    traced: Client, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    parent = SpanContext(
        0x0AF7651916CD43DD8448EB211C80319C,
        0xB7AD6B7169203331,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=TraceState([("vendor", "abc")]),
    )
    with use_span(NonRecordingSpan(parent)):
        traced.send("jobs", 1)
    sent = only(spans[1])
    [msg] = traced.read("jobs", vt=30, qty=1)
    assert msg.headers == {"_pg_traceparent": traceparent(sent), "_pg_tracestate": "vendor=abc"}
    assert traceparent(sent).startswith("00-0af7651916cd43dd8448eb211c80319c-")
