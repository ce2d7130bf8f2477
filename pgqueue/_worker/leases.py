"""The worker's leases: heartbeats, hard timeouts, give-backs, nacks and poisons, all fenced.

Every change this duty makes to a lease names the read_ct of the read that
leased the message, so a worker that was stalled past its vt (and taken over)
changes nothing; it then logs `message.lease_lost` once and leaves that lease
alone for good.
"""

from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING, Any

from pgqueue._log import logs_at
from pgqueue._outcomes import Retry
from pgqueue._worker.clock import Clock
from pgqueue._worker.counting import Counts
from pgqueue._worker.db import DB_ERRORS, WorkerDb
from pgqueue._worker.inflight import InFlight, Task, by_queue, message_log
from pgqueue._worker.settings import WorkerSettings

if TYPE_CHECKING:
    from pgqueue._metrics import WorkerMetrics
    from pgqueue._worker.registry import Tally


class Leases:
    """Keeps the leases of running messages, and gives back what the worker will not finish."""

    def __init__(
        self,
        db: WorkerDb,
        inflight: InFlight,
        settings: WorkerSettings,
        clock: Clock,
        log: Any,
        metrics: WorkerMetrics | None = None,
        tally: Tally | None = None,
    ) -> None:
        """The lease duty of one worker; nacks and poisons count in `tally`, when given."""
        self.db = db
        self.count = Counts(metrics, tally)
        self.inflight = inflight
        self.settings = settings
        self.clock = clock
        self.log = log
        self.max_attempts: dict[str, int] = {}
        self._debug = logs_at(log, logging.DEBUG)  # a heartbeat's line per message only then

    def heartbeat(self) -> None:
        """Extend the leases of running messages that used up part of their vt.

        Only running ones (and finished ones waiting for their ack): a message
        waiting locally whose lease would need extending has waited too long
        for a handler, and goes back to the queue. One statement per queue,
        which never waits for a row lock: a lease whose row is locked (our own
        ack still running) is tried again at the next tick, not waited for.
        """
        s = self.settings
        running, waiting = self.inflight.due(self.clock.now(), s.vt * (1 - s.heartbeat_fraction))
        self.give_back_many(waiting, "waited a lease's worth for a handler")
        for queue, group in by_queue(running).items():
            sent = self.clock.now()  # the new lease ends no earlier than this + vt
            try:
                extended = self.db.extend_many(queue, [t.msg for t in group], s.vt)
            except DB_ERRORS as exc:
                ids = [t.msg.msg_id for t in group]
                self.log.error("message.heartbeat_failed", queue=queue, msg_ids=ids, error=str(exc))
                continue
            for task in group:
                done = extended.get(task.msg.msg_id)
                if done:
                    task.lease_until = sent + s.vt
                    if self._debug:
                        message_log(self.log, task.msg).debug("message.heartbeat", vt=s.vt)
                elif done is None:
                    self.lost(task)
                # False: its row is locked (our ack still running, or a reader
                # taking it over): tried again at the next tick

    def lost(self, task: Task) -> None:
        """Our lease on the message is gone: say so once, and never touch that lease again."""
        if self.inflight.mark_lease_lost(task):  # not for a heartbeat racing our own ack
            message_log(self.log, task.msg).warning("message.lease_lost")
            self.count(task.msg.queue, "lease_lost")

    def release_hung(self) -> None:
        """Give back the messages whose handlers ran past the hard timeout."""
        now = self.clock.now()
        hung = self.inflight.hung(now, self.settings.hard_timeout)
        for task in hung:
            message_log(self.log, task.msg).error(
                "handler.hung",
                running_for=round(now - task.started, 1),
                hard_timeout=self.settings.hard_timeout,
            )
        self.give_back_many(hung, "hung")
        if hung and self.inflight.healthy_threads() <= 0:
            self.log.error(
                "worker.stuck",
                concurrency=self.settings.concurrency,
                advice="every handler thread is in a hung handler: reading stops until one returns",
            )
            self.give_back_waiting("no handler thread can start it")

    def give_back_waiting(self, why: str) -> int:
        """Give back every message that waits locally and has not started; how many."""
        waiting = self.inflight.abandon_waiting()
        self.give_back_many(waiting, why)
        return len(waiting)

    def give_back_all(self, why: str) -> int:
        """Give back every message still held; how many."""
        left = self.inflight.abandon_all()
        self.give_back_many(left, why)
        return len(left)

    def give_back_many(self, tasks: list[Task], why: str) -> None:
        """Make abandoned tasks' messages visible now where our leases are still current.

        A stopping worker may hold hundreds of prefetched messages; they go
        back in one round trip per queue, not one each. Each is still logged
        (`message.released`): at WARNING when its handler had started, at
        DEBUG when it had only waited.
        """
        for task in tasks:
            self.inflight.drop(task)
        released = 0
        for queue, group in by_queue([t for t in tasks if not t.lease_lost]).items():
            try:
                ours = self.db.release_many(queue, [t.msg for t in group])
            except DB_ERRORS as exc:
                ids = [t.msg.msg_id for t in group]
                self.log.error("message.release_failed", queue=queue, msg_ids=ids, error=str(exc))
                continue
            back = [t for t in group if t.msg.msg_id in ours]
            for task in group:
                if task.msg.msg_id not in ours:
                    self.lost(task)
            released += len(back)
            if back:
                self.count(queue, "released", len(back))
            for task in back:
                mlog = message_log(self.log, task.msg)
                log = mlog.warning if task.running else mlog.debug
                log("message.released", why=why, started=task.running)
        if tasks:
            self.log.info("worker.gave_back", count=released, of=len(tasks), why=why)

    def nack(self, task: Task, exc: Exception, *, traceback: bool = True) -> None:
        """Give the failed attempt back with a backoff; its last one goes to the poison table.

        Its line carries the handler's traceback (not for a Retry the handler
        raised on purpose); a batch's messages share one failure, so only the
        first message's line carries it (traceback=False for the others).
        """
        s = self.settings
        msg = task.msg
        mlog = message_log(self.log, msg)
        if task.abandoned or task.lease_lost:
            return  # given back meanwhile, or the lease is another reader's: its run decides
        if isinstance(exc, Retry) and exc.delay is not None:
            delay = exc.delay
        else:
            backoff = min(s.backoff_max, s.backoff_base * 2 ** max(msg.read_ct - 1, 0))
            delay = round(backoff * random.uniform(0.5, 1.5))
        error = f"{type(exc).__name__}: {exc}"
        trace = exc if traceback and not isinstance(exc, Retry) else None
        try:
            outcome = self.db.nack(msg, max(0, int(delay)), error)
        except DB_ERRORS as nack_exc:
            mlog.error(
                "message.nack_failed", error=str(nack_exc), handler_error=error, exc_info=trace
            )
            return
        if outcome in ("retry", "poisoned"):
            self.count(msg.queue, "nacked" if outcome == "retry" else "poisoned")
        if outcome == "retry":
            mlog.warning("message.failed", error=error, retry_in=delay, exc_info=trace)
        elif outcome == "poisoned":
            mlog.warning(
                "message.poisoned",
                reason="max_attempts exceeded",
                error=error,
                max_attempts=self.max_attempts.get(msg.queue),
                by="nack",
                exc_info=trace,
            )
        else:
            mlog.warning("message.failed", error=error, exc_info=trace)
            self.lost(task)

    def poison(self, task: Task, exc: Exception) -> None:
        """Poison the message at once, as its handler asked, if our lease is still current."""
        if task.abandoned or task.lease_lost:
            return
        msg = task.msg
        reason = str(exc) or "poisoned by its handler"
        try:
            moved = self.db.poison(msg, reason)
        except DB_ERRORS as db_exc:
            message_log(self.log, msg).error("message.poison_failed", error=str(db_exc))
            return
        if moved:
            message_log(self.log, msg).warning("message.poisoned", reason=reason, by="handler")
            self.count(msg.queue, "poisoned")
        else:
            self.lost(task)
