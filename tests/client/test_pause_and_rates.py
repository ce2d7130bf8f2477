"""Pausing, the worker registry and the rates through both clients."""

from __future__ import annotations

import asyncio
import uuid

from pgqueue import AsyncClient, Client, QueueMinute, WorkerInfo
from pgqueue._calls import workers as workers_calls


def test_a_read_of_a_paused_queue_is_observed_and_logged_at_debug_only(
    client: Client, queue: str, captured_logs: list[dict[str, object]]
) -> None:
    heard: list[str] = []
    client.observers.read_paused.append(heard.append)
    client.send(queue, {"n": 1})
    assert client.pause_queue(queue, actor="me") is True
    assert client.read(queue, qty=5) == []
    assert client.read_with_poll(queue, max_poll_seconds=3) == []
    assert client.pop(queue) == []
    assert heard == [queue] * 3
    assert [e["log_level"] for e in captured_logs if e["event"] == "read.paused"] == ["debug"] * 3
    assert not [e for e in captured_logs if e["event"] == "message.poisoned"]
    assert client.resume_queue(queue) is True
    assert [m.message for m in client.read(queue)] == [{"n": 1}]
    assert heard == [queue] * 3


def test_the_async_client_pauses_and_reads_workers_and_rates(dsn: str, client: Client) -> None:
    client.create_queue("jobs")
    me = uuid.uuid4()
    client.run(
        workers_calls.worker_heartbeat(me, "h", 7, ["jobs"], 2, 1, False, {"jobs": (3, 1, 0)})
    )

    async def main() -> tuple[bool, bool, bool, list[WorkerInfo], list[QueueMinute], int]:
        async with await AsyncClient.from_dsn(dsn, max_size=2) as ac:
            paused = await ac.pause_queue("jobs", actor="async")
            again = await ac.pause_queue("jobs")
            info = await ac.list_queues()
            resumed = await ac.resume_queue("jobs")
            assert info[0].paused_by == "async"
            return (
                paused,
                again,
                resumed,
                await ac.list_workers(),
                await ac.queue_rates(["jobs"], minutes=2),
                await ac.sample_rates(),
            )

    paused, again, resumed, workers, rates, sampled = asyncio.run(main())
    assert (paused, again, resumed) == (True, False, True)
    assert [(w.worker_id, w.host, w.pid, w.in_flight, w.alive) for w in workers] == [
        (me, "h", 7, 1, True)
    ]
    assert (sum(r.acked for r in rates), sum(r.nacked for r in rates)) == (3, 1)
    assert sampled in (0, 1)  # 0: the heartbeat sampled this minute already
