"""pgqueue: a Postgres message queue with exactly-once fan-in barriers.

This module is the whole public API, with pgqueue.types for the values the
API hands out; every other module is private (its name starts with `_`).
"""

from pgqueue._async_client import AsyncClient
from pgqueue._calls.read import channel
from pgqueue._client import Client
from pgqueue._errors import (
    BarrierConflict,
    BarrierNotFound,
    ConnectionLost,
    Contention,
    InvalidArgument,
    InvalidMessage,
    MigrationError,
    NotMigrated,
    PermissionDenied,
    PgQueueError,
    QueueInUse,
    QueueNotFound,
    StorageError,
    TransactionAborted,
    WorkflowConflict,
    WorkflowNotFound,
)
from pgqueue._guard import guard
from pgqueue._outcomes import Poison, Retry
from pgqueue._retry import RetryPolicy, is_dead_connection
from pgqueue._single_flight import AsyncClaim, Claim
from pgqueue._worker import App, Worker, WorkerSettings
from pgqueue.types import (
    TRANSPORT_MARKER,
    BarrierStatus,
    Callback,
    ClaimRecord,
    KeyedSend,
    MemberFailure,
    MemberResult,
    Message,
    PeekedMessage,
    PoisonFilter,
    PoisonMessage,
    QueueInfo,
    QueueMetrics,
    QueueMinute,
    Step,
    StepStatus,
    Undecodable,
    WorkerInfo,
    WorkflowStatus,
)

__all__ = [
    "TRANSPORT_MARKER",
    "App",
    "AsyncClaim",
    "AsyncClient",
    "BarrierConflict",
    "BarrierNotFound",
    "BarrierStatus",
    "Callback",
    "Claim",
    "ClaimRecord",
    "Client",
    "ConnectionLost",
    "Contention",
    "InvalidArgument",
    "InvalidMessage",
    "KeyedSend",
    "MemberFailure",
    "MemberResult",
    "Message",
    "MigrationError",
    "NotMigrated",
    "PeekedMessage",
    "PermissionDenied",
    "PgQueueError",
    "Poison",
    "PoisonFilter",
    "PoisonMessage",
    "QueueInUse",
    "QueueInfo",
    "QueueMetrics",
    "QueueMinute",
    "QueueNotFound",
    "Retry",
    "RetryPolicy",
    "Step",
    "StepStatus",
    "StorageError",
    "TransactionAborted",
    "Undecodable",
    "Worker",
    "WorkerInfo",
    "WorkerSettings",
    "WorkflowConflict",
    "WorkflowNotFound",
    "WorkflowStatus",
    "channel",
    "guard",
    "is_dead_connection",
]
