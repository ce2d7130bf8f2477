"""Prometheus metrics: a worker process's /metrics and the exporter's, read by a real parser."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from typing import Any

import pytest
import yaml
from support.db import wait_until
from support.extras import needs_extra
from support.processes import TESTS, prepare

needs_extra("prometheus")
from prometheus_client.parser import text_string_to_metric_families

ROOT = TESTS.parent
ALERTS = ROOT / "docs" / "alerts.yml"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> Samples:
    """Every sample of /metrics, parsed by prometheus_client's own text parser."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        text = r.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), -1.0)


def scrapes(port: int) -> bool:
    try:
        scrape(port)
    except OSError:
        return False
    return True


def outcomes(samples: Samples, queue: str) -> dict[str, float]:
    names = ("acked", "nacked", "poisoned", "released", "lease_lost")
    return {o: value(samples, "pgqueue_messages_total", queue=queue, outcome=o) for o in names}


def start_exporter(dsn: str, port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "pgqueue", "exporter", "--port", str(port), "--dsn", dsn],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def test_worker_and_exporter_metrics_count_exactly_what_happened(
    dsn: str, spawn: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGQUEUE_BACKOFF_BASE", "0.01")  # a nack's retry is due at once
    with prepare(dsn, "other") as client:
        # Read five times (max_attempts) already: the worker's read poison-drops it.
        exhausted = client.send("jobs", {"n": -1})
        for _ in range(5):
            assert [m.msg_id for m in client.read("jobs", vt=0, qty=1)] == [exhausted]
        client.send_batch("jobs", [{"n": i} for i in range(10)])
        client.send("jobs", {"fail_times": 2})  # two nacks, then acked
        client.send("jobs", {"poison": True})  # poisoned by its handler
        port = free_port()
        w = spawn(dsn, "--metrics-port", str(port), "--concurrency", "2")
        wait_until(lambda: scrapes(port))

        def settled() -> bool:
            return outcomes(scrape(port), "jobs")["acked"] == 11

        wait_until(settled, timeout=120)
        samples = scrape(port)
        assert outcomes(samples, "jobs") == {
            "acked": 11,
            "nacked": 2,
            "poisoned": 2,  # one by its handler, one by the read
            "released": 0,
            "lease_lost": 0,
        }
        assert outcomes(samples, "callbacks")["acked"] == 0
        calls = 10 + 3 + 1  # every handler call: the one that failed twice ran three times
        assert value(samples, "pgqueue_handler_duration_seconds_count", queue="jobs") == calls
        assert value(samples, "pgqueue_claim_latency_seconds_count", queue="jobs") == calls
        assert value(samples, "pgqueue_worker_up") == 1
        assert value(samples, "pgqueue_acks_pending") == 0
        assert value(samples, "pgqueue_connection_retries_total") == 0
        assert not [k for k in samples if k[0] == "pgqueue_worker_in_flight" and samples[k]]
        assert len(client.poison_list("jobs")) == 2
        w.signal(signal.SIGTERM)
        assert w.wait() == 0

        # The queues' state, as the exporter serves it: exact figures.
        client.send_batch("jobs", [{"n": 1}, {"n": 2}, {"n": 3}])
        client.read("jobs", vt=600, qty=1)  # leased
        client.send("jobs", {"n": 4}, delay=600)  # delayed
        client.fan_out("other", [{}, {}], callback_queue="callbacks", callback_message={})
        client.pause_queue("other")
        eport = free_port()
        exporter = start_exporter(dsn, eport)
        try:
            wait_until(lambda: scrapes(eport))
            state = scrape(eport)
        finally:
            exporter.send_signal(signal.SIGTERM)
            assert exporter.wait(10) == 0
    q = "pgqueue_queue_messages"
    assert value(state, q, queue="jobs", state="visible") == 2
    assert value(state, q, queue="jobs", state="leased") == 1
    assert value(state, q, queue="jobs", state="delayed") == 1
    assert value(state, q, queue="other", state="visible") == 2
    assert value(state, q, queue="callbacks", state="visible") == 0
    assert value(state, "pgqueue_queue_poison_messages", queue="jobs") == 2
    assert value(state, "pgqueue_barriers_open", queue="other") == 1
    assert value(state, "pgqueue_barriers_open", queue="jobs") == 0
    assert value(state, "pgqueue_barrier_oldest_open_age_seconds", queue="other") >= 0
    assert value(state, "pgqueue_queue_oldest_message_age_seconds", queue="jobs") > 0
    # every id jobs handed out: 1 + 10 + 1 + 1, then 3 + 1
    assert value(state, "pgqueue_messages_sent_total", queue="jobs") == 17
    assert value(state, "pgqueue_queue_paused", queue="other") == 1
    assert value(state, "pgqueue_queue_paused", queue="jobs") == 0
    assert value(state, "pgqueue_exporter_scrape_success") == 1


def test_exporter_scrape_is_one_query_and_says_when_the_database_is_away(dsn: str) -> None:
    from pgqueue import Client
    from pgqueue._metrics import exporter_registry

    with Client.from_dsn(dsn) as client:
        for i in range(50):
            client.create_queue(f"q{i}")
        ran: list[str] = []

        def run(call: Any) -> Any:
            ran.append(call.name)
            return client.run(call)

        registry = exporter_registry(run)
        labels = {"queue": "q7", "state": "visible"}
        assert registry.get_sample_value("pgqueue_queue_messages", labels) == 0
        assert ran == ["exporter_metrics"]

    def away(call: Any) -> Any:
        import psycopg

        raise psycopg.OperationalError("connection refused")

    registry = exporter_registry(away)
    assert registry.get_sample_value("pgqueue_exporter_scrape_success") == 0


def test_worker_with_metrics_off_does_not_import_prometheus_client(dsn: str) -> None:
    prepare(dsn).close()
    script = (
        "import sys, threading\n"
        "from pgqueue import Client\n"
        "from pgqueue._worker import Worker, WorkerSettings\n"
        "from support.worker_app import app\n"
        f"client = Client.from_dsn({dsn!r}, max_size=8)\n"
        "client.send('jobs', {})\n"
        "w = Worker(app, client, WorkerSettings(queues=('jobs',), poll_interval=0.1))\n"
        "t = threading.Thread(target=w.run, kwargs={'install_signals': False})\n"
        "t.start()\n"
        "import time\n"
        "deadline = time.monotonic() + 120\n"
        "while w.handled < 1 and time.monotonic() < deadline: time.sleep(0.05)\n"
        "w.stop(); t.join(); client.close()\n"
        "print(w.handled, 'prometheus_client' in sys.modules)\n"
    )
    env = dict(os.environ, PGQUEUE_DSN=dsn, PYTHONPATH=str(TESTS))
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=240
    )
    assert out.stdout.splitlines()[-1].split() == ["1", "False"], out.stdout + out.stderr


def test_metrics_port_without_prometheus_client_is_one_line_and_exit_2(dsn: str) -> None:
    # sys.modules[name] = None makes the package look absent, as if not installed.
    script = (
        "import sys; sys.modules['prometheus_client'] = None\n"
        "from pgqueue._cli import main\n"
        "main(['worker', 'support.worker_app:app', '--metrics-port', '9999'])\n"
    )
    env = dict(os.environ, PGQUEUE_DSN=dsn, PYTHONPATH=str(TESTS))
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "pgqueue: error: --metrics-port needs prometheus_client:"
        " pip install 'pgqueue-py[prometheus]'"
    ]


def test_alert_rules_are_valid_and_use_only_metrics_pgqueue_serves() -> None:
    rules = yaml.safe_load(ALERTS.read_text())
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    assert exprs and all(r.get("alert") for g in rules["groups"] for r in g["rules"])
    served = (ROOT / "docs" / "observability.md").read_text()
    for expr in exprs:
        for name in {w for w in _words(expr) if w.startswith("pgqueue_")}:
            assert f"`{name}" in served, f"{name} is not documented in docs/observability.md"
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (apt-get install prometheus); parsed only")
    out = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def _words(expr: str) -> list[str]:
    import re

    return re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr)


def test_observability_doc_lists_every_metric_the_code_serves() -> None:
    text = (ROOT / "docs" / "observability.md").read_text()
    source = (ROOT / "pgqueue" / "_metrics.py").read_text()
    import re

    names = set(re.findall(r'"(pgqueue_[a-z_]+)"', source))
    counters = {"pgqueue_messages", "pgqueue_connection_retries", "pgqueue_messages_sent"}
    documented = {n + "_total" if n in counters else n for n in names}
    missing = [n for n in sorted(documented) if f"`{n}" not in text]
    assert not missing, f"not in docs/observability.md: {missing}"


def test_in_process_worker_counts_in_flight_retries_and_releases(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from support import worker_app
    from support.db import terminate_client_backends
    from support.processes import count

    from pgqueue import Client, Worker, WorkerSettings

    monkeypatch.setenv("PGQUEUE_DSN", dsn)  # the handlers record through it
    client = prepare(dsn)
    client.send("jobs", {"sleep": 2})
    settings = WorkerSettings(
        queues=("jobs",), metrics_port=free_port(), poll_interval=0.2, shutdown_grace=0
    )
    # Every connection of the pool open from the start: all of them die below,
    # so whichever duty calls next meets a dead one and retries.
    size = settings.pool_size
    with Client.from_dsn(dsn, min_size=size, max_size=size) as wclient:
        w = Worker(worker_app.app, wclient, settings)
        assert w.metrics is not None
        registry = w.metrics.registry

        def sample(name: str, **labels: str) -> float | None:
            return registry.get_sample_value(name, labels)

        t = threading.Thread(target=w.run, kwargs={"install_signals": False}, daemon=True)
        t.start()
        wait_until(lambda: count(dsn, "start") == 1)
        assert sample("pgqueue_worker_in_flight", queue="jobs") == 1
        assert scrapes(settings.metrics_port)
        # Every pooled connection dies under the running handler: its ack retries.
        assert terminate_client_backends(dsn) > 0
        wait_until(lambda: sample("pgqueue_messages_total", queue="jobs", outcome="acked") == 1)
        assert (sample("pgqueue_connection_retries_total") or 0) >= 1
        assert sample("pgqueue_worker_in_flight", queue="jobs") is None  # no series: none held

        client.send("jobs", {"sleep": 30})
        wait_until(lambda: count(dsn, "start") == 2)
        w.stop()  # no grace: the running message goes back at once
        t.join(15)
        assert sample("pgqueue_messages_total", queue="jobs", outcome="released") == 1
        assert sample("pgqueue_worker_up") == 0
        assert not scrapes(settings.metrics_port)  # the endpoint stopped with the worker
    client.close()
