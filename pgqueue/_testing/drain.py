"""drain(): an App's handlers run in this process until nothing is visible, acked as by the worker.

Public as pgqueue.testing.drain (with Drained and DrainLimitReached).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from pgqueue._calls import encode_json
from pgqueue._client import Client
from pgqueue._errors import PgQueueError
from pgqueue._outcomes import Poison, Retry
from pgqueue._worker.acker import is_member
from pgqueue._worker.app import App, Handler
from pgqueue._worker.db import WorkerDb
from pgqueue._worker.dispatch import _batch_results
from pgqueue.types import Message


class DrainLimitReached(PgQueueError):
    """drain() stopped with messages still to run: max_messages ran, or the timeout passed.

    Usually a handler that sends to its own queue every time it runs; raise
    max_messages if the test really does run that many.
    """


@dataclass(frozen=True, slots=True)
class Drained:
    """What a drain ran, each message once per run, in the order the runs ended, by outcome."""

    acked: tuple[Message, ...] = ()  # the handler returned; the message was acked
    retried: tuple[Message, ...] = ()  # the handler raised Retry; the message is live again
    poisoned: tuple[Message, ...] = ()  # Poison, or a failure on its last attempt
    failed: tuple[Message, ...] = ()  # another exception (raise_errors=False), live again

    def counts(self) -> dict[str, int]:
        """How many runs ended each way."""
        return {
            "acked": len(self.acked),
            "retried": len(self.retried),
            "poisoned": len(self.poisoned),
            "failed": len(self.failed),
        }

    def __len__(self) -> int:
        """How many handler runs there were (a batch run counts each of its messages)."""
        return len(self.acked) + len(self.retried) + len(self.poisoned) + len(self.failed)


def drain(
    client: Client,
    app: App,
    queue: str | Sequence[str] | None = None,
    *,
    max_messages: int = 1000,
    timeout: float = 30.0,
    batch_size: int = 100,
    raise_errors: bool = True,
) -> Drained:
    """Run `app`'s handlers on `queue` (default: every queue the app handles) until none is visible.

    In this thread, one message at a time (one read of up to `batch_size`
    for a batch handler), a round over the queues at a time, so a fan-out's
    callback runs once its members have when its queue is drained too. Acks
    are the worker's: delete, complete_members for barrier members (with the
    handler's result), and a transactional handler's ack commits with its
    writes. What differs from the worker, for determinism: no backoff (a
    failed attempt is visible again at once; `Retry(delay=...)` keeps its
    delay), and a member's result that is not JSON raises instead of being
    stored as null.

    Errors: a handler's exception nacks its message(s) (on the last attempt
    they go to the poison table, as with the worker) and is re-raised, with a
    note saying which message; `raise_errors=False` records it in `failed`
    and goes on. `Poison` and `Retry` are the handler's decisions, not errors:
    they poison or nack the message as the worker would, are recorded, and
    never raised. Delayed messages are not waited for. DrainLimitReached
    when more than `max_messages` would run or `timeout` seconds passed
    (checked between runs: a handler that hangs is not interrupted).
    """
    queues = app.consumed((queue,) if isinstance(queue, str) else tuple(queue or ()))
    return _Drain(client, app, raise_errors).run(queues, max_messages, timeout, batch_size)


class _Drain:
    """One drain: reads, runs and acks, and what each run came to."""

    # A lease longer than any handler in a test should take: nobody else reads meanwhile.
    VT = 300

    def __init__(self, client: Client, app: App, raise_errors: bool) -> None:
        self.db = WorkerDb(client)
        self.client = client
        self.app = app
        self.raise_errors = raise_errors
        self.outcomes: dict[str, list[Message]] = {
            "acked": [],
            "retried": [],
            "poisoned": [],
            "failed": [],
        }
        self._runner: asyncio.Runner | None = None

    def run(
        self, queues: tuple[str, ...], max_messages: int, timeout: float, batch_size: int
    ) -> Drained:
        deadline = time.monotonic() + timeout
        ran = 0
        try:
            progressed = True
            while progressed:
                progressed = False
                for queue in queues:
                    handler = self.app.handlers[queue]
                    qty = max(1, min(batch_size, max_messages - ran)) if handler.batch else 1
                    msgs = self.client.read(queue, vt=self.VT, qty=qty)
                    if not msgs:
                        continue
                    if ran >= max_messages or time.monotonic() > deadline:
                        self.db.release_many(queue, msgs)
                        why = (
                            f"{max_messages} messages ran (max_messages)"
                            if ran >= max_messages
                            else f"{timeout} s passed (timeout)"
                        )
                        raise DrainLimitReached(
                            f"drain stopped with messages left in {queue!r}: {why}; a handler"
                            " that sends to its own queue each time never drains"
                        )
                    self._run(handler, msgs)
                    ran += len(msgs)
                    progressed = True
        finally:
            if self._runner is not None:
                self._runner.close()
        return Drained(
            *(tuple(self.outcomes[k]) for k in ("acked", "retried", "poisoned", "failed"))
        )

    def _run(self, handler: Handler, msgs: list[Message]) -> None:
        arg: Message | list[Message] = msgs if handler.batch else msgs[0]
        failure: Exception | None = None
        if handler.transactional:
            try:
                with self.db.transaction() as conn:
                    try:
                        results = self._results(handler, msgs, handler.func(arg, conn))
                    except Exception as exc:
                        failure = exc
                        raise  # rolls the handler's writes back
                    if not self.db.hold(handler.queue, msgs, conn):
                        raise PgQueueError(
                            f"another consumer took over a message of {handler.queue!r} while"
                            " drain() ran it (is a worker running on this database too?)"
                        )
                    self._ack(handler.queue, msgs, results, conn)
            except Exception as exc:
                if exc is not failure:
                    raise  # the database's, not the handler's
        else:
            try:
                results = self._results(handler, msgs, self._call(handler, arg))
            except Exception as exc:
                failure = exc
            else:
                self._ack(handler.queue, msgs, results, None)
        if failure is None:
            self.outcomes["acked"].extend(msgs)
        else:
            self._failed(handler, msgs, failure)

    def _results(self, handler: Handler, msgs: list[Message], result: Any) -> list[Any]:
        return _batch_results(handler, msgs, result) if handler.batch else [result]

    def _call(self, handler: Handler, arg: Message | list[Message]) -> Any:
        if not handler.is_async:
            return handler.func(arg)
        return self._await(handler.func(arg))

    def _await(self, coro: Coroutine[Any, Any, Any]) -> Any:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            if self._runner is None:
                self._runner = asyncio.Runner()
            return self._runner.run(coro)
        # An async test called drain(): a loop cannot run inside the running
        # one, so the handler runs on a loop of its own in a helper thread.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, coro).result()

    def _ack(self, queue: str, msgs: list[Message], results: list[Any], conn: Any) -> None:
        kinds: dict[bool, list[tuple[Message, Any]]] = {}
        for msg, result in zip(msgs, results, strict=True):
            kinds.setdefault(is_member(msg), []).append((msg, result))
        for member, group in kinds.items():
            if member:
                for _, result in group:
                    encode_json(result, "a barrier member's result")  # InvalidMessage, saying why
            self.db.ack(
                queue,
                member,
                [m.msg_id for m, _ in group],
                [m.enqueued_at for m, _ in group],
                [r for _, r in group] if member else [],
                conn,
            )

    def _failed(self, handler: Handler, msgs: list[Message], exc: Exception) -> None:
        if isinstance(exc, Poison):
            reason = str(exc) or "poisoned by its handler"
            for msg in msgs:
                self.db.poison(msg, reason)
                self.outcomes["poisoned"].append(msg)
            return
        delay = (exc.delay or 0) if isinstance(exc, Retry) else 0
        error = f"{type(exc).__name__}: {exc}"
        for msg in msgs:
            outcome = self.db.nack(msg, delay, error)
            kind = "retried" if isinstance(exc, Retry) else "failed"
            self.outcomes["poisoned" if outcome == "poisoned" else kind].append(msg)
        if isinstance(exc, Retry) or not self.raise_errors:
            return
        first = msgs[0]
        exc.add_note(
            f"pgqueue.testing.drain: raised by the handler of {handler.queue!r} for"
            f" msg_id {first.msg_id} (read_ct {first.read_ct}"
            + (f", and {len(msgs) - 1} more of its batch" if len(msgs) > 1 else "")
            + f"): {first.message!r}; {len(self.outcomes['acked'])} message(s) acked before it"
        )
        raise exc
