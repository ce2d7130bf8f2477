"""Every HTTP listener (`pgqueue web`, `pgqueue exporter`, a worker's /metrics): one default
address, 127.0.0.1, an option to choose another, and one line when its port is taken.

Real processes; the address a listener bound is read from the kernel's socket table
(/proc/net/tcp), not from what the process says it did.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.extras import needs_extra
from support.processes import TESTS, prepare

from pgqueue import WorkerSettings
from pgqueue._errors import InvalidSettings

PROC_TCP = Path("/proc/net/tcp")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bound_addresses(port: int) -> set[str]:
    """The IPv4 addresses a socket listens on at this port, from the kernel's table."""
    found = set()
    for line in PROC_TCP.read_text().splitlines()[1:]:
        fields = line.split()
        local, state = fields[1], fields[3]
        addr, hexport = local.split(":")
        if state == "0A" and int(hexport, 16) == port:  # 0A: LISTEN
            found.add(socket.inet_ntoa(bytes.fromhex(addr)[::-1]))
    return found


def listening(proc: subprocess.Popen[Any], port: int, timeout: float = 30) -> set[str]:
    """The addresses proc's listener bound, once it has (while proc runs)."""
    deadline = time.monotonic() + timeout
    while not (found := bound_addresses(port)):
        assert proc.poll() is None, f"exited with {proc.returncode} before listening"
        assert time.monotonic() < deadline, f"nothing listened on port {port}"
        time.sleep(0.1)
    return found


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port another process would find taken: a socket listens on it (127.0.0.1)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


@pytest.fixture
def run_pgqueue(tmp_path: Path) -> Iterator[Any]:
    """run_pgqueue(*args, **env): a `pgqueue` process, its output in a file; killed after."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(*args: str, **env: str) -> subprocess.Popen[bytes]:
        out = tmp_path / f"out-{len(procs)}.txt"
        full_env = {
            **os.environ,
            "PYTHONPATH": str(TESTS) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            **env,
        }
        with out.open("wb") as f:
            proc = subprocess.Popen(
                [sys.executable, "-m", "pgqueue", *args],
                env=full_env,
                stdout=f,
                stderr=subprocess.STDOUT,
            )
        proc.out = out  # type: ignore[attr-defined]
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def output(proc: subprocess.Popen[Any]) -> str:
    return str(proc.out.read_text())  # type: ignore[attr-defined]


needs_proc = pytest.mark.skipif(not PROC_TCP.exists(), reason="reads Linux's /proc/net/tcp")


# --- where each listener binds ------------------------------------------------


@needs_proc
def test_worker_metrics_listen_on_loopback_unless_told_by_flag_or_variable(
    dsn: str, run_pgqueue: Any
) -> None:
    needs_extra("prometheus")
    prepare(dsn).close()
    worker = ("worker", "support.worker_app:app", "--queue", "jobs", "--dsn", dsn)
    ports = [free_port() for _ in range(3)]
    default = run_pgqueue(*worker, "--metrics-port", str(ports[0]))
    flag = run_pgqueue(*worker, "--metrics-port", str(ports[1]), "--metrics-host", "0.0.0.0")
    variable = run_pgqueue(
        *worker, "--metrics-port", str(ports[2]), PGQUEUE_METRICS_HOST="127.0.0.2"
    )
    assert listening(default, ports[0]) == {"127.0.0.1"}, output(default)
    assert listening(flag, ports[1]) == {"0.0.0.0"}, output(flag)
    assert listening(variable, ports[2]) == {"127.0.0.2"}, output(variable)


@needs_proc
def test_exporter_listens_on_loopback_unless_given_a_host(dsn: str, run_pgqueue: Any) -> None:
    needs_extra("prometheus")
    ports = [free_port() for _ in range(3)]
    default = run_pgqueue("exporter", "--port", str(ports[0]), "--dsn", dsn)
    given = run_pgqueue("exporter", "--port", str(ports[1]), "--host", "0.0.0.0", "--dsn", dsn)
    # --addr, the option's name before --host, still works
    old = run_pgqueue("exporter", "--port", str(ports[2]), "--addr", "127.0.0.2", "--dsn", dsn)
    assert listening(default, ports[0]) == {"127.0.0.1"}, output(default)
    assert listening(given, ports[1]) == {"0.0.0.0"}, output(given)
    assert listening(old, ports[2]) == {"127.0.0.2"}, output(old)


@needs_proc
def test_web_listens_on_loopback_unless_given_a_host(dsn: str, run_pgqueue: Any) -> None:
    needs_extra("web")
    ports = [free_port() for _ in range(2)]
    default = run_pgqueue("web", "--port", str(ports[0]), "--dsn", dsn)
    given = run_pgqueue("web", "--port", str(ports[1]), "--host", "127.0.0.2", "--dsn", dsn)
    assert listening(default, ports[0]) == {"127.0.0.1"}, output(default)
    assert listening(given, ports[1]) == {"127.0.0.2"}, output(given)
    assert f"pgqueue web on http://127.0.0.2:{ports[1]}/" in output(given)


def test_metrics_host_is_a_worker_setting_from_its_variable_with_one_default() -> None:
    assert WorkerSettings().metrics_host == "127.0.0.1"
    assert WorkerSettings.from_env({"PGQUEUE_METRICS_HOST": "0.0.0.0"}).metrics_host == "0.0.0.0"
    given = WorkerSettings.from_env({"PGQUEUE_METRICS_HOST": "0.0.0.0"}, metrics_host="::1")
    assert given.metrics_host == "::1"  # a flag wins
    with pytest.raises(InvalidSettings, match="metrics_host must be an address to listen on"):
        WorkerSettings(metrics_host=" ")


# --- a port that is taken -------------------------------------------------------


def _one_error_line(proc: subprocess.Popen[Any], port: int) -> None:
    assert proc.wait(30) == 1, output(proc)
    text = output(proc)
    assert "Traceback" not in text and "Errno" not in text, text
    errors = [line for line in text.splitlines() if "error" in line.lower()]
    assert errors == [
        f"pgqueue: error: cannot listen on 127.0.0.1:{port}: Address already in use;"
        " choose another port or address"
    ], text


def test_web_on_a_taken_port_says_so_in_one_line_before_any_url(
    dsn: str, run_pgqueue: Any, held_port: int
) -> None:
    needs_extra("web")
    proc = run_pgqueue("web", "--port", str(held_port), "--dsn", dsn)
    _one_error_line(proc, held_port)
    assert "pgqueue web on" not in output(proc)  # no URL that answers nothing


def test_exporter_on_a_taken_port_says_so_in_one_line(
    dsn: str, run_pgqueue: Any, held_port: int
) -> None:
    needs_extra("prometheus")
    proc = run_pgqueue("exporter", "--port", str(held_port), "--dsn", dsn)
    _one_error_line(proc, held_port)
    assert "serving /metrics" not in output(proc)


def test_worker_metrics_on_a_taken_port_says_so_in_one_line(
    dsn: str, run_pgqueue: Any, held_port: int
) -> None:
    needs_extra("prometheus")
    prepare(dsn).close()
    proc = run_pgqueue(
        "worker",
        "support.worker_app:app",
        "--queue",
        "jobs",
        "--dsn",
        dsn,
        "--metrics-port",
        str(held_port),
    )
    _one_error_line(proc, held_port)
