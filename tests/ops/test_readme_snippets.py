"""Every Python block of the README runs as written, each on a fresh migrated database.

The README presents each block whole: each imports pgqueue and opens its own
client from $PGQUEUE_DSN (the Consumers block only defines an App, which
`pgqueue worker` would run). So each block runs standalone, in a fresh
interpreter with nothing but PGQUEUE_DSN, in the order of the README, and a
new block runs here as soon as it is written. A block that cannot run alone
says why in an HTML comment right before it, `<!-- snippet: needs ... -->`,
and is skipped with that reason. tests/ops/test_readme.py checks what the
fan-out and workflow blocks print.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgqueue import Client
from pgqueue.testing import drain

README = Path(__file__).resolve().parents[2] / "README.md"

BLOCK = re.compile(r"(?:<!-- snippet: (?P<needs>[^>]*?) -->\n)?```python\n(?P<code>.*?)```", re.S)


def python_blocks() -> list[tuple[int, str | None, str]]:
    """The README's ```python blocks: (line of the fence, a snippet marker's text, code)."""
    text = README.read_text()
    return [
        (text.count("\n", 0, m.start("code")), m.group("needs"), m.group("code"))
        for m in BLOCK.finditer(text)
    ]


def run(code: str, dsn: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The block in a fresh interpreter, as a reader pastes it into a file and runs it."""
    env = {k: v for k, v in os.environ.items() if k not in ("PGQUEUE_DSN", "DATABASE_URL")}
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "PGQUEUE_DSN": dsn},
        cwd=cwd,  # not the checkout: the block imports only what is installed
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("line", "needs", "code"), python_blocks(), ids=[f"line-{b[0]}" for b in python_blocks()]
)
def test_every_python_block_of_the_readme_runs_as_written(
    dsn: str, tmp_path: Path, line: int, needs: str | None, code: str
) -> None:
    if needs is not None:
        pytest.skip(f"README.md line {line}: {needs}")
    done = run(code, dsn, tmp_path)
    assert done.returncode == 0, f"README.md line {line}:\n{done.stderr[-3000:]}"


def test_the_readme_has_the_python_blocks_this_file_runs() -> None:
    blocks = python_blocks()
    assert len(blocks) >= 5
    assert [needs for _, needs, _ in blocks if needs] == [], "every block runs: keep it so"


def test_the_python_api_block_sends_to_queues_it_creates(dsn: str, tmp_path: Path) -> None:
    [code] = [c for _, _, c in python_blocks() if "dedupe_key=" in c]
    done = run(code, dsn, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    with Client.from_dsn(dsn) as client:
        assert {q.queue_name for q in client.list_queues()} == {"orders", "orchestrator"}
        assert client.metrics("orchestrator").queue_length == 1


def test_the_consumers_block_handles_its_messages(
    client: Client, sql: psycopg.Connection[Any]
) -> None:
    """The block's App, run by drain(), with the two helpers it leaves to the reader stubbed."""
    [code] = [c for _, _, c in python_blocks() if "app = pgqueue.App()" in c]
    module: dict[str, Any] = {"__name__": "readme_consumers"}
    exec(compile(code, "README.md", "exec"), module)
    sent: list[Any] = []

    async def send_email(message: Any) -> None:
        sent.append(message)

    module.update(do_resize=lambda message: 1024, send_email=send_email)
    sql.execute("CREATE TABLE albums (id int PRIMARY KEY, ready boolean NOT NULL DEFAULT false)")
    sql.execute("INSERT INTO albums (id) VALUES (7)")
    for name in ("resize", "notify", "album_done"):
        client.create_queue(name, max_attempts=3)
    barrier_id = client.fan_out(
        "resize",
        [{"photo": 1}, {"photo": 2, "corrupt": True}],
        callback_queue="album_done",
        callback_message={"album": 7},
    )
    client.send("notify", {"to": "ann@example.com"})
    done = drain(client, module["app"])
    assert done.counts()["poisoned"] == 1  # the corrupt photo, never retried
    assert sent == [{"to": "ann@example.com"}]
    results = {r.member_index: (r.outcome, r.result) for r in client.barrier_results(barrier_id)}
    assert results == {
        0: ("succeeded", {"bytes": 1024}),
        1: ("poisoned", {"reason": "image cannot be decoded"}),
    }
    assert sql.execute("SELECT ready FROM albums WHERE id = 7").fetchone() == (True,)
