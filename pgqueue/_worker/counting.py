"""Where a worker's message outcomes are counted: its metrics and the registry's tally alike."""

from __future__ import annotations

from typing import Protocol


class Counter(Protocol):
    """Something that counts messages by queue and outcome."""

    def count(self, queue: str, outcome: str, n: int = 1) -> None:
        """n messages of queue had that outcome."""


class Counts:
    """One call that tells every counter given (those that are None left out)."""

    def __init__(self, *counters: Counter | None) -> None:
        """Count into each of counters that is set."""
        self.counters = tuple(c for c in counters if c is not None)

    def __call__(self, queue: str, outcome: str, n: int = 1) -> None:
        """n messages of queue had that outcome: every counter hears of it."""
        for counter in self.counters:
            counter.count(queue, outcome, n)
