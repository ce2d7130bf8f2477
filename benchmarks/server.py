"""A private Postgres with stock settings, for figures that must not depend on a tuned server.

The machine's shared server may carry CI settings (autovacuum off, say); the
suite's --private starts a fresh cluster with initdb's defaults on a free
port, and removes it afterwards.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager


def _bindir() -> str:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return os.path.dirname(found[-1])
    initdb = shutil.which("initdb")
    if initdb is None:
        raise RuntimeError("no initdb found: install the PostgreSQL server packages")
    return os.path.dirname(initdb)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _as_postgres(cmd: list[str]) -> list[str]:
    """Postgres refuses to run as root: run as the postgres user there."""
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


class Cluster:
    """A private cluster this process started: its DSN, and a way to restart it."""

    def __init__(self, bindir: str, root: str, data: str, options: str, port: int) -> None:
        self.bindir, self.root, self.data, self.options, self.port = (
            bindir,
            root,
            data,
            options,
            port,
        )
        self.dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"

    def _ctl(self, *args: str, check: bool = True) -> None:
        subprocess.run(
            _as_postgres([f"{self.bindir}/pg_ctl", "-D", self.data, *args]),
            check=check,
            capture_output=True,
        )

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        log = os.path.join(self.root, "log")
        self._ctl("-o", self.options, "-w", "-t", "120", "-l", log, "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: `fast` rolls back and disconnects, `immediate` crashes it."""
        self._ctl("-m", mode, "-w", "stop", check=False)

    def restart(self, mode: str = "immediate") -> None:
        """Stop (crash, by default) and start again; committed work survives."""
        self.stop(mode)
        self.start()


def init_cluster(settings: dict[str, str] | None = None) -> Cluster:
    """A new stock cluster (initdb, trust auth) on a free port of 127.0.0.1, not started."""
    bindir = _bindir()
    root = tempfile.mkdtemp(prefix="pgqueue-bench-pg-")
    data = os.path.join(root, "data")
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    port = _free_port()
    subprocess.run(
        _as_postgres([f"{bindir}/initdb", "-D", data, "-A", "trust", "-U", "postgres"]),
        check=True,
        capture_output=True,
    )
    options = f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={root}"
    for name, value in (settings or {}).items():
        options += f" -c {name}={value}"
    return Cluster(bindir, root, data, options, port)


@contextmanager
def private_cluster(settings: dict[str, str] | None = None) -> Iterator[Cluster]:
    """A stock Postgres cluster on 127.0.0.1 (trust auth, database `postgres`), removed after."""
    cluster = init_cluster(settings)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)


@contextmanager
def private_server() -> Iterator[str]:
    """A stock Postgres cluster on 127.0.0.1 (trust auth, database `postgres`); its DSN."""
    with private_cluster() as cluster:
        yield cluster.dsn
