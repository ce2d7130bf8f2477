"""What a worker runs: an App's handlers by queue, and how to load an App by name."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pgqueue._errors import InvalidArgument

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class Handler:
    """A registered handler and how to call it."""

    queue: str
    func: Callable[..., Any]
    transactional: bool
    is_async: bool
    batch: bool = False


class App:
    """A registry of handlers by queue: `@app.handler("queue")`."""

    def __init__(self) -> None:
        """An app with no handlers yet."""
        self.handlers: dict[str, Handler] = {}

    def handler(
        self, queue: str, *, transactional: bool = False, batch: bool = False
    ) -> Callable[[F], F]:
        """Register a function (sync or async) as the handler of a queue.

        A handler gets the Message; its return value is the member result when
        the message is a barrier member. With transactional=True (sync only)
        it gets `(message, conn)` and its writes on `conn` commit in the same
        transaction as the ack: exactly-once effects for database work.

        With batch=True it gets the list of Messages of one read instead (and
        `conn` after it when transactional). They succeed or fail together:
        returning acks them all (None, or a list with one result per message
        for barrier members); raising retries them all, or poisons them all
        with Poison.
        """

        def register(func: F) -> F:
            if queue in self.handlers:
                raise InvalidArgument(f"queue {queue!r} already has a handler")
            is_async = inspect.iscoroutinefunction(func)
            if transactional and is_async:
                raise InvalidArgument("transactional handlers must be sync functions")
            self.handlers[queue] = Handler(queue, func, transactional, is_async, batch)
            return func

        return register


def load_app(path: str) -> App:
    """The App named by "module:attribute", with a clear error when it is not one."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise InvalidArgument(f"expected MODULE:APP (e.g. myproj.tasks:app), got {path!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidArgument(f"cannot import {module_name!r}: {exc}") from exc
    app = getattr(module, attr, None)
    if not isinstance(app, App):
        raise InvalidArgument(f"{path!r} is not a pgqueue.App (got {type(app).__name__})")
    return app
