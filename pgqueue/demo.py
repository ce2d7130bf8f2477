"""A short tour of the queue core: send, read with a lease, ack, and a poison drop."""

from __future__ import annotations

from collections.abc import Callable

from pgqueue.client import Client

DEMO_QUEUE = "pgqueue_demo"


def run_demo(client: Client, echo: Callable[[str], None] = print) -> dict[str, int]:
    """Run the tour on an (already migrated) database; counts of what happened."""
    client.create_queue(DEMO_QUEUE, max_attempts=3)
    client.purge_queue(DEMO_QUEUE)
    client.poison_purge(DEMO_QUEUE)

    orders = [{"order": n, "poison": n == 3} for n in range(1, 6)]
    ids = client.send_batch(DEMO_QUEUE, orders)
    echo(f"sent {len(ids)} orders to queue {DEMO_QUEUE!r}: msg_ids {ids}")
    single = client.send(DEMO_QUEUE, {"order": 6}, dedupe_key="order-6")
    again = client.send(DEMO_QUEUE, {"order": 6}, dedupe_key="order-6")
    echo(f"sent order 6 twice with dedupe_key 'order-6': msg_id {single} then {again} (one row)")

    acked = 0
    failures = 0
    for _ in range(20):
        batch = client.read(DEMO_QUEUE, vt=30, qty=10)
        if not batch:
            break
        for msg in batch:
            if msg.message.get("poison"):
                failures += 1
                echo(f"  order {msg.message['order']}: handler failed (read {msg.read_ct}), nack")
                client.set_vt(DEMO_QUEUE, msg.msg_id, 0)
            else:
                client.delete(DEMO_QUEUE, msg.msg_id)
                acked += 1
                echo(f"  order {msg.message['order']}: done, acked msg_id {msg.msg_id}")

    poisoned = client.poison_list(DEMO_QUEUE)
    for p in poisoned:
        echo(f"poison: msg_id {p.msg_id} {p.message} after {p.read_ct} reads: {p.reason}")
    m = client.metrics(DEMO_QUEUE)
    echo(
        f"metrics: queue_length={m.queue_length} total_messages={m.total_messages}"
        f" poison_length={m.poison_length}"
    )
    return {"acked": acked, "failures": failures, "poisoned": len(poisoned)}
