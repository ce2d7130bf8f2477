"""A PgBouncer of the tests' own, in transaction pooling mode, in front of the test server.

Started on a free port with a config in a temporary directory (as the
`postgres` user when the tests run as root: PgBouncer refuses root), stopped
when the test session ends. `Bouncer.admin(...)` runs an admin console command
(RECONNECT, KILL, RESUME, SHOW ...).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

BINARY_PATHS = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")


def binary() -> str | None:
    """The pgbouncer executable, or None when it is not installed."""
    found = shutil.which("pgbouncer")
    if found:
        return found
    return next((p for p in BINARY_PATHS if os.path.exists(p)), None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Bouncer:
    """A running PgBouncer: its port, and DSNs through it."""

    port: int
    root: Path
    process: subprocess.Popen[bytes]
    server_user: str

    def dsn(self, dbname: str) -> str:
        """A DSN to `dbname` on the test server, through this PgBouncer."""
        return make_conninfo(
            "", host="127.0.0.1", port=str(self.port), dbname=dbname, user=self.server_user
        )

    def admin(self, command: str) -> list[tuple[Any, ...]]:
        """Run one admin console command; its rows (none for most commands)."""
        with psycopg.connect(self.dsn("pgbouncer"), autocommit=True) as conn:
            cur = conn.execute(command, prepare=False)
            return cur.fetchall() if cur.description else []

    def stop(self) -> None:
        """Stop it and remove its directory."""
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        shutil.rmtree(self.root, ignore_errors=True)


def start(server_dsn: str, **settings: str) -> Bouncer:
    """Start a PgBouncer in transaction mode in front of the server of `server_dsn`."""
    exe = binary()
    if exe is None:
        raise RuntimeError("pgbouncer is not installed (apt-get install pgbouncer)")
    params = conninfo_to_dict(server_dsn)
    user = str(params.get("user") or "postgres")
    root = Path(tempfile.mkdtemp(prefix="pgqueue-pgbouncer-"))
    port = _free_port()
    options = {
        "listen_addr": "127.0.0.1",
        "listen_port": str(port),
        "unix_socket_dir": "",
        "auth_type": "trust",
        "auth_file": str(root / "users.txt"),
        "admin_users": user,
        "pool_mode": "transaction",
        "max_client_conn": "500",
        "default_pool_size": "20",
        "ignore_startup_parameters": "extra_float_digits,options",
        "logfile": str(root / "pgbouncer.log"),
        "pidfile": str(root / "pgbouncer.pid"),
        **settings,
    }
    server = f"host={params.get('host') or '127.0.0.1'} port={params.get('port') or 5432}"
    lines = ["[databases]", f"* = {server}", "", "[pgbouncer]"]
    lines += [f"{k} = {v}" for k, v in options.items()]
    (root / "pgbouncer.ini").write_text("\n".join(lines) + "\n")
    (root / "users.txt").write_text(f'"{user}" ""\n')
    cmd = [exe, str(root / "pgbouncer.ini")]
    if os.geteuid() == 0:  # PgBouncer will not run as root
        shutil.chown(root, "postgres", "postgres")
        for f in root.iterdir():
            shutil.chown(f, "postgres", "postgres")
        cmd = [exe, "-u", "postgres", str(root / "pgbouncer.ini")]
    process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    bouncer = Bouncer(port, root, process, user)
    deadline = time.monotonic() + 15
    while True:
        try:
            bouncer.admin("SHOW VERSION")
            return bouncer
        except psycopg.OperationalError:
            if process.poll() is not None or time.monotonic() > deadline:
                log = (
                    (root / "pgbouncer.log").read_text()
                    if (root / "pgbouncer.log").exists()
                    else ""
                )
                err = process.stderr.read().decode() if process.stderr else ""
                bouncer.stop()
                raise RuntimeError(f"pgbouncer did not start: {err}{log}"[-2000:]) from None
            time.sleep(0.1)
