"""A database call as a value: the SQL, its parameters and how to read its rows.

The modules of this package build the calls of each area of the SQL API
(queue, barrier, poison, single_flight, guard); the clients run them.

The sync and async clients execute the same `Call` objects, so each contract
call is written once, and a retry re-executes the very same call (same
parameters, same send token).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, TypeVar

from pgqueue._errors import InvalidArgument, InvalidMessage
from pgqueue.types import Duration, Undecodable

T = TypeVar("T")
Row = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One statement against the pgqueue SQL API and the reader of its result."""

    name: str
    sql: str
    params: tuple[Any, ...]
    result: Callable[[list[Row]], T]
    # False for the calls a blind retry could harm (pop: a retry after a lost
    # reply would take a second batch and the first would be gone unseen).
    retryable: bool = True


def with_trace(call: Call[T], trace: tuple[str, str | None] | None) -> Call[T]:
    """The call with a trace context as its function's last two arguments (as is, for None).

    The SQL function writes them into the reserved headers; without one the
    call is the very statement it was before tracing existed.
    """
    if trace is None:
        return call
    sql = call.sql.rstrip()
    assert sql.endswith(")"), call.name
    return Call(
        call.name,
        sql[:-1] + ", traceparent => %s, tracestate => %s)",
        (*call.params, *trace),
        call.result,
        call.retryable,
    )


def scalar(rows: list[Row]) -> Any:
    """The single value of a one-row, one-column result."""
    return rows[0][0]


def column(rows: list[Row]) -> list[Any]:
    """The first column of every row."""
    return [r[0] for r in rows]


def nothing(rows: list[Row]) -> None:
    """Ignore the result."""
    return None


# A NUL character as json.dumps escapes it: \u0000 after an even number of
# backslashes (a string holding a backslash and "u0000" is \\u0000 in the text).
_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def encode_json(value: Any, what: str) -> str:
    """Serialize a JSON value for a jsonb parameter, or raise InvalidMessage saying why not."""
    try:
        text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    except RecursionError as exc:
        raise InvalidMessage(
            f"{what} is nested too deep for Python's JSON encoder ({exc}); pgqueue takes"
            " at most 255 levels: flatten it"
        ) from exc
    except (TypeError, ValueError) as exc:
        raise InvalidMessage(
            f"{what} is not valid JSON: {exc}; pass dicts, lists, strings, numbers,"
            " booleans or None (no NaN/Infinity)"
        ) from exc
    if "\\u0000" in text and _NUL.search(text):
        raise InvalidMessage(
            f"{what} contains a NUL character (\\u0000), which Postgres jsonb cannot store;"
            " remove it or encode the data (e.g. base64)"
        )
    return text


def encode_json_list(values: Sequence[Any], what: str) -> str:
    """Serialize a list of JSON values as one JSON array, naming the bad element on error.

    One document rather than a Postgres array of documents: psycopg escapes
    every element of a text array in Python (measured: 25 us a message, more
    than the insert); the SQL side unpacks it with JSONB_ELEMENTS.
    """
    try:
        return encode_json(list(values), what)
    except InvalidMessage:
        for i, v in enumerate(values):
            encode_json(v, f"{what}[{i}]")  # raises, naming the element
        raise


# A jsonb[] from a JSON array parameter, in order; JSON nulls become SQL NULLs
# only where the SQL asks for it (headers: "no headers" is NULL).
_ELEMENTS = "FROM jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS e (v, i) ORDER BY e.i)"
JSONB_ELEMENTS = f"ARRAY(SELECT e.v {_ELEMENTS}"
JSONB_ELEMENTS_NULLABLE = f"ARRAY(SELECT nullif(e.v, 'null'::jsonb) {_ELEMENTS}"


INT32_MAX = 2**31 - 1


def int32(name: str, value: int) -> int:
    """The value, if Postgres' integer can hold it; else an InvalidArgument naming the argument."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name} must be a whole number, got {value!r}")
    if not -INT32_MAX - 1 <= value <= INT32_MAX:
        raise InvalidArgument(
            f"{name} must fit Postgres' integer (at most {INT32_MAX:,}, about 68 years"
            f" in seconds), got {value}"
        )
    return value


def seconds(name: str, value: Duration) -> int:
    """A duration as whole seconds: an int, a whole float, or a timedelta of whole seconds.

    Anything else is an InvalidArgument naming the argument: every duration
    the API takes goes through here, so a float or a timedelta never reaches
    the database as a type its functions do not take.
    """
    if isinstance(value, timedelta):
        whole, rest = divmod(value, timedelta(seconds=1))
        if rest:
            raise InvalidArgument(f"{name} must be whole seconds, got {value!r} ({value})")
        return int32(name, whole)
    if isinstance(value, float):
        if not value.is_integer():
            raise InvalidArgument(f"{name} must be whole seconds, got {value!r}")
        return int32(name, int(value))
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(
            f"{name} must be a number of seconds (an int, a whole float or a timedelta),"
            f" got {type(value).__name__} {value!r}"
        )
    return int32(name, value)


def seconds_or_none(name: str, value: Duration | None) -> int | None:
    """seconds(), with None passed through (no duration)."""
    return None if value is None else seconds(name, value)


# How much of an undecodable document's text is kept beside the error (the
# whole document stays in the database).
UNDECODABLE_TEXT_CHARS = 1000


# Python converts at most this many digits of a decimal string to an int
# by default (sys.get_int_max_str_digits()); the pieces of a longer one are.
_INT_PIECE = 4000


def _exact_int(digits: str) -> int:
    """An integer of any length from its decimal text, exactly, whatever Python's digit limit."""
    if len(digits) <= _INT_PIECE:
        return int(digits)
    sign, body = (-1, digits[1:]) if digits.startswith("-") else (1, digits)
    value = 0
    for start in range(0, len(body), _INT_PIECE):
        piece = body[start : start + _INT_PIECE]
        value = value * 10 ** len(piece) + int(piece)
    return sign * value


def decode_json(text: str | None) -> Any:
    """A document as the database printed it, decoded; an Undecodable where this Python cannot.

    Never raises for a document Postgres stored. An integer longer than
    Python's digit limit is read exactly (on a second pass, so other
    documents pay nothing for it); one nested deeper than Python's recursion
    allows comes back as an Undecodable with the decoder's error.
    """
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        try:
            return json.loads(text, parse_int=_exact_int)
        except (RecursionError, ValueError) as exc:
            return Undecodable(
                text[:UNDECODABLE_TEXT_CHARS], len(text), f"{type(exc).__name__}: {exc}"
            )
    except RecursionError as exc:
        return Undecodable(text[:UNDECODABLE_TEXT_CHARS], len(text), f"{type(exc).__name__}: {exc}")
