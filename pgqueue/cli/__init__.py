"""The `pgqueue` command: queues, messages, poison, barriers, claims, workers and the demo."""

from pgqueue.cli import barriers, poison, queues, run  # noqa: F401  (they register commands)
from pgqueue.cli._main import main

__all__ = ["main"]
