"""Where the pgmq facade's SQL is (sql/pgmq/, in the wheel or the checkout) and its digest."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

from pgqueue._errors import MigrationError
from pgqueue._schema import available, sql_dir


def facade_dir() -> Path:
    """The folder holding the facade's SQL: pgmq/ beside the migrations (in the wheel or sql/)."""
    return sql_dir() / "pgmq"


def facade_files(directory: Path | None = None) -> list[Path]:
    """The facade's SQL files in the order they apply (by name)."""
    folder = directory or facade_dir()
    files = sorted(p for p in folder.glob("*.sql") if p.is_file()) if folder.is_dir() else []
    if not files:
        raise MigrationError(f"no pgmq facade SQL found in {folder}; reinstall pgqueue")
    return files


def facade_digest(files: Sequence[Path]) -> str:
    """A short digest of the facade's SQL: a facade installed from other files has another."""
    h = hashlib.sha256()
    for path in files:
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def latest_migration() -> int:
    """The number of the newest migration this pgqueue ships (the facade needs it applied)."""
    return available()[-1].version
