"""Logging setup for the processes pgqueue runs (CLI, demo, workers).

Every line on stderr goes through one handler on the root logger: pgqueue's own
structlog events and the standard `logging` records of the libraries beneath it
(psycopg, psycopg_pool, tenacity, the app's handlers), rendered by the same
processors, so with JSON every line is one JSON object. One path also means one
lock and one write per line: when structlog printed on its own while `logging`'s
fallback wrote psycopg_pool's warnings to the same stderr, a JSON line and a
plain one once came out on a single line.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any, TextIO

import structlog
from structlog.typing import EventDict, Processor


def logs_at(log: Any, level: int) -> bool:
    """Whether `log` emits events at `level` (True when it cannot tell)."""
    check = getattr(log, "is_enabled_for", None)
    return bool(check(level)) if callable(check) else True


class _StderrHandler(logging.StreamHandler[TextIO]):
    """The root handler pgqueue installs; a later configure_logging replaces it."""

    def write_line(self, line: str) -> None:
        """Write one rendered line in one write, under the lock emit() takes for records."""
        self.acquire()
        try:
            self.stream.write(line + self.terminator)
            self.flush()
        finally:
            self.release()


class _LineLogger:
    """structlog's logger: hands each rendered event to the shared handler."""

    def __init__(self, handler: _StderrHandler, name: str) -> None:
        self._handler = handler
        self.name = name

    def msg(self, message: str) -> None:
        """Write one rendered event as one line."""
        self._handler.write_line(message)

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg


def _add_logger_name(logger: Any, method_name: str, event_dict: EventDict) -> EventDict:
    # A foreign record names its stdlib logger (psycopg.pool); a structlog
    # event the name given to get_logger (pgqueue), when there is one.
    record = event_dict.get("_record")
    name = record.name if record is not None else getattr(logger, "name", "")
    if name:
        event_dict.setdefault("logger", name)
    return event_dict


def foreign_level(level: int) -> int:
    """The level other libraries' records need to be written at, given pgqueue's own level.

    psycopg_pool says INFO for every connection it hands out: at pgqueue's
    INFO that would drown the worker's own lines. So other loggers write from
    WARNING (or pgqueue's level, if higher), and everything at DEBUG.
    """
    return level if level <= logging.DEBUG else max(level, logging.WARNING)


def configure_logging(*, json: bool | None = None, level: str = "INFO") -> None:
    """Send every log line, structlog's and stdlib logging's, to stderr as JSON or console text.

    JSON when stderr is not a terminal (or json=True), else console text.
    pgqueue's events are written from `level`; other loggers' records (on
    the root logger) from foreign_level(level); Python warnings are logged
    too (py.warnings). Calling it again replaces the previous setup.
    """
    as_json = (not sys.stderr.isatty()) if json is None else json
    own = logging.getLevelNamesMapping()[level.upper()]
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        _add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    render: list[Processor] = (
        [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
        if as_json
        else [structlog.dev.ConsoleRenderer()]
    )
    handler = _StderrHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *render],
        )
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _StderrHandler)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(foreign_level(own))
    # psycopg sets its own logger to WARNING on import: without this, DEBUG
    # would never show the pool's lines or the connection attempts.
    logging.getLogger("psycopg").setLevel(foreign_level(own))
    logging.captureWarnings(True)
    structlog.configure(
        processors=[*shared, *render],
        wrapper_class=structlog.make_filtering_bound_logger(own),
        logger_factory=_line_loggers(handler),
        cache_logger_on_first_use=False,
    )


def _line_loggers(handler: _StderrHandler) -> Callable[..., _LineLogger]:
    def factory(*args: Any) -> _LineLogger:
        return _LineLogger(handler, str(args[0]) if args else "")

    return factory
