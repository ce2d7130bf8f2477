"""pgqueue: a Postgres message queue with exactly-once fan-in barriers."""

from pgqueue.aio import AsyncClient
from pgqueue.client import Client
from pgqueue.errors import (
    ConnectionLost,
    InvalidArgument,
    InvalidMessage,
    MigrationError,
    NotMigrated,
    PgQueueError,
    QueueNotFound,
)
from pgqueue.poison import PoisonMessage
from pgqueue.queue import Message, QueueInfo, QueueMetrics, channel
from pgqueue.retry import RetryPolicy, is_dead_connection

__all__ = [
    "AsyncClient",
    "Client",
    "ConnectionLost",
    "InvalidArgument",
    "InvalidMessage",
    "Message",
    "MigrationError",
    "NotMigrated",
    "PgQueueError",
    "PoisonMessage",
    "QueueInfo",
    "QueueMetrics",
    "QueueNotFound",
    "RetryPolicy",
    "channel",
    "is_dead_connection",
]
