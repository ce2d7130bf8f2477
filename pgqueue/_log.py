"""Logging setup for the processes pgqueue runs (CLI, demo, workers)."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog


def logs_at(log: Any, level: int) -> bool:
    """Whether `log` emits events at `level` (True when it cannot tell)."""
    check = getattr(log, "is_enabled_for", None)
    return bool(check(level)) if callable(check) else True


def configure_logging(*, json: bool | None = None, level: str = "INFO") -> None:
    """Send structlog output to stderr: JSON when not on a terminal (or json=True), else console."""
    as_json = (not sys.stderr.isatty()) if json is None else json
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
