"""examples/fastapi_app.py, run: an order and its message commit together or not at all.

The app runs in process (starlette's TestClient, entered so that its lifespan
opens and closes the AsyncClient); the worker beside it is a real `pgqueue
worker` process on the example's App; the docs' FastAPI section's snippets
are the example's own code, or run here as written.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import pgqueue

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient
from support.db import wait_until

from examples import fastapi_app

ROOT = Path(__file__).resolve().parents[2]
# The section lives in docs/integrations.md once merged there; until then in its own file.
MERGED, OWN = ROOT / "docs" / "integrations.md", ROOT / "docs" / "integrations" / "fastapi.md"
DOC = MERGED if MERGED.exists() and "\n## FastAPI\n" in MERGED.read_text() else OWN


def section() -> str:
    """The doc's FastAPI section: from its heading to the next one of the same level."""
    text = DOC.read_text()
    start = text.index("## FastAPI\n")
    end = text.find("\n## ", start + 1)
    return text[start : None if end < 0 else end]


EXAMPLE = ROOT / "examples" / "fastapi_app.py"


@pytest.fixture
def http(dsn: str) -> Iterator[TestClient]:
    """The example app on this test's database, its lifespan running."""
    with TestClient(fastapi_app.create_app(dsn)) as tc:
        yield tc


def orders(dsn: str) -> list[tuple[int, str, int, bool]]:
    """(id, item, quantity, shipped) of every order row, as another session sees them."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT id, item, quantity, shipped_at IS NOT NULL FROM example_orders ORDER BY id"
        ).fetchall()
    return [(r[0], r[1], r[2], r[3]) for r in rows]


def messages(dsn: str) -> list[tuple[int, Any]]:
    """(msg_id, body) of every live message of the orders queue, looked at without leasing."""
    with pgqueue.Client.from_dsn(dsn, max_size=1) as client:
        return [(m.msg_id, m.message) for m in client.peek(fastapi_app.QUEUE, qty=1000)]


def test_a_placed_order_commits_exactly_one_row_and_one_message(http: TestClient, dsn: str) -> None:
    resp = http.post("/orders", json={"item": "book", "quantity": 2})
    assert resp.status_code == 201, resp.text
    body = resp.json()
    assert orders(dsn) == [(body["order_id"], "book", 2, False)]
    assert messages(dsn) == [(body["msg_id"], {"order_id": body["order_id"]})]


def test_a_failure_after_the_send_leaves_no_row_and_no_message(http: TestClient, dsn: str) -> None:
    resp = http.post("/orders?fail_after_send=true", json={"item": "pen", "quantity": 1})
    assert resp.status_code == 503 and "after the send" in resp.json()["detail"]
    assert orders(dsn) == [] and messages(dsn) == []
    # The rolled-back connection went back to the pool clean: the next request commits.
    ok = http.post("/orders", json={"item": "ink", "quantity": 3}).json()
    assert orders(dsn) == [(ok["order_id"], "ink", 3, False)]
    assert messages(dsn) == [(ok["msg_id"], {"order_id": ok["order_id"]})]


def test_a_refused_order_writes_nothing(http: TestClient, dsn: str) -> None:
    assert http.post("/orders", json={"item": "book", "quantity": 0}).status_code == 422
    assert orders(dsn) == [] and messages(dsn) == []


def test_many_requests_at_once_each_commit_their_own_row_and_message(
    http: TestClient, dsn: str
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    def post(i: int) -> int:
        fail = "true" if i % 3 == 0 else "false"
        resp = http.post(f"/orders?fail_after_send={fail}", json={"item": f"i{i}", "quantity": 1})
        return resp.status_code

    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(post, range(30)))
    assert sorted(set(codes)) == [201, 503] and codes.count(201) == 20
    rows = orders(dsn)
    assert sorted(item for _, item, _, _ in rows) == sorted(f"i{i}" for i in range(30) if i % 3)
    assert sorted(body["order_id"] for _, body in messages(dsn)) == [r[0] for r in rows]


def worker_command() -> str:
    """The MODULE:APP the docs tell to run beside the web app."""
    match = re.search(r"^pgqueue worker (\S+)$", section(), re.M)
    assert match, f"{DOC.name} shows no `pgqueue worker` command"
    return match.group(1)


def test_the_worker_beside_the_app_ships_every_committed_order(
    http: TestClient, dsn: str, spawn: Callable[..., Any]
) -> None:
    placed = [
        http.post("/orders", json={"item": f"box{i}", "quantity": i + 1}).json() for i in range(3)
    ]
    http.post("/orders?fail_after_send=true", json={"item": "lost", "quantity": 1})
    worker = spawn(dsn, "--queue", fastapi_app.QUEUE, app=worker_command())
    wait_until(lambda: all(shipped for *_, shipped in orders(dsn)) and not messages(dsn))
    assert [r[0] for r in orders(dsn)] == [p["order_id"] for p in placed]
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", section(), re.S)


def test_the_docs_show_the_examples_own_code() -> None:
    source = EXAMPLE.read_text()
    *excerpts, _ = python_blocks()
    assert len(excerpts) == 3
    for block in excerpts:
        assert block in source, f"the FastAPI docs drifted from the example:\n{block}"


def test_the_docs_testing_snippet_runs_as_written(
    dsn: str, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setenv("PGQUEUE_DSN", dsn)
    exec(compile(python_blocks()[-1], str(DOC), "exec"), {})
    assert capsys.readouterr().out.splitlines() == ["201 503", "True"]
