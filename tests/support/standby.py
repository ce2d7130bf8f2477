"""A private primary with a hot standby (pg_basebackup -R), and a proxy that can be re-pointed.

What a failover looks like to a client without an HA engine: connections to
a node that cannot write (the standby), a standby promoted under them, an
endpoint (DNS, a VIP, PgBouncer) that moves from one node to the other.
Built on benchmarks/server.py's private clusters: run as user postgres when
root, trust auth on 127.0.0.1, removed afterwards.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from support.db import migrated_database, with_dbname
from support.faultproxy import FaultProxy

# Small and fast: a test cluster holds a few rows, and a crash loses nothing a
# test looks at after it.
FAST_SETTINGS = {
    "shared_buffers": "16MB",
    "fsync": "off",
    "full_page_writes": "off",
    "synchronous_commit": "off",
    "max_wal_senders": "4",
    "wal_level": "replica",
}


def require_server_binaries() -> None:
    """Skip the test where the PostgreSQL server packages (initdb, pg_basebackup) are missing."""
    if os.geteuid() == 0 and not shutil.which("runuser"):
        pytest.skip("needs runuser to run PostgreSQL as user postgres")
    try:
        from benchmarks.server import _bindir
    except ImportError:
        pytest.skip("needs the benchmarks package of a source checkout")
    try:
        bindir = _bindir()
    except RuntimeError:
        pytest.skip("needs the PostgreSQL server packages (initdb)")
    if not (Path(bindir, "pg_basebackup").exists() or shutil.which("pg_basebackup")):
        pytest.skip("needs pg_basebackup (the PostgreSQL client packages)")


@dataclass
class Pair:
    """A primary and its hot standby; `app` is a migrated pgqueue database on both."""

    primary: Any  # benchmarks.server.Cluster
    standby: Any
    app: str = "app"

    @property
    def primary_dsn(self) -> str:
        return with_dbname(self.primary.dsn, self.app)

    @property
    def standby_dsn(self) -> str:
        return with_dbname(self.standby.dsn, self.app)

    def multi_host_dsn(self, first: Any, then: Any, **extra: str) -> str:
        """A DSN naming both nodes, `first` first, with target_session_attrs=read-write."""
        params = {"target_session_attrs": "read-write", **extra}
        tail = " ".join(f"{k}={v}" for k, v in params.items())
        return (
            f"host=127.0.0.1,127.0.0.1 port={first.port},{then.port}"
            f" user=postgres dbname={self.app} {tail}"
        )

    def promote(self) -> None:
        """Promote the standby (pg_ctl promote -w): it takes writes from now on."""
        self.standby._ctl("-w", "-t", "60", "promote")


def _replayed(dsn: str, table: str) -> bool:
    try:
        with psycopg.connect(dsn, connect_timeout=2) as conn:
            row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()
            return bool(row and row[0])
    except psycopg.OperationalError:
        return False


@contextmanager
def primary_with_standby(settings: dict[str, str] | None = None) -> Iterator[Pair]:
    """A private primary with a migrated database `app`, and a hot standby that replays it."""
    require_server_binaries()
    from benchmarks.server import Cluster, _as_postgres, _bindir, _free_port, private_cluster

    wanted = {**FAST_SETTINGS, **(settings or {})}
    with private_cluster(wanted) as primary:
        migrated_database(primary.dsn)
        bindir = _bindir()
        basebackup = Path(bindir, "pg_basebackup")
        root = tempfile.mkdtemp(prefix="pgqueue-standby-pg-")
        data = os.path.join(root, "data")
        if os.geteuid() == 0:
            shutil.chown(root, "postgres", "postgres")
        subprocess.run(
            _as_postgres(
                [
                    str(basebackup) if basebackup.exists() else "pg_basebackup",
                    *("-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres"),
                    *("-D", data, "-R", "-c", "fast", "-X", "stream"),
                ]
            ),
            check=True,
            capture_output=True,
        )
        port = _free_port()
        options = f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={root}"
        for name, value in wanted.items():
            options += f" -c {name}={value}"
        standby = Cluster(bindir, root, data, options, port)
        standby.start()
        try:
            pair = Pair(primary, standby)
            deadline = time.monotonic() + 30
            while not _replayed(pair.standby_dsn, "pgqueue.message"):
                if time.monotonic() > deadline:
                    raise AssertionError("the standby never replayed the migrated database")
                time.sleep(0.05)
            yield pair
        finally:
            standby.stop("immediate")
            shutil.rmtree(root, ignore_errors=True)


class SwitchProxy(FaultProxy):
    """A FaultProxy whose target can move, like a DNS name or a VIP after a failover.

    Connections already open stay on the node they reached (sockets are not
    closed by a DNS change): only new ones go to the new target.
    """

    def point_at(self, dsn: str) -> None:
        """Send new connections to the server of `dsn`."""
        params: dict[str, Any] = conninfo_to_dict(dsn)
        host = str(params.get("host") or "127.0.0.1")
        port = int(params.get("port") or 5432)
        self._target = (socket.AF_INET, (host, port))


def server_port(conn: psycopg.Connection[Any]) -> int:
    """The port of the server this connection reached, as the server knows it."""
    row = conn.execute("SELECT current_setting('port')::int").fetchone()
    assert row is not None
    return int(row[0])
