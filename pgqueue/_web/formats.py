"""How the pages write values: ages, sizes, and commands to paste into a shell."""

from __future__ import annotations

import shlex
from datetime import UTC, datetime


def age(seconds: float | None) -> str:
    """A short human age: 45s, 12m, 3h, 2d; a dash for none."""
    if seconds is None:
        return "\u2013"
    s = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}"
    return f"{s}s"


def since_text(when: datetime | None) -> str:
    """How long ago, by this machine's clock (for times the database wrote)."""
    if when is None:
        return "\u2013"
    return age((datetime.now(UTC) - when).total_seconds()) + " ago"


def size(n: int) -> str:
    """A size in bytes for a reader: 812 bytes, 16 kB, 4.0 MB (powers of 1,024)."""
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if n >= scale:
            value = n / scale
            return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"
    return f"{n} bytes"


def command(*argv: object) -> str:
    """A command line quoted for a POSIX shell: a queue's name is anyone's text."""
    return shlex.join(str(a) for a in argv)
