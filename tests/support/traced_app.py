"""worker_app's handlers in a process that traces: spans go to one JSON-lines file per process.

When PGQUEUE_TEST_SPANS names a directory, importing this installs an
OpenTelemetry SDK provider whose exporter appends every finished span to
`spans-<pid>.jsonl` there (one file per process, so nothing interleaves).
The SimpleSpanProcessor exports as each span ends, so a SIGTERM loses none.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from support.worker_app import app

__all__ = ["app", "read_spans"]


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """What the tests need of one span, as JSON."""
    ctx = span.context
    assert ctx is not None
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_id": f"{span.parent.span_id:016x}" if span.parent else None,
        "attributes": dict(span.attributes or {}),
        "links": [
            {
                "trace_id": f"{link.context.trace_id:032x}",
                "span_id": f"{link.context.span_id:016x}",
                "attributes": dict(link.attributes or {}),
            }
            for link in span.links
        ],
        "status": span.status.status_code.name,
        "pid": os.getpid(),
    }


class JsonLinesExporter(SpanExporter):
    """Appends each span to a file of its own process."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / f"spans-{os.getpid()}.jsonl"

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self.path.open("a") as out:
            for span in spans:
                out.write(json.dumps(span_record(span)) + "\n")
        return SpanExportResult.SUCCESS


def read_spans(directory: Path) -> list[dict[str, Any]]:
    """Every span every process wrote there."""
    return [
        json.loads(line)
        for path in sorted(directory.glob("spans-*.jsonl"))
        for line in path.read_text().splitlines()
    ]


if os.environ.get("PGQUEUE_TEST_SPANS"):
    _provider = TracerProvider()
    _provider.add_span_processor(
        SimpleSpanProcessor(JsonLinesExporter(Path(os.environ["PGQUEUE_TEST_SPANS"])))
    )
    trace.set_tracer_provider(_provider)
