"""The demo: fan out 100 orders under a barrier, two consumers, one poison order, one callback."""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Callable
from typing import Any

from pgqueue._client import Client
from pgqueue._embedded import embedded_dir
from pgqueue._worker import App, Worker, WorkerSettings
from pgqueue.types import TRANSPORT_MARKER, Message

ORDERS = "demo_orders"
DONE = "demo_orders_done"
MEMBERS = 100
BROKEN = 57  # the order whose SKU is not in the catalogue: it fails on every attempt
MAX_ATTEMPTS = 3


def _reset(client: Client) -> None:
    """Start from empty demo queues, however an earlier run ended."""
    for name, attempts in ((ORDERS, MAX_ATTEMPTS), (DONE, 5)):
        client.create_queue(name, max_attempts=attempts)
    # Purging members of an unfinished earlier run fires its barrier (as
    # failed); the callback queue is purged after, so that callback goes too.
    for name in (ORDERS, DONE):
        client.purge_queue(name)
        client.poison_purge(name)


def _app(echo: Callable[[str], None], callbacks: list[Message], fired: threading.Event) -> App:
    app = App()

    @app.handler(ORDERS)
    def price(msg: Message) -> dict[str, Any]:
        order = msg.message
        if order["sku"] == "SKU-UNKNOWN":
            echo(
                f"  order {order['order']}: SKU-UNKNOWN is not in the catalogue"
                f" (attempt {msg.read_ct} of {MAX_ATTEMPTS})"
            )
            raise LookupError(f"{order['sku']} is not in the catalogue")
        return {"order": order["order"], "total": order["qty"] * 10}

    @app.handler(DONE)
    def report(msg: Message) -> None:
        callbacks.append(msg)
        cb = msg.callback
        echo(f"callback received on {DONE!r}: {msg.message}")
        if cb is not None:  # what the firing wrote (headers _pg_transport, _pg_callback)
            echo(
                f"  {TRANSPORT_MARKER}={msg.is_callback} barrier_id={cb.barrier_id}"
                f" state={cb.state} total={cb.total} succeeded={cb.succeeded} failed={cb.failed}"
            )
        fired.set()

    return app


def next_steps(
    barrier_id: str, broken_id: int | str, export_dsn: str | None, embedded: bool
) -> list[str]:
    """What to try after the demo, as commands that run when pasted into a shell."""
    lines = ["next, in this shell:"]
    if export_dsn is not None:  # commands find the database through it
        lines.append(f"  export PGQUEUE_DSN={shlex.quote(export_dsn)}")
    lines += [
        f"  pgqueue poison show {ORDERS} {broken_id}     # the whole message, and why it failed",
        f"  pgqueue poison requeue {ORDERS} --all  # give it another go (asks first)",
        f"  pgqueue barrier show {barrier_id}",
        "  pgqueue queue list",
        "",
        "To see it all in a browser: pip install 'pgqueue-py[web]', then `pgqueue web`",
        "(http://127.0.0.1:8765/; docs/dashboard.md).",
    ]
    if embedded:
        lines += [
            "",
            "The embedded Postgres keeps running for these commands (its data is in",
            f"{embedded_dir()}); `pgqueue demo --stop` stops it.",
        ]
    return lines


def run_demo(
    client: Client,
    dsn: str,
    echo: Callable[[str], None] = print,
    timeout: float = 60.0,
    *,
    export_dsn: str | None = None,
    embedded: bool = False,
) -> bool:
    """Run the demo on a migrated database; True when everything it shows held.

    Its closing lines are commands that run as printed: `export_dsn` is the
    DSN they need exported (None when the environment already names it).
    """
    from pgqueue._cli._connect import server_now
    from pgqueue._cli._table import render_table
    from pgqueue._cli.poison import POISON_COLUMNS, poison_rows

    started = time.monotonic()
    _reset(client)
    orders = [
        {"order": n, "sku": "SKU-UNKNOWN" if n == BROKEN else f"SKU-{n % 7}", "qty": n % 5 + 1}
        for n in range(1, MEMBERS + 1)
    ]
    barrier_id = client.fan_out(
        ORDERS, orders, callback_queue=DONE, callback_message={"report": "price the batch"}
    )
    echo(
        f"fanned out {MEMBERS} orders to {ORDERS!r} under barrier {barrier_id};"
        f" order {BROKEN} always fails (max_attempts={MAX_ATTEMPTS})"
    )

    callbacks: list[Message] = []
    fired = threading.Event()
    app = _app(echo, callbacks, fired)
    settings = WorkerSettings(
        concurrency=4, vt=10, poll_interval=0.2, backoff_base=0.2, backoff_max=0.2
    )
    workers = []
    for _ in range(2):
        own = Client.from_dsn(dsn, max_size=settings.concurrency + 3)
        workers.append((Worker(app, own, settings), own))
    threads = [
        threading.Thread(target=w.run, kwargs={"install_signals": False}, name=f"demo-consumer-{i}")
        for i, (w, _) in enumerate(workers, start=1)
    ]
    echo("started 2 consumers (4 handlers each) in this process")
    for t in threads:
        t.start()
    try:
        got_it = fired.wait(timeout)
        time.sleep(0.5)  # a second callback, if there were one, would arrive now
    finally:
        for w, _ in workers:
            w.stop()
        for t in threads:
            t.join()
        for _, own in workers:
            own.close()
    if not got_it:
        echo(f"the callback did not arrive within {timeout:g}s: something is wrong")
        return False

    status = client.barrier_status(barrier_id)
    handled = sum(w.handled for w, _ in workers)
    echo(
        f"barrier {status.state} exactly once: {len(callbacks)} callback,"
        f" succeeded={status.succeeded} failed={status.failed};"
        f" the two consumers acked {handled} messages (the orders that succeeded and the"
        f" callback) in {time.monotonic() - started:.1f}s"
    )
    for f in client.barrier_failures(barrier_id):
        echo(f"  member {f.member_index} (msg_id {f.msg_id}) {f.outcome}: {f.reason}")
    echo("")
    echo(f"$ pgqueue poison list {ORDERS}")
    poisoned = client.poison_list(ORDERS)
    echo(render_table(POISON_COLUMNS, poison_rows(poisoned, server_now(client))))
    echo("")
    broken_id = poisoned[0].msg_id if poisoned else "MSG_ID"
    for line in next_steps(barrier_id, broken_id, export_dsn, embedded):
        echo(line)
    return (
        len(callbacks) == 1
        and status.succeeded == MEMBERS - 1
        and status.failed == 1
        and len(poisoned) == 1
    )
