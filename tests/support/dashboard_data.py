"""A database worth looking at: what the dashboard's tests and screenshots show.

Queues (one paused), poison rows whose payload and headers are hostile HTML,
an open fan-out with failures and pending members, a fired barrier, and a
workflow part way through. Everything goes through the public API, as an
application would make it.
"""

from __future__ import annotations

import re
from typing import Any

from pgqueue import Client, Step

SCRIPT = "<script>window.__pwned=1</script>"
IMG = '"><img src=x onerror="window.__pwned=2">'


def seed(client: Client) -> dict[str, Any]:
    """Fill the database; the ids a test needs to find things again."""
    for name, attempts in (("orders", 3), ("emails", 5), ("reports", 5), ("done", 5)):
        client.create_queue(name, max_attempts=attempts)
    for i in range(12):
        client.send("emails", {"to": f"user{i}@example.com", "template": "welcome"})
    client.send("reports", {"month": "2026-10"}, delay=3600)
    hostile = client.send("orders", {"note": SCRIPT, "sku": "SKU-1"}, headers={"x": IMG})
    client.poison("orders", hostile, f"handler raised ValueError: {SCRIPT}")
    poisoned = [hostile]
    for i in range(4):
        msg_id = client.send("orders", {"sku": f"SKU-{100 + i}", "qty": i + 1})
        client.poison("orders", msg_id, f"attempts exhausted: KeyError: 'SKU-{100 + i}'")
        poisoned.append(msg_id)
    # An open fan-out: 2 succeeded, 1 failed, 1 poisoned, 2 pending (one leased).
    client.fan_out(
        "orders",
        [{"sku": f"SKU-{i}", "line": i} for i in range(6)],
        barrier_id="invoice-2026-11",
        callback_queue="done",
        callback_message={"invoice": "2026-11"},
    )
    members = sorted(
        m.msg_id for m in client.peek("orders", qty=100) if m.message.get("line") is not None
    )
    client.complete_member("orders", members[0])
    client.complete_member("orders", members[1])
    client.complete_member(
        "orders", members[2], outcome="failed", result={"error": "card declined"}
    )
    client.poison("orders", members[3], "attempts exhausted: TimeoutError: warehouse API")
    leased = [m for m in client.read("orders", vt=600, qty=6) if m.msg_id == members[4]]
    # A fired barrier: both members succeeded; its callback sits in `done`.
    client.fan_out(
        "emails",
        [{"digest": 1}, {"digest": 2}],
        barrier_id="digest-42",
        callback_queue="done",
        callback_message={"digest": 42},
    )
    for m in client.peek("emails", qty=100):
        if isinstance(m.message, dict) and m.message.get("digest"):
            client.complete_member("emails", m.msg_id)
    client.start_workflow(
        "nightly-etl",
        [
            Step("extract", "reports", {"source": "crm"}),
            Step("transform", "reports", {"t": 1}, depends_on=("extract",)),
            Step("audit", "reports", {"a": 1}, depends_on=("extract",)),
            Step("load", "reports", {"l": 1}, depends_on=("transform", "audit")),
        ],
    )
    # extract succeeds, audit fails: transform runs on, load is cancelled
    for step, outcome in (("extract", "succeeded"), ("audit", "failed")):
        for m in client.read("reports", vt=60, qty=10):
            if m.step == step:
                client.complete_member("reports", m.msg_id, outcome=outcome, result={"step": step})
            else:
                client.set_vt("reports", m.msg_id, 0)
    client.pause_queue("reports", actor="seed")
    return {"poisoned": poisoned, "members": members, "leased": bool(leased)}


def hidden_fields(html: str) -> dict[str, list[str]]:
    """A confirmation page's hidden fields, as a form to POST (repeated names kept)."""
    form: dict[str, list[str]] = {}
    for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', html):
        form.setdefault(name, []).append(value)
    return form
