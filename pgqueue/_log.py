"""Logging: what the library emits, and the setup the processes pgqueue runs install.

As a library, pgqueue configures nothing, on import or on a call. Its events
are structlog events handed to the standard `logging` logger `pgqueue` (and
`pgqueue.web`) as ordinary records, so an application's logging setup decides
where they go and from what level, as for any other library. A record's
message is the event and its fields as text (`message.failed queue='q'
msg_id=7 ...`); the fields themselves are on the record as `pgqueue_event`,
and a failure's exception is the record's `exc_info`. With no setup at all,
Python's own fallback writes WARNING and above to stderr.

The `pgqueue` commands (the CLI, the worker, the demo) are applications: they
call `configure_logging`, which installs one handler on the root logger for
pgqueue's records and those of the libraries beneath it (psycopg,
psycopg_pool, tenacity, the app's handlers), rendered by the same
processors, so with JSON every line is one JSON object, written in one write.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

# The record attribute that carries a pgqueue event's fields.
EVENT_FIELDS = "pgqueue_event"


def logs_at(log: Any, level: int) -> bool:
    """Whether `log` emits events at `level` (True when it cannot tell)."""
    for name in ("is_enabled_for", "isEnabledFor"):
        check = getattr(log, name, None)
        if callable(check):
            return bool(check(level))
    return True


def _as_text(fields: EventDict) -> str:
    rest = " ".join(f"{k}={v!r}" for k, v in fields.items() if k != "event")
    event = str(fields.get("event", ""))
    return f"{event} {rest}" if rest else event


def _to_record(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> Any:
    """The last processor: the arguments of the standard logging call, fields kept whole."""
    exc_info = event_dict.pop("exc_info", None)
    kwargs: dict[str, Any] = {"extra": {EVENT_FIELDS: dict(event_dict)}}
    if exc_info:
        kwargs["exc_info"] = exc_info
    return (_as_text(event_dict),), kwargs


def get_logger(name: str = "pgqueue") -> Any:
    """pgqueue's logger: its events become records of the standard logger `name`, nothing else.

    It does not read or change structlog's global configuration: an
    application that configures structlog (or does not) changes nothing here.
    """
    return structlog.wrap_logger(
        logging.getLogger(name),
        processors=[
            structlog.stdlib.filter_by_level,
            structlog.contextvars.merge_contextvars,
            _to_record,
        ],
        wrapper_class=structlog.stdlib.BoundLogger,
        context_class=dict,
        cache_logger_on_first_use=True,
    )


class _DirectLogger:
    """A standard logger for an app's structlog events, past the standard levels.

    structlog has filtered the event at pgqueue's level already; the record is
    handed to the handlers whatever the standard logger's own level is (the
    root's is WARNING at INFO, for the other libraries' sake).
    """

    def __init__(self, *args: Any) -> None:
        self._logger = logging.getLogger(str(args[0]) if args else None)

    def _emit(self, level: int, msg: str, exc_info: Any = None, extra: Any = None) -> None:
        if exc_info is True:
            exc_info = sys.exc_info()
        record = self._logger.makeRecord(
            self._logger.name, level, "(structlog)", 0, msg, (), exc_info or None, extra=extra
        )
        self._logger.handle(record)

    def debug(self, msg: str, **kw: Any) -> None:
        """A DEBUG record."""
        self._emit(logging.DEBUG, msg, **kw)

    def info(self, msg: str, **kw: Any) -> None:
        """An INFO record."""
        self._emit(logging.INFO, msg, **kw)

    def warning(self, msg: str, **kw: Any) -> None:
        """A WARNING record."""
        self._emit(logging.WARNING, msg, **kw)

    def error(self, msg: str, **kw: Any) -> None:
        """An ERROR record."""
        self._emit(logging.ERROR, msg, **kw)

    def critical(self, msg: str, **kw: Any) -> None:
        """A CRITICAL record."""
        self._emit(logging.CRITICAL, msg, **kw)

    exception = error
    warn = warning
    fatal = critical


class _StderrHandler(logging.StreamHandler[TextIO]):
    """The root handler pgqueue's commands install; a later configure_logging replaces it."""


class _Formatter(logging.Formatter):
    """Renders a pgqueue record from its fields, any other record from its message."""

    def __init__(self, chain: list[Processor]) -> None:
        super().__init__()
        self._chain = chain

    def format(self, record: logging.LogRecord) -> str:
        """One line (console text may add a traceback's lines) for one record."""
        fields = getattr(record, EVENT_FIELDS, None)
        ed: Any
        if isinstance(fields, dict):
            ed = dict(fields)
        else:
            ed = structlog.contextvars.merge_contextvars(None, "", {"event": record.getMessage()})
        if record.exc_info:
            ed["exc_info"] = record.exc_info
        if record.stack_info:
            ed["stack_info"] = record.stack_info
        ed["_record"] = record
        method = record.levelname.lower()
        for proc in self._chain:
            ed = proc(None, method, ed)
        return str(ed)


def _add_logger_name(logger: Any, method_name: str, event_dict: EventDict) -> EventDict:
    record = event_dict.pop("_record", None)
    if record is not None and record.name and record.name != "root":
        event_dict.setdefault("logger", record.name)
    return event_dict


def foreign_level(level: int) -> int:
    """The level other libraries' records need to be written at, given pgqueue's own level.

    psycopg_pool says INFO for every connection it hands out: at pgqueue's
    INFO that would drown the worker's own lines. So other loggers write from
    WARNING (or pgqueue's level, if higher), and everything at DEBUG.
    """
    return level if level <= logging.DEBUG else max(level, logging.WARNING)


def configure_logging(*, json: bool | None = None, level: str = "INFO") -> None:
    """For pgqueue's own commands: every log line to stderr as JSON or console text.

    JSON when stderr is not a terminal (or json=True), else console text.
    pgqueue's events are written from `level`; other loggers' records (on
    the root logger) from foreign_level(level); Python warnings are logged
    too (py.warnings); a record with an exception carries its traceback
    (`exception` in JSON). structlog, for an app's handlers that use it,
    writes through the same handler. Calling it again replaces the previous
    setup. The library never calls it.
    """
    as_json = (not sys.stderr.isatty()) if json is None else json
    own = logging.getLevelNamesMapping()[level.upper()]
    render: list[Processor] = (
        [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
        if as_json
        else [structlog.dev.ConsoleRenderer()]
    )
    chain: list[Processor] = [
        structlog.processors.add_log_level,
        _add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        *render,
    ]
    handler = _StderrHandler(sys.stderr)
    handler.setFormatter(_Formatter(chain))
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _StderrHandler)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(foreign_level(own))
    logging.getLogger("pgqueue").setLevel(own)
    # psycopg sets its own logger to WARNING on import: without this, DEBUG
    # would never show the pool's lines or the connection attempts.
    logging.getLogger("psycopg").setLevel(foreign_level(own))
    logging.captureWarnings(True)
    # An app's handlers that log with structlog.get_logger() write through
    # the same handler, at pgqueue's level.
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, _to_record],
        wrapper_class=structlog.make_filtering_bound_logger(own),
        logger_factory=_DirectLogger,
        cache_logger_on_first_use=False,
    )
