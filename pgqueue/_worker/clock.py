"""Where a worker's duties read the time: a seam, so leases and timeouts test without sleeping."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Seconds on a monotonic scale; what every duty of a worker reads the time from."""

    def now(self) -> float:
        """The current time, in seconds, never going back."""
        ...


class SystemClock:
    """The machine's monotonic clock."""

    def now(self) -> float:
        """time.monotonic()."""
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told to: for tests of heartbeats, hard timeouts and grace."""

    def __init__(self, start: float = 1000.0) -> None:
        """A clock standing at `start`."""
        self._now = start

    def now(self) -> float:
        """Where the clock stands."""
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock forward."""
        self._now += seconds
