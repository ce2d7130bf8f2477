"""The exceptions pgqueue raises: one base class, a few precise ones."""

from __future__ import annotations

import psycopg

# SQLSTATEs raised by the SQL functions in sql/ (see the header of 0001_core.sql).
SQLSTATE_QUEUE_NOT_FOUND = "PGQ01"
SQLSTATE_BARRIER_NOT_FOUND = "PGQ02"
SQLSTATE_BARRIER_CONFLICT = "PGQ03"
_INVALID_ARGUMENT_STATES = frozenset({"22023", "22004", "22P02", "22003", "54000", "23514"})
_NOT_MIGRATED_STATES = frozenset({"3F000", "42883", "42P01", "42704"})


class PgQueueError(Exception):
    """Base class of every error pgqueue raises on purpose."""

    def __init__(self, message: str, *, what: str | None = None) -> None:
        """An error whose text says what went wrong and what to do; `what` alone says the first."""
        super().__init__(message)
        self.what = what or message


class QueueNotFound(PgQueueError):
    """The named queue does not exist."""


class InvalidArgument(PgQueueError, ValueError):
    """An argument was rejected (negative timeout, bad queue name, ...)."""


class InvalidMessage(InvalidArgument):
    """A message or its headers cannot be stored as JSON."""


class ConnectionLost(PgQueueError):
    """The database could not be reached, even after retrying on fresh connections."""


class BarrierNotFound(PgQueueError):
    """The named barrier does not exist."""


class BarrierConflict(PgQueueError):
    """A barrier id was reused for a different fan-out."""


class QueueInUse(PgQueueError):
    """The queue cannot be dropped: open barriers will call back into it."""


class NotMigrated(PgQueueError):
    """The database has no (or an outdated) pgqueue schema."""


class MigrationError(PgQueueError):
    """A migration could not be applied, or an applied one was edited."""


def translate(exc: psycopg.Error) -> PgQueueError | None:
    """Map a database error to the pgqueue error it means, or None if it is not one of ours."""
    state = exc.sqlstate
    diag = exc.diag
    primary = diag.message_primary or str(exc).strip()
    hint = f" ({diag.message_hint})" if diag.message_hint else ""
    if state == SQLSTATE_QUEUE_NOT_FOUND:
        return QueueNotFound(primary + hint, what=primary)
    if state == SQLSTATE_BARRIER_NOT_FOUND:
        return BarrierNotFound(primary + hint, what=primary)
    if state == SQLSTATE_BARRIER_CONFLICT:
        return BarrierConflict(primary + hint)
    if state == "55006":
        return QueueInUse(primary + hint)
    if state in _NOT_MIGRATED_STATES and "pgqueue" in str(exc):
        return NotMigrated(
            f"{primary}: the database is missing pgqueue's schema or a newer part of it;"
            " run `pgqueue migrate` (or Client.migrate()) against it"
        )
    if state in _INVALID_ARGUMENT_STATES:
        return InvalidArgument(primary + hint)
    if state is None and isinstance(exc, psycopg.DataError):
        # Raised by psycopg itself while sending an argument (a NUL byte in a
        # text value, say): nothing reached the server.
        return InvalidArgument(f"{primary}; nothing was sent")
    return None
