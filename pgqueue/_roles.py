"""The least-privilege roles of sql/0007_roles.sql, as error messages need to name them.

The database is the source of truth (pgqueue.role_grant, applied by
pgqueue.grant_roles()); tests/sql/test_roles.py checks that this table says the
same, function by function.
"""

from __future__ import annotations

PRODUCER = "pgqueue_producer"
CONSUMER = "pgqueue_consumer"
OPERATOR = "pgqueue_operator"
GROUP_ROLES = (PRODUCER, CONSUMER, OPERATOR)

_EVERYONE = (PRODUCER, CONSUMER, OPERATOR)
_WORKERS = (CONSUMER,)
_BOTH = (CONSUMER, OPERATOR)
_OPERATORS = (OPERATOR,)

# Every API function by name (overloads share their roles), and who may call it.
FUNCTION_ROLES: dict[str, tuple[str, ...]] = {
    "send": _EVERYONE,
    "send_keyed": _EVERYONE,
    "send_batch": _EVERYONE,
    "fan_out": (PRODUCER, CONSUMER),
    "open_barrier": (PRODUCER, CONSUMER),
    "add_members": (PRODUCER, CONSUMER),
    "seal": (PRODUCER, CONSUMER),
    "start_workflow": (PRODUCER, CONSUMER),
    "add_steps": (PRODUCER, CONSUMER),
    "seal_workflow": (PRODUCER, CONSUMER),
    "workflow_status": _EVERYONE,
    "step_results": _WORKERS,
    **dict.fromkeys(["workflow_steps", "list_workflows", "cancel_workflow"], (CONSUMER, OPERATOR)),
    **dict.fromkeys(
        [
            "read",
            "read_with_poll",
            "pop",
            "delete",
            "archive",
            "set_vt",
            "nack",
            "hold_leases",
            "extend_leases",
            "poison",
            "listen",
            "unlisten",
            "complete_member",
            "complete_members",
            "barrier_results",
            "barrier_links",
            "guard",
            "claim",
            "renew",
            "release",
            "finish_claim",
            "worker_heartbeat",
            "worker_deregister",
        ],
        _WORKERS,
    ),
    **dict.fromkeys(
        [
            "list_queues",
            "metrics",
            "metrics_all",
            "barrier_status",
            "expire_barriers",
            "sample_rates",
        ],
        _BOTH,
    ),
    **dict.fromkeys(
        [
            "create_queue",
            "drop_queue",
            "pause_queue",
            "resume_queue",
            "list_workers",
            "queue_rates",
            "purge_queue",
            "purge_queue_chunk",
            "peek",
            "exporter_metrics",
            "poison_list",
            "poison_get",
            "poison_count",
            "poison_ids",
            "poison_requeue",
            "poison_purge",
            "list_barriers",
            "barrier_failures",
            "barrier_outcomes",
            "barrier_pending",
            "barrier_steps",
            "poison_page",
            "list_claims",
            "purge_claims",
            "purge_guards",
            "purge_archive",
        ],
        _OPERATORS,
    ),
}
