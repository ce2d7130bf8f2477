"""Every error pgqueue raises, each declared once with the SQLSTATEs it stands for.

A class that stands for SQLSTATEs names them in `sqlstates`; declaring it
registers them, and `translate` looks the class up by the state a database
error carries. `SQLSTATES` below is the one list of the codes pgqueue's SQL
raises (tests/sql/test_errors.py checks it against sql/). `Poison` and
`Retry` are here too: a handler raises them to tell the worker what to do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

import psycopg

from pgqueue._roles import FUNCTION_ROLES, GROUP_ROLES

# The SQLSTATEs pgqueue's SQL raises, with what each means. The PGQ class is
# pgqueue's own; the others are Postgres' standard codes, used for what they say.
SQLSTATES: dict[str, str] = {
    "PGQ01": "the named queue does not exist",
    "PGQ02": "the named barrier does not exist",
    "PGQ03": "a barrier id was reused for another fan-out, or members came after its seal",
    "PGQ04": "a workflow id is running another request, a step name is taken, or it is sealed",
    "PGQ05": "the named workflow (or step) does not exist",
    "PGQ10": "(a NOTICE, not an error) a read poison-dropped this message",
    "PGQ11": "(a NOTICE, not an error) a read found its queue paused and returned nothing",
    "22004": "a required argument is NULL",
    "22023": "an argument is out of range or malformed (a negative vt, a bad queue name, ...)",
    "42P01": "(through the pgmq facade only) the named queue does not exist, in PGMQ's words",
    "55000": "a dedupe key (or a workflow's cancel) could not be settled: it kept changing hands",
    "55006": "a queue that open barriers call back into cannot be dropped",
}

_REGISTRY: dict[str, type[PgQueueError]] = {}


class PgQueueError(Exception):
    """Base class of every error pgqueue raises on purpose."""

    sqlstates: ClassVar[tuple[str, ...]] = ()
    """The SQLSTATEs this class stands for; declaring a subclass registers them."""

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        for state in cls.__dict__.get("sqlstates", ()):
            if state in _REGISTRY:
                raise TypeError(f"SQLSTATE {state} is {_REGISTRY[state].__name__}'s already")
            _REGISTRY[state] = cls

    def __init__(self, message: str, *, what: str | None = None) -> None:
        """An error whose text says what went wrong and what to do; `what` alone says the first."""
        super().__init__(message)
        self.what = what or message

    @classmethod
    def from_database(
        cls, exc: psycopg.Error, primary: str, hint: str, role: str | None
    ) -> PgQueueError | None:
        """This error for a database error of one of its states; None if it is not one after all."""
        return cls(primary + hint, what=primary)


class QueueNotFound(PgQueueError):
    """The named queue does not exist."""

    sqlstates = ("PGQ01",)


class BarrierNotFound(PgQueueError):
    """The named barrier does not exist."""

    sqlstates = ("PGQ02",)


class BarrierConflict(PgQueueError):
    """A barrier id was reused for a different fan-out, or members came after its seal."""

    sqlstates = ("PGQ03",)


class WorkflowConflict(PgQueueError):
    """A workflow id is running another request, a step name is taken, or steps came too late."""

    sqlstates = ("PGQ04",)


class WorkflowNotFound(PgQueueError):
    """The named workflow (or step) does not exist."""

    sqlstates = ("PGQ05",)


class QueueInUse(PgQueueError):
    """The queue cannot be dropped: open barriers will call back into it."""

    sqlstates = ("55006",)


class Contention(PgQueueError):
    """A dedupe key (or a workflow being cancelled) kept changing hands; call again."""

    sqlstates = ("55000",)


class StorageError(PgQueueError):
    """The server could not write its files: its disk is full, or failing. Nothing was written.

    Postgres raises these as an ERROR and rolls the transaction back, so the
    call changed nothing; it is not retried (the same statement would fail the
    same way until someone frees space). A full WAL disk is not one of these:
    the server stops (PANIC), and the calls then fail as ConnectionLost.
    """

    sqlstates = ("53100", "58030")

    @classmethod
    def from_database(
        cls, exc: psycopg.Error, primary: str, hint: str, role: str | None
    ) -> PgQueueError | None:
        """What failed (the server's own line names the file) and what to do; its hint is ours."""
        if exc.sqlstate == "53100":
            what = f"the database is out of disk space (SQLSTATE 53100: {primary})"
            advice = "free space on the server, then retry"
        else:
            what = (
                f"the database server could not read or write its files (SQLSTATE 58030: {primary})"
            )
            advice = "check the server's disk and its log, then retry"
        return cls(f"{what}; nothing was written: {advice}", what=what)


class TransactionAborted(PgQueueError):
    """The transaction on the connection you passed had already failed: nothing was sent.

    An earlier statement in it raised, and the server ignores every statement
    until the transaction ends (SQLSTATE 25P02). Roll it back and start again.
    """

    sqlstates = ("25P02",)

    @classmethod
    def from_database(
        cls, exc: psycopg.Error, primary: str, hint: str, role: str | None
    ) -> PgQueueError | None:
        """Say which transaction and what to do."""
        what = "the transaction on the connection you passed has already failed"
        return cls(
            f"{what} (an earlier statement in it raised, and the server ignores the rest until"
            " it ends); nothing was sent: roll it back, then send in a new transaction",
            what=what,
        )


class InvalidArgument(PgQueueError, ValueError):
    """An argument was rejected (negative timeout, bad queue name, ...)."""

    sqlstates: ClassVar[tuple[str, ...]] = ("22023", "22004", "22P02", "22003", "54000", "23514")

    @classmethod
    def from_database(
        cls, exc: psycopg.Error, primary: str, hint: str, role: str | None
    ) -> PgQueueError | None:
        """InvalidMessage for a value past what jsonb holds; else the rejected argument."""
        if exc.sqlstate == "54000" and "jsonb" in primary:
            return InvalidMessage(
                f"{primary}: a message and its headers are stored as jsonb, which holds at most"
                " 255 MB in one string and 255 MB in all; store large data elsewhere and send a"
                " reference to it. Nothing was enqueued"
            )
        return cls(primary + hint, what=primary)


@dataclass(frozen=True, slots=True)
class SettingProblem:
    """One rejected setting: how it was given (a field, or its PGQUEUE_* variable), as what."""

    given_as: str
    value: object
    need: str
    """What the value must be: "must be >= 1", ..."""

    @property
    def shown(self) -> str:
        """The value as a message shows it: text quoted ('soon'), a number as is (-1, 2.5)."""
        if isinstance(self.value, str):
            return sql_literal(self.value)
        return f"{self.value:g}" if isinstance(self.value, float) else str(self.value)


class InvalidSettings(InvalidArgument):
    """Worker settings were rejected; `problems` names each wrong one, by field."""

    def __init__(self, problems: dict[str, SettingProblem]) -> None:
        """The error for these problems, every one in its one line."""
        super().__init__(
            "invalid worker settings: "
            + "; ".join(f"{p.given_as} {p.need} (got {p.shown})" for p in problems.values())
        )
        self.problems = problems


class InvalidMessage(InvalidArgument):
    """A message or its headers cannot be stored as JSON."""


class ConnectionLost(PgQueueError):
    """The database could not be reached, or its server refused us; the message says which."""


class NotMigrated(PgQueueError):
    """The database has no (or an outdated) pgqueue schema."""

    sqlstates = ("3F000", "42883", "42P01", "42704")

    @classmethod
    def from_database(
        cls, exc: psycopg.Error, primary: str, hint: str, role: str | None
    ) -> PgQueueError | None:
        """Only when the missing object is pgqueue's (an application's own is not ours)."""
        if "pgqueue" not in str(exc):
            return None
        wrong = _wrong_argument_types(primary)
        if wrong is not None:
            return wrong
        return cls(
            f"{primary}: the database is missing pgqueue's schema or a newer part of it;"
            " run `pgqueue migrate` (or Client.migrate()) against it"
        )


# "function pgqueue.fan_out(unknown, ..., numeric) does not exist": the same
# error a schema without that function raises. Every argument pgqueue's
# Python API passes is checked first (int32, seconds), so a fractional number
# reaching an API function means a caller of the SQL through the client's
# connection (or a gap in those checks): say so, not "migrate".
_NO_FUNCTION = re.compile(r"function pgqueue\.(\w+)\((.*)\) does not exist")
_FRACTIONAL_TYPES = ("numeric", "double precision", "real")


def _wrong_argument_types(primary: str) -> InvalidArgument | None:
    """For an API function called with a fractional number where it takes a whole one."""
    match = _NO_FUNCTION.fullmatch(primary)
    if match is None or match.group(1) not in FUNCTION_ROLES:
        return None
    types = [t.strip() for t in match.group(2).split(",")]
    if not any(t in _FRACTIONAL_TYPES for t in types):
        return None
    return InvalidArgument(
        f"{primary}: pgqueue.{match.group(1)} takes whole numbers (durations in whole seconds)"
        " where it was given a fractional one; pass an int, or a timedelta of whole seconds"
    )


class MigrationError(PgQueueError):
    """A migration could not be applied, or an applied one was edited."""


class PermissionDenied(PgQueueError):
    """The connection's role may not do this; the message names the pgqueue role to grant."""

    sqlstates = ("42501",)

    @classmethod
    def from_database(
        cls, exc: psycopg.Error, primary: str, hint: str, role: str | None
    ) -> PgQueueError | None:
        """The role that lacks the right, and the GRANT that gives it."""
        return permission_denied(primary, role)


_DENIED = re.compile(r"permission denied for (\w+) (\S+)")
_PLAIN_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_$]*")


def sql_literal(text: str) -> str:
    """A name or value in a message, in single quotes as SQL writes a literal ('it''s')."""
    return "'" + text.replace("'", "''") + "'"


def sql_identifier(name: str) -> str:
    """A role or database name as SQL would need it written: quoted unless plain lowercase."""
    return name if _PLAIN_IDENTIFIER.fullmatch(name) else '"' + name.replace('"', '""') + '"'


def permission_denied(primary: str, role: str | None = None) -> PermissionDenied:
    """The error for SQLSTATE 42501: which role lacks which right, and the GRANT that gives it.

    `role` is the login role of the connection, when the caller knows it.
    """
    who = f"role {role}" if role else "this connection's role"
    grantee = sql_identifier(role) if role else "<login role>"
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
    """The pgqueue error a database error means, or None if it is not one of ours.

    `role`, the connection's login role if known, is named in a permission error.
    """
    state = exc.sqlstate
    primary = exc.diag.message_primary or str(exc).strip()
    if state is None:
        if isinstance(exc, psycopg.DataError):
            # Raised by psycopg itself while sending an argument (a NUL byte in
            # a text value, say): nothing reached the server.
            return InvalidArgument(f"{primary}; nothing was sent")
        return None
    cls = _REGISTRY.get(state)
    if cls is None:
        return None
    hint = f" ({exc.diag.message_hint})" if exc.diag.message_hint else ""
    return cls.from_database(exc, primary, hint, role)
