"""What the dashboard's figures say agrees with what happened: sends beside acks,
the workflow a step's barrier belongs to, and one word for a worker that stopped reporting.
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from support.db import wait_until
from support.extras import needs_extra

needs_extra("web")

from starlette.testclient import TestClient
from support.dashboard_data import seed

from pgqueue import App, Client, Message, Worker, WorkerSettings
from pgqueue.web import create_app


@pytest.fixture
def web(dsn: str) -> Iterator[TestClient]:
    """The app on this test's database, as its owner (allowed here)."""
    with TestClient(create_app(dsn, allow_owner=True, secret="s" * 32)) as tc:
        yield tc


def row_of(html: str, marker: str) -> str:
    """The table row of a page that holds marker."""
    rows = [r for r in re.findall(r"<tr\b.*?</tr>", html, re.S) if marker in r]
    assert len(rows) == 1, f"{len(rows)} rows hold {marker!r}"
    return rows[0]


def cell(row: str, label: str) -> str:
    """The text of a row's cell by its data-label, tags and spaces stripped."""
    found = re.search(rf'<td data-label="{label}"[^>]*>(.*?)</td>', row, re.S)
    assert found, f"no {label} cell in {row}"
    text = re.sub(r"<svg.*?</svg>", "", found[1], flags=re.S)
    return " ".join(re.sub(r"<[^>]+>", "", text).split())


def run_worker(dsn: str, queue: str) -> tuple[Worker, threading.Thread, Client]:
    """An in-process worker acking every message of queue, heartbeating its tallies often."""
    app = App()

    @app.handler(queue)
    def handle(msg: Message) -> None:
        return None

    settings = WorkerSettings(queues=(queue,), poll_interval=0.2, registry_interval=0.2)
    wclient = Client.from_dsn(dsn, max_size=settings.pool_size)
    worker = Worker(app, wclient, settings)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    return worker, thread, wclient


def test_sent_and_acked_in_the_last_hour_agree_for_a_queue_created_after_its_minute_was_sampled(
    dsn: str, client: Client
) -> None:
    client.create_queue("earlier")
    client.create_queue("done")
    # The minute is sampled (a heartbeat, the dashboard) before the queue exists:
    # its sends had no sample to count from, and showed as 0 beside 60 acked.
    client.sample_rates()
    client.create_queue("fresh")
    client.send_batch("fresh", [{"n": i} for i in range(40)])
    client.fan_out(
        "fresh", [{"m": i} for i in range(20)], callback_queue="done", callback_message={}
    )
    worker, thread, wclient = run_worker(dsn, "fresh")
    try:
        wait_until(lambda: sum(r.acked for r in client.queue_rates(["fresh"])) == 60, timeout=30)
    finally:
        worker.stop()
        thread.join(15)
        wclient.close()
    rates = client.queue_rates(["fresh"])
    assert sum(r.sent or 0 for r in rates) == 60
    # a dashboard started now: its snapshot of the queues is taken at its first page
    with TestClient(create_app(dsn, allow_owner=True, secret="s" * 32)) as web:
        overview = row_of(web.get("/").text, "name=fresh")
        page = web.get("/queue?name=fresh").text
    assert (cell(overview, "Sent"), cell(overview, "Acked")) == ("60", "60")
    assert "60 in the hour" in page and "no samples yet" not in page
    assert page.count("60 in the hour") == 2  # sent and acked alike


def test_barriers_page_names_the_workflow_and_step_of_a_steps_barrier(
    client: Client, web: TestClient
) -> None:
    seed(client)
    steps = {s.step: s.barrier_id for s in client.workflow_steps("nightly-etl") if s.barrier_id}
    assert set(steps) == {"extract", "audit", "transform"}  # load was cancelled: never enqueued
    page = web.get("/barriers").text
    assert "<th>Workflow</th>" in page
    for step, barrier_id in steps.items():
        row = row_of(page, f"id={barrier_id}")
        assert cell(row, "Workflow") == f"nightly-etl, step {step}"
        assert 'href="/workflow?id=nightly-etl"' in row
    for plain in ("invoice-2026-11", "digest-42"):  # fan-outs of their own
        assert cell(row_of(page, f'id={plain}"'), "Workflow") == "\u2013"
    one = web.get(f"/barrier?id={steps['audit']}").text
    assert 'href="/workflow?id=nightly-etl"' in one and "step audit" in one
    assert 'href="/workflow?' not in web.get("/barrier?id=digest-42").text


def test_a_worker_that_stopped_heartbeating_is_lost_as_in_the_cli(
    client: Client, sql: psycopg.Connection[Any], web: TestClient
) -> None:
    client.create_queue("jobs")
    ids = {}
    for name, stopping in (("alive", False), ("stopping", True), ("lost", False), ("gone", True)):
        ids[name] = uuid.uuid4()
        sql.execute(
            "SELECT * FROM pgqueue.worker_heartbeat(%s, %s, 1, '{jobs}', 1, 0, NULL, %s,"
            " '{}', '{}', '{}', '{}')",
            (ids[name], name, stopping),
        )
    # killed: one while it ran, one while it was stopping
    sql.execute(
        "UPDATE pgqueue.worker SET last_seen_at = now() - interval '20 seconds'"
        " WHERE worker_id = ANY (%s)",
        ([ids["lost"], ids["gone"]],),
    )
    page = web.get("/workers").text
    states = {name: cell(row_of(page, f'"Host">{name}<'), "State") for name in ids}
    assert states == {"alive": "alive", "stopping": "stopping", "lost": "lost", "gone": "lost"}
    assert page.count('class="state s-lost"') == 2
    assert "silent" not in page
