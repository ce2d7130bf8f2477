"""The exceptions pgqueue raises: one base class, a few precise ones."""

from __future__ import annotations

import re

import psycopg

from pgqueue.roles import FUNCTION_ROLES, GROUP_ROLES

# SQLSTATEs raised by the SQL functions in sql/ (see the header of 0001_core.sql).
SQLSTATE_QUEUE_NOT_FOUND = "PGQ01"
SQLSTATE_BARRIER_NOT_FOUND = "PGQ02"
SQLSTATE_BARRIER_CONFLICT = "PGQ03"
SQLSTATE_INSUFFICIENT_PRIVILEGE = "42501"
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


class PermissionDenied(PgQueueError):
    """The connection's role may not do this; the message names the pgqueue role to grant."""


_DENIED = re.compile(r"permission denied for (\w+) (\S+)")
_PLAIN_ROLE = re.compile(r"[a-z_][a-z0-9_$]*")


def _sql_role(role: str) -> str:
    return role if _PLAIN_ROLE.fullmatch(role) else '"' + role.replace('"', '""') + '"'


def permission_denied(primary: str, role: str | None = None) -> PermissionDenied:
    """The error for SQLSTATE 42501: which role lacks which right, and the GRANT that gives it.

    `role` is the login role of the connection, when the caller knows it.
    """
    who = f"role {role}" if role else "this connection's role"
    grantee = _sql_role(role) if role else "<login role>"
    match = _DENIED.fullmatch(primary)
    kind, name = match.groups() if match else ("", "")
    if kind == "function" and name in FUNCTION_ROLES:
        roles = FUNCTION_ROLES[name]
        choice = roles[0] if len(roles) == 1 else "one of " + ", ".join(roles)
        advice = (
            f"{who} may not call pgqueue.{name}; grant it {choice}: GRANT {roles[0]} TO {grantee};"
        )
    elif kind == "function":
        advice = (
            f"pgqueue.{name} is internal to pgqueue and no role may call it; call the API functions"
        )
    elif kind == "schema" and name == "pgqueue":
        advice = (
            f"{who} is in none of pgqueue's roles; grant it the one it needs"
            f" ({', '.join(GROUP_ROLES)}), e.g. GRANT {GROUP_ROLES[1]} TO {grantee};"
        )
    elif kind in ("table", "sequence", "view"):
        advice = f"{who} may not use pgqueue's {kind}s directly; call pgqueue's functions"
    else:
        advice = f"{who} lacks this right"
    return PermissionDenied(f"{primary}: {advice} (see docs/security.md)", what=primary)


def translate(exc: psycopg.Error, role: str | None = None) -> PgQueueError | None:
    """Map a database error to the pgqueue error it means, or None if it is not one of ours.

    `role`, the connection's login role if known, is named in a permission error.
    """
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
    if state == SQLSTATE_INSUFFICIENT_PRIVILEGE:
        return permission_denied(primary, role)
    if state in _NOT_MIGRATED_STATES and "pgqueue" in str(exc):
        return NotMigrated(
            f"{primary}: the database is missing pgqueue's schema or a newer part of it;"
            " run `pgqueue migrate` (or Client.migrate()) against it"
        )
    if state == "54000" and "jsonb" in primary:
        return InvalidMessage(
            f"{primary}: a message and its headers are stored as jsonb, which holds at most"
            " 255 MB in one string and 255 MB in all; store large data elsewhere and send a"
            " reference to it. Nothing was enqueued"
        )
    if state in _INVALID_ARGUMENT_STATES:
        return InvalidArgument(primary + hint)
    if state is None and isinstance(exc, psycopg.DataError):
        # Raised by psycopg itself while sending an argument (a NUL byte in a
        # text value, say): nothing reached the server.
        return InvalidArgument(f"{primary}; nothing was sent")
    return None
