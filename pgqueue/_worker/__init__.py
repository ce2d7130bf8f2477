"""The long-running consumer, one module per duty; its public names are re-exported by pgqueue.

app (App, handlers by queue), settings (WorkerSettings), clock (the time seam),
inflight (the table of messages held), db (the narrow interface over Client),
reader (reads with back-pressure), dispatch (handler threads), acker (batched
acks), leases (heartbeats, hard timeouts, give-backs, nacks, poisons), listener
(LISTEN/NOTIFY), pauses (the paused queues), registry (the worker's row in
pgqueue.worker, and its tallies), runner (Worker: run, signals, shutdown).
"""

from pgqueue._worker.app import App, load_app
from pgqueue._worker.runner import Worker
from pgqueue._worker.settings import WorkerSettings

__all__ = ["App", "Worker", "WorkerSettings", "load_app"]
