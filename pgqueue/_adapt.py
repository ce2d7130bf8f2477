"""`conn=`: the caller's own transaction, whatever holds it (psycopg, Django, SQLAlchemy).

A call given a connection runs on it as is: inside the caller's transaction
(or in autocommit, if that is what the caller's connection is in), on no
second connection, with no commit and no retry. Frameworks hold psycopg 3
connections under their own objects; these functions find them.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import psycopg

from pgqueue._errors import InvalidArgument

# What `conn=` takes on Client: a psycopg Connection, a Django connection
# (`django.db.connection`, `connections[alias]`), or an SQLAlchemy Connection
# or Session (its current transaction). On AsyncClient: a psycopg
# AsyncConnection, or an SQLAlchemy AsyncConnection or AsyncSession.
ConnArg: TypeAlias = "psycopg.Connection[Any] | Any"
AsyncConnArg: TypeAlias = "psycopg.AsyncConnection[Any] | Any"

_KINDS = "a psycopg Connection, a Django connection, or an SQLAlchemy Connection or Session"
_ASYNC_KINDS = "a psycopg AsyncConnection, or an SQLAlchemy AsyncConnection or AsyncSession"


def _framework(conn: object) -> str:
    return type(conn).__module__.split(".", 1)[0]


def psycopg_of(conn: Any) -> psycopg.Connection[Any]:
    """The psycopg connection under `conn` (used as is: its transaction stays the caller's)."""
    if isinstance(conn, psycopg.Connection):
        return conn
    if isinstance(conn, psycopg.AsyncConnection):
        raise InvalidArgument("conn is an async connection: pass it to AsyncClient, not Client")
    framework = _framework(conn)
    raw: object
    if framework == "django":
        raw = _django(conn)
    elif framework == "sqlalchemy":
        if type(conn).__name__ in ("AsyncSession", "AsyncConnection", "async_scoped_session"):
            raise InvalidArgument(
                f"conn is an SQLAlchemy {type(conn).__name__}: pass it to AsyncClient, not Client"
            )
        is_session = callable(getattr(conn, "connection", None))
        connection = _session_connection(conn) if is_session else conn
        if not connection.in_transaction():
            # What SQLAlchemy's autobegin does on a statement of its own:
            # without it, its commit() would not know of ours, and the
            # connection's reset on return would roll the send back.
            connection.begin()
        raw = connection.connection.driver_connection
    else:
        raise InvalidArgument(f"conn must be {_KINDS}, got {type(conn).__name__}")
    if not isinstance(raw, psycopg.Connection):
        raise _not_psycopg(framework, raw)
    return raw


async def async_psycopg_of(conn: Any) -> psycopg.AsyncConnection[Any]:
    """The psycopg async connection under `conn` (used as is: the caller's transaction)."""
    if isinstance(conn, psycopg.AsyncConnection):
        return conn
    if isinstance(conn, psycopg.Connection):
        raise InvalidArgument("conn is a blocking connection: pass it to Client, not AsyncClient")
    framework = _framework(conn)
    name = type(conn).__name__
    if framework != "sqlalchemy":
        raise InvalidArgument(f"conn must be {_ASYNC_KINDS}, got {name}")
    if name not in ("AsyncSession", "AsyncConnection", "async_scoped_session"):
        raise InvalidArgument(f"conn is an SQLAlchemy {name}: pass it to Client, not AsyncClient")
    if name == "AsyncConnection":
        connection = conn
    else:
        _refuse_binds(getattr(conn, "sync_session", conn))
        try:
            connection = await conn.connection()
        except Exception as exc:
            if _framework(exc) == "sqlalchemy":
                raise _no_connection(conn, exc) from exc
            raise
    if not connection.in_transaction():
        await connection.begin()  # as psycopg_of does, for the same reason
    fairy = await connection.get_raw_connection()
    raw = fairy.driver_connection
    if not isinstance(raw, psycopg.AsyncConnection):
        raise _not_psycopg(framework, raw)
    return raw


def _session_connection(session: Any) -> Any:
    """The Connection of a Session's current transaction (begun if need be)."""
    _refuse_binds(session)
    try:
        return session.connection()
    except Exception as exc:
        if _framework(exc) == "sqlalchemy":
            raise _no_connection(session, exc) from exc
        raise


def _refuse_binds(session: Any) -> None:
    # A Session that binds models to engines of their own: its default
    # connection may not be the one that holds the caller's write.
    # (`binds` from SQLAlchemy 2.1, `__binds` before)
    if getattr(session, "binds", None) or getattr(session, "_Session__binds", None):
        raise InvalidArgument(
            "conn is an SQLAlchemy Session with per-model binds: pgqueue cannot tell which"
            " engine's transaction holds your write; pass that connection instead:"
            " session.connection(bind_arguments={'mapper': YourModel})"
        )


def _no_connection(session: Any, exc: Exception) -> InvalidArgument:
    return InvalidArgument(
        f"conn is an SQLAlchemy {type(session).__name__} that gives no connection"
        f" ({str(exc).splitlines()[0]}): begin its transaction (session.begin()) or bind it"
        " to an engine, or pass a Connection"
    )


def _django(conn: Any) -> object:
    if getattr(conn, "vendor", None) != "postgresql":
        raise InvalidArgument(
            f"conn is a Django connection to {getattr(conn, 'vendor', 'an unknown database')}:"
            " pgqueue needs the postgresql backend"
        )
    conn.ensure_connection()
    return conn.connection


def _not_psycopg(framework: str, raw: object) -> InvalidArgument:
    kind = type(raw).__module__.split(".", 1)[0]
    return InvalidArgument(
        f"conn is a {framework} connection over {kind}, not psycopg 3: pgqueue runs on"
        f" psycopg 3 (pip install 'psycopg[binary]'; Django picks it from 4.2 on;"
        f" SQLAlchemy with a postgresql+psycopg:// URL)"
    )
