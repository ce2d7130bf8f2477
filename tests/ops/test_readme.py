"""The README's examples run as written."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def python_block_after(heading: str) -> str:
    text = README.read_text()
    section = text[text.index(heading) :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, f"no python example under {heading!r}"
    return match.group(1)


def test_fan_out_example_runs(dsn: str, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    monkeypatch.setenv("PGQUEUE_DSN", dsn)
    exec(compile(python_block_after("## Fan-out and barriers"), "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "{'album': 7} succeeded 10" in out


def test_workflow_example_runs(dsn: str, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    monkeypatch.setenv("PGQUEUE_DSN", dsn)
    exec(compile(python_block_after("### Workflows"), "README.md", "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "test {'run': 'pytest'}"
    assert sorted(out[1:4]) == [f"wheels {{'py': '{v}'}}" for v in ("3.11", "3.12", "3.13")]
    assert out[4:] == ["publish {'run': 'twine'}", "succeeded"]


WORKFLOWS = Path(__file__).resolve().parents[2] / "docs" / "workflows.md"


def test_the_workflow_examples_run(dsn: str, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    monkeypatch.setenv("PGQUEUE_DSN", dsn)
    blocks = re.findall(r"```python\n(.*?)```", WORKFLOWS.read_text(), re.S)
    assert len(blocks) == 3
    for block in blocks:
        exec(compile(block, "docs/workflows.md", "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "failed 1 3",
        "failed {'failed': 1, 'pending': 1, 'cancelled': 3}",
        "0",
        "succeeded 3",
        "['extract']",
        "['clean', 'index']",
        "{'rows': 100}",
        "['publish']",
        "['tidy']",
        "failed 4 1",
        "failed failed",
    ]
