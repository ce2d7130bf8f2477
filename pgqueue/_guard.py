"""The duplicate guard: an idempotency ledger written in the handler's own transaction."""

from __future__ import annotations

from typing import Any

import psycopg

from pgqueue._calls.guard import guard_call
from pgqueue._execute import execute


def guard(conn: psycopg.Connection[Any], key: str) -> bool:
    """True if this transaction is the first to do the work named `key` (then do it here).

    Call it on the connection whose transaction holds the side effects: the key
    commits or rolls back with them, so a redelivered message, or a callback
    run twice, finds the key and skips the work.
    """
    return execute(conn, guard_call(key))
