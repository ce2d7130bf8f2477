"""What is enqueued, and assertions on it: live messages matched by payload and headers subsets.

Public as pgqueue.testing's enqueued(), assert_enqueued() and assert_not_enqueued().
"""

from __future__ import annotations

from typing import Any

from pgqueue._client import Client
from pgqueue.types import PeekedMessage


def enqueued(client: Client, queue: str) -> list[PeekedMessage]:
    """Every live message of the queue (visible, delayed or leased), by msg_id; leases none."""
    found: list[PeekedMessage] = []
    page_size = 1000
    while True:
        after = found[-1].msg_id if found else 0
        page = client.peek(queue, qty=page_size, after_msg_id=after)
        found.extend(page)
        if len(page) < page_size:
            return found


def _matches(pattern: Any, value: Any) -> bool:
    """A dict matches any dict holding its keys with matching values; others must be equal.

    JSON's types stay apart: True is not 1, and 1 is not "1".
    """
    if isinstance(pattern, dict):
        return isinstance(value, dict) and all(
            k in value and _matches(v, value[k]) for k, v in pattern.items()
        )
    if isinstance(pattern, (list, tuple)):
        return (
            isinstance(value, list)
            and len(value) == len(pattern)
            and all(_matches(p, v) for p, v in zip(pattern, value, strict=True))
        )
    return isinstance(pattern, bool) == isinstance(value, bool) and bool(pattern == value)


def _matching(
    live: list[PeekedMessage], message: Any, headers: dict[str, Any] | None
) -> list[PeekedMessage]:
    return [
        m
        for m in live
        if (message is None or _matches(message, m.message))
        and (headers is None or _matches(headers, m.headers or {}))
    ]


def _listing(live: list[PeekedMessage], limit: int = 20) -> str:
    if not live:
        return "  (nothing)"
    lines = [
        f"  msg_id={m.msg_id} read_ct={m.read_ct} {m.message!r}"
        + (f" headers={m.headers!r}" if m.headers else "")
        for m in live[:limit]
    ]
    if len(live) > limit:
        lines.append(f"  ... and {len(live) - limit} more")
    return "\n".join(lines)


def _wanted(queue: str, message: Any, headers: dict[str, Any] | None) -> str:
    what = f"in {queue!r}"
    if message is not None:
        what += f" matching {message!r}"
    if headers is not None:
        what += f" with headers matching {headers!r}"
    return what


def assert_enqueued(
    client: Client,
    queue: str,
    message: Any = None,
    *,
    count: int | None = None,
    headers: dict[str, Any] | None = None,
) -> list[PeekedMessage]:
    """Assert a live message matches (exactly `count` of them, if given); the matching ones.

    `message` and `headers` match as subsets: a dict matches any payload
    holding its keys with matching values (nested dicts too); anything else
    must be equal. None matches everything. The failure lists what is there.
    """
    __tracebackhide__ = True
    live = enqueued(client, queue)
    found = _matching(live, message, headers)
    if (count is None and found) or (count is not None and len(found) == count):
        return found
    expected = "at least 1 message" if count is None else f"{count} message(s)"
    raise AssertionError(
        f"expected {expected} {_wanted(queue, message, headers)}, found {len(found)};"
        f" {len(live)} enqueued:\n{_listing(live)}"
    )


def assert_not_enqueued(
    client: Client,
    queue: str,
    message: Any = None,
    *,
    headers: dict[str, Any] | None = None,
) -> None:
    """Assert no live message matches (with neither `message` nor `headers`: the queue is empty)."""
    __tracebackhide__ = True
    live = enqueued(client, queue)
    found = _matching(live, message, headers)
    if found:
        raise AssertionError(
            f"expected no message {_wanted(queue, message, headers)}, found {len(found)}:\n"
            f"{_listing(found)}\n{len(live)} enqueued in all"
        )
