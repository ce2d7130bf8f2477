"""Bulk work in short transactions: how many rows a transaction takes, and a progress bar."""

from __future__ import annotations

import sys
from typing import Any

import click

# Rows per transaction for bulk work: short transactions, steady progress.
# Read as `_bulk.CHUNK` when the work runs, so a test can make it small.
CHUNK = 1000


class Progress:
    """A progress bar on a terminal (stderr), silence elsewhere."""

    def __init__(self, total: int, label: str) -> None:
        """Show progress over total items when stderr is a terminal."""
        self._bar: Any = None
        if sys.stderr.isatty() and total > 0:
            self._bar = click.progressbar(length=total, label=label, file=sys.stderr)
            self._bar.__enter__()

    def update(self, n: int) -> None:
        """Advance by n items."""
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        """Finish the bar."""
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
            self._bar = None
