"""Worker processes for tests (a plugin of tests/conftest.py): spawn them, read their logs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgqueue import Client

TESTS = Path(__file__).resolve().parents[1]


def _sighup_default() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


class Proc:
    """A `pgqueue worker worker_app:app` process, its log in a file (JSON lines)."""

    def __init__(
        self, dsn: str, log: Path, *args: str, app: str = "support.worker_app:app", **env_extra: str
    ) -> None:
        env = dict(
            os.environ,
            **env_extra,
            PGQUEUE_DSN=dsn,
            PGQUEUE_LOG_FORMAT="json",
            PYTHONPATH=str(TESTS) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        )
        queues = [] if "--queue" in args else ["--queue", "jobs", "--queue", "callbacks"]
        self.log = log
        with log.open("ab") as out:
            self.p = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "pgqueue",
                    "worker",
                    app,
                    *queues,
                    "--poll-interval",
                    "0.2",
                    *args,
                ],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                # as from a terminal: a run under nohup (CI's) would hand its
                # ignored SIGHUP down, and the worker keeps an ignored one so
                preexec_fn=_sighup_default,
            )

    def signal(self, sig: int) -> None:
        self.p.send_signal(sig)

    def wait(self, timeout: float = 30) -> int:
        return self.p.wait(timeout)

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        """The log lines so far (JSON ones), optionally only those of one event."""
        found = []
        for line in self.log.read_text().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and (name is None or entry.get("event") == name):
                found.append(entry)
        return found


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Proc]]:
    """spawn(dsn, *args, app=..., **env): a worker process, killed at the test's end if running."""
    procs: list[Proc] = []

    def start(dsn: str, *args: str, **kw: str) -> Proc:
        proc = Proc(dsn, tmp_path / f"worker-{len(procs)}.log", *args, **kw)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        exited = proc.p.poll()
        if exited is None:
            proc.p.kill()
            proc.p.wait()
        # shown only when the test failed (captured teardown output): a worker that
        # died at start-up, or never got going on a loaded machine, says why here
        tail = proc.log.read_text(errors="replace").splitlines()[-40:] if proc.log.exists() else []
        print(f"--- {proc.log.name}: exit {exited} (None: killed at teardown) ---", *tail, sep="\n")


def prepare(dsn: str, *queues: str) -> Client:
    """worker_app's tables and queues (jobs and callbacks, and any named) on dsn; a client."""
    from support import worker_app

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(worker_app.SCHEMA)
    client = Client.from_dsn(dsn)
    for q in ("jobs", "callbacks", *queues):
        client.create_queue(q, max_attempts=5)
    return client


def count(dsn: str, event: str) -> int:
    """How many handler events of that kind worker_app recorded; -1 while the server is away."""
    try:
        with psycopg.connect(dsn, connect_timeout=2) as conn:
            row = conn.execute("SELECT count(*) FROM handled WHERE event = %s", (event,)).fetchone()
    except psycopg.OperationalError:
        return -1  # restarting: asked again by wait_until
    return int(row[0]) if row else 0
