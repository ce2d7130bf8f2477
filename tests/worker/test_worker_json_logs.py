"""With PGQUEUE_LOG_FORMAT=json, a worker's stderr is JSON lines only, its libraries' lines too."""

from __future__ import annotations

import json
import signal
from typing import Any

from support.db import terminate_client_backends, wait_until
from support.processes import count, prepare


def test_json_log_is_one_object_per_line_with_the_pool_lines_routed_through_it(
    dsn: str, spawn: Any
) -> None:
    with prepare(dsn) as client:
        client.send_batch("jobs", [{"sleep": 0.05} for _ in range(40)])
        w = spawn(dsn, "--concurrency", "4", "--vt", "10")
        wait_until(lambda: count(dsn, "done") >= 4, timeout=120)
        # Cut every pool connection under the worker, twice: the pool discards
        # the dead ones (psycopg_pool logs) and the calls retry (pgqueue logs).
        for _ in range(2):
            assert terminate_client_backends(dsn) > 0
            wait_until(lambda: count(dsn, "done") >= 20, timeout=120)
        wait_until(lambda: client.metrics("jobs").queue_length == 0, timeout=120)
        w.signal(signal.SIGTERM)
        assert w.wait() == 0
    lines = w.log.read_text().splitlines()
    entries = []
    for n, line in enumerate(lines, 1):
        try:
            entries.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"line {n} of the worker's stderr is not JSON: {line!r}") from None
    assert all(isinstance(e, dict) and "event" in e and "level" in e for e in entries)
    foreign = [e for e in entries if str(e.get("logger", "")).startswith("psycopg")]
    assert foreign, "no line from psycopg / psycopg_pool: foreign records are not routed"
    assert any(e["event"] == "worker.stopped" for e in entries)
