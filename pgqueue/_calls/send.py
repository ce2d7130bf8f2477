"""Sending as calls: one message, one under a dedupe key, many in one statement.

Each send drops the reserved trace headers a caller passed
(without_trace_headers) and carries the trace context given, if any (with_trace).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from pgqueue._calls import (
    JSONB_ELEMENTS,
    JSONB_ELEMENTS_NULLABLE,
    Call,
    column,
    encode_json,
    encode_json_list,
    scalar,
    seconds,
    with_trace,
)
from pgqueue._errors import InvalidArgument
from pgqueue._tracing import Trace, without_trace_headers
from pgqueue.types import JSON, Duration, KeyedSend


def send(
    queue: str,
    message: JSON,
    headers: dict[str, Any] | None = None,
    delay: Duration = 0,
    dedupe_key: str | None = None,
    trace: Trace | None = None,
    group: str | None = None,
) -> Call[int]:
    """Enqueue one message; with a dedupe_key, at most one live message holds that key."""
    # A token only where it buys something: with a dedupe_key, a retry of this
    # call that finds its own earlier attempt already consumed returns that id
    # instead of sending again (exactly-once across the retry).
    token = uuid.uuid4() if dedupe_key is not None else None
    headers = without_trace_headers(headers)
    call = Call(
        "send",
        "SELECT pgqueue.send(%s, %s::jsonb, %s::jsonb, %s, %s, %s)"
        if group is None
        else "SELECT pgqueue.send(%s, %s::jsonb, %s::jsonb, %s, %s, %s, group_key => %s)",
        (
            queue,
            encode_json(message, "message"),
            None if headers is None else encode_json(headers, "headers"),
            seconds("delay", delay),
            dedupe_key,
            token,
            *(() if group is None else (group,)),
        ),
        scalar,
    )
    return with_trace(call, trace)


def send_keyed(
    queue: str,
    message: JSON,
    dedupe_key: str,
    headers: dict[str, Any] | None = None,
    delay: Duration = 0,
    trace: Trace | None = None,
) -> Call[KeyedSend]:
    """Enqueue one message under dedupe_key unless an unfinished one holds it; says which."""
    token = uuid.uuid4()  # one per call: its retries know their own earlier attempt
    headers = without_trace_headers(headers)
    call = Call(
        "send",
        "SELECT msg_id, sent FROM pgqueue.send_keyed(%s, %s::jsonb, %s, %s::jsonb, %s, %s)",
        (
            queue,
            encode_json(message, "message"),
            dedupe_key,
            None if headers is None else encode_json(headers, "headers"),
            seconds("delay", delay),
            token,
        ),
        lambda rows: KeyedSend(int(rows[0][0]), bool(rows[0][1])),
    )
    return with_trace(call, trace)


def send_batch(
    queue: str,
    messages: Sequence[JSON],
    headers: Sequence[dict[str, Any] | None] | None = None,
    delay: Duration = 0,
    trace: Trace | None = None,
    groups: Sequence[str | None] | None = None,
) -> Call[list[int]]:
    """Enqueue many messages in one statement; their ids in input order."""
    if headers is not None and len(headers) != len(messages):
        raise InvalidArgument(
            f"headers has {len(headers)} elements but messages has {len(messages)};"
            " pass one headers value per message, or None for none"
        )
    if groups is not None and len(groups) != len(messages):
        raise InvalidArgument(
            f"groups has {len(groups)} elements but messages has {len(messages)};"
            " pass one group (or None) per message, or None for no groups"
        )
    headers_sql = "NULL::jsonb[]" if headers is None else JSONB_ELEMENTS_NULLABLE
    if headers is not None:
        headers = [without_trace_headers(h) for h in headers]
    call = Call(
        "send_batch",
        f"SELECT * FROM pgqueue.send_batch(%s, {JSONB_ELEMENTS}, {headers_sql}, %s"
        + (")" if groups is None else ", group_keys => %s::text[])"),
        (
            queue,
            encode_json_list(messages, "messages"),
            *(() if headers is None else (encode_json_list(headers, "headers"),)),
            seconds("delay", delay),
            *(() if groups is None else (list(groups),)),
        ),
        column,
    )
    return with_trace(call, trace)
