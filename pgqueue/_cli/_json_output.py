"""JSON out: --json documents in their documented shape, one-line previews, undecodable ones."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

import click

from pgqueue.types import Undecodable

F = TypeVar("F", bound=Callable[..., Any])


def json_option(func: F) -> F:
    """Add --json (machine-readable output, documented in docs/cli.md) to a listing."""
    return click.option(
        "--json", "as_json", is_flag=True, help="Print JSON (shape in docs/cli.md)."
    )(func)


def _any_length_ints() -> None:
    # An operator's command prints and reads integers of any length, as
    # Postgres holds them (Python's default stops at 4,300 digits); the
    # setting is the process's, so only the operator's commands make it.
    sys.set_int_max_str_digits(0)


def emit_json(value: Any) -> None:
    """Print a JSON document (pretty, keys in their documented order)."""
    _any_length_ints()
    click.echo(json.dumps(value, indent=2, ensure_ascii=False, default=_shown))


def compact_json(value: Any) -> str:
    """A JSON value on one line."""
    _any_length_ints()
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=_shown)


def shape(obj: Any, fields: Mapping[str, str]) -> dict[str, Any]:
    """A record as the documented JSON object: {json key: attribute}, timestamps as ISO UTC."""
    out: dict[str, Any] = {}
    for key, attr in fields.items():
        value = getattr(obj, attr)
        out[key] = iso(value) if isinstance(value, datetime) else value
    return out


def iso(value: datetime | None) -> str | None:
    """A timestamp in ISO 8601, UTC (as the JSON output carries it)."""
    return None if value is None else value.astimezone(UTC).isoformat()


# -- documents Python cannot decode ------------------------------------------


def _known(value: Undecodable) -> dict[str, Any]:
    """What is known of a document Python could not decode, as --json and the tables show it."""
    return {"undecodable": value.error, "chars": value.chars, "text_start": value.text[:200]}


def _shown(value: Any) -> Any:
    """How --json and the tables show a document Python could not decode (json.dumps' default)."""
    if isinstance(value, Undecodable):
        return _known(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


# The psql query that prints one column ("message", "headers") of a row raw.
RawQuery = Callable[[str], str]


def undecodable_line(value: Undecodable, where: str) -> str:
    """One line saying a stored document cannot be decoded, its size, and how to see it raw."""
    return (
        f"(cannot be decoded by Python: {value.error}; {value.chars:,} characters;"
        f" see it raw with psql: {where})"
    )


def with_raw_queries(row: dict[str, Any], raw: RawQuery) -> dict[str, Any]:
    """A --json row; a document in it Python cannot decode carries the psql query that prints it."""
    return {
        key: {**_known(value), "psql": raw(key)} if isinstance(value, Undecodable) else value
        for key, value in row.items()
    }


class StoredMessage(Protocol):
    """A row that holds a message as stored: a live one (peek) or a poison one."""

    @property
    def msg_id(self) -> int: ...
    @property
    def message(self) -> Any: ...
    @property
    def headers(self) -> Any: ...


M = TypeVar("M", bound=StoredMessage)


def undecodable_notes(rows: Iterable[M], raw: Callable[[M], RawQuery]) -> list[str]:
    """The lines under a table for the documents in it Python cannot decode (a cell is short)."""
    return [
        f"msg_id {r.msg_id}, {key}: {undecodable_line(value, raw(r)(key))}"
        for r in rows
        for key, value in (("message", r.message), ("headers", r.headers))
        if isinstance(value, Undecodable)
    ]
