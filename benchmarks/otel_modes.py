"""The tracing modes the benchmarks can run pgqueue in, chosen by PGQUEUE_BENCH_OTEL.

- `off` (the default): no OpenTelemetry SDK; pgqueue's tracing is off.
- `sdk-drop`: the SDK with a BatchSpanProcessor around an exporter that keeps
  nothing: every span is made, recorded and dropped, the price of tracing.
- `sampled-off`: the SDK with a sampler that records nothing (ALWAYS_OFF):
  spans exist but do not record; the trace context still travels.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

MODES = ("off", "sdk-drop", "sampled-off")


def provider(mode: str) -> Any:
    """A tracer provider for the mode (None for off)."""
    if mode == "off":
        return None
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased

    class Drop(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    if mode == "sampled-off":
        return TracerProvider(sampler=ParentBased(ALWAYS_OFF))
    if mode != "sdk-drop":
        raise SystemExit(f"PGQUEUE_BENCH_OTEL must be one of {MODES}, got {mode!r}")
    made = TracerProvider()
    made.add_span_processor(BatchSpanProcessor(Drop()))
    return made


def install_from_env() -> str:
    """Set the global tracer provider PGQUEUE_BENCH_OTEL asks for; the mode."""
    mode = os.environ.get("PGQUEUE_BENCH_OTEL", "off")
    made = provider(mode)
    if made is not None:
        from opentelemetry import trace

        trace.set_tracer_provider(made)
    return mode
