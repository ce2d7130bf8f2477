"""Where pgqueue finds its database: the DSN resolution order, in one place."""

from __future__ import annotations

import os

import psycopg.conninfo

from pgqueue._errors import ConnectionLost, InvalidArgument, PgQueueError

DSN_ENV_VARS = ("PGQUEUE_DSN", "DATABASE_URL")


def resolve_dsn(explicit: str | None = None) -> str | None:
    """The DSN to use: the explicit one, else $PGQUEUE_DSN, else $DATABASE_URL, else None."""
    if explicit:
        return explicit
    for var in DSN_ENV_VARS:
        value = os.environ.get(var)
        if value:
            return value
    return None


def require_dsn(explicit: str | None = None) -> str:
    """The DSN to use, or a PgQueueError that says how to give one."""
    dsn = resolve_dsn(explicit)
    if dsn is None:
        raise PgQueueError(
            "no database given: pass a DSN (--dsn), or set PGQUEUE_DSN (or DATABASE_URL),"
            " e.g. postgresql://user@localhost:5432/dbname"
        )
    return dsn


def unreachable(dsn_label: str, timeout: float, exc: Exception) -> ConnectionLost:
    """The error for a server that did not answer at startup, with the reason it gave."""
    reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return ConnectionLost(
        f"could not connect to {dsn_label} within {timeout:g}s ({reason});"
        " check that the server is running and that the DSN (PGQUEUE_DSN) is right"
    )


def describe_dsn(dsn: str) -> str:
    """The DSN without its password, for messages and logs."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparseable DSN>"
    params.pop("password", None)
    host = params.get("host") or "localhost"
    port = params.get("port") or 5432
    return f"{params.get('user', '')}@{host}:{port}/{params.get('dbname', '')}".lstrip("@")


class Unset:
    """The type of UNSET: an argument left to its environment variable."""


UNSET = Unset()


def prepare_threshold_from_env() -> int | None:
    """$PGQUEUE_PREPARE_THRESHOLD: a number of executions, or off (None); 5 when unset."""
    raw = os.environ.get("PGQUEUE_PREPARE_THRESHOLD", "").strip().lower()
    if raw == "":
        return 5
    if raw in ("off", "none", "no", "false"):
        return None
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise InvalidArgument(
            f"PGQUEUE_PREPARE_THRESHOLD={raw!r}: expected a number >= 0, or off"
            " (off behind PgBouncer older than 1.21 in transaction mode)"
        )
    return value
