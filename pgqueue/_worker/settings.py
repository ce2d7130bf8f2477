"""How a worker runs: WorkerSettings, each from a flag or a PGQUEUE_* variable."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from pgqueue._errors import InvalidArgument


def _env_bool(value: str) -> bool:
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise InvalidArgument(f"expected on/off, got {value!r}")


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """How a worker runs; every field can come from a PGQUEUE_<FIELD> environment variable."""

    queues: tuple[str, ...] = ()
    concurrency: int = 4
    batch: int = 0
    readers: int = 1
    vt: int = 30
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
    startup_timeout: float = 60.0

    def __post_init__(self) -> None:
        problems = []
        if self.concurrency < 1:
            problems.append("concurrency must be >= 1")
        if self.batch < 0:
            problems.append("batch must be >= 0 (0: a prefetch sized by the handlers' rate)")
        if self.readers < 1:
            problems.append("readers must be >= 1")
        if self.vt < 1:
            problems.append("vt must be >= 1 second")
        if not 0 < self.heartbeat_fraction < 1:
            problems.append("heartbeat_fraction must be between 0 and 1")
        if self.ack not in ("delete", "archive"):
            problems.append("ack must be 'delete' or 'archive'")
        for name in (
            "hard_timeout",
            "poll_interval",
            "shutdown_grace",
            "sweep_interval",
            "startup_timeout",
        ):
            if getattr(self, name) < 0:
                problems.append(f"{name} must be >= 0")
        if self.backoff_base <= 0 or self.backoff_max < self.backoff_base:
            problems.append("need 0 < backoff_base <= backoff_max")
        if problems:
            raise InvalidArgument("invalid worker settings: " + "; ".join(problems))

    @property
    def pool_size(self) -> int:
        """Connections the worker's pool needs: handlers, readers, two ack threads, the loop."""
        return self.concurrency + self.readers + 3

    @property
    def batch_size(self) -> int:
        """Messages a batch handler gets per call (the fixed prefetch, when batch is set)."""
        return self.batch or self.concurrency

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> WorkerSettings:
        """Settings from PGQUEUE_* variables, then the explicit overrides (None means unset)."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(f"PGQUEUE_{f.name.upper()}")
            if raw is None or raw == "":
                continue
            try:
                if f.name == "queues":
                    values[f.name] = tuple(q.strip() for q in raw.split(",") if q.strip())
                elif f.type == "bool":
                    values[f.name] = _env_bool(raw)
                elif f.type == "int":
                    values[f.name] = int(raw)
                elif f.type == "float":
                    values[f.name] = float(raw)
                else:
                    values[f.name] = raw
            except ValueError as exc:
                raise InvalidArgument(f"PGQUEUE_{f.name.upper()}={raw!r}: {exc}") from exc
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)
