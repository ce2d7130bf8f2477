"""OpenTelemetry traces (`pgqueue-py[otel]`): the only module that imports opentelemetry.

Spans follow the OpenTelemetry messaging conventions: `send {queue}`
(PRODUCER) around send, send_keyed, send_batch and fan_out; `process {queue}`
(CONSUMER) around a handler's run, the child of the message's creation
context; `settle {queue}` (CLIENT) around the worker's acks, linking the runs
it acks. A message's context travels in the reserved headers
`_pg_traceparent` / `_pg_tracestate`, written only by pgqueue's SQL from the
call's own trace arguments, so a producer can set its own message's context
and nothing else. A barrier's callback run links the runs that completed its
members (`pgqueue.barrier_links`), at most `links` of them.

Tracing is resolved once, when a Client or a Worker is made: off (None) when
opentelemetry is not installed, when PGQUEUE_TRACING=off, or when no SDK
tracer provider is set. Off, the hot path pays one `is None` branch and sends
the very SQL it sent before.
"""

from __future__ import annotations

import os
import re
from collections.abc import Coroutine, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from pgqueue.types import Message

TRACEPARENT = "_pg_traceparent"
TRACESTATE = "_pg_tracestate"
# The semantic conventions followed (messaging.operation.type, `send` not `publish`).
SCHEMA_URL = "https://opentelemetry.io/schemas/1.27.0"
# A callback's run links at most this many member runs: with its creation
# link, the SDK's default limit of 128 links a span (past it, the SDK drops
# the oldest links first: the creation link would go).
DEFAULT_LINKS = 127

_TRACEPARENT = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}\Z")

Trace = tuple[str, str | None]
"""A context as W3C headers carry it: (traceparent, tracestate or None)."""


def _version() -> str:
    try:
        return metadata.version("pgqueue-py")
    except metadata.PackageNotFoundError:  # pragma: no cover - a source tree without metadata
        return "0"


def without_trace_headers(headers: dict[str, Any] | None) -> dict[str, Any] | None:
    """The headers without the two trace keys, which a send writes afresh (others stay refused).

    A handler that passes on the headers of the message it got then sends
    them as they are: the trace context is the current one, not the old one.
    """
    if headers is None or (TRACEPARENT not in headers and TRACESTATE not in headers):
        return headers
    return {k: v for k, v in headers.items() if k not in (TRACEPARENT, TRACESTATE)}


def resolve(tracer_provider: Any = None, links: int = DEFAULT_LINKS) -> Tracing | None:
    """The tracing a client or worker made now uses, or None: tracing off, its cost one branch."""
    if os.environ.get("PGQUEUE_TRACING", "").strip().lower() in ("off", "0", "false", "no"):
        return None
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
    if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        return None  # no SDK configured: every span would be a no-op
    return Tracing(provider, links)


@dataclass
class SendSpan:
    """A producer span, and the context its messages carry (None when it has none)."""

    span: Any
    trace: Trace | None

    def sent(self, msg_ids: Sequence[int]) -> None:
        """Record the ids sent (one id: messaging.message.id)."""
        if len(msg_ids) == 1:
            self.span.set_attribute("messaging.message.id", str(msg_ids[0]))


@dataclass
class ProcessSpan:
    """A consumer span around one handler run."""

    span: Any
    traceparent: str | None  # what a member completed in it records; None when not sampled

    def failed(self, exc: BaseException) -> None:
        """Mark the run failed with the exception's type (error.type), as a handler error."""
        from opentelemetry.trace import Status, StatusCode

        self.span.set_attribute("error.type", _error_type(exc))
        self.span.set_status(Status(StatusCode.ERROR, str(exc)[:200]))

    def note(self, key: str, value: Any) -> None:
        """Set one more attribute (pgqueue.*) on the run's span."""
        self.span.set_attribute(key, value)


def _error_type(exc: BaseException) -> str:
    cls = type(exc)
    module = cls.__module__
    if module.startswith("pgqueue."):
        module = "pgqueue"  # the public name of Poison, Retry and the errors
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"


class Tracing:
    """Spans for one client or worker, from one tracer provider."""

    def __init__(self, provider: Any, links: int = DEFAULT_LINKS) -> None:
        """Tracing through `provider`; a callback's run links at most `links` member runs."""
        from opentelemetry import context, trace

        self._trace = trace
        self._context = context
        self.provider = provider
        self._tracer = provider.get_tracer("pgqueue", _version(), schema_url=SCHEMA_URL)
        self.links = links

    def _attributes(self, queue: str, operation: str, kind: str) -> dict[str, Any]:
        return {
            "messaging.system": "pgqueue",
            "messaging.destination.name": queue,
            "messaging.operation.type": kind,
            "messaging.operation.name": operation,
        }

    @contextmanager
    def send(
        self, queue: str, count: int | None = None, extra: dict[str, Any] | None = None
    ) -> Iterator[SendSpan]:
        """A PRODUCER span `send {queue}`, current while the call runs; its context to carry."""
        attributes = self._attributes(queue, "send", "send")
        if count is not None:
            attributes["messaging.batch.message_count"] = count
        attributes.update(extra or {})
        with self._span(f"send {queue}", self._trace.SpanKind.PRODUCER, attributes) as span:
            # What the W3C propagator would write, made directly (its inject
            # costs more than the span): sampled or not, the context travels.
            ctx = span.get_span_context()
            trace: Trace | None = None
            if ctx.is_valid:
                state = ctx.trace_state.to_header() if ctx.trace_state else ""
                trace = (
                    f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}",
                    state or None,
                )
            yield SendSpan(span, trace)

    @contextmanager
    def process(
        self, msgs: Sequence[Message], links: Sequence[tuple[str, dict[str, Any]]] = ()
    ) -> Iterator[ProcessSpan]:
        """A CONSUMER span `process {queue}` around a handler's run, current in its thread.

        One message: the child of its creation context, and linked to it. A
        batch: no parent, a link to each message's creation context. `links`
        adds (traceparent, attributes) pairs: a callback's member runs.
        """
        from opentelemetry.trace import Link

        msg = msgs[0]
        attributes = self._attributes(msg.queue, "process", "process")
        parent = None
        span_links: list[Any] = []
        for m in msgs:
            created = self._extract(m.headers)
            if created is not None:
                span_links.append(Link(created, {"messaging.message.id": str(m.msg_id)}))
        if len(msgs) == 1:
            attributes.update(
                {"messaging.message.id": str(msg.msg_id), "pgqueue.read_ct": msg.read_ct}
            )
            if msg.barrier_id is not None:
                attributes["pgqueue.barrier_id"] = msg.barrier_id
            if msg.member_index is not None:
                attributes["pgqueue.member_index"] = msg.member_index
            if msg.is_callback:
                attributes["pgqueue.callback"] = True
            if span_links:
                parent = self._trace.set_span_in_context(
                    self._trace.NonRecordingSpan(span_links[0].context)
                )
        else:
            attributes["messaging.batch.message_count"] = len(msgs)
        for traceparent, attrs in links:
            member = self._parse(traceparent)
            if member is not None:
                span_links.append(Link(member, attrs))
        with self._span(
            f"process {msg.queue}",
            self._trace.SpanKind.CONSUMER,
            attributes,
            context=parent if parent is not None else self._context.Context(),
            links=span_links,
        ) as span:
            yield ProcessSpan(span, self._traceparent(span))

    @contextmanager
    def settle(self, queue: str, call: str, traceparents: Sequence[str | None]) -> Iterator[Any]:
        """A CLIENT span `settle {queue}` around one ack statement, linking the runs it acks."""
        from opentelemetry.trace import Link

        attributes = self._attributes(queue, "settle", "settle")
        attributes["messaging.batch.message_count"] = len(traceparents)
        attributes["pgqueue.call"] = call
        links = []
        for tp in traceparents:
            ctx = self._parse(tp) if tp is not None else None
            if ctx is not None:
                links.append(Link(ctx))
        if len(links) > self.links:
            attributes["pgqueue.links_dropped"] = len(links) - self.links
            links = links[: self.links]
        with self._span(
            f"settle {queue}",
            self._trace.SpanKind.CLIENT,
            attributes,
            context=self._context.Context(),
            links=links,
        ) as span:
            yield span

    def current_traceparent(self) -> str | None:
        """The traceparent of the current span, if it is sampled: what a completion records."""
        return self._traceparent(self._trace.get_current_span())

    def in_current_context(self, coro: Coroutine[Any, Any, Any]) -> Coroutine[Any, Any, Any]:
        """The coroutine, run inside the calling thread's current span (an async handler's run)."""
        ctx = self._context.get_current()
        attach, detach = self._context.attach, self._context.detach

        async def run() -> Any:
            token = attach(ctx)
            try:
                return await coro
            finally:
                detach(token)

        return run()

    # -- helpers ------------------------------------------------------------

    @contextmanager
    def _span(self, name: str, kind: Any, attributes: dict[str, Any], **kw: Any) -> Iterator[Any]:
        with self._tracer.start_as_current_span(
            name, kind=kind, attributes=attributes, **kw
        ) as span:
            try:
                yield span
            except BaseException as exc:
                span.set_attribute("error.type", _error_type(exc))
                raise

    def _traceparent(self, span: Any) -> str | None:
        ctx = span.get_span_context()
        if not ctx.is_valid or not ctx.trace_flags.sampled:
            return None
        return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"

    def _parse(self, traceparent: str) -> Any:
        """A remote SpanContext from a traceparent, or None if it is not one."""
        return self._extract({TRACEPARENT: traceparent})

    def _extract(self, headers: dict[str, Any] | None) -> Any:
        """The creation context a message carries in its reserved headers, or None.

        Parsed here rather than through the propagator (a tenth of its cost):
        pgqueue's SQL wrote and checked these values, and a value that does
        not match is ignored.
        """
        if not isinstance(headers, dict):
            return None
        traceparent = headers.get(TRACEPARENT)
        if not isinstance(traceparent, str) or not _TRACEPARENT.match(traceparent):
            return None
        trace_id, span_id = int(traceparent[3:35], 16), int(traceparent[36:52], 16)
        if not trace_id or not span_id:
            return None
        state = headers.get(TRACESTATE)
        return self._trace.SpanContext(
            trace_id,
            span_id,
            is_remote=True,
            trace_flags=self._trace.TraceFlags(int(traceparent[53:55], 16)),
            trace_state=self._trace_state(state) if isinstance(state, str) and state else None,
        )

    def _trace_state(self, header: str) -> Any:
        from opentelemetry.trace.span import TraceState

        return TraceState.from_header([header])
