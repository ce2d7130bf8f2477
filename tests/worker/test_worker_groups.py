"""A worker with many handlers at once runs a FIFO group's messages one at a time, in order."""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict
from typing import Any

from support.db import wait_until

from pgqueue import App, Client, Message, Worker, WorkerSettings


def test_concurrent_handlers_take_a_group_one_message_at_a_time_in_order(
    dsn: str, client: Client
) -> None:
    client.create_queue("orders", max_attempts=10)
    groups = [f"customer-{i}" for i in range(6)]
    per_group = 12
    for n in range(per_group):
        client.send_batch("orders", [{"g": g, "n": n} for g in groups], groups=groups)

    app = App()
    running: dict[str, threading.Lock] = {g: threading.Lock() for g in groups}
    done: dict[str, list[int]] = defaultdict(list)
    overlaps: list[str] = []
    failed_once: set[tuple[str, int]] = set()
    rng = random.Random(7)

    @app.handler("orders")
    def handle(msg: Message) -> None:
        g, n = msg.message["g"], msg.message["n"]  # type: ignore[index]
        if not running[g].acquire(blocking=False):
            overlaps.append(f"{g} #{n} ran beside another message of its group")
            return
        try:
            time.sleep(rng.random() * 0.01)
            if n % 5 == 2 and (g, n) not in failed_once:
                failed_once.add((g, n))  # retried (nacked): the group must wait for it
                raise RuntimeError("first attempt fails")
            done[g].append(n)
        finally:
            running[g].release()

    settings = WorkerSettings(
        concurrency=8,
        poll_interval=0.1,
        vt=10,
        backoff_base=0.05,
        backoff_max=0.05,
        shutdown_grace=5,
    )
    with Client.from_dsn(dsn, max_size=12) as wclient:
        worker = Worker(app, wclient, settings)
        t = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
        t.start()
        try:
            wait_until(lambda: sum(len(v) for v in done.values()) == per_group * len(groups), 60)
        finally:
            worker.stop()
            t.join(15)
    assert overlaps == []
    for g in groups:
        assert done[g] == list(range(per_group)), g
    assert client.metrics("orders").queue_length == 0


def test_a_group_key_travels_with_send_batch_and_async_sends(dsn: str) -> None:
    import asyncio

    from pgqueue import AsyncClient

    async def main() -> list[Any]:
        async with await AsyncClient.from_dsn(dsn) as c:
            await c.create_queue("q")
            await c.send("q", 1, group="a")
            await c.send_batch("q", [2, 3], groups=["a", None])
            return [m.message for m in await c.read("q", vt=30, qty=10)]

    assert sorted(asyncio.run(main())) == [1, 3]
