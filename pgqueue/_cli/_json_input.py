"""JSON in: what an operator typed, refused in JSON's terms before anything is sent."""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from pgqueue._calls import encode_json
from pgqueue._errors import InvalidMessage


class _NotJson(ValueError):
    """A value Python's JSON reader takes but JSON has not (NaN, Infinity, 1e999)."""


def _no_constant(name: str) -> Any:
    raise _NotJson(
        f"{name} is not a JSON value (JSON has no NaN or Infinity; send null or a string instead)"
    )


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _NotJson(f"the number {text} is out of range (beyond 1.8e308); send it as a string")
    return value


def parse_json(text: str, where: str) -> Any:
    """JSON from text; else InvalidMessage saying why, in JSON terms, and that nothing was sent."""
    sys.set_int_max_str_digits(0)  # integers of any length, as Postgres takes them
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError as exc:
        raise InvalidMessage(
            f"{where} is nested too deep for Python's JSON reader (about 1,000 levels);"
            " pgqueue takes at most 255 levels: flatten it; nothing was sent"
        ) from exc
    except json.JSONDecodeError as exc:
        raise InvalidMessage(
            f"{where} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno});"
            " nothing was sent"
        ) from exc
    except _NotJson as exc:
        raise InvalidMessage(f"{where} is not valid JSON: {exc}; nothing was sent") from exc


def read_message(text: str, where: str) -> Any:
    """A message from text, checked as the client will check it (a NUL, ...), naming `where`."""
    value = parse_json(text, where)
    try:
        encode_json(value, where)
    except InvalidMessage as exc:
        raise InvalidMessage(f"{exc}; nothing was sent") from exc
    return value
