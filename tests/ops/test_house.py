"""The house rules of pgqueue/: no module over 400 lines, and no import circle.

Every import counts, at the top of a module, inside a function (a lazy
import) or under `if TYPE_CHECKING:`. `python tests/ops/test_house.py` prints
every module's line count and its imports of the package, and any circle.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "pgqueue"
MAX_LINES = 400


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its __init__)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules `name` imports, wherever in the module the import is."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                if sub in known:
                    out.add(sub)  # `from pgqueue import _tracing`: the submodule
                elif source in known:
                    out.add(source)
    out.discard(name)
    return out


def graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports."""
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    sys.setrecursionlimit(10_000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)


def line_counts() -> dict[str, int]:
    """Lines of every module."""
    return {name: len(path.read_text().splitlines()) for name, path in modules().items()}


def test_no_module_is_over_400_lines() -> None:
    over = {n: c for n, c in line_counts().items() if c > MAX_LINES}
    assert not over, f"over {MAX_LINES} lines: {over}"


def test_the_package_has_no_import_circle() -> None:
    assert circles(graph()) == []


def test_the_checker_finds_a_circle_and_resolves_relative_imports(tmp_path: Path) -> None:
    a = tmp_path / "a.py"
    a.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import b\n")
    b = tmp_path / "b.py"
    b.write_text("def f():\n    from .a import x\n")
    known = {"pkg.a": a, "pkg.b": b}
    edges = {n: imports(n, p, known) for n, p in known.items()}
    assert edges == {"pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}}
    assert circles(edges) == [["pkg.a", "pkg.b"]]


if __name__ == "__main__":
    counts = line_counts()
    edges = graph()
    for name in sorted(counts, key=lambda n: -counts[n]):
        print(f"{counts[name]:5d}  {name}  ->  {', '.join(sorted(edges[name])) or '-'}")
    print(f"\n{len(counts)} modules; largest {max(counts.values())} lines;", end=" ")
    print(f"circles: {circles(edges) or 'none'}")
