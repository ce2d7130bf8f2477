"""How the `pgqueue` commands log: to stderr, format and level from the environment."""

from __future__ import annotations

import os

from pgqueue._log import configure_logging


def setup_logging(default_level: str = "INFO") -> None:
    """Configure logs from PGQUEUE_LOG_FORMAT / PGQUEUE_LOG_LEVEL."""
    log_format = os.environ.get("PGQUEUE_LOG_FORMAT", "")
    configure_logging(
        json={"json": True, "console": False}.get(log_format),
        level=os.environ.get("PGQUEUE_LOG_LEVEL", default_level),
    )
