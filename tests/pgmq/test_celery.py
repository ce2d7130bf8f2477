"""Celery on pgqueue: a real Celery worker, brokered by `kombu-pgmq` over the pgmq facade.

The app (tests/support/celery_app.py) is configured the way kombu-pgmq
documents it; the worker is a real `celery worker` process. Every task run
leaves a row in `celery_runs`, so the tests count runs per message, and
results come back through Celery's database backend on the same Postgres.

- test_tasks_run_once_each: 50 tasks sent with .delay() each run once, and
  each result arrives. It runs on real PGMQ too (the same harness, the same
  assertions), which shows the harness, not the facade, is what is tested
  there.
- test_celery_messages_in_pgqueue_metrics: tasks sent with no worker running
  are in `pgqueue.metrics('celery')`, then drain when a worker starts.
- test_crashing_task_is_poisoned: a task that kills its worker process (acks
  late) is redelivered by the visibility timeout until the queue's
  max_attempts, set through pgqueue, sends it to the poison table; `pgqueue
  poison list` shows it with its reason.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

pytest.importorskip("celery")
pytest.importorskip("kombu_pgmq")

from support.celery_app import broker_url, make_app, prepare

TESTS = Path(__file__).resolve().parents[1]
QUEUE = "celery"  # Celery's default queue: a pgqueue queue of that name


class CeleryWorker:
    """A `celery -A support.celery_app worker` process in its own process group."""

    def __init__(self, dsn: str, log: Path, pool: str, concurrency: int, vt: int) -> None:
        env = dict(
            os.environ,
            PGQUEUE_CELERY_DSN=dsn,
            PGQUEUE_CELERY_VT=str(vt),
            PYTHONPATH=str(TESTS) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        )
        self.log = log
        with log.open("ab") as out:
            self.p = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "support.celery_app",
                    "worker",
                    f"--pool={pool}",
                    f"--concurrency={concurrency}",
                    "--loglevel=INFO",
                    f"--hostname=pgqtest{os.getpid()}@localhost",
                    "--without-mingle",
                    "--without-gossip",
                    "--without-heartbeat",
                    "--time-limit=60",
                ],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def text(self) -> str:
        """The worker's log so far."""
        return self.log.read_text(errors="replace")

    def wait_ready(self, timeout: float = 120) -> None:
        """Wait for the worker's 'ready' line; fail with its log if it exits or never is."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if " ready." in self.text():
                return
            if self.p.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"the Celery worker did not start:\n{self.text()[-4000:]}")

    def stop(self) -> None:
        """Warm shutdown (SIGTERM), then SIGKILL to the whole group if it lingers."""
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.p.wait(15)
        # the prefork pool's children, whatever became of their parent
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.p.pid, signal.SIGKILL)
        if self.p.poll() is None:
            self.p.wait(10)


@pytest.fixture
def celery_worker(tmp_path: Path) -> Iterator[Callable[..., CeleryWorker]]:
    """celery_worker(dsn, pool=, concurrency=, vt=): a started worker, stopped at the end."""
    workers: list[CeleryWorker] = []

    def start(dsn: str, pool: str = "threads", concurrency: int = 4, vt: int = 30) -> CeleryWorker:
        worker = CeleryWorker(dsn, tmp_path / f"celery-{len(workers)}.log", pool, concurrency, vt)
        workers.append(worker)
        worker.wait_ready()
        return worker

    yield start
    for worker in workers:
        worker.stop()


def runs(dsn: str, task: str) -> list[tuple[str, int]]:
    """(task_id, n) of every recorded run of `task`."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT task_id, n FROM celery_runs WHERE task = %s ORDER BY run_id", (task,)
        ).fetchall()
    return [(r[0], r[1]) for r in rows]


def wait_for(check: Callable[[], Any], timeout: float, what: str, worker: CeleryWorker) -> Any:
    """Poll check() until it returns something true; fail with the worker's log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(
        f"{what}: not reached in {timeout} s; worker log:\n{worker.text()[-4000:]}"
    )


def test_tasks_run_once_each(either_dsn: str, celery_worker: Callable[..., CeleryWorker]) -> None:
    prepare(either_dsn)
    worker = celery_worker(either_dsn, pool="threads", concurrency=4)
    app = make_app(either_dsn)
    try:
        sent = [app.tasks["pgq.square"].delay(n) for n in range(50)]
        results = [r.get(timeout=60) for r in sent]
        assert results == [n * n for n in range(50)]
        assert all(r.status == "SUCCESS" for r in sent)
        done = runs(either_dsn, "square")
        # each task ran exactly once, under its own task id
        assert sorted(n for _, n in done) == list(range(50))
        assert sorted(tid for tid, _ in done) == sorted(r.id for r in sent)
    finally:
        app.close()
    worker.stop()
    # every message was acked (deleted): nothing is left in the queue
    with psycopg.connect(either_dsn) as conn:
        row = conn.execute("SELECT queue_length FROM pgmq.metrics(%s)", (QUEUE,)).fetchone()
    assert row is not None and row[0] == 0


def test_celery_messages_in_pgqueue_metrics(
    facade_dsn: str, celery_worker: Callable[..., CeleryWorker]
) -> None:
    from pgqueue import Client

    prepare(facade_dsn)
    app = make_app(facade_dsn)
    try:
        sent = [app.tasks["pgq.square"].delay(n) for n in range(20)]
        with Client.from_dsn(facade_dsn) as client:
            queued = client.metrics(QUEUE)
            assert queued.queue_length == 20
            assert queued.visible_length == 20
            assert queued.poison_length == 0
            worker = celery_worker(facade_dsn, pool="threads", concurrency=4)
            assert [r.get(timeout=60) for r in sent] == [n * n for n in range(20)]
            drained = wait_for(
                lambda: client.metrics(QUEUE).queue_length == 0,
                30,
                "the queue drains",
                worker,
            )
            assert drained
            assert client.metrics(QUEUE).total_messages >= 20
        assert sorted(n for _, n in runs(facade_dsn, "square")) == list(range(20))
    finally:
        app.close()


def poison_list(dsn: str) -> list[dict[str, Any]]:
    """`pgqueue poison list celery --json`, run as an operator would."""
    out = subprocess.run(
        [sys.executable, "-m", "pgqueue", "poison", "list", QUEUE, "--json", "--dsn", dsn],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    rows: list[dict[str, Any]] = json.loads(out.stdout)
    return rows


def test_crashing_task_is_poisoned(
    facade_dsn: str, celery_worker: Callable[..., CeleryWorker]
) -> None:
    prepare(facade_dsn)
    app = make_app(facade_dsn, visibility_timeout=2)
    try:
        result = app.tasks["pgq.crash"].delay(7)  # declares Celery's queue through pgmq.create
        with psycopg.connect(facade_dsn, autocommit=True) as conn:
            # an operator gives the Celery queue a poison limit through pgqueue
            conn.execute("SELECT pgqueue.create_queue(%s, max_attempts => 2)", (QUEUE,))
        # prefork: the task's os._exit kills the pool process, and Celery (acks
        # late, reject on worker lost) leaves the message to the visibility timeout
        worker = celery_worker(facade_dsn, pool="prefork", concurrency=1, vt=2)
        poisoned = wait_for(lambda: poison_list(facade_dsn), 60, "the poison drop", worker)
    finally:
        app.close()
    assert len(poisoned) == 1, poisoned
    row = poisoned[0]
    assert row["queue"] == QUEUE
    assert row["read_ct"] == 2
    assert "max_attempts exceeded" in row["reason"], row
    # the poisoned message is Celery's own envelope, as kombu-pgmq sent it
    assert row["message"]["headers"]["id"] == result.id
    # delivered twice (max_attempts 2), run twice, then never again
    time.sleep(3)
    assert runs(facade_dsn, "crash") == [(result.id, 7), (result.id, 7)]
    with psycopg.connect(facade_dsn) as conn:
        metrics = conn.execute(
            "SELECT queue_length, poison_length FROM pgqueue.metrics(%s)", (QUEUE,)
        ).fetchone()
    assert metrics == (0, 1)
    assert "WorkerLostError" in worker.text() or "exited" in worker.text()


def celery_queue_names() -> list[str]:
    """The queues a Celery worker and its tools declare, as kombu-pgmq names them in PGMQ."""
    import uuid

    from kombu_pgmq.transport import _pgmq_name

    return [
        QUEUE,
        # the worker's remote-control queue, declared at start unless remote control is off
        _pgmq_name("celery@worker-1.example.com.celery.pidbox"),
        # `celery inspect` / `celery control` reply queues (shortened by kombu-pgmq past 47)
        _pgmq_name(f"{uuid.uuid4()}.reply.celery.pidbox"),
        # `celery events` / flower receivers
        _pgmq_name(f"celeryev.{uuid.uuid4()}"),
    ]


def test_celery_queue_names_are_accepted(either_dsn: str) -> None:
    """Every queue name Celery declares through kombu-pgmq can be created, listed and used."""
    from pgmq import PGMQueue

    q = PGMQueue(conn_string=broker_url(either_dsn), init_extension=False, pool_size=1)
    names = celery_queue_names()
    refused = {}
    try:
        for name in names:
            try:
                q.create_queue(name)
                msg_id = q.send(name, {"n": 1})
                got = q.read(name, vt=30)
                assert got is not None and got.msg_id == msg_id
                assert q.delete(name, msg_id)
            except psycopg.Error as exc:
                refused[name] = str(exc).splitlines()[0]
        listed = {r.queue_name for r in q.list_queues()}
    finally:
        q.close()
    assert refused == {}, refused
    assert set(names) <= listed
