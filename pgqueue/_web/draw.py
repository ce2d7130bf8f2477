"""Numbers into shapes: sparklines, outcome bars and a workflow's DAG, as coordinates.

The templates draw the SVG from these; nothing here writes markup, so every
text a page shows passes through the templates' escaping.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def sparkline(values: Sequence[int | None], width: int = 120, height: int = 24) -> str:
    """An SVG polyline's points for values (None drawn as 0), scaled to the box."""
    if not values:
        return ""
    top = max((v or 0) for v in values) or 1
    step = width / max(len(values) - 1, 1)
    return " ".join(
        f"{i * step:.1f},{height - 1 - (v or 0) * (height - 2) / top:.1f}"
        for i, v in enumerate(values)
    )


# The order the bar shows outcomes in, and each one's colour class.
OUTCOME_ORDER = ("succeeded", "failed", "poisoned", "purged", "timed_out", "cancelled", "pending")


@dataclass(frozen=True, slots=True)
class Segment:
    """One outcome's share of a bar, in percent of its width."""

    outcome: str
    count: int
    start: float
    width: float


def outcome_bar(counts: dict[str, int]) -> list[Segment]:
    """The bar's segments, in OUTCOME_ORDER, skipping empty ones; all zero gives none."""
    total = sum(counts.values())
    segments: list[Segment] = []
    start = 0.0
    names = [*OUTCOME_ORDER, *sorted(set(counts) - set(OUTCOME_ORDER))]
    for name in names:
        n = counts.get(name, 0)
        if n and total:
            width = 100.0 * n / total
            segments.append(Segment(name, n, start, width))
            start += width
    return segments


@dataclass(frozen=True, slots=True)
class Node:
    """A step drawn as a box at (x, y)."""

    name: str
    state: str
    x: int
    y: int


@dataclass(frozen=True, slots=True)
class Edge:
    """A dependency drawn from the right of one box to the left of another."""

    x1: int
    y1: int
    x2: int
    y2: int


@dataclass(frozen=True, slots=True)
class Dag:
    """A laid-out workflow: boxes in columns by longest path from a root, and its edges."""

    nodes: list[Node]
    edges: list[Edge]
    width: int
    height: int


BOX_W, BOX_H, GAP_X, GAP_Y, PAD = 150, 34, 60, 16, 10


def layout(steps: Sequence[tuple[str, str, Sequence[str]]]) -> Dag:
    """Columns by longest path from the roots; rows in the order the steps came."""
    deps = {name: [d for d in depends if d != name] for name, _, depends in steps}
    column: dict[str, int] = {}

    def depth(name: str, seen: frozenset[str]) -> int:
        if name in column:
            return column[name]
        parents = [d for d in deps.get(name, []) if d in deps and d not in seen]
        value = 1 + max((depth(d, seen | {name}) for d in parents), default=-1)
        column[name] = value
        return value

    rows: dict[int, int] = {}
    nodes: dict[str, Node] = {}
    for name, state, _ in steps:
        col = depth(name, frozenset())
        row = rows.get(col, 0)
        rows[col] = row + 1
        nodes[name] = Node(name, state, PAD + col * (BOX_W + GAP_X), PAD + row * (BOX_H + GAP_Y))
    edges = [
        Edge(
            nodes[d].x + BOX_W,
            nodes[d].y + BOX_H // 2,
            nodes[name].x,
            nodes[name].y + BOX_H // 2,
        )
        for name, _, depends in steps
        for d in depends
        if d in nodes and d != name
    ]
    cols = max(column.values(), default=0) + 1
    height_rows = max(rows.values(), default=1)
    return Dag(
        list(nodes.values()),
        edges,
        2 * PAD + cols * BOX_W + (cols - 1) * GAP_X,
        2 * PAD + height_rows * BOX_H + (height_rows - 1) * GAP_Y,
    )
