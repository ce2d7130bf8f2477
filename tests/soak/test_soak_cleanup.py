"""The soak leaves nothing on the server: its databases are dropped, its workers gone, even
when it fails halfway (each run used to leave a `soak_…` database of about 11 MB)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import chaos
import psycopg
import pytest
import soak_app
from psycopg.conninfo import conninfo_to_dict


class Injected(Exception):
    """The failure these tests inject."""


@dataclass
class Made:
    """What a run created: the databases' names and the worker processes."""

    databases: list[str] = field(default_factory=list)
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> Made:
    """Records every database and worker the soak creates in this test."""
    found = Made()
    real_database, real_spawn = chaos.soak_database, chaos.Consumers.spawn

    @contextlib.contextmanager
    def database(server_dsn: str, queues: dict[str, int]) -> Iterator[str]:
        with real_database(server_dsn, queues) as dsn:
            found.databases.append(str(conninfo_to_dict(dsn)["dbname"]))
            yield dsn

    def spawn(self: chaos.Consumers) -> subprocess.Popen[bytes]:
        proc = real_spawn(self)
        found.workers.append(proc)
        return proc

    monkeypatch.setattr(chaos, "soak_database", database)
    monkeypatch.setattr(chaos.Consumers, "spawn", spawn)
    return found


def existing(server_dsn: str, names: list[str]) -> list[str]:
    with psycopg.connect(server_dsn) as conn:
        rows = conn.execute(
            "SELECT datname FROM pg_database WHERE datname = ANY(%s)", (names,)
        ).fetchall()
    return [r[0] for r in rows]


def test_the_soak_database_is_dropped_when_the_body_fails(server_dsn: str, made: Made) -> None:
    with pytest.raises(Injected), chaos.soak_database(server_dsn, {soak_app.WORK: 5}) as dsn:
        left_open = psycopg.connect(dsn)  # still connected at the drop: it is cut
        assert existing(server_dsn, made.databases) == made.databases
        raise Injected
    assert len(made.databases) == 1
    assert existing(server_dsn, made.databases) == []
    with left_open, pytest.raises(psycopg.OperationalError):
        left_open.execute("SELECT 1")


def test_a_soak_that_fails_after_starting_workers_stops_them_and_drops_its_database(
    server_dsn: str, made: Made, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(self: Any) -> None:
        raise Injected("the fault thread could not start")

    monkeypatch.setattr(chaos.Faults, "start", fail)
    cfg = chaos.Config(duration=5, consumers=2, rate=50)
    with pytest.raises(Injected):
        chaos.soak(cfg, server_dsn, None, tmp_path)
    assert len(made.databases) == 1 and len(made.workers) == 2
    assert existing(server_dsn, made.databases) == []
    assert all(w.poll() is not None for w in made.workers)


def test_a_scenario_that_fails_midway_stops_its_workers_and_drops_its_database(
    server_dsn: str, made: Made, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*args: Any) -> None:
        raise Injected("the baseline batch failed")

    monkeypatch.setattr(chaos, "run_phase", fail)
    with pytest.raises(Injected):
        chaos.scenario("pg_backend_kill", chaos.Config(), server_dsn, None, tmp_path)
    assert len(made.databases) == 1 and len(made.workers) == 2
    assert existing(server_dsn, made.databases) == []
    assert all(w.poll() is not None for w in made.workers)
