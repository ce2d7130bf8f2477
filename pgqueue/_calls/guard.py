"""The duplicate guard as a call: a key in the idempotency ledger, in the caller's transaction."""

from __future__ import annotations

from pgqueue._calls import Call, scalar


def guard_call(key: str) -> Call[bool]:
    """Record `key` as done; True the first time, False for every later transaction."""
    return Call("guard", "SELECT pgqueue.guard(%s)", (key,), scalar)
