"""The PGQUEUE setting: which Django database holds pgqueue's schema, and how to reach it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg
from django.conf import settings  # type: ignore[import-untyped]
from django.core.exceptions import ImproperlyConfigured  # type: ignore[import-untyped]
from django.db import connections  # type: ignore[import-untyped]
from psycopg.conninfo import make_conninfo

_KEYS = ("DATABASE", "DSN", "MIGRATE", "CLIENT_OPTIONS")

# What Django's get_connection_params() hands psycopg.connect() beside libpq's
# own parameters: Python objects a DSN cannot carry (Django's adapters and
# cursor class), and what pgqueue's pool sets for itself.
_NOT_CONNINFO = ("context", "cursor_factory", "prepare_threshold", "client_encoding")


@dataclass(frozen=True, slots=True)
class PgQueueSettings:
    """settings.PGQUEUE, checked, with its defaults."""

    database: str = "default"
    dsn: str | None = None
    migrate: bool = True
    client_options: Mapping[str, Any] = field(default_factory=dict)


def get_settings() -> PgQueueSettings:
    """settings.PGQUEUE (a dict, optional); ImproperlyConfigured names a wrong key or value."""
    raw = getattr(settings, "PGQUEUE", None) or {}
    if not isinstance(raw, Mapping):
        raise ImproperlyConfigured("settings.PGQUEUE must be a dict")
    unknown = sorted(set(raw) - set(_KEYS))
    if unknown:
        raise ImproperlyConfigured(
            f"settings.PGQUEUE has unknown key(s) {', '.join(unknown)}; known: {', '.join(_KEYS)}"
        )
    conf = PgQueueSettings(
        database=raw.get("DATABASE", "default"),
        dsn=raw.get("DSN"),
        migrate=raw.get("MIGRATE", True),
        client_options=raw.get("CLIENT_OPTIONS", {}),
    )
    if conf.database not in settings.DATABASES:
        raise ImproperlyConfigured(
            f"settings.PGQUEUE['DATABASE'] is {conf.database!r}, not an alias of"
            f" settings.DATABASES ({', '.join(settings.DATABASES)})"
        )
    if conf.dsn is not None and not isinstance(conf.dsn, str):
        raise ImproperlyConfigured("settings.PGQUEUE['DSN'] must be a string (a Postgres DSN)")
    if not isinstance(conf.migrate, bool):
        raise ImproperlyConfigured("settings.PGQUEUE['MIGRATE'] must be True or False")
    if not isinstance(conf.client_options, Mapping):
        raise ImproperlyConfigured(
            "settings.PGQUEUE['CLIENT_OPTIONS'] must be a dict of pgqueue.Client.from_dsn arguments"
        )
    return conf


def dsn(conf: PgQueueSettings) -> str:
    """PGQUEUE['DSN'], else the DSN of the Django database PGQUEUE['DATABASE'] names."""
    if conf.dsn:
        return conf.dsn
    connection = connections[conf.database]
    require_postgresql(connection)
    params = connection.get_connection_params()
    return make_conninfo(
        "", **{k: v for k, v in params.items() if k not in _NOT_CONNINFO and v is not None}
    )


def require_postgresql(connection: Any) -> None:
    """Refuse a Django database that is not PostgreSQL: pgqueue's schema is Postgres SQL."""
    if connection.vendor != "postgresql":
        raise ImproperlyConfigured(
            f"pgqueue needs PostgreSQL, but Django database {connection.alias!r} uses the"
            f" {connection.vendor} backend; point settings.PGQUEUE['DATABASE'] at a"
            " django.db.backends.postgresql database"
        )


def psycopg_connection(connection: Any) -> psycopg.Connection[Any]:
    """The psycopg 3 connection under a Django connection (connected if it was not)."""
    require_postgresql(connection)
    connection.ensure_connection()
    raw = connection.connection
    if not isinstance(raw, psycopg.Connection):
        raise ImproperlyConfigured(
            f"pgqueue needs psycopg 3, but Django database {connection.alias!r} runs on"
            f" {type(raw).__module__}; use Django 4.2 or later, which picks psycopg 3"
            " when it is installed (pgqueue installs it)"
        )
    return raw
