"""Messages name queues in plain English: one queue, or several."""

from __future__ import annotations

from collections.abc import Sequence


def queue_names(names: Sequence[str]) -> str:
    """ "queue 'a'" for one name, "queues 'a', 'b'" for several."""
    quoted = ", ".join(f"'{n}'" for n in names)
    return f"queue {quoted}" if len(names) == 1 else f"queues {quoted}"


def one_or_many(names: Sequence[str], one: str, many: str) -> str:
    """`one` when there is one name, else `many` (the verb or pronoun that agrees)."""
    return one if len(names) == 1 else many
