"""A workflow run by a real worker: each step's messages run once, in dependency order."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import psycopg
import pytest
from support import worker_app
from support.db import wait_until

from pgqueue import Client, Step, Worker, WorkerSettings


@pytest.fixture
def run_worker(
    dsn: str, client: Client, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[], None]]:
    monkeypatch.setenv("PGQUEUE_DSN", dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(worker_app.SCHEMA)
    for q in ("jobs", "callbacks"):
        client.create_queue(q, max_attempts=2)
    started: list[tuple[Worker, threading.Thread, Client]] = []

    def run() -> None:
        wclient = Client.from_dsn(dsn, max_size=10)
        settings = WorkerSettings(queues=("jobs", "callbacks"), poll_interval=0.2, vt=5,
                                  backoff_base=0.01, backoff_max=0.01)  # fmt: skip
        w = Worker(worker_app.app, wclient, settings)
        t = threading.Thread(target=w.run, kwargs={"install_signals": False}, daemon=True)
        t.start()
        started.append((w, t, wclient))

    yield run
    for w, t, c in started:
        w.stop()
        t.join(15)
        c.close()


def starts_by_step(dsn: str, client: Client, wid: str) -> dict[str, int]:
    """How many times each step's messages started, from worker_app's records."""
    ids: dict[int, str] = {}
    for s in client.workflow_steps(wid):
        if s.barrier_id:
            for r in client.barrier_results(s.barrier_id):
                ids[r.msg_id] = s.step
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT msg_id FROM handled WHERE queue = 'jobs' AND event = 'start' ORDER BY at"
        ).fetchall()
    counts: dict[str, int] = {}
    for (msg_id,) in rows:
        counts[ids[msg_id]] = counts.get(ids[msg_id], 0) + 1
    return counts


def test_a_worker_runs_a_workflow_to_its_one_final_callback(
    dsn: str, client: Client, run_worker: Callable[[], None]
) -> None:
    wid = client.start_workflow(
        "album",
        [
            Step("fetch", "jobs", {"n": 0}),
            Step("resize", "jobs", messages=[{"n": i} for i in range(5)], depends_on=("fetch",)),
            Step("bad", "jobs", {"poison": True}, depends_on=("fetch",)),
            Step("publish", "jobs", {"n": 9}, depends_on=("resize", "bad")),
            Step(
                "cleanup", "jobs", {"n": 10}, depends_on=("publish",), on_dependency_failure="run"
            ),
        ],
        callback_queue="callbacks",
    )
    run_worker()
    wait_until(lambda: client.workflow_status(wid).state != "running", timeout=120)
    s = client.workflow_status(wid)
    assert (s.state, s.succeeded, s.failed, s.cancelled) == ("failed", 3, 1, 1)
    steps = {x.step: x.state for x in client.workflow_steps(wid)}
    assert steps == {
        "fetch": "succeeded",
        "resize": "succeeded",
        "bad": "failed",
        "publish": "cancelled",
        "cleanup": "succeeded",
    }
    assert starts_by_step(dsn, client, wid) == {"fetch": 1, "resize": 5, "bad": 1, "cleanup": 1}
    assert [r.result for r in client.step_results(wid, "resize")] == [{"n": i} for i in range(5)]
    with psycopg.connect(dsn) as conn:
        wait_until(
            lambda: (
                conn.execute(
                    "SELECT count(*) FROM handled WHERE queue = 'callbacks' AND event = 'callback'"
                ).fetchone()
                == (1,)
            )
        )
