"""What the peer adapters share: timing worker processes draining a queue, a scratch database."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import psycopg

from benchmarks import common

REPO_ROOT = Path(__file__).resolve().parents[2]
POLL_EVERY = 0.02  # seconds between "is the queue drained?" checks
READY_TIMEOUT = 60.0  # seconds for the first worker process to say "ready"
STOP_GRACE = 5.0  # seconds between SIGTERM and SIGKILL


def split(n: int, parts: int) -> list[int]:
    """n as `parts` near-equal shares (the first ones one bigger)."""
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


def timed_threads(shares: list[int], work: Callable[[int], None]) -> float:
    """Seconds for one thread per share running work(share), all started together."""
    go = threading.Barrier(len(shares) + 1)

    def run(k: int) -> None:
        go.wait()
        work(k)

    threads = [threading.Thread(target=run, args=(k,)) for k in shares]
    for t in threads:
        t.start()
    go.wait()
    began = time.monotonic()
    for t in threads:
        t.join()
    return time.monotonic() - began


def time_drain(dsn: str, module: str, args: list[str], processes: int, done_sql: str) -> float:
    """Seconds from the first worker process printing "ready" until `done_sql` returns true.

    Starts `processes` copies of `python -m module *args`, polls `done_sql` every
    POLL_EVERY seconds, then stops them all (SIGTERM, SIGKILL after STOP_GRACE).
    """
    first_ready = threading.Event()
    ready_at: list[float] = []
    lock = threading.Lock()
    procs: list[subprocess.Popen[str]] = []
    readers: list[threading.Thread] = []

    def read(proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:  # keep draining to EOF so the pipe never fills
            if line.strip() == "ready":
                with lock:
                    ready_at.append(time.monotonic())
                first_ready.set()

    with psycopg.connect(dsn, autocommit=True) as conn:
        try:
            for _ in range(processes):
                proc = subprocess.Popen(
                    [sys.executable, "-m", module, *args],
                    cwd=REPO_ROOT,
                    stdout=subprocess.PIPE,
                    stdin=subprocess.DEVNULL,
                    text=True,
                )
                procs.append(proc)
                reader = threading.Thread(target=read, args=(proc,), daemon=True)
                reader.start()
                readers.append(reader)
            deadline = time.monotonic() + READY_TIMEOUT
            while not first_ready.wait(POLL_EVERY):
                _check_alive(procs)
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no {module} process said ready in {READY_TIMEOUT} s")
            with lock:
                began = ready_at[0]
            while True:
                row = conn.execute(done_sql).fetchone()
                if row is not None and row[0]:
                    ended = time.monotonic()
                    break
                _check_alive(procs)
                time.sleep(POLL_EVERY)
        finally:
            stop(procs)
            for reader in readers:
                reader.join(STOP_GRACE)
    return ended - began


def vacuum_analyze(dsn: str, *tables: str) -> None:
    """VACUUM ANALYZE freshly filled tables, so plans see their real size (as autovacuum would)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in tables:
            conn.execute(f"VACUUM ANALYZE {table}")


def _check_alive(procs: list[subprocess.Popen[str]]) -> None:
    """Raise if any worker process has exited."""
    for proc in procs:
        if proc.poll() is not None:
            raise RuntimeError(f"worker process {proc.pid} exited early with {proc.returncode}")


def stop(procs: list[subprocess.Popen[str]]) -> None:
    """SIGTERM every process, SIGKILL those still alive after STOP_GRACE, reap them all."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def summary(xs: list[float]) -> str:
    """p50 / p99 / max of a latency sample, or a note that there is none."""
    if not xs:
        return "n/a"
    s = sorted(xs)
    p50 = s[len(s) // 2]
    p99 = s[min(len(s) - 1, int(0.99 * len(s)))]
    return f"p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {s[-1]:.1f} ms (n={len(s)})"


def self_check(peer: ModuleType, header: str) -> None:
    """Run every function of an adapter once, small, on a scratch database; print the figures."""
    admin = os.environ.get("PGQUEUE_DSN", common.DEFAULT_DSN)
    with common.scratch_database(admin, f"bench_peer_{peer.NAME.lower()}", migrate=False) as target:
        print(f"{peer.NAME}, {header}")
        peer.install(target)
        for conns in (1, 4):
            peer.reset(target)
            rate = peer.enqueue_single(target, 2000, conns)
            print(f"enqueue_single n=2000 conns={conns}: {rate:,.0f}/s")
        peer.reset(target)
        print(f"enqueue_batch n=2000 batch=100: {peer.enqueue_batch(target, 2000, 100):,.0f}/s")
        for processes in (1, 2):
            peer.reset(target)
            rate = peer.drain(target, 2000, processes)
            print(f"drain n=2000 processes={processes}: {rate:,.0f}/s")
        for listen in (True, False):
            peer.reset(target)
            print(f"latency listen={listen}: {summary(peer.latency(target, 5, listen))}")
