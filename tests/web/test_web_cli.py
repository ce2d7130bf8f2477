"""`pgqueue web` as a user starts it, and the mounting example of docs/dashboard.md."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from support.extras import needs_extra

needs_extra("web")

from starlette.testclient import TestClient
from support.db import refused_dsn

DOCS = Path(__file__).resolve().parents[2] / "docs" / "dashboard.md"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _web(*args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "pgqueue", "web", *args],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_serves_the_pages_until_interrupted(dsn: str, client: Any) -> None:
    client.create_queue("emails")
    port = _free_port()
    proc = _web("--port", str(port), "--dsn", dsn)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
                    page = r.read().decode()
                break
            except (urllib.error.URLError, ConnectionError):
                assert proc.poll() is None, proc.communicate()[1]
                assert time.monotonic() < deadline, "pgqueue web never answered"
                time.sleep(0.2)
        assert "emails" in page
        # DNS rebinding: another site's name resolved to 127.0.0.1 gets nothing
        rebound = urllib.request.Request(
            f"http://127.0.0.1:{port}/", headers={"Host": f"rebound.example:{port}"}
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(rebound, timeout=5)
        assert refused.value.code == 400
        localhost = urllib.request.Request(
            f"http://127.0.0.1:{port}/healthz", headers={"Host": f"localhost:{port}"}
        )
        with urllib.request.urlopen(localhost, timeout=5) as r:
            assert r.read() == b"ok"
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    assert f"pgqueue web on http://127.0.0.1:{port}/" in err
    assert "can do more than the dashboard needs" in err  # the tests' role is a superuser
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--host", "0.0.0.0"], {}, "refusing to serve on 0.0.0.0 without a login"),
        (["--host", "0.0.0.0"], {"PGQUEUE_WEB_TOKEN": "short"}, "PGQUEUE_WEB_TOKEN is too short"),
        (["--port", "-1"], {}, "Invalid value for '--port'"),
    ],
)
def test_refuses_unsafe_or_bad_settings_in_one_line(
    dsn: str, args: list[str], env: dict[str, str], message: str
) -> None:
    proc = _web(*args, "--dsn", dsn, **env)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err


def test_a_dsn_that_does_not_answer_is_one_line() -> None:
    proc = _web("--dsn", refused_dsn(), "--connect-timeout", "1")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert err.startswith("pgqueue: error:") and "Traceback" not in err, err


def test_the_mounting_example_runs_and_asks_the_host_for_the_actor() -> None:
    [block] = re.findall(r"```python\n(.*?)```", DOCS.read_text(), re.S)
    scope: dict[str, Any] = {}
    exec(compile(block, "docs/dashboard.md", "exec"), scope)
    app = scope["app"]
    with TestClient(app) as web:
        assert web.get("/ops/queues/").status_code == 401  # no x-forwarded-user: refused
        assert web.get("/ops/queues/healthz").text == "ok"


def test_the_dashboard_shows_the_demos_data(dsn: str) -> None:
    """After `pgqueue demo`, every page shows what the demo made: what a newcomer sees first."""
    env = {k: v for k, v in os.environ.items() if k not in ("PGQUEUE_DSN", "DATABASE_URL")}
    done = subprocess.run(
        [sys.executable, "-m", "pgqueue", "demo", "--dsn", dsn],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    barrier = re.search(r"pgqueue barrier show (\S+)", done.stdout)
    assert barrier, done.stdout
    from pgqueue.web import create_app

    with TestClient(create_app(dsn, allow_owner=True)) as web:
        assert "demo_orders_done" in web.get("/").text
        poison = web.get("/poison").text
        assert "SKU-UNKNOWN is not in the catalogue" in poison
        assert "SKU-UNKNOWN" in web.get("/poison/message?queue=demo_orders&id=57").text
        page = web.get(f"/barrier?id={barrier[1]}").text
        assert "fired" in page and "99" in page and "SKU-UNKNOWN" in page
        assert barrier[1] in web.get("/barriers").text
