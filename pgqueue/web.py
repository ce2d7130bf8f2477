"""The web dashboard as an ASGI app: `create_app()` to serve or mount (docs/dashboard.md).

Needs the `web` extra: pip install 'pgqueue-py[web]'.
"""

from __future__ import annotations

from pgqueue._web.app import create_app
from pgqueue._web.security import AuthCallable

__all__ = ["AuthCallable", "create_app"]
