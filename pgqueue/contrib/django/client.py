"""One pgqueue Client per process, and sends on Django's connection (its transaction)."""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Sequence
from typing import Any

from django.db import connections  # type: ignore[import-untyped]

from pgqueue._client import Client
from pgqueue.contrib.django.conf import dsn, get_settings
from pgqueue.types import JSON, Duration

_lock = threading.Lock()
_client: Client | None = None
_pid = 0


def client() -> Client:
    """The process's Client on PGQUEUE's DSN: opened on first use, closed at exit.

    A forked child (a preloading server's worker) gets a Client of its own: a
    pool's connections and threads do not survive a fork.
    """
    global _client, _pid
    with _lock:
        if _client is None or _pid != os.getpid():
            conf = get_settings()
            _client = Client.from_dsn(dsn(conf), **conf.client_options)
            _pid = os.getpid()
        return _client


@atexit.register
def close() -> None:
    """Close the process's Client, if open; the next client() opens a new one.

    Its pool holds connections to the database: call this before the
    database is dropped (Django's test runner drops its test database).
    """
    global _client
    with _lock:
        if _client is not None and _pid == os.getpid():
            _client.close()
        _client = None


def send(
    queue: str,
    message: JSON,
    *,
    using: str | None = None,
    headers: dict[str, Any] | None = None,
    delay: Duration = 0,
    dedupe_key: str | None = None,
) -> int:
    """client().send() in Django's current transaction on `using`; its msg_id.

    `using` defaults to PGQUEUE["DATABASE"]. Inside `atomic()` the message
    commits or rolls back with the block (a rolled-back savepoint takes it
    back too); outside, it autocommits, as Django's own queries do.
    """
    return client().send(
        queue,
        message,
        headers=headers,
        delay=delay,
        dedupe_key=dedupe_key,
        conn=connections[using or get_settings().database],
    )


def send_batch(
    queue: str,
    messages: Sequence[JSON],
    *,
    using: str | None = None,
    headers: Sequence[dict[str, Any] | None] | None = None,
    delay: Duration = 0,
) -> list[int]:
    """client().send_batch() in Django's current transaction on `using`; the msg_ids in order."""
    return client().send_batch(
        queue,
        messages,
        headers=headers,
        delay=delay,
        conn=connections[using or get_settings().database],
    )
