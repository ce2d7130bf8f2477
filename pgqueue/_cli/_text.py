"""How a command words numbers, durations and moments: plurals, 1h30m, ages, timestamps."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import click

from pgqueue._errors import sql_literal

F = TypeVar("F", bound=Callable[..., Any])


def plural(n: int, word: str) -> str:
    """'1 message', '2 messages'."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


# -- durations ----------------------------------------------------------------

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


def parse_duration(text: str) -> timedelta:
    """A duration like 90s, 15m, 2h, 7d, 1w or 1h30m; ValueError saying what is accepted."""
    compact = text.strip().lower()
    parts = _DURATION_RE.findall(compact)
    if not compact or "".join(n + u for n, u in parts) != compact:
        raise ValueError(
            f"{sql_literal(text)} is not a duration: use a number and a unit (s, m, h, d or w),"
            " e.g. 90s, 15m, 2h, 7d or 1h30m"
        )
    return timedelta(seconds=sum(float(n) * _UNITS[u] for n, u in parts))


def _to_duration(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from exc


def duration_option(*names: str, help: str, required: bool = False) -> Callable[[F], F]:
    """An option holding a duration as a timedelta; a bad one is a usage error."""
    return click.option(
        *names,
        metavar="DURATION",
        default=None,
        required=required,
        callback=_to_duration,
        help=help,
    )


def human_age(seconds: float | None) -> str:
    """An age as an operator reads it, rounded down: 45s, 27m, 3h12m, 2d4h; '-' for None."""
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        hours, minutes = divmod(s // 60, 60)
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    days, hours = divmod(s // 3600, 24)
    return f"{days}d{hours}h" if hours else f"{days}d"


def exact_duration(value: timedelta) -> str:
    """A duration in full, largest unit first, as parse_duration reads it: 1h30m, 10d12h."""
    rest = value.total_seconds()
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        n, rest = divmod(rest, size)
        if n:
            parts.append(f"{int(n)}{unit}")
    if rest or not parts:
        parts.append(f"{rest:g}s")
    return "".join(parts)


def ago(value: datetime | None, now: datetime) -> str:
    """A moment for a table, seen from now: '27m ago', 'in 4m', 'now' (within a second), '-'."""
    if value is None:
        return "-"
    seconds = (now - value).total_seconds()
    if abs(seconds) < 1:
        return "now"
    return f"{human_age(seconds)} ago" if seconds > 0 else f"in {human_age(-seconds)}"


def when(value: datetime | None) -> str:
    """A timestamp for a table: UTC to the second."""
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
