"""The worker's duties one at a time, on a real database and a clock that moves when told.

No sleeps: the clock decides when a lease needs a heartbeat, when a waiting
message has waited too long, when a handler is hung, and how much the
reader may lease.
"""

from __future__ import annotations

import threading
from typing import Any

import psycopg

from pgqueue import App, Client, Message, WorkerSettings
from pgqueue._log import get_logger
from pgqueue._worker.app import Handler
from pgqueue._worker.clock import ManualClock
from pgqueue._worker.db import WorkerDb
from pgqueue._worker.inflight import InFlight, Task
from pgqueue._worker.leases import Leases
from pgqueue._worker.pauses import Pauses
from pgqueue._worker.reader import Reader
from pgqueue._worker.registry import Registry

LOG = get_logger()


def noop(msg: Message) -> None:
    return None


HANDLER = Handler("jobs", noop, transactional=False, is_async=False)


def duties(client: Client, **settings: Any) -> tuple[ManualClock, InFlight, Leases, WorkerSettings]:
    s = WorkerSettings(queues=("jobs",), **settings)
    clock = ManualClock()
    inflight = InFlight(s.concurrency)
    return clock, inflight, Leases(WorkerDb(client), inflight, s, clock, LOG), s


def hold(client: Client, inflight: InFlight, clock: ManualClock, vt: int, n: int = 1) -> list[Task]:
    """Read n messages for vt seconds and hold them, as the reader would."""
    tasks = [
        Task(m, HANDLER, clock.now(), clock.now() + vt) for m in client.read("jobs", vt=vt, qty=n)
    ]
    inflight.add(tasks)
    return tasks


def collecting_reader(
    client: Client,
    app: App,
    s: WorkerSettings,
    inflight: InFlight,
    clock: ManualClock,
    pauses: Pauses | None = None,
) -> tuple[Reader, list[Task]]:
    """A reader whose reads are held in `inflight` and listed, never run; that list."""
    submitted: list[Task] = []

    class Collect:
        def submit(self, tasks: list[Task], batch: Any) -> None:
            inflight.add(tasks)
            submitted.extend(tasks)

    dispatcher: Any = Collect()
    reader = Reader(
        app, s, WorkerDb(client), inflight, dispatcher, threading.Event(), clock, LOG, pauses
    )
    return reader, submitted


def vt_left(client: Client, sql: Any, msg_id: int) -> float:
    row = sql.execute(
        "SELECT extract(epoch FROM vt - clock_timestamp()) FROM pgqueue.message WHERE msg_id = %s",
        (msg_id,),
    ).fetchone()
    return float(row[0])


def test_a_running_lease_is_extended_only_once_its_margin_is_reached(
    client: Client, sql: Any, queue: str
) -> None:
    client.send(queue, 1)
    clock, inflight, leases, _ = duties(client, vt=100, heartbeat_fraction=0.5)
    [task] = hold(client, inflight, clock, vt=100)
    assert inflight.begin([task], threading.Event(), clock.now()) == ([task], [])
    client.set_vt(queue, task.msg.msg_id, 80, read_ct=task.msg.read_ct)  # the server's lease
    clock.advance(49)  # 51 s left on the worker's clock: more than the 50 s margin
    leases.heartbeat()
    assert vt_left(client, sql, task.msg.msg_id) < 81
    clock.advance(2)  # 49 s left: within the margin
    leases.heartbeat()
    assert vt_left(client, sql, task.msg.msg_id) > 95
    assert task.lease_until == clock.now() + 100


def test_a_message_waiting_a_lease_worth_for_a_handler_is_given_back_not_extended(
    client: Client, sql: Any, queue: str
) -> None:
    client.send_batch(queue, [1, 2])
    clock, inflight, leases, _ = duties(client, vt=100, heartbeat_fraction=0.5)
    running, waiting = hold(client, inflight, clock, vt=100, n=2)
    inflight.begin([running], threading.Event(), clock.now())
    clock.advance(51)
    leases.heartbeat()
    assert waiting.abandoned and len(inflight) == 1
    assert [m.msg_id for m in client.read(queue, vt=30, qty=5)] == [waiting.msg.msg_id]
    assert vt_left(client, sql, running.msg.msg_id) > 95  # the running one was extended


def test_a_message_whose_lease_ran_out_while_it_waited_does_not_start(
    client: Client, queue: str
) -> None:
    """After a stall longer than the vt, what waited locally may be another reader's now."""
    client.send_batch(queue, [1, 2])
    clock, inflight, _, _ = duties(client, vt=10)
    early, late = hold(client, inflight, clock, vt=10, n=2)
    late.lease_until = clock.now() + 20  # read later, in a second read
    clock.advance(10)  # the process was stopped past the first read's vt
    started, expired = inflight.begin([early, late], threading.Event(), clock.now())
    assert (started, expired) == ([late], [early]) and early.abandoned and not early.running


def test_a_handler_past_the_hard_timeout_is_given_back_and_holds_its_thread_until_it_returns(
    client: Client, queue: str
) -> None:
    client.send_batch(queue, [1, 2])
    clock, inflight, leases, _ = duties(client, vt=100, hard_timeout=10, concurrency=1)
    hung, waiting = hold(client, inflight, clock, vt=100, n=2)
    inflight.begin([hung], threading.Event(), clock.now())
    clock.advance(10)
    leases.release_hung()
    assert not hung.abandoned  # not past it yet
    clock.advance(0.5)
    leases.release_hung()
    assert hung.abandoned and waiting.abandoned  # every thread held: what waits goes back too
    assert inflight.healthy_threads() == 0 and len(inflight) == 0
    assert sorted(m.msg_id for m in client.read(queue, vt=30, qty=5)) == [1, 2]
    assert inflight.forget(hung) is True  # the handler returned at last: its thread is free
    assert inflight.healthy_threads() == 1


def test_the_reader_leases_no_more_than_healthy_threads_can_start(
    client: Client, queue: str
) -> None:
    client.send_batch(queue, list(range(20)))
    app = App()
    app.handler(queue)(noop)
    s = WorkerSettings(queues=(queue,), concurrency=2, batch=4)
    clock, inflight = ManualClock(), InFlight(2)
    reader, submitted = collecting_reader(client, app, s, inflight, clock)
    assert reader.room() == 2 + 4  # two running and a batch waiting
    assert reader.fill() == 4 and reader.fill() == 2 and reader.fill() == 0
    running, _ = inflight.begin(submitted[:2], threading.Event(), clock.now())
    assert reader.room() == 0
    clock.advance(100)
    hung = inflight.hung(clock.now(), 10)  # both running handlers hang
    assert hung == running and inflight.healthy_threads() == 0
    for task in hung:
        inflight.drop(task)  # given back
    assert reader.room() == 0  # four wait, and no thread can start them
    inflight.forget(hung[0])  # one handler returns
    assert reader.room() == 0  # a read waits until half a batch has room
    inflight.forget(hung[1])
    assert reader.room() == 2


def test_the_prefetch_follows_the_handlers_rate_unless_batch_is_set(
    client: Client, queue: str
) -> None:
    """Unset, the prefetch is 25 ms of completions (at least concurrency, at most 1,000)."""
    client.send_batch(queue, list(range(300)))
    app = App()
    app.handler(queue)(noop)
    clock, inflight = ManualClock(), InFlight(4)
    submitted: list[Task] = []

    class Collect:
        def submit(self, tasks: list[Task], batch: Any) -> None:
            inflight.add(tasks)
            submitted.extend(tasks)

    def reader(**settings: Any) -> Reader:
        s = WorkerSettings(queues=(queue,), concurrency=4, **settings)
        return Reader(app, s, WorkerDb(client), inflight, Collect(), threading.Event(), clock, LOG)  # type: ignore[arg-type]

    def finish(n: int, seconds: float) -> None:
        for _ in range(n):
            inflight.finished += 1
        clock.advance(seconds)

    adaptive = reader()
    assert adaptive.prefetch() == 4  # nothing measured yet: concurrency
    assert adaptive.fill() == 4 and adaptive.fill() == 4  # running and waiting
    finish(2, 0.5)  # slow handlers, 4 msg/s: 25 ms of them is 0.1
    assert adaptive.prefetch() == 4
    finish(4000, 0.5)  # fast handlers, 8,000 msg/s: 25 ms of them is 200
    assert adaptive.prefetch() == 200
    for task in submitted:
        inflight.forget(task)
    submitted.clear()
    assert adaptive.fill() == 200  # one read takes the whole prefetch
    finish(10**6, 0.5)
    assert adaptive.prefetch() == 1000  # capped
    finish(0, 0.5)  # idle: back to concurrency
    assert adaptive.prefetch() == 4

    fixed = reader(batch=6)
    finish(4000, 0.5)
    assert fixed.prefetch() == 6
    app.handlers[queue] = Handler(queue, noop, transactional=False, is_async=False, batch=True)
    batched = reader()  # a batch handler gets `concurrency` a call, whatever the rate
    finish(4000, 0.5)
    assert batched.prefetch() == 4


def test_a_heartbeat_does_not_wait_behind_a_slow_ack_of_a_message_it_holds(
    client: Client, dsn: str, sql: Any, queue: str
) -> None:
    """An ack still running holds its row's lock; the other leases are extended meanwhile.

    It failed first: the heartbeat waited on the acked row's lock for as long
    as the ack ran, and the messages behind it in the acker's queue ran out
    of their leases and were handed out again.
    """
    client.send_batch(queue, [1, 2])
    clock, inflight, leases, _ = duties(client, vt=100, heartbeat_fraction=0.5)
    acking, waiting_ack = hold(client, inflight, clock, vt=100, n=2)
    for task in (acking, waiting_ack):
        inflight.begin([task], threading.Event(), clock.now())
        inflight.forget(task)
    inflight.awaiting_ack([acking, waiting_ack])
    with psycopg.connect(dsn) as ack:  # our own ack, its statement not finished yet
        ack.execute("DELETE FROM pgqueue.message WHERE msg_id = %s", (acking.msg.msg_id,))
        clock.advance(51)
        beat = threading.Thread(target=leases.heartbeat)
        beat.start()
        beat.join(10)
        blocked = beat.is_alive()
        ack.rollback()  # an ack that failed: the message is ours again, its lease too
    beat.join()
    assert not blocked, "the heartbeat waited for the ack's row lock"
    assert vt_left(client, sql, waiting_ack.msg.msg_id) > 95
    assert not acking.lease_lost and not waiting_ack.lease_lost
    clock.advance(1)
    leases.heartbeat()  # the lock is gone: the skipped lease is extended now
    assert vt_left(client, sql, acking.msg.msg_id) > 95


def test_the_reader_probes_a_paused_queue_once_a_poll_interval_and_sees_it_resumed(
    client: Client, queue: str
) -> None:
    client.send_batch(queue, list(range(3)))
    app = App()
    app.handler(queue)(noop)
    s = WorkerSettings(queues=(queue,), concurrency=4, poll_interval=2.0)
    clock, inflight = ManualClock(), InFlight(4)
    pauses = Pauses(s.queues, s.poll_interval, clock, LOG)
    client.observers.read_paused.append(pauses.read_paused)
    reader, _ = collecting_reader(client, app, s, inflight, clock, pauses)
    reads: list[str] = []
    client.observers.read_paused.append(reads.append)
    client.pause_queue(queue)
    assert reader.fill() == 0 and reads == [queue] and pauses.paused(queue)
    assert reader.fill() == 0 and reads == [queue]  # not read again before its probe
    clock.advance(1.9)
    assert reader.fill() == 0 and len(reads) == 1
    clock.advance(0.1)
    assert reader.fill() == 0 and len(reads) == 2  # the probe: still paused
    client.resume_queue(queue)
    assert reader.fill() == 0  # the next probe is 2 s away
    clock.advance(2.0)
    assert reader.fill() == 3 and not pauses.paused(queue)  # the probe found it running
    assert len(reads) == 2


def test_the_registry_heartbeats_once_its_interval_has_passed(client: Client, queue: str) -> None:
    s = WorkerSettings(queues=(queue,), registry_interval=5.0)
    clock, inflight = ManualClock(), InFlight(s.concurrency)
    pauses = Pauses(s.queues, s.poll_interval, clock, LOG)
    registry = Registry(WorkerDb(client), s, inflight, pauses, clock, LOG)
    assert registry.due_in() == 0
    registry.tick()
    [row] = client.list_workers()
    assert (row.worker_id, row.in_flight, row.stopping) == (registry.worker_id, 0, False)
    registry.tally.count(queue, "acked", 2)
    registry.tick()  # not due: nothing sent
    assert client.list_workers()[0].last_seen_at == row.last_seen_at
    assert registry.due_in() == 5.0
    clock.advance(5.0)
    client.pause_queue(queue)
    registry.tick()
    assert client.list_workers()[0].last_seen_at > row.last_seen_at
    assert pauses.paused(queue)  # the heartbeat said so
    assert sum(r.acked for r in client.queue_rates([queue], minutes=2)) == 2
    assert registry.tally.empty()
    registry.stop()
    assert client.list_workers()[0].stopping
    registry.deregister()
    assert client.list_workers() == []


def test_a_heartbeat_older_than_a_resume_does_not_pause_the_queue_again() -> None:
    """Found by CI: a heartbeat that read 'paused' just before a resume, applied after the
    resume's notification, paused the queue again for a whole poll interval."""
    clock = ManualClock()
    pauses = Pauses(["jobs"], 10.0, clock, LOG)
    pauses.update({"jobs": True}, as_of=clock.now())
    assert pauses.paused("jobs")
    asked = clock.now()  # a heartbeat's query begins: the queue is still paused
    clock.advance(0.1)
    pauses.resumed("jobs")  # the resume's notification
    clock.advance(0.1)
    pauses.update({"jobs": True}, as_of=asked)  # the heartbeat's answer arrives late
    assert not pauses.paused("jobs")
    assert pauses.before_read("jobs") is not None
    # a later heartbeat still pauses it
    pauses.update({"jobs": True}, as_of=clock.now())
    assert pauses.paused("jobs")


def test_a_paused_notice_of_a_read_begun_before_a_resume_does_not_pause_the_queue_again() -> None:
    """A probe read in flight when the queue is resumed returns its PGQ11 notice afterwards."""
    clock = ManualClock()
    pauses = Pauses(["jobs"], 10.0, clock, LOG)
    pauses.update({"jobs": True}, as_of=clock.now())
    clock.advance(10)
    token = pauses.before_read("jobs")  # the probe begins
    assert token is not None
    clock.advance(0.1)
    pauses.resumed("jobs")
    clock.advance(0.1)
    pauses.read_paused("jobs")  # the probe's notice, older than the resume
    pauses.after_read("jobs", token)
    assert not pauses.paused("jobs")
    # a read begun after the resume that meets a notice: paused again
    token = pauses.before_read("jobs")
    assert token is not None
    pauses.read_paused("jobs")
    assert pauses.paused("jobs")
