"""What a worker runs: an App's handlers by queue, and how to load an App by name."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypeVar

from pgqueue._errors import InvalidArgument, PgQueueError, sql_literal
from pgqueue._words import queue_names

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

    def consumed(self, queues: Sequence[str] = ()) -> tuple[str, ...]:
        """The queues a worker of this app consumes: `queues`, else all it handles; each handled.

        InvalidArgument when a queue has no handler, or the app has none at all.
        """
        chosen = tuple(queues) or tuple(self.handlers)
        if not chosen:
            raise InvalidArgument("the app has no handlers; register one with @app.handler(queue)")
        missing = [q for q in chosen if q not in self.handlers]
        if missing:
            raise InvalidArgument(
                f"no handler for {queue_names(missing)}; the app handles {', '.join(self.handlers)}"
            )
        return chosen


def load_app(path: str) -> App:
    """The App named by "module:attribute"; InvalidArgument saying why when the path names none.

    A module that is found but fails to import (a dependency of it is
    missing) raises PgQueueError instead: the path was right, the module is not.
    """
    module_name, _, attr = path.partition(":")
    if not module_name:
        raise InvalidArgument(
            f"expected MODULE:APP (e.g. myproj.tasks:app), got {sql_literal(path)}"
        )
    module = _import(module_name)
    if not attr:
        raise InvalidArgument(f"expected MODULE:APP, got {sql_literal(path)}" + _apps_in(module))
    if not hasattr(module, attr):
        raise InvalidArgument(
            f"module {sql_literal(module_name)} has no attribute {sql_literal(attr)}"
            + _apps_in(module, none=", and")
        )
    app = getattr(module, attr)
    if not isinstance(app, App):
        raise InvalidArgument(
            f"{sql_literal(path)} is of type {type(app).__name__}, not a pgqueue.App"
            + _apps_in(module)
        )
    return app


def _import(module_name: str) -> ModuleType:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # Not found itself (or a package above it): the path is wrong. Any
        # other module not found was imported by it: the module is broken.
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise InvalidArgument(
                f"no module named {sql_literal(exc.name)} on the Python path (the current"
                " directory, PYTHONPATH and the installed packages)"
            ) from exc
        raise PgQueueError(f"importing {sql_literal(module_name)} failed: {exc}") from exc
    except ImportError as exc:
        raise PgQueueError(f"importing {sql_literal(module_name)} failed: {exc}") from exc


def _apps_in(module: ModuleType, none: str = "") -> str:
    """What a message adds about the Apps a module does have: their names, or that it has none."""
    names = sorted(name for name, value in vars(module).items() if isinstance(value, App))
    if not names:
        return f"{none or f'; module {sql_literal(module.__name__)} has'} no pgqueue.App at all"
    return f"; its pgqueue.App objects: {', '.join(names)} (use {module.__name__}:{names[0]})"
