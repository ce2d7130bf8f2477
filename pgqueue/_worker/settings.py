"""How a worker runs: WorkerSettings, each from a flag or a PGQUEUE_* variable."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import timedelta
from typing import Any

from pgqueue._calls import seconds
from pgqueue._errors import InvalidArgument, InvalidSettings, SettingProblem
from pgqueue._listen import DEFAULT_HOST


def _env_bool(value: str) -> bool:
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(value)


# What a PGQUEUE_* value must look like, by the field's type, when it does not parse.
_PARSE_REQUIREMENT = {"int": "must be a whole number", "float": "must be a number"}


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """How a worker runs; every field can come from a PGQUEUE_<FIELD> environment variable."""

    queues: tuple[str, ...] = ()
    concurrency: int = 4
    batch: int = 0
    readers: int = 1
    vt: int = 30  # whole seconds (a whole float or a timedelta is taken, as an int)
    heartbeat_fraction: float = 0.5
    hard_timeout: float = 0.0
    ack: str = "delete"
    poll_interval: float = 1.0
    listen: bool = True
    listen_dsn: str = ""
    shutdown_grace: float = 30.0
    backoff_base: float = 1.0
    backoff_max: float = 300.0
    health_file: str = ""
    sweep_interval: float = 10.0
    registry_interval: float = 5.0
    startup_timeout: float = 60.0
    metrics_port: int = 0
    trace_links: int = 127
    metrics_host: str = DEFAULT_HOST  # last, so positional arguments keep their places

    def __post_init__(self) -> None:
        # durations by the one rule of the API: vt in whole seconds (an int, a
        # whole float or a timedelta), the others in seconds (a timedelta too)
        problems: dict[str, str] = {}
        if not isinstance(self.vt, int) or isinstance(self.vt, bool):
            try:
                object.__setattr__(self, "vt", seconds("vt", self.vt))
            except InvalidArgument:
                problems["vt"] = "must be whole seconds (an int, a whole float or a timedelta)"
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "float" and isinstance(value, timedelta):
                object.__setattr__(self, f.name, value.total_seconds())
        if not problems:
            problems = self._problems()
        if problems:
            raise InvalidSettings(
                {n: SettingProblem(n, getattr(self, n), need) for n, need in problems.items()}
            )

    def _problems(self) -> dict[str, str]:
        """What each field out of its range must be, by field name; empty when all are fine."""
        problems = {}
        if self.concurrency < 1:
            problems["concurrency"] = "must be >= 1"
        if self.batch < 0:
            problems["batch"] = "must be >= 0 (0: a prefetch sized by the handlers' rate)"
        if self.readers < 1:
            problems["readers"] = "must be >= 1"
        if self.vt < 1:
            problems["vt"] = "must be >= 1 second"
        if not 0 < self.heartbeat_fraction < 1:
            problems["heartbeat_fraction"] = "must be between 0 and 1"
        if self.ack not in ("delete", "archive"):
            problems["ack"] = "must be delete or archive"
        for name in (
            "hard_timeout",
            "poll_interval",
            "shutdown_grace",
            "sweep_interval",
            "startup_timeout",
        ):
            if getattr(self, name) < 0:
                problems[name] = "must be >= 0"
        if not 0 <= self.registry_interval <= 10:
            # list_workers counts a worker alive for 15 s after its last heartbeat
            problems["registry_interval"] = "must be between 0 (off) and 10 seconds"
        if not 0 <= self.metrics_port <= 65535:
            problems["metrics_port"] = "must be a TCP port, 1-65535 (0: metrics off)"
        if not self.metrics_host.strip():
            problems["metrics_host"] = (
                f"must be an address to listen on ({DEFAULT_HOST}; 0.0.0.0 for every interface)"
            )
        if self.trace_links < 0:
            problems["trace_links"] = "must be >= 0 (0: a callback's run links no member runs)"
        if self.backoff_base <= 0:
            problems["backoff_base"] = "must be > 0"
        elif self.backoff_max < self.backoff_base:
            problems["backoff_max"] = f"must be >= backoff_base ({self.backoff_base:g})"
        return problems

    @property
    def pool_size(self) -> int:
        """Connections the worker's pool needs: handlers, readers, two ack threads, the loop."""
        return self.concurrency + self.readers + 3

    @property
    def batch_size(self) -> int:
        """Messages a batch handler gets per call (the fixed prefetch, when batch is set)."""
        return self.batch or self.concurrency

    @staticmethod
    def env_var(name: str) -> str:
        """The environment variable a field comes from: PGQUEUE_<FIELD>."""
        return f"PGQUEUE_{name.upper()}"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> WorkerSettings:
        """Settings from PGQUEUE_* variables, then the explicit overrides (None means unset).

        A value that is wrong raises InvalidSettings naming every wrong one,
        a variable by its name (PGQUEUE_VT) and an override by its field's;
        a variable an override replaces is not read at all.
        """
        env = os.environ if env is None else env
        given = {k: v for k, v in overrides.items() if v is not None}
        values: dict[str, Any] = {}
        raw: dict[str, str] = {}
        unparsed: dict[str, str] = {}
        for f in fields(cls):
            text = env.get(cls.env_var(f.name))
            if text is None or text == "" or f.name in given:
                continue
            raw[f.name] = text
            try:
                if f.name == "queues":
                    values[f.name] = tuple(q.strip() for q in text.split(",") if q.strip())
                elif f.type == "bool":
                    values[f.name] = _env_bool(text)
                elif f.type == "int":
                    values[f.name] = int(text)
                elif f.type == "float":
                    values[f.name] = float(text)
                else:
                    values[f.name] = text
            except ValueError:
                unparsed[f.name] = _PARSE_REQUIREMENT.get(str(f.type), "must be on or off")
        values.update(given)
        needs = dict(unparsed)
        try:
            settings = cls(**{k: v for k, v in values.items() if k not in unparsed})
        except InvalidSettings as exc:
            needs = {n: p.need for n, p in exc.problems.items()} | needs
        if not needs:
            return settings
        defaults = {f.name: f.default for f in fields(cls)}
        problems = {}
        for name, need in needs.items():
            if name in raw:
                problems[name] = SettingProblem(cls.env_var(name), raw[name], need)
            elif name in given:
                problems[name] = SettingProblem(name, given[name], need)
            else:  # a default, wrong only next to another setting (backoff_max < backoff_base)
                problems[name] = SettingProblem(cls.env_var(name), defaults[name], need)
        raise InvalidSettings(problems)
