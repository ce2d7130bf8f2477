"""Tables that fit the terminal: columns that keep, wrap or clip, and the lines under them."""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import click

Fit = Literal["keep", "wrap", "clip"]


@dataclass(frozen=True)
class Column:
    """A table column: its header, and how its cells give way when the table must narrow.

    `keep` cells (ids, counts, names, ages) are never cut. `wrap` cells (a
    reason, an error) wrap onto continuation lines, and when the column would
    be narrower than WRAP_MIN_WIDTH they go under their row at the table's
    full width. `clip` cells (a preview of a payload) are cut with an
    ellipsis, and left out when narrower than CLIP_MIN_WIDTH. `limit` caps a
    free-text cell at that many characters at any width: `show` and --json
    have the whole text. Numbers align right.
    """

    header: str
    right: bool = False
    fit: Fit = "keep"
    limit: int | None = None


# Below these widths a wrapped column reads a few words a line and a preview
# shows next to nothing: the first goes under its row, the second is left out.
WRAP_MIN_WIDTH = 30
CLIP_MIN_WIDTH = 12


def output_width() -> int | None:
    """The width tables fit: $COLUMNS if set, else the terminal's; None (no limit) for a pipe."""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    if sys.stdout is not None and sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return None


def clip(text: str, width: int) -> str:
    """Text cut to width characters, with an ellipsis when cut; one line."""
    one_line = " ".join(text.split())
    return one_line if len(one_line) <= width else one_line[: width - 1] + "…"


def _cell(column: Column, value: Any) -> str:
    text = str(value)
    if column.fit == "keep":
        return text
    one_line = " ".join(text.split())
    return one_line if column.limit is None else clip(one_line, column.limit)


@dataclass(frozen=True)
class _Layout:
    """How a table fits: the width of each column in it, those under each row, those left out."""

    widths: dict[int, int]
    under: list[int]
    width: int
    note: str


def _fit(columns: Sequence[Column], natural: list[int], width: int) -> _Layout:
    """The layout of a table within `width` columns.

    Previews give way first, then the widest reasons and errors, a character
    at a time. Past their minimum widths, the previews are left out, then
    the reasons and errors go under their rows. Ids, counts and ages never
    give way, so a table of those alone may be wider.
    """
    least = {"wrap": WRAP_MIN_WIDTH, "clip": CLIP_MIN_WIDTH}
    widths = dict(enumerate(natural))
    under: list[int] = []
    left_out: list[str] = []
    while True:
        free = [i for i in widths if columns[i].fit != "keep"]
        floor = {
            i: min(natural[i], max(len(columns[i].header), least[columns[i].fit])) for i in free
        }
        over = sum(widths.values()) + 2 * (len(widths) - 1) - width
        slack = sum(widths[i] - floor[i] for i in free)
        if over <= slack or not free or len(widths) == 1:
            for _ in range(max(0, min(over, slack))):
                narrowed = max(
                    free, key=lambda c: (widths[c] > floor[c], columns[c].fit == "clip", widths[c])
                )
                widths[narrowed] -= 1
            break
        clipped = [i for i in free if columns[i].fit == "clip"]
        if clipped:
            del widths[clipped[-1]]
            left_out.insert(0, columns[clipped[-1]].header)
        else:
            del widths[free[-1]]
            under.insert(0, free[-1])
    note = f"({', '.join(left_out)} left out to fit {width} columns)" if left_out else ""
    return _Layout(widths, under, width, note)


def _row_lines(columns: Sequence[Column], layout: _Layout, row: list[str]) -> list[str]:
    """One row: a line, continuation lines while a wrapped cell goes on, then the cells under it."""
    parts: dict[int, list[str]] = {}
    for i, w in layout.widths.items():
        col, text = columns[i], row[i]
        if col.fit == "wrap" and len(text) > w:
            parts[i] = textwrap.wrap(text, w, break_on_hyphens=False)
        elif col.fit == "clip":
            parts[i] = [clip(text, w)]
        else:
            parts[i] = [text]
    lines = []
    for k in range(max(len(p) for p in parts.values())):
        out = []
        for i, w in layout.widths.items():
            value = parts[i][k] if k < len(parts[i]) else ""
            out.append(value.rjust(w) if columns[i].right else value.ljust(w))
        lines.append("  ".join(out).rstrip())
    for i in layout.under:
        label = f"  {columns[i].header}: "
        wrapped = textwrap.wrap(
            row[i], max(layout.width - len(label), CLIP_MIN_WIDTH), break_on_hyphens=False
        )
        lines += [(label if k == 0 else " " * len(label)) + t for k, t in enumerate(wrapped)]
    return lines


def render_table(
    columns: Sequence[Column], rows: Sequence[Sequence[Any]], width: int | None = None
) -> str:
    """An aligned text table with a header line, fitted to `width` (default: output_width()).

    Within the width unless its ids, counts and ages alone are wider; with no
    width (a pipe), one line per row.
    """
    cells = [[_cell(col, v) for col, v in zip(columns, row, strict=True)] for row in rows]
    natural = [max([len(col.header), *(len(r[i]) for r in cells)]) for i, col in enumerate(columns)]
    fit_to = output_width() if width is None else width
    if fit_to is None:
        layout = _Layout(dict(enumerate(natural)), [], 0, "")
    else:
        layout = _fit(columns, natural, fit_to)
    header = [c.header if i in layout.widths else "" for i, c in enumerate(columns)]
    lines = _row_lines(columns, replace(layout, under=[]), header)
    for r in cells:
        lines += _row_lines(columns, layout, r)
    return "\n".join([*lines, layout.note] if layout.note else lines)


def echo_table(
    columns: Sequence[Column],
    rows: Sequence[Sequence[Any]],
    empty: str,
    footer: str = "",
    notes: Sequence[str] = (),
) -> None:
    """Print a table, or the `empty` line when there are no rows; then its footer and notes."""
    if not rows:
        click.echo(empty)
        return
    click.echo(render_table(columns, rows))
    for line in [footer, *notes] if footer else notes:
        click.echo(line)
