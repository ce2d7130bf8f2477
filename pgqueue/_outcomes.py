"""What a handler raises to decide its message's outcome: Poison it, or Retry it."""

from __future__ import annotations

from pgqueue._calls import seconds_or_none
from pgqueue.types import Duration


class Poison(Exception):
    """Raised by a handler: never retry this message; poison it with this reason."""


class Retry(Exception):
    """Raised by a handler: try this message again after `delay` seconds (default: backoff)."""

    def __init__(self, reason: str = "", *, delay: Duration | None = None) -> None:
        """Ask for a retry, optionally after a fixed delay in whole seconds (or a timedelta)."""
        super().__init__(reason)
        self.delay = seconds_or_none("delay", delay)  # the one rule for durations
