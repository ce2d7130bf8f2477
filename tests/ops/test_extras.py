"""The tests' list of extras matches pyproject.toml, and the README's test command installs all."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

from support.extras import EXTRAS

ROOT = Path(__file__).resolve().parents[2]


def test_every_extra_of_pyproject_is_known_to_the_tests() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert set(declared) == set(EXTRAS)


def test_the_readme_test_command_installs_every_extra_and_ci_runs_it_verbatim() -> None:
    command = subprocess.run(
        [str(ROOT / ".ci" / "readme-command"), "tests"], capture_output=True, text=True, check=True
    ).stdout.strip()
    installed = re.search(r"pip install -e '\.\[([a-z,]+)\]'", command)
    assert installed, command
    assert set(installed.group(1).split(",")) == set(EXTRAS)
    assert command.endswith("&& pytest -n auto")
    ci = (ROOT / ".ci" / "run").read_text()
    assert "readme tests" in ci and "readme quickstart" in ci
