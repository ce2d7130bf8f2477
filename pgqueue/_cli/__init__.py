"""The `pgqueue` command: queues, messages, poison, barriers, claims, workers and the demo."""

from pgqueue._cli import barriers, exporter, poison, queues, run  # noqa: F401  (they register)
from pgqueue._cli._main import main

__all__ = ["main"]
