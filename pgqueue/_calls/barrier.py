"""Barriers as calls: fan out N messages, count member completions, fire exactly one callback."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from pgqueue._calls import (
    JSONB_ELEMENTS,
    Call,
    Row,
    column,
    decode_json,
    encode_json,
    encode_json_list,
    int32,
    scalar,
    seconds_or_none,
    with_trace,
)
from pgqueue._errors import InvalidArgument
from pgqueue._tracing import Trace, without_trace_headers
from pgqueue.types import BarrierStatus, Duration, MemberFailure, MemberResult

OUTCOMES = ("succeeded", "failed")
POLICIES = ("wait_all", "fail_fast", "max_failures")


def _statuses(rows: list[Row]) -> list[BarrierStatus]:
    return [BarrierStatus(*r) for r in rows]


def _policy(
    policy: str | None, max_failures: int | None, max_failure_ratio: float | None
) -> tuple[str | None, int | None, float | None]:
    """The policy arguments as the SQL takes them (None: inferred from the limits there)."""
    if policy is not None and policy not in POLICIES:
        raise InvalidArgument(
            f"policy must be one of {', '.join(POLICIES)}, got {policy!r}; for a number of"
            " tolerated failures pass max_failures=N or max_failure_ratio=0.05"
        )
    return (
        policy,
        None if max_failures is None else int32("max_failures", max_failures),
        max_failure_ratio,
    )


def fan_out(
    queue: str,
    messages: Sequence[Any],
    callback_queue: str,
    callback_message: Any,
    barrier_id: str | None,
    headers: dict[str, Any] | None = None,
    deadline_seconds: Duration | None = None,
    trace: Trace | None = None,
    policy: str | None = None,
    max_failures: int | None = None,
    max_failure_ratio: float | None = None,
) -> Call[str]:
    """Send the members and arm their barrier in one transaction; the barrier id.

    The id is generated here, once per call, when not given: a retry of the
    same call then finds its first attempt and sends nothing twice.
    """
    if barrier_id is None:
        barrier_id = str(uuid.uuid4())
    headers = without_trace_headers(headers)
    policy_args = _policy(policy, max_failures, max_failure_ratio)
    named = any(a is not None for a in policy_args)  # else the call of before policies
    call = Call(
        "fan_out",
        f"SELECT pgqueue.fan_out(%s, {JSONB_ELEMENTS}, %s, %s::jsonb, %s, %s::jsonb, %s"
        + (", policy => %s, max_failures => %s, max_failure_ratio => %s)" if named else ")"),
        (
            queue,
            encode_json_list(messages, "messages"),
            callback_queue,
            encode_json(callback_message, "callback_message"),
            barrier_id,
            None if headers is None else encode_json(headers, "headers"),
            seconds_or_none("deadline_seconds", deadline_seconds),
            *(policy_args if named else ()),
        ),
        scalar,
    )
    return with_trace(call, trace)


def open_barrier(
    queue: str,
    callback_queue: str,
    callback_message: Any,
    barrier_id: str | None,
    headers: dict[str, Any] | None = None,
    deadline_seconds: Duration | None = None,
    messages: Sequence[Any] = (),
    trace: Trace | None = None,
    policy: str | None = None,
    max_failures: int | None = None,
    max_failure_ratio: float | None = None,
) -> Call[str]:
    """Arm a barrier that takes members until sealed, with its first members; its id."""
    if barrier_id is None:
        barrier_id = str(uuid.uuid4())
    headers = without_trace_headers(headers)
    call = Call(
        "open_barrier",
        "SELECT pgqueue.open_barrier(%s, %s, %s::jsonb, %s, %s::jsonb, %s, %s, %s, %s,"
        f" {JSONB_ELEMENTS})",
        (
            queue,
            callback_queue,
            encode_json(callback_message, "callback_message"),
            barrier_id,
            None if headers is None else encode_json(headers, "headers"),
            seconds_or_none("deadline_seconds", deadline_seconds),
            *_policy(policy, max_failures, max_failure_ratio),
            encode_json_list(messages, "messages"),
        ),
        scalar,
    )
    return with_trace(call, trace)


def add_members(barrier_id: str, messages: Sequence[Any]) -> Call[list[int]]:
    """Add members to an open barrier; their msg_ids. Exactly once across retries (an add key)."""
    return Call(
        "add_members",
        f"SELECT * FROM pgqueue.add_members(%s, {JSONB_ELEMENTS}, %s)",
        (barrier_id, encode_json_list(messages, "messages"), uuid.uuid4()),
        column,
    )


def seal(barrier_id: str) -> Call[BarrierStatus]:
    """No more members: the barrier fires when the last one has an outcome; its state."""
    return Call(
        "seal",
        "SELECT * FROM pgqueue.seal(%s)",
        (barrier_id,),
        lambda rows: _statuses(rows)[0],
    )


def complete_members(
    queue: str,
    msg_ids: Sequence[int],
    outcomes: Sequence[str] | None = None,
    results: Sequence[Any] | None = None,
    read_cts: Sequence[int | None] | None = None,
    traceparents: Sequence[str | None] | None = None,
    enqueued_ats: Sequence[datetime] | None = None,
) -> Call[list[BarrierStatus]]:
    """Ack members and count each once; the state of every barrier they belong to.

    An entry with a read_ct acts only while that read's lease is current
    (else it is left alone, and its barrier is not in the result). With
    enqueued_ats, an entry whose msg_id now names another message (handed
    out again after a failover to an asynchronous standby) is left alone. A
    traceparent records the run that completed the member, for its
    callback's span links.
    """
    traced = traceparents is not None and any(t is not None for t in traceparents)
    return Call(
        "complete_members",
        "SELECT * FROM pgqueue.complete_members(%s, %s::bigint[], %s::text[],"
        f" {JSONB_ELEMENTS if results is not None else 'NULL::jsonb[]'}, %s::integer[]"
        f"{', traceparents => %s::text[]' if traced else ''}"
        f"{', enqueued_ats => %s::timestamptz[]' if enqueued_ats is not None else ''})",
        (
            queue,
            list(msg_ids),
            None if outcomes is None else list(outcomes),
            *(() if results is None else (encode_json_list(results, "results"),)),
            None if read_cts is None else list(read_cts),
            *((list(traceparents),) if traced and traceparents is not None else ()),
            *(() if enqueued_ats is None else (list(enqueued_ats),)),
        ),
        _statuses,
    )


def barrier_links(barrier_id: str, qty: int) -> Call[list[tuple[int, int, str]]]:
    """The trace contexts the barrier's members were completed in: (member_index, msg_id, tp)."""
    return Call(
        "barrier_links",
        "SELECT member_index, msg_id, traceparent FROM pgqueue.barrier_links(%s, %s)",
        (barrier_id, int32("qty", qty)),
        lambda rows: [(int(r[0]), int(r[1]), str(r[2])) for r in rows],
    )


def barrier_status(barrier_id: str) -> Call[BarrierStatus]:
    """The barrier's progress; BarrierNotFound if there is no such barrier."""
    return Call(
        "barrier_status",
        "SELECT * FROM pgqueue.barrier_status(%s)",
        (barrier_id,),
        lambda rows: _statuses(rows)[0],
    )


# A member's result as the database prints it, decoded row by row: one this
# Python cannot decode (stored by a handler of another language, or by hand)
# shows as an Undecodable instead of failing the whole list.
RESULT_COLUMNS = "member_index, msg_id, outcome, result::text, completed_at"


def member_results(rows: list[Row]) -> list[MemberResult]:
    """MemberResult rows of RESULT_COLUMNS, each result decoded on its own."""
    return [MemberResult(i, m, o, decode_json(r), c) for i, m, o, r, c in rows]


def barrier_results(barrier_id: str) -> Call[list[MemberResult]]:
    """Every member's outcome and result, by member index."""
    return Call(
        "barrier_results",
        f"SELECT {RESULT_COLUMNS} FROM pgqueue.barrier_results(%s)",
        (barrier_id,),
        member_results,
    )


def barrier_failures(barrier_id: str, qty: int = 100) -> Call[list[MemberFailure]]:
    """The members that completed other than succeeded, by member index, with their reason."""
    return Call(
        "barrier_failures",
        "SELECT member_index, msg_id, outcome, reason, result::text, completed_at"
        " FROM pgqueue.barrier_failures(%s, %s)",
        (barrier_id, int32("qty", qty)),
        lambda rows: [MemberFailure(i, m, o, w, decode_json(r), c) for i, m, o, w, r, c in rows],
    )


def list_barriers(state: str | None = None, qty: int = 100) -> Call[list[BarrierStatus]]:
    """The newest barriers, optionally only those in one state."""
    return Call(
        "list_barriers",
        "SELECT * FROM pgqueue.list_barriers(%s, %s)",
        (state, int32("qty", qty)),
        _statuses,
    )


def expire_barriers() -> Call[int]:
    """Fire the callbacks of overdue barriers (missing members timed out); how many."""
    return Call("expire_barriers", "SELECT pgqueue.expire_barriers()", (), scalar)
