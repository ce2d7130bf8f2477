"""What a poison action touches: picked (queue, id) pairs, or every match of one queue's filter.

A selection is parsed from the confirmation page's query and again from the
POST that acts on it; anything these pages did not make is a 400. A filter's
selection is fixed at the confirmation by the database's clock (`before`),
so messages poisoned after the count was shown are not changed by the act.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from starlette.exceptions import HTTPException

from pgqueue._web import formats, params
from pgqueue.types import PoisonFilter

MAX_SELECTED = 500  # ids one selection carries (a page shows 50)
SINCE = {
    "15m": timedelta(minutes=15),
    "1h": timedelta(hours=1),
    "6h": timedelta(hours=6),
    "24h": timedelta(days=1),
    "7d": timedelta(days=7),
}


@dataclass(frozen=True)
class Selection:
    """What a poison action touches: explicit (queue, id) pairs, or one queue's filter."""

    action: str
    ids: list[tuple[str, int]]
    queue: str | None
    reason: str | None
    since: str
    before: datetime | None

    def fields(self) -> list[tuple[str, str]]:
        """The hidden form fields that carry it to the POST."""
        out = [("action", self.action)]
        out += [("m", f"{q}:{i}") for q, i in self.ids]
        if not self.ids:
            out += [("all", "1"), ("queue", self.queue or ""), ("reason", self.reason or "")]
            out += [
                ("since", self.since),
                ("before", self.before.isoformat() if self.before else ""),
            ]
        return out


def selection_of(source: Any, now: datetime | None) -> Selection:
    """What the request asks to change; 400 for anything not made by these pages.

    `now` (the database's clock) fixes the cut-off of a filter's selection on
    the confirmation page; the act (None) must carry the one it confirmed.
    """
    action = source.get("action")
    if action not in ("requeue", "purge"):
        raise HTTPException(400, "action must be requeue or purge")
    ids: list[tuple[str, int]] = []
    for item in source.getlist("m"):
        queue, sep, text = str(item).rpartition(":")
        if not sep:
            raise HTTPException(400, "bad selection: pick messages on the poison page")
        ids.append((queue, params.message_id(text, "the selected id")))
    if len(ids) > MAX_SELECTED:
        raise HTTPException(400, f"select at most {MAX_SELECTED} messages at once")
    if ids:
        return Selection(action, sorted(set(ids)), None, None, "", None)
    if source.get("all") != "1":
        raise HTTPException(400, "select messages first, or act on all that match a filter")
    target = source.get("queue") or None
    if target is None:
        raise HTTPException(400, "choose a queue to act on all its matching messages")
    since = source.get("since") or ""
    if since and since not in SINCE:
        raise HTTPException(400, f"since must be one of {', '.join(SINCE)}")
    before_text = source.get("before") or ""
    if not before_text and now is None:
        raise HTTPException(400, "the confirmation's cut-off time is missing: confirm again")
    try:
        before = params.parse_time(before_text) if before_text else now
        assert before is not None
        if since:
            _ = before - SINCE[since]  # in range, or OverflowError
    except (ValueError, OverflowError) as exc:
        raise HTTPException(400, "bad time in the selection: confirm again") from exc
    return Selection(action, [], str(target), source.get("reason") or None, since, before)


def filter_of(sel: Selection) -> PoisonFilter:
    """The PoisonFilter of a filter's selection: its reason, and its window ending at `before`."""
    after = sel.before - SINCE[sel.since] if sel.since in SINCE and sel.before else None
    return PoisonFilter(after=after, before=sel.before, reason=sel.reason)


def cli_command(sel: Selection) -> str | None:
    """The `pgqueue poison` command that does what a filter's selection does, quoted for a shell."""
    if sel.queue is None:
        return None
    argv = ["pgqueue", "poison", sel.action, sel.queue, "--all"]
    if sel.reason:
        argv += ["--reason", sel.reason]
    if sel.since:
        argv += ["--since", sel.since]
    return formats.command(*argv)
