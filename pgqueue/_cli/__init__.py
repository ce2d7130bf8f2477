"""The `pgqueue` command: queues, messages, poison, barriers, claims, workflows, workers."""

from pgqueue._cli import (  # noqa: F401  (they register)
    barriers,
    exporter,
    messages,
    pgmq,
    poison,
    queues,
    run,
    web,
    workers,
    workflows,
)
from pgqueue._cli._main import main

__all__ = ["main"]
