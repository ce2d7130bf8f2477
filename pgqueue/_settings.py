"""Where pgqueue finds its database: the DSN resolution order, in one place."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import psycopg.conninfo

from pgqueue._errors import (
    ConnectionLost,
    InvalidArgument,
    PgQueueError,
    sql_identifier,
    sql_literal,
)
from pgqueue._retry import is_server_not_ready

DSN_ENV_VARS = ("PGQUEUE_DSN", "DATABASE_URL")

EXPLICIT_SOURCE = "the dsn argument"
"""Where an explicit DSN came from, unless the caller names it (the CLI says --dsn)."""


@dataclass(frozen=True, slots=True)
class Dsn:
    """A DSN and where it came from (--dsn, PGQUEUE_DSN, ...), which every message names."""

    value: str
    source: str

    @property
    def label(self) -> str:
        """The DSN without its password, for messages and logs."""
        return describe_dsn(self.value)


def find_dsn(explicit: str | None = None, explicit_source: str | None = None) -> Dsn | None:
    """The DSN to use and its source: the explicit one, else $PGQUEUE_DSN, else $DATABASE_URL."""
    if explicit:
        return Dsn(explicit, explicit_source or EXPLICIT_SOURCE)
    for var in DSN_ENV_VARS:
        value = os.environ.get(var)
        if value:
            return Dsn(value, var)
    return None


def resolve_dsn(explicit: str | None = None) -> str | None:
    """The DSN to use: the explicit one, else $PGQUEUE_DSN, else $DATABASE_URL, else None."""
    found = find_dsn(explicit)
    return found.value if found else None


def require_dsn(explicit: str | None = None, explicit_source: str | None = None) -> Dsn:
    """The DSN to use, parsed and checked; else a PgQueueError that says how to give one.

    A DSN that does not parse raises InvalidArgument before anything connects.
    """
    dsn = find_dsn(explicit, explicit_source)
    if dsn is None:
        raise PgQueueError(
            "no database given: pass a DSN (--dsn), or set PGQUEUE_DSN (or DATABASE_URL),"
            " e.g. postgresql://user@localhost:5432/dbname"
        )
    problem = _dsn_problem(dsn.value)
    if problem is not None:
        raise InvalidArgument(
            f"malformed DSN (from {dsn.source}): {_without_secrets(problem, dsn.value)}; use a URI"
            " (postgresql://user:password@host:5432/dbname) or key=value pairs"
            " (host=... port=5432 dbname=...)"
        )
    return dsn


def _dsn_problem(dsn: str) -> str | None:
    # libpq parses the syntax; it checks a port or a timeout only when it
    # connects, and psycopg resolves hosts before that, so "port=abc" would be
    # reported as a host that cannot be resolved.
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    # postgresql://user:p@ss@host or user:p/ss@host: libpq splits the URI at
    # the first "@" or "/", so part of the password lands in the host or the
    # port. Such a value is never named here: it may be part of a secret.
    encode = "in a URI, write '@', ':' and '/' in a user name or password as %40, %3A and %2F"
    if any("@" in str(params.get(key) or "") for key in ("host", "port")):
        return f"a host name or port contains '@'; {encode}"
    for port in str(params.get("port") or "").split(","):
        if port and not (port.isdigit() and 1 <= int(port) <= 65535):
            if port.isdigit() or "://" not in dsn:
                return f"port {sql_literal(port)} is not a number from 1 to 65535"
            return f"the port after the host is not a number from 1 to 65535; {encode}"
    timeout = str(params.get("connect_timeout") or "")
    try:
        float(timeout or 0)
    except ValueError:
        return f"connect_timeout {sql_literal(timeout)} is not a number of seconds"
    return None


_URI_USERINFO = re.compile(r"://([^/?#]*)@")
_KV_PASSWORD = re.compile(r"""password\s*=\s*('(?:[^'\\]|\\.)*'?|\S+)""")
_ANY_USERINFO_PASSWORD = re.compile(r"""(?<=:)[^\s:/@"']+(?=@)""")


def _without_secrets(text: str, dsn: str) -> str:
    """The parser's reason with any password the DSN may hold blanked out.

    libpq quotes the part of the DSN it stumbled on, in double quotes, and
    that may hold the password: the URI's user info, a password=... value,
    or a user:pass@host written without the scheme.
    """
    secrets = [m.group(1).partition(":")[2] for m in _URI_USERINFO.finditer(dsn)]
    secrets += [m.group(1).strip("'") for m in _KV_PASSWORD.finditer(dsn)]
    secrets = sorted(filter(None, secrets), key=len, reverse=True)

    def scrub(quoted: re.Match[str]) -> str:
        fragment = quoted.group(0)
        for secret in secrets:
            fragment = fragment.replace(secret, "***")
        return _ANY_USERINFO_PASSWORD.sub("***", fragment)

    return re.sub(r'"[^"]*"', scrub, text)


# -- why a connection failed ---------------------------------------------------

# psycopg's and libpq's words for "nobody answered at this address".
_REFUSED = "connection refused"
_TIMED_OUT = "timeout expired"
_UNRESOLVED = re.compile(
    r"failed to resolve host '([^']*)'|could not translate host name \"([^\"]*)\""
)
# 'connection to server at "127.0.0.1", port 5432 failed: <reason>', or on socket "...".
_SERVER_SAYS = re.compile(
    r'connection to server (?:at "(?P<host>[^"]*)"(?: \([^)]*\))?, port (?P<port>\d+)'
    r'|on socket "(?P<socket>[^"]*)") failed: (?P<reason>.*)'
)
# What the server says when it answered and refused a login, and what to do about it.
_REFUSALS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"database '(.+)' does not exist"),
        "create it (CREATE DATABASE {ident}) or fix the database name in the DSN{src}",
    ),
    (
        re.compile(r"role '(.+)' does not exist"),
        "create the role (CREATE ROLE {ident} LOGIN) or fix the user name in the DSN{src}",
    ),
    (
        re.compile(r"password authentication failed for user '(.+)'"),
        "check the user name and password in the DSN{src}",
    ),
    (
        re.compile(r"no pg_hba\.conf entry"),
        "add a line for this host, user and database to the server's pg_hba.conf (then"
        " reload it), or connect as a user or to a database it lets in",
    ),
    (
        re.compile(r"no password supplied"),
        "the server asks for a password: give it in the DSN{src}, in PGPASSWORD or in ~/.pgpass",
    ),
    (
        re.compile(r"role '(.+)' is not permitted to log in"),
        "give it LOGIN (ALTER ROLE {ident} LOGIN), or use another user in the DSN{src}",
    ),
    (
        re.compile(r"permission denied for database '(.+)'"),
        "grant the user CONNECT (GRANT CONNECT ON DATABASE {ident} TO {user}), or use"
        " another user in the DSN{src}",
    ),
)


def _attempts(attempts: int, elapsed: float) -> str:
    took = "under 0.1s" if elapsed < 0.1 else f"{elapsed:.1f}s"
    return f"after {attempts} attempt{'' if attempts == 1 else 's'} in {took}"


def connect_failed(
    label: str, source: str | None, exc: Exception, *, attempts: int, elapsed: float
) -> ConnectionLost:
    """The error for a first connection that failed: no answer, or an answer that refused.

    A server that did not answer (refused port, timeout, unknown host) gets
    what happened, the attempts and the time they took, and the hint to check
    that it is running; one that answered and refused (no such database or
    role, a password, pg_hba.conf) gets what it refused and what to do.
    `source` names where the DSN came from (--dsn, PGQUEUE_DSN, ...).
    """
    src = f" (from {source})" if source else ""
    text = str(exc).strip()
    first = (text.splitlines() or [type(exc).__name__])[0]
    server = _SERVER_SAYS.search(first)
    said = server.group("reason").strip() if server else first
    # The first line is the last attempt's; with several hosts, the others follow.
    lowered = first.lower()
    resolved = _UNRESOLVED.search(first)
    if _REFUSED in lowered or _TIMED_OUT in lowered or resolved:
        took = _attempts(attempts, elapsed)
        if resolved:
            what = f"cannot resolve host name {resolved.group(1) or resolved.group(2)} ({took})"
        elif _REFUSED in lowered:
            what = f"connection refused ({took})"
        else:
            what = f"no answer (timed out {took})"
        primary = f"could not connect to {label}: {what}"
        return ConnectionLost(
            f"{primary}; check that the server is running and that the DSN{src} is right",
            what=primary,
        )
    answered = said.startswith(("FATAL:", "ERROR:")) or "no password supplied" in said
    if answered:
        reason = said.partition(":")[2].strip() if said.startswith(("FATAL:", "ERROR:")) else said
        # The server names a database or role in double quotes; our lines use single ones.
        reason = re.sub(r'"([^"]*)"', lambda m: sql_literal(m.group(1)), reason)
        where = label.split("@")[-1].split("/")[0]
        if server:
            where = (
                f"socket {server.group('socket')}"
                if server.group("socket")
                else f"{server.group('host')}:{server.group('port')}"
            )
        user = label.split("@")[0] if "@" in label else "<user>"
        advice = (
            "it does not take connections now; try again later"
            if is_server_not_ready(exc)
            else f"check the DSN{src}"
        )
        for pattern, template in _REFUSALS:
            match = pattern.search(reason)
            if match:
                name = match.group(1).replace("''", "'") if match.groups() else ""
                advice = template.format(
                    ident=sql_identifier(name), user=sql_identifier(user), src=src
                )
                break
        primary = f"the server at {where} answered but refused the connection: {reason}"
        return ConnectionLost(f"{primary}; {advice}", what=primary)
    # Neither: the client gave up on its own (an SSL requirement, a bad sslmode, ...).
    primary = f"could not connect to {label}: {said} ({_attempts(attempts, elapsed)})"
    return ConnectionLost(f"{primary}; check the DSN{src}", what=primary)


def dsn_hosts(dsn: str) -> list[str]:
    """Every host:port the DSN names, in libpq's order ([] for a DSN that does not parse).

    libpq pairs the comma-separated hosts and ports by position; a single
    port applies to every host, and an empty entry is the default.
    """
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return []
    hosts = str(params.get("host") or params.get("hostaddr") or "").split(",")
    ports = str(params.get("port") or "").split(",")
    if len(ports) == 1:
        ports = ports * len(hosts)
    return [
        f"{host or 'localhost'}:{port or 5432}"
        for host, port in zip(hosts, ports + [""] * (len(hosts) - len(ports)), strict=False)
    ]


def describe_dsn(dsn: str) -> str:
    """The DSN without its password, for messages and logs: user@h1:p1,h2:p2/db."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparseable DSN>"
    where = ",".join(dsn_hosts(dsn))
    return f"{params.get('user', '')}@{where}/{params.get('dbname', '')}".lstrip("@")


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
