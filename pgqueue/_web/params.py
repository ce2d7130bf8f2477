"""What the pages take from a request: parsed here, or refused with a 400 that says why.

A parameter the database could not take (a NUL character, a number past
bigint, a time out of range) is refused here, before any query, with a
sentence an operator can act on; nothing a link or a form sends may become
a 500.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request

MAX_MSG_ID = 2**63 - 1  # bigint
MAX_QUEUE_ID = 2**31 - 1  # integer
_DIGITS = re.compile(r"[0-9]{1,19}")


class BadParameter(HTTPException):
    """A 400: the request's parameter cannot mean anything; the detail says which and why."""

    def __init__(self, detail: str) -> None:
        super().__init__(400, detail)


def nul_problem(items: Iterable[tuple[str, Any]]) -> str | None:
    """What is wrong with parameters holding a NUL character (Postgres text cannot); else None."""
    for name, value in items:
        if "\x00" in name or (isinstance(value, str) and "\x00" in value):
            shown = name.replace("\x00", "\\0")
            return f"the parameter {shown!r} holds a NUL character, which no name or text may hold"
    return None


def queue_name(request: Request, source: dict[str, Any] | FormData | None = None) -> str:
    """The queue named by `name` in source (else the query): a non-empty text, or a 400."""
    name = (source if source is not None else request.query_params).get("name")
    if not isinstance(name, str) or not name:
        raise HTTPException(400, "name a queue: ?name=...")
    return name


def message_id(text: str | None, name: str) -> int:
    """A msg_id given as decimal digits (0 to bigint's largest)."""
    if text is None or not _DIGITS.fullmatch(text) or int(text) > MAX_MSG_ID:
        raise BadParameter(f"{name} must be a message id: a whole number from 0 to {MAX_MSG_ID}")
    return int(text)


def parse_time(text: str) -> datetime:
    """An aware time from ISO text, in UTC; ValueError for anything else (or out of range)."""
    try:
        when = datetime.fromisoformat(text)
        if when.tzinfo is None:
            raise ValueError("a time needs its offset")
        return when.astimezone(UTC)
    except OverflowError as exc:
        raise ValueError("time out of range") from exc


def encode_cursor(*parts: Any) -> str:
    """An opaque cursor of a keyset page (times as ISO text)."""
    return json.dumps([p.isoformat() if isinstance(p, datetime) else p for p in parts])


def decode_cursor(text: str | None, kinds: tuple[type, ...]) -> tuple[Any, ...] | None:
    """The cursor's parts, or None for the first page; 400 for one not made here.

    An int second part is a queue_id (integer), every other int a msg_id (bigint).
    """
    if not text:
        return None
    try:
        parts = json.loads(text)
        if not isinstance(parts, list) or len(parts) != len(kinds):
            raise ValueError
        values = tuple(
            parse_time(p) if k is datetime else k(p) for p, k in zip(parts, kinds, strict=True)
        )
        for i, v in enumerate(values):
            top = MAX_QUEUE_ID if i == 1 else MAX_MSG_ID
            if (isinstance(v, int) and not 0 <= v <= top) or (isinstance(v, str) and "\x00" in v):
                raise ValueError("out of range")
        return values
    except (ValueError, TypeError, OverflowError) as exc:
        raise BadParameter("bad cursor: start again from the first page") from exc
