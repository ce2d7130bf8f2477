"""The `pgqueue` command: queues, messages, poison, barriers, claims, workers and the demo."""

from pgqueue._cli import barriers, poison, queues, run  # noqa: F401  (they register commands)
from pgqueue._cli._main import main

__all__ = ["main"]
