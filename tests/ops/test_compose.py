"""compose/docker-compose.yml, proven without Docker.

No Docker engine runs here, so the file is checked, then run another way:
every pgqueue command is parsed by the real CLI, every PGQUEUE_* variable must
be a real setting, every consumer sizes its vt to its work; then the services'
own commands run as local processes against the test server through a local
PgBouncer in transaction mode, with the services' own environment (only the
hosts changed), and the albums must all complete with one callback each.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import click
import psycopg
import pytest
import yaml
from psycopg.conninfo import conninfo_to_dict
from support import pgbouncer
from support.db import wait_until

from pgqueue._cli import main as cli
from pgqueue._worker import WorkerSettings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose" / "docker-compose.yml"
OTHER_SETTINGS = {
    "PGQUEUE_DSN",
    "PGQUEUE_LOG_FORMAT",
    "PGQUEUE_LOG_LEVEL",
    "PGQUEUE_PREPARE_THRESHOLD",
}
SETTINGS = {f"PGQUEUE_{f.name.upper()}" for f in fields(WorkerSettings)} | OTHER_SETTINGS


def services() -> dict[str, dict[str, Any]]:
    spec = yaml.safe_load(COMPOSE.read_text())
    found: dict[str, dict[str, Any]] = spec["services"]
    return found


def pgqueue_services() -> dict[str, dict[str, Any]]:
    return {n: s for n, s in services().items() if s.get("command", [None])[0] == "pgqueue"}


def environment(service: dict[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in (service.get("environment") or {}).items()}


def parse_cli(args: list[str]) -> dict[str, Any]:
    """The params of a pgqueue command line, parsed by the real CLI (raises on a bad one)."""
    ctx = cli.make_context("pgqueue", list(args))
    rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
    name, cmd, sub = cli.resolve_command(ctx, rest)
    assert cmd is not None and name is not None
    params: dict[str, Any] = cmd.make_context(name, sub, parent=ctx).params
    return params


def test_the_compose_file_has_the_deployment_shape() -> None:
    svc = services()
    expected = {"postgres", "pgbouncer", "migrate", "queues", "producer", "thumbnails"}
    assert expected | {"album-ready"} <= set(svc)
    assert "healthcheck" in svc["postgres"]
    assert environment(svc["pgbouncer"])["POOL_MODE"] == "transaction"
    assert svc["migrate"]["command"] == ["pgqueue", "migrate"]
    assert svc["thumbnails"]["deploy"]["replicas"] > 1
    for name in ("queues", "producer", "thumbnails", "album-ready"):
        depends = svc[name]["depends_on"]
        assert depends["migrate"]["condition"] == "service_completed_successfully", name
    for name in ("producer", "thumbnails", "album-ready"):  # no worker before its queues
        assert svc[name]["depends_on"]["queues"]["condition"] == "service_completed_successfully"


def test_every_pgqueue_command_is_valid_and_every_setting_real() -> None:
    for name, service in pgqueue_services().items():
        params = parse_cli(service["command"][1:])
        env = environment(service)
        unknown = {k for k in env if k.startswith("PGQUEUE_")} - SETTINGS
        assert not unknown, f"{name}: not pgqueue settings: {sorted(unknown)}"
        assert "PGQUEUE_DSN" in env, name
        if service["command"][1] == "worker":
            # the values parse as the worker will parse them
            WorkerSettings.from_env(env, queues=params["queues"] or None)
            # no consumer left at a default vt: it is sized to the service's work
            assert "PGQUEUE_VT" in env, f"{name} leaves vt at its default"
            work = float(env.get("EXAMPLE_WORK_SECONDS", "0"))
            assert int(env["PGQUEUE_VT"]) >= max(10 * work, 5), name
    with pytest.raises(click.UsageError):
        parse_cli(["worker", "examples.albums:app", "--no-such-option"])  # the check can fail


def test_the_other_app_services_run_the_example_module() -> None:
    """Services that are neither Postgres, PgBouncer nor a pgqueue command run the
    example app's module (the run below executes them for real)."""
    images = {"postgres", "pgbouncer"}
    others = {
        n: s for n, s in services().items() if n not in images
    }.keys() - pgqueue_services().keys()
    assert others == {"producer"}
    args = services()["producer"]["command"]
    assert args[:3] == ["python", "-m", "examples.albums"]
    assert importlib.util.find_spec("examples.albums") is not None
    env = environment(services()["producer"])
    assert not {k for k in env if k.startswith("PGQUEUE_")} - SETTINGS


def test_a_bad_setting_in_the_environment_is_one_clear_error() -> None:
    with pytest.raises(ValueError, match="PGQUEUE_VT"):
        WorkerSettings.from_env({"PGQUEUE_VT": "1m"})


@pytest.fixture
def bouncer(server_dsn: str) -> Iterator[pgbouncer.Bouncer]:
    if pgbouncer.binary() is None:
        pytest.skip("needs pgbouncer (apt-get install pgbouncer)")
    b = pgbouncer.start(server_dsn)
    yield b
    b.stop()


def run_env(service: dict[str, Any], pooled: str, direct: str, tmp: Path) -> dict[str, str]:
    """The service's environment, with the compose hosts replaced by local ones."""
    env = dict(os.environ)
    env.update(environment(service))
    env["PGQUEUE_DSN"] = pooled
    if "PGQUEUE_LISTEN_DSN" in env:
        env["PGQUEUE_LISTEN_DSN"] = direct
    if "PGQUEUE_HEALTH_FILE" in env:
        env["PGQUEUE_HEALTH_FILE"] = str(tmp / "alive")
    env["PYTHONPATH"] = str(ROOT)
    # a short run: fewer, smaller albums and quicker work than the demo deployment
    env.update(EXAMPLE_ALBUMS="6", EXAMPLE_PHOTOS="40", EXAMPLE_EVERY_SECONDS="0.2")
    if "EXAMPLE_WORK_SECONDS" in env:
        env["EXAMPLE_WORK_SECONDS"] = "0.005"
    return env


def command(service: dict[str, Any]) -> list[str]:
    args: list[str] = service["command"]
    if args[0] == "pgqueue":
        return [sys.executable, "-m", "pgqueue", *args[1:]]
    assert args[0] == "python"
    return [sys.executable, *args[1:]]


def test_the_services_run_through_pgbouncer_and_every_album_calls_back_once(
    bouncer: pgbouncer.Bouncer, empty_dsn: str, tmp_path: Path
) -> None:
    svc = services()
    pooled = bouncer.dsn(str(conninfo_to_dict(empty_dsn)["dbname"]))

    def run_to_end(name: str) -> str:
        result = subprocess.run(
            command(svc[name]),
            env=run_env(svc[name], pooled, empty_dsn, tmp_path),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, f"{name}: {result.stderr[-2000:]}"
        return result.stdout

    run_to_end("migrate")
    run_to_end("queues")
    consumers: list[subprocess.Popen[str]] = []
    try:
        for name in ("thumbnails", "album-ready"):
            for _ in range(int(svc[name].get("deploy", {}).get("replicas", 1))):
                consumers.append(
                    subprocess.Popen(
                        command(svc[name]),
                        env=run_env(svc[name], pooled, empty_dsn, tmp_path),
                        cwd=tmp_path,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.PIPE,
                        text=True,
                    )
                )
        assert "fanned out 6 album(s)" in run_to_end("producer")

        def albums() -> int:
            with psycopg.connect(empty_dsn) as conn:
                return int(conn.execute("SELECT count(*) FROM example_albums").fetchone()[0])  # type: ignore[index]

        def messages() -> int:
            with psycopg.connect(empty_dsn) as conn:
                return int(conn.execute("SELECT count(*) FROM pgqueue.message").fetchone()[0])  # type: ignore[index]

        wait_until(lambda: albums() == 6, timeout=120)
        # a second callback would be a message: once none is left, it has landed (and is
        # counted below) or was never sent; no pause to guess
        wait_until(lambda: messages() == 0)
        with psycopg.connect(empty_dsn) as conn:
            rows = conn.execute(
                "SELECT count(*), sum(thumbnails), sum(failed) FROM example_albums"
            ).fetchone()
            assert rows == (6, 240, 0)
            fired = conn.execute(
                "SELECT count(*) FROM pgqueue.barrier WHERE state = 'fired'"
            ).fetchone()
            assert fired == (6,)
            left = conn.execute("SELECT count(*) FROM pgqueue.message").fetchone()
            assert left == (0,)
        assert (tmp_path / "alive").exists()  # the health file is touched
    finally:
        for p in consumers:
            p.send_signal(signal.SIGTERM)
        codes = [p.wait(30) for p in consumers]
    assert codes == [0] * len(consumers), [p.stderr.read()[-500:] for p in consumers if p.stderr]
