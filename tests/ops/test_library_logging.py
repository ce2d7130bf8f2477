"""As a library pgqueue configures no logging; the worker logs a failure's traceback once.

The library tests run a fresh interpreter each: logging's configuration is
global to the process.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from typing import Any

from support.db import wait_until
from support.processes import count, prepare

LIBRARY = """
import logging, sys, threading
import pgqueue

if sys.argv[2] == "basicConfig":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")

client = pgqueue.Client.from_dsn(sys.argv[1])
client.migrate()
client.create_queue("lib")
app = pgqueue.App()
seen = []

@app.handler("lib")
def handle(msg):
    seen.append(msg.msg_id)
    if msg.message["n"] == 1 and msg.read_ct == 1:
        return do_resize(msg)  # noqa: F821 -- a NameError, as a real slip would be
    return None

client.send_batch("lib", [{"n": 0}, {"n": 1}, {"n": 2}])
settings = pgqueue.WorkerSettings(vt=30, backoff_base=0.01, backoff_max=0.01)
worker = pgqueue.Worker(app, client, settings)
t = threading.Thread(target=worker.run)
t.start()
import time
deadline = time.monotonic() + 60
while client.metrics("lib").queue_length and time.monotonic() < deadline:
    time.sleep(0.05)
worker.stop()
t.join(30)
assert client.metrics("lib").queue_length == 0, "not drained"
client.close()
"""


def run_library(dsn: str, mode: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQUEUE_LOG")}
    return subprocess.run(
        [sys.executable, "-c", LIBRARY, dsn, mode],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=True,
    )


def test_the_library_writes_nothing_to_stdout_and_no_info_or_debug_when_unconfigured(
    empty_dsn: str,
) -> None:
    out = run_library(empty_dsn, "none")
    assert out.stdout == ""
    # Python's own fallback writes WARNING and above, the message and its traceback
    assert "migration.applied" not in out.stderr and "message.acked" not in out.stderr
    assert "worker.started" not in out.stderr
    failed = [line for line in out.stderr.splitlines() if line.startswith("message.failed")]
    assert len(failed) == 1, out.stderr
    assert "NameError" in failed[0] and "queue='lib'" in failed[0]
    assert "name 'do_resize' is not defined" in out.stderr
    assert re.search(r'File "<string>", line \d+, in handle', out.stderr), out.stderr


def test_an_application_that_configures_logging_gets_pgqueues_records_at_its_level(
    empty_dsn: str,
) -> None:
    out = run_library(empty_dsn, "basicConfig")
    assert out.stdout == ""
    lines = out.stderr.splitlines()
    assert any(line.startswith("INFO pgqueue migration.applied") for line in lines), out.stderr
    assert any(line.startswith("INFO pgqueue worker.started") for line in lines)
    assert not any(line.startswith("DEBUG ") for line in lines)
    [failed] = [line for line in lines if line.startswith("WARNING pgqueue message.failed")]
    assert "msg_id=" in failed and "NameError" in failed
    assert out.stderr.count("Traceback (most recent call last)") == 1


def test_a_failed_handler_is_logged_with_its_traceback_once_per_failure(
    dsn: str, spawn: Any
) -> None:
    with prepare(dsn, "batch_jobs") as client:
        client.send("jobs", {"fail_times": 2})
        client.send_batch("batch_jobs", [{"fail_times": 1, "n": i} for i in range(3)])
        w = spawn(
            dsn,
            "--queue",
            "jobs",
            "--queue",
            "batch_jobs",
            "--batch",
            "10",
        )
        wait_until(lambda: count(dsn, "done") >= 4, timeout=60)
        w.signal(signal.SIGTERM)
        assert w.wait() == 0
    failed = w.events("message.failed")
    single = [e for e in failed if e["queue"] == "jobs"]
    assert len(single) == 2
    for line in single:
        assert "RuntimeError: transient failure on read" in line["exception"]
        assert re.search(r'worker_app\.py", line \d+, in behave', line["exception"])
    # the three were visible when the worker started: one read, one batch, one
    # failure of the handler, so one traceback for its three lines
    batch = [e for e in failed if e["queue"] == "batch_jobs"]
    assert len(batch) == 3
    [traced] = [e for e in batch if "exception" in e]
    assert re.search(r'worker_app\.py", line \d+, in batch_jobs', traced["exception"])
