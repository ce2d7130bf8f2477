"""pgqueue: a Postgres message queue with exactly-once fan-in barriers."""

from pgqueue.aio import AsyncClient
from pgqueue.barrier import TRANSPORT_MARKER, BarrierStatus, MemberResult
from pgqueue.claims import Claim, ClaimRecord
from pgqueue.client import Client
from pgqueue.consumer import App, Poison, Retry, Worker, WorkerSettings
from pgqueue.errors import (
    BarrierConflict,
    BarrierNotFound,
    ConnectionLost,
    InvalidArgument,
    InvalidMessage,
    MigrationError,
    NotMigrated,
    PermissionDenied,
    PgQueueError,
    QueueInUse,
    QueueNotFound,
)
from pgqueue.idempotency import guard
from pgqueue.poison import PoisonMessage
from pgqueue.queue import Message, QueueInfo, QueueMetrics, channel
from pgqueue.retry import RetryPolicy, is_dead_connection

__all__ = [
    "TRANSPORT_MARKER",
    "App",
    "AsyncClient",
    "BarrierConflict",
    "BarrierNotFound",
    "BarrierStatus",
    "Claim",
    "ClaimRecord",
    "Client",
    "ConnectionLost",
    "InvalidArgument",
    "InvalidMessage",
    "MemberResult",
    "Message",
    "MigrationError",
    "NotMigrated",
    "PermissionDenied",
    "PgQueueError",
    "Poison",
    "PoisonMessage",
    "QueueInUse",
    "QueueInfo",
    "QueueMetrics",
    "QueueNotFound",
    "Retry",
    "RetryPolicy",
    "Worker",
    "WorkerSettings",
    "channel",
    "guard",
    "is_dead_connection",
]
