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


@contextmanager
def private_server() -> Iterator[str]:
    """A stock Postgres cluster on 127.0.0.1 (trust auth, database `postgres`); its DSN."""
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
    subprocess.run(
        _as_postgres(
            [
                f"{bindir}/pg_ctl",
                "-D",
                data,
                "-o",
                options,
                "-w",
                "-l",
                os.path.join(root, "log"),
                "start",
            ]
        ),
        check=True,
        capture_output=True,
    )
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            _as_postgres([f"{bindir}/pg_ctl", "-D", data, "-m", "fast", "-w", "stop"]),
            capture_output=True,
        )
        shutil.rmtree(root, ignore_errors=True)
