"""configure_logging: pgqueue's lines and other libraries' share one format, one line each.

Each test runs a fresh interpreter: logging's configuration is global to the process.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

SCRIPT = """
import logging, sys, threading, warnings
import structlog
from pgqueue._log import configure_logging

configure_logging(json=sys.argv[1] == "json", level=sys.argv[2])
own = structlog.get_logger("pgqueue")
pool = logging.getLogger("psycopg.pool")

def burst(i):
    for n in range(int(sys.argv[3])):
        own.warning("own.burst", thread=i, n=n, pad="x" * 3000)
        pool.warning("pool burst %s %s %s", i, n, "y" * 3000)

threads = [threading.Thread(target=burst, args=(i,)) for i in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
own.debug("own.debug")
own.info("own.info")
pool.debug("pool debug")
pool.info("pool info")
logging.getLogger("tenacity").error("tenacity error")
warnings.warn("a library warns", UserWarning)
try:
    1 / 0
except ZeroDivisionError:
    pool.exception("pool failed")
"""


def run(fmt: str, level: str, burst: int = 0) -> str:
    """The script's stderr; `burst` lines of each kind from each of 8 threads first."""
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, fmt, level, str(burst)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout == ""
    return result.stderr


def json_lines(text: str) -> list[dict[str, Any]]:
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        try:
            out.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"line {n} is not JSON: {line[:200]!r}") from None
    return out


def test_json_lines_from_many_threads_and_both_kinds_of_logger_never_share_a_line() -> None:
    entries = json_lines(run("json", "INFO", burst=200))
    by_logger = [(e.get("logger"), e["event"]) for e in entries]
    assert sum(e["event"] == "own.burst" for e in entries) == 8 * 200
    assert sum(str(e["event"]).startswith("pool burst") for e in entries) == 8 * 200
    assert ("tenacity", "tenacity error") in by_logger
    assert any(name == "py.warnings" and "a library warns" in ev for name, ev in by_logger)
    [failed] = [e for e in entries if e["event"] == "pool failed"]
    assert failed["level"] == "error" and "ZeroDivisionError" in failed["exception"]


def test_other_libraries_log_from_warning_unless_debug() -> None:
    at_info = {e["event"] for e in json_lines(run("json", "INFO"))}
    assert "own.info" in at_info and "own.debug" not in at_info
    assert "pool info" not in at_info and "pool debug" not in at_info  # psycopg_pool's chatter
    at_debug = {e["event"] for e in json_lines(run("json", "DEBUG"))}
    assert {"own.debug", "own.info", "pool debug", "pool info"} <= at_debug
    at_error = {e["event"] for e in json_lines(run("json", "ERROR"))}
    assert at_error == {"tenacity error", "pool failed"}


def test_console_lines_of_other_libraries_look_like_pgqueues() -> None:
    text = re.sub(r"\x1b\[[0-9;]*m", "", run("console", "INFO"))  # no colours
    [own] = [line for line in text.splitlines() if "own.info" in line]
    [tenacity] = [line for line in text.splitlines() if "tenacity error" in line]
    assert "[info" in own and own.rstrip().endswith("[pgqueue]")
    assert "[error" in tenacity and tenacity.rstrip().endswith("[tenacity]")
