"""pgqueue: a Postgres message queue with exactly-once fan-in barriers."""

from pgqueue.aio import AsyncClient
from pgqueue.barrier import TRANSPORT_MARKER, BarrierStatus, MemberResult
from pgqueue.claims import Claim, ClaimRecord
from pgqueue.client import Client
from pgqueue.errors import (
    BarrierConflict,
    BarrierNotFound,
    ConnectionLost,
    InvalidArgument,
    InvalidMessage,
    MigrationError,
    NotMigrated,
    PgQueueError,
    QueueInUse,
    QueueNotFound,
)
from pgqueue.poison import PoisonMessage
from pgqueue.queue import Message, QueueInfo, QueueMetrics, channel
from pgqueue.retry import RetryPolicy, is_dead_connection

__all__ = [
    "TRANSPORT_MARKER",
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
    "PgQueueError",
    "PoisonMessage",
    "QueueInUse",
    "QueueInfo",
    "QueueMetrics",
    "QueueNotFound",
    "RetryPolicy",
    "channel",
    "is_dead_connection",
]
