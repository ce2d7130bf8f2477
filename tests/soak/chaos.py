"""The chaos soak: real consumer processes, real faults, and a ledger that must balance.

    python tests/soak/chaos.py --mode short      # what CI runs: a few minutes
    python tests/soak/chaos.py --mode long       # the figures in docs/reliability.md

Part 1, the soak. K `pgqueue worker` processes consume through a TCP fault
proxy while producer threads send single messages and fan out barriers of
1-500 members (some members fail for a while, some always, some outlast their
vt and live on heartbeats, some callbacks fan out again). Meanwhile a fault
thread SIGKILLs consumers (and starts new ones), terminates backends, cuts or
stalls every proxied connection, and once restarts the server (a crash:
``pg_ctl -m immediate``). Then the producers stop, the queues drain, and the
checker balances the books from the database (an audit trigger records every
row that enters or leaves ``pgqueue.message``) and from the handlers' own
append-only log.

Part 2, five scenarios, one at a time: a baseline batch of jobs, then the same
batch with one fault in the middle; each reports the fraction completed in
time against the baseline's.

Exits 1 when anything was lost, stuck, delivered after its ack, or called back
twice, when a barrier's counts are wrong, or when duplicate executions exceed
their bound (see docs/reliability.md for the bound and why it holds).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parent.parent)]

import psycopg  # noqa: E402
from psycopg.conninfo import conninfo_to_dict  # noqa: E402
from soak_app import CALLBACKS, JOBS, WORK  # noqa: E402
from support.db import LOCAL_DSN, drop_database, with_dbname  # noqa: E402
from support.faultproxy import FaultProxy  # noqa: E402

from pgqueue import Client, PgQueueError, RetryPolicy, Step  # noqa: E402
from pgqueue._calls import barrier as _barrier  # noqa: E402
from pgqueue._calls import workflow as _workflow  # noqa: E402
from pgqueue._log import configure_logging  # noqa: E402
from pgqueue._migrate import migrate  # noqa: E402

OBSERVER = "soak-observer"

AUDIT = """
CREATE TABLE soak_audit (
    op char(1) NOT NULL, queue_id int NOT NULL, msg_id bigint NOT NULL, read_ct int NOT NULL,
    message jsonb, headers jsonb, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE FUNCTION soak_audit_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO public.soak_audit (op, queue_id, msg_id, read_ct, message, headers)
        VALUES ('I', NEW.queue_id, NEW.msg_id, NEW.read_ct, NEW.message, NEW.headers);
        RETURN NEW;
    END IF;
    INSERT INTO public.soak_audit (op, queue_id, msg_id, read_ct)
    VALUES ('D', OLD.queue_id, OLD.msg_id, OLD.read_ct);
    RETURN OLD;
END $$;
CREATE TRIGGER soak_audit AFTER INSERT OR DELETE ON pgqueue.message
    FOR EACH ROW EXECUTE FUNCTION soak_audit_row();
CREATE TABLE soak_callback (
    barrier_id text NOT NULL, msg_id bigint NOT NULL, total int, succeeded int, failed int);
CREATE TABLE soak_workflow_callback (workflow_id text NOT NULL, msg_id bigint NOT NULL, state text);
"""


@dataclass
class Config:
    """One run's shape; `short` and `long` are presets."""

    duration: float = 90.0
    consumers: int = 3
    concurrency: int = 8
    vt: int = 4
    producers: int = 2
    rate: float = 300.0  # messages per second, all producers together
    fault_every: float = 3.0
    restart: bool = True
    drain_timeout: float = 180.0
    max_attempts: int = 10
    p_perm: float = 0.02
    p_fail: float = 0.05
    p_slow: float = 0.002
    p_nest: float = 0.2
    scenario_jobs: int = 3000
    scenario_timeout: float = 60.0
    seed: int = 0
    roles: bool = False  # producers and consumers log in as docs/security.md's roles

    @classmethod
    def preset(cls, mode: str) -> Config:
        """The `short` (CI) or `long` (figures) preset."""
        if mode == "long":
            return cls(
                duration=1200.0, consumers=4, rate=500.0, fault_every=5.0, scenario_jobs=10000
            )
        return cls()


# -- the database and the processes ------------------------------------------------


@contextlib.contextmanager
def soak_database(server_dsn: str, queues: dict[str, int]) -> Iterator[str]:
    """A fresh migrated database with the audit trigger and the given queues; its DSN.

    Dropped on the way out, whatever happened: each run left a `soak_…`
    database of about 11 MB on the shared server before.
    """
    name = f"soak_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        dsn = with_dbname(server_dsn, name)
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate(conn)
            conn.execute(AUDIT)
        with Client.from_dsn(dsn, max_size=1) as client:
            for queue, max_attempts in queues.items():
                client.create_queue(queue, max_attempts=max_attempts)
        yield dsn
    finally:
        drop_soak_database(server_dsn, name)


def drop_soak_database(server_dsn: str, name: str, timeout: float = 60) -> None:
    """Drop a soak database, cutting whoever is still on it; rides out a server restarting."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            drop_database(server_dsn, name)
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def login_roles(dsn: str, enabled: bool) -> tuple[str, str]:
    """DSNs for the producers and the consumers: least-privilege login roles when enabled.

    The roles are cluster-wide, so this is only for a private cluster.
    """
    if not enabled:
        return dsn, dsn
    with psycopg.connect(dsn, autocommit=True) as conn:
        for login, group in (("soak_producer", "producer"), ("soak_consumer", "consumer")):
            if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (login,)).fetchone():
                conn.execute(f"CREATE ROLE {login} LOGIN IN ROLE pgqueue_{group}")
        # The callback handler's own effect, written in its transaction with the ack.
        conn.execute("GRANT INSERT ON soak_callback TO soak_consumer")
        conn.execute("GRANT INSERT ON soak_workflow_callback TO soak_consumer")
    return with_dbname(dsn, _dbname(dsn), user="soak_producer"), with_dbname(
        dsn, _dbname(dsn), user="soak_consumer"
    )


def _dbname(dsn: str) -> str:
    return str(conninfo_to_dict(dsn)["dbname"])


@contextlib.contextmanager
def observer(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """A direct connection the faults leave alone (except a server restart)."""
    conn = psycopg.connect(
        with_dbname(dsn, _dbname(dsn), application_name=OBSERVER),
        autocommit=True,
        connect_timeout=5,
    )
    try:
        yield conn
    finally:
        conn.close()


def patiently(fn: Callable[[psycopg.Connection[Any]], Any], dsn: str, timeout: float = 120) -> Any:
    """Run fn on an observer connection, riding out a restart in progress."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with observer(dsn) as conn:
                return fn(conn)
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def terminate_backends(dsn: str, fraction: float, rng: random.Random) -> int:
    """pg_terminate_backend on a random `fraction` of the database's other backends."""

    def kill(conn: psycopg.Connection[Any]) -> int:
        pids = [
            r[0]
            for r in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid() AND application_name <> %s",
                (OBSERVER,),
            )
        ]
        chosen = rng.sample(pids, max(1, round(len(pids) * fraction))) if pids else []
        for pid in chosen:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        return len(chosen)

    return int(patiently(kill, dsn))


class Consumers:
    """`pgqueue worker soak_app:app` processes; killed ones are replaced on demand."""

    def __init__(self, dsn: str, logdir: Path, queues: list[str], cfg: Config) -> None:
        self.dsn, self.logdir, self.queues, self.cfg = dsn, logdir, queues, cfg
        self.procs: list[subprocess.Popen[bytes]] = []
        self.killed: set[int] = set()
        self.started = 0
        self.closed = False
        self._lock = threading.Lock()

    def __enter__(self) -> Consumers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """SIGKILL every worker still running; none is started after this."""
        with self._lock:
            self.closed = True
            procs = list(self.procs)
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()

    def spawn(self) -> subprocess.Popen[bytes]:
        """Start one more worker process (RuntimeError once closed)."""
        env = dict(
            os.environ,
            PGQUEUE_DSN=self.dsn,
            PGQUEUE_LOG_FORMAT="json",
            PGQUEUE_BACKOFF_BASE="0.2",
            PGQUEUE_BACKOFF_MAX="2",
            PGQUEUE_SWEEP_INTERVAL="5",
            SOAK_LOG_DIR=str(self.logdir),
            PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        )
        args = [sys.executable, "-m", "pgqueue", "worker", "soak_app:app"]
        for q in self.queues:
            args += ["--queue", q]
        args += ["--ack", "archive", "--vt", str(self.cfg.vt)]
        args += ["--concurrency", str(self.cfg.concurrency), "--poll-interval", "0.5"]
        args += ["--shutdown-grace", "20"]
        with self._lock:
            if self.closed:
                raise RuntimeError("the consumers are closed: no new worker")
            n = self.started
            self.started += 1
            out = (self.logdir / f"worker-{n}.log").open("ab")
            proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT)
            out.close()
            self.procs.append(proc)
        return proc

    def alive(self) -> list[subprocess.Popen[bytes]]:
        """Worker processes still running."""
        with self._lock:
            return [p for p in self.procs if p.poll() is None]

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL one worker and start its replacement."""
        with self._lock:
            self.killed.add(proc.pid)
        proc.kill()
        proc.wait()
        self.spawn()

    def unexpected_exits(self) -> list[tuple[int, int]]:
        """(pid, exit code) of workers that ended without being killed or stopped."""
        with self._lock:
            return [
                (p.pid, p.returncode)
                for p in self.procs
                if p.returncode is not None and p.pid not in self.killed and p.returncode != 0
            ]

    def stop(self, timeout: float = 60) -> list[int]:
        """SIGTERM every live worker; their exit codes."""
        live = self.alive()
        for p in live:
            p.send_signal(signal.SIGTERM)
        codes = []
        for p in live:
            try:
                codes.append(p.wait(timeout))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append(p.wait())
        return codes


# -- producers -------------------------------------------------------------------


@dataclass
class Ledger:
    """What the producers know they sent: confirmed single keys and barrier ids."""

    singles: dict[str, int] = field(default_factory=dict)
    barriers: dict[str, int] = field(default_factory=dict)
    workflows: list[str] = field(default_factory=list)
    open_barriers: int = 0  # of them, armed open and grown by add_members before a seal
    retries: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


# The failure policies barriers are armed with, at random.
POLICIES: list[dict[str, Any]] = [{}, {}, {"policy": "fail_fast"}, {"max_failures": 2}]


def design(rng: random.Random, cfg: Config) -> dict[str, Any]:
    """One member's behaviour, written into its payload."""
    r = rng.random()
    if r < cfg.p_perm:
        return {"perm": rng.choice(["raise", "poison"])}
    if r < cfg.p_perm + cfg.p_fail:
        return {"fail": rng.randint(1, 2), "ms": rng.choice([0, 1, 5])}
    if r < cfg.p_perm + cfg.p_fail + cfg.p_slow:
        return {"slow": round(cfg.vt * 1.6, 1)}
    return {"ms": rng.choice([0, 0, 1, 2, 5])}


def callback_message(rng: random.Random, cfg: Config, depth: int) -> dict[str, Any]:
    """A callback payload; nested ones fan out children, down to depth 2."""
    if depth >= 2 or rng.random() >= cfg.p_nest:
        return {"depth": depth}
    children = [design(rng, cfg) for _ in range(rng.randint(1, 20))]
    return {
        "depth": depth,
        "children": children,
        "child_callback": callback_message(rng, cfg, depth + 1),
    }


class Producer(threading.Thread):
    """Sends singles and fan-outs at its share of the rate, until told to stop."""

    def __init__(
        self, idx: int, dsn: str, cfg: Config, ledger: Ledger, stop: threading.Event
    ) -> None:
        super().__init__(daemon=True)
        self.idx, self.dsn, self.cfg, self.ledger, self.stopping = idx, dsn, cfg, ledger, stop
        self.rng = random.Random(cfg.seed * 1000 + idx)
        self.sent = 0
        self.error: BaseException | None = None

    def _until_confirmed(self, fn: Callable[[], Any]) -> Any:
        """Retry an idempotent send until the database confirms it (a lost reply is retried)."""
        while True:
            try:
                return fn()
            except PgQueueError:
                with self.ledger.lock:
                    self.ledger.retries += 1
                time.sleep(0.5)

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported by the runner: a producer must not die
            self.error = exc

    def _workflow(self, client: Client, wid: str) -> None:
        """A workflow: a, then a fan-out b and c, then d after both, then a cleanup e.

        Its members are designed like any message (some fail for good), and b
        fails under a random policy, so dependents are cancelled or run anyway.
        The start is one call retried as is (its token with it): a retry after
        a lost reply never starts a second run.
        """
        policy = self.rng.choice(POLICIES)
        call = _workflow.start_workflow(
            wid,
            [
                Step("a", WORK, design(self.rng, self.cfg)),
                Step(
                    "b",
                    WORK,
                    messages=[design(self.rng, self.cfg) for _ in range(self.rng.randint(1, 30))],
                    depends_on=("a",),
                    **policy,
                ),
                Step("c", WORK, design(self.rng, self.cfg), depends_on=("a",)),
                Step("d", WORK, design(self.rng, self.cfg), depends_on=("b", "c")),
                Step(
                    "e",
                    WORK,
                    design(self.rng, self.cfg),
                    depends_on=("d",),
                    on_dependency_failure="run",
                ),
            ],
            CALLBACKS,
        )
        self._until_confirmed(partial(client.run, call))

    def _open_barrier(
        self,
        client: Client,
        bid: str,
        members: list[dict[str, Any]],
        cb: dict[str, Any],
        policy: dict[str, Any],
    ) -> None:
        """Arm bid open with a first part of its members, add the rest in two calls, seal it.

        Each add is one call retried as is (its add key with it), so a retry
        after a lost reply adds nothing twice.
        """
        cut = self.rng.randint(0, len(members))
        mid = self.rng.randint(cut, len(members))
        self._until_confirmed(
            partial(
                client.open_barrier,
                WORK,
                callback_queue=CALLBACKS,
                callback_message=cb,
                barrier_id=bid,
                messages=members[:cut],
                **policy,
            )
        )
        for part in (members[cut:mid], members[mid:]):
            add = _barrier.add_members(bid, part)
            self._until_confirmed(partial(client.run, add))
        self._until_confirmed(partial(client.seal, bid))
        with self.ledger.lock:
            self.ledger.open_barriers += 1

    def _run(self) -> None:
        retry = RetryPolicy(attempts=20, deadline_seconds=30, initial_wait_seconds=0.05)
        share = self.cfg.rate / self.cfg.producers
        started = time.monotonic()
        with Client.from_dsn(self.dsn, min_size=1, max_size=2, retry=retry) as client:
            n = 0
            while not self.stopping.is_set():
                n += 1
                if self.rng.random() < 0.01:
                    wid = f"p{self.idx}-w{n}"
                    self._workflow(client, wid)
                    with self.ledger.lock:
                        self.ledger.workflows.append(wid)
                    self.sent += 5
                elif self.rng.random() < 0.98:
                    key = f"p{self.idx}-s{n}"
                    payload = {**design(self.rng, self.cfg), "single": key}
                    msg_id = self._until_confirmed(
                        partial(client.send, WORK, payload, dedupe_key=key)
                    )
                    with self.ledger.lock:
                        self.ledger.singles[key] = msg_id
                    self.sent += 1
                else:
                    bid = f"p{self.idx}-b{n}"
                    size = self.rng.randint(1, 500)
                    members = [design(self.rng, self.cfg) for _ in range(size)]
                    cb = callback_message(self.rng, self.cfg, 0)
                    policy = self.rng.choice(POLICIES)
                    if self.rng.random() < 0.25:
                        self._open_barrier(client, bid, members, cb, policy)
                    else:
                        self._until_confirmed(
                            partial(
                                client.fan_out,
                                WORK,
                                members,
                                callback_queue=CALLBACKS,
                                callback_message=cb,
                                barrier_id=bid,
                                **policy,
                            )
                        )
                    with self.ledger.lock:
                        self.ledger.barriers[bid] = size
                    self.sent += size
                ahead = self.sent / share - (time.monotonic() - started)
                if ahead > 0:
                    self.stopping.wait(ahead)


# -- faults ------------------------------------------------------------------------


class Faults(threading.Thread):
    """Injects one fault every `fault_every` seconds; the server restart once, midway."""

    def __init__(
        self,
        cfg: Config,
        dsn: str,
        consumers: Consumers,
        proxy: FaultProxy,
        restart: Callable[[], None] | None,
        stop: threading.Event,
    ) -> None:
        super().__init__(daemon=True)
        self.cfg, self.dsn, self.consumers, self.proxy = cfg, dsn, consumers, proxy
        self.restart, self.stopping = restart, stop
        self.rng = random.Random(cfg.seed + 7)
        self.counts: Counter[str] = Counter()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:
            self.error = exc

    def _run(self) -> None:
        started = time.monotonic()
        restart_at = started + self.cfg.duration / 2
        kinds: list[str] = []
        while not self.stopping.wait(self.cfg.fault_every * self.rng.uniform(0.5, 1.5)):
            if (
                self.restart is not None
                and not self.counts["restart"]
                and time.monotonic() > restart_at
            ):
                self.restart()
                self.counts["restart"] += 1
                continue
            if not kinds:  # every kind in turn, in a shuffled order each round
                kinds = ["sigkill", "terminate", "cut", "stall"]
                self.rng.shuffle(kinds)
            kind = kinds.pop()
            if kind == "sigkill":
                live = self.consumers.alive()
                if live:
                    self.consumers.kill(self.rng.choice(live))
            elif kind == "terminate":
                self.counts["backends terminated"] += terminate_backends(self.dsn, 0.5, self.rng)
            elif kind == "cut":
                self.counts["connections cut"] += self.proxy.cut_all()
            else:
                self.proxy.stall(self.rng.uniform(1.0, 3.0))
            self.counts[kind] += 1


def stop_thread(thread: threading.Thread, stop: threading.Event, timeout: float = 60) -> None:
    """Tell a thread to stop, and wait for it if it was started."""
    stop.set()
    if thread.is_alive():
        thread.join(timeout)


# -- the checker ---------------------------------------------------------------------


@dataclass
class Report:
    """The books after a run; `failures` lists every broken promise."""

    figures: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def fail(self, what: str, count: int, examples: list[Any]) -> None:
        """Record a broken promise when count > 0."""
        if count:
            self.failures.append(f"{what}: {count} (e.g. {examples[:5]})")


def read_log(logdir: Path) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """The handlers' log lines, by (queue, msg_id); a line cut short by SIGKILL is skipped."""
    events: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for path in sorted(logdir.glob("handlers-*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                e = json.loads(line)
            except json.JSONDecodeError:
                continue
            events[(e["q"], int(e["id"]))].append(e)
    return events


def expected_outcome(payload: Any) -> str:
    """What the payload designed: poisoned or succeeded."""
    return "poisoned" if isinstance(payload, dict) and payload.get("perm") else "succeeded"


def pgqueue_keys(headers: dict[str, Any]) -> dict[str, Any]:
    """What pgqueue wrote on a message (docs/security.md), flattened for the books:
    _pg_transport, a callback's record, a member's barrier_id and member_index, a step's."""
    flat: dict[str, Any] = dict(headers.get("_pg_callback") or {})
    member = headers.get("_pg_member") or {}
    if member:
        flat.update(barrier_id=member.get("barrier_id"), member_index=member.get("index"))
    flat.update(headers.get("_pg_step") or {})
    if headers.get("_pg_transport") is True:
        flat["_pg_transport"] = True
    return flat


def check(dsn: str, logdir: Path, ledger: Ledger | None, bound: int | None) -> Report:
    """Balance the books from the database and the handlers' log."""
    rep = Report()
    with observer(dsn) as conn:
        names = dict(conn.execute("SELECT queue_id, queue_name FROM pgqueue.queue").fetchall())
        inserted: dict[tuple[str, int], tuple[Any, dict[str, Any]]] = {}
        for qid, mid, message, headers in conn.execute(
            "SELECT queue_id, msg_id, message, headers FROM soak_audit WHERE op = 'I'"
        ):
            inserted[(names[qid], mid)] = (message, pgqueue_keys(headers or {}))
        deleted: dict[tuple[str, int], int] = {}
        deleted_twice = []
        for qid, mid, read_ct in conn.execute(
            "SELECT queue_id, msg_id, read_ct FROM soak_audit WHERE op = 'D'"
        ):
            key = (names[qid], mid)
            if key in deleted:
                deleted_twice.append(key)
            deleted[key] = read_ct
        present = {
            (names[q], m) for q, m in conn.execute("SELECT queue_id, msg_id FROM pgqueue.message")
        }
        poisoned = {
            (names[q], m) for q, m in conn.execute("SELECT queue_id, msg_id FROM pgqueue.poison")
        }
        members: dict[str, list[tuple[int, str | None]]] = defaultdict(list)
        member_outcome: dict[tuple[str, int], str | None] = {}
        ended_at: dict[tuple[str, int], float] = {}
        for bid, qid, mid, outcome, ended in conn.execute(
            "SELECT barrier_id, queue_id, msg_id, outcome, extract(epoch FROM completed_at)"
            " FROM pgqueue.barrier_member"
        ):
            members[bid].append((mid, outcome))
            member_outcome[(names[qid], mid)] = outcome
            if ended is not None:
                ended_at[(names[qid], mid)] = float(ended)
        barriers = {
            r[0]: r[1:]
            for r in conn.execute(
                "SELECT barrier_id, total, succeeded, failed, state, cancelled, remaining, policy,"
                " outcome, max_failures FROM pgqueue.barrier"
            )
        }
        effects = Counter(r[0] for r in conn.execute("SELECT barrier_id FROM soak_callback"))
        step_barriers = {
            r[0]
            for r in conn.execute(
                "SELECT barrier_id FROM pgqueue.barrier WHERE workflow_id IS NOT NULL"
            )
        }
        flows = dict(conn.execute("SELECT workflow_id, state FROM pgqueue.workflow").fetchall())
        steps = {
            (r[0], r[1]): r[2:]
            for r in conn.execute(
                "SELECT s.workflow_id, s.step, s.state, s.on_dependency_failure, s.barrier_id,"
                " extract(epoch FROM s.finished_at), b.outcome"
                " FROM pgqueue.workflow_step s LEFT JOIN pgqueue.barrier b USING (barrier_id)"
            )
        }
        deps: dict[tuple[str, str], list[str]] = defaultdict(list)
        for wid, step, dep in conn.execute(
            "SELECT workflow_id, step, depends_on FROM pgqueue.workflow_dep"
        ):
            deps[(wid, step)].append(dep)
        sends = Counter(
            (r[0], r[1])
            for r in conn.execute(
                "SELECT workflow_id, step FROM pgqueue.barrier WHERE workflow_id IS NOT NULL"
            )
        )
        flow_effects = Counter(
            r[0] for r in conn.execute("SELECT workflow_id FROM soak_workflow_callback")
        )
    log = read_log(logdir)

    singles = [k for k, (m, _) in inserted.items() if isinstance(m, dict) and "single" in m]
    callbacks = [k for k, (_, h) in inserted.items() if h.get("_pg_transport")]
    member_keys = [k for k, (_, h) in inserted.items() if "member_index" in h]
    lost = [k for k in inserted if k not in deleted and k not in present]
    # members a failing barrier cancelled: deleted by the firing, never to run
    # again (one may have run an attempt before, failed it and waited visible
    # for its retry: that is not a run after its cancellation)
    cancelled = {k for k, o in member_outcome.items() if o == "cancelled"}
    ran_cancelled = [
        k
        for k in cancelled
        if any(e["e"] == "start" and e["t"] > ended_at[k] for e in log.get(k, []))
    ]
    acked = [k for k in deleted if k not in poisoned and k not in cancelled]
    no_run = [k for k in acked if not any(e["e"] == "done" for e in log.get(k, []))]
    unexpected = [
        k
        for k, (m, h) in inserted.items()
        if not h.get("_pg_transport")
        and k in deleted
        and k not in cancelled
        and expected_outcome(m) != ("poisoned" if k in poisoned else "succeeded")
    ]
    after_ack = [
        k for k, evs in log.items() if k in deleted and max(e["rc"] for e in evs) > deleted[k]
    ]
    duplicates = sum(max(0, sum(e["e"] == "done" for e in evs) - 1) for evs in log.values())
    executions = sum(sum(e["e"] == "start" for e in evs) for evs in log.values())

    # Barriers: each fired once, its counts right three ways (members, callback, design).
    callback_headers: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for k in callbacks:
        callback_headers[inserted[k][1].get("barrier_id")].append(inserted[k][1])
    callbacks_of = {b: len(hs) for b, hs in callback_headers.items()}
    stranded = [b for b, row in barriers.items() if row[3] != "fired"]
    twice = [b for b in barriers if callbacks_of.get(b, 0) > 1 or effects[b] > 1]
    missing = [
        b
        for b in barriers
        if b not in step_barriers
        and row_fired(barriers[b])
        and (b not in callbacks_of or effects[b] == 0)
    ]
    flow_problems = check_workflows(
        flows, steps, deps, sends, flow_effects, inserted, members, log, ledger
    )
    wrong = []
    for bid, row in barriers.items():
        total, succeeded, failed, _state, n_cancelled, remaining, policy, outcome, limit = row
        outs = [o for _, o in members[bid]]
        ok = sum(o == "succeeded" for o in outs)
        designed_fail = sum(
            expected_outcome(inserted[("soak_work", mid)][0]) == "poisoned"
            for mid, _ in members[bid]
            if ("soak_work", mid) in inserted
        )
        tolerated = (limit or 0) if policy == "max_failures" else 0
        # the counts are frozen when it fires: what ended later (remaining) is
        # recorded on its member row only
        books = total == len(outs) and succeeded + failed + n_cancelled + remaining == total
        books = books and n_cancelled == sum(o == "cancelled" for o in outs)
        said = outcome == ("failed" if failed > tolerated else "succeeded")
        if policy == "wait_all" or outcome == "succeeded":
            # every member counted before it fired: the books match the design
            counts_ok = (succeeded, failed, n_cancelled, remaining) == (ok, total - ok, 0, 0)
            counts_ok = counts_ok and failed == designed_fail
        else:  # failed early: it fired at the failure that broke the policy
            # (one statement can fail several members at once: a read's poison drops)
            counts_ok = failed > tolerated and designed_fail >= failed
        cb_ok = all(
            (
                h.get("total"),
                h.get("succeeded"),
                h.get("failed"),
                h.get("cancelled"),
                h.get("state"),
            )
            == (total, succeeded, failed, n_cancelled, outcome)
            for h in callback_headers.get(bid, [])
        )
        if not (books and said and counts_ok and cb_ok):
            wrong.append(bid)
    unconfirmed: list[Any] = []
    if ledger is not None:
        by_single = Counter(inserted[k][0]["single"] for k in singles)
        unconfirmed += [s for s in ledger.singles if by_single[s] != 1]
        unconfirmed += [b for b in ledger.barriers if b not in barriers]
    bad_members = [k for k in member_keys if member_outcome.get(k) is None]

    def designed(key: str) -> list[tuple[str, int]]:
        return [k for k, (m, _) in inserted.items() if isinstance(m, dict) and m.get(key)]

    slow = designed("slow")
    rep.figures.update(
        {
            "messages sent": len(inserted),
            "singles": len(singles),
            "barrier members": len(member_keys),
            "callbacks": len(callbacks),
            "barriers": len(barriers),
            "nested barriers": sum("/child" in b for b in barriers),
            "barriers fail_fast / max_failures": (
                f"{sum(r[6] == 'fail_fast' for r in barriers.values())}"
                f" / {sum(r[6] == 'max_failures' for r in barriers.values())}"
            ),
            "barriers failed early by their policy": sum(
                r[6] != "wait_all" and r[7] == "failed" for r in barriers.values()
            ),
            "members cancelled (none started after)": len(cancelled),
            "open barriers grown, then sealed": ledger.open_barriers if ledger else "-",
            "workflows (steps)": f"{len(flows)} ({len(steps)})",
            "workflow steps succeeded / failed / cancelled": " / ".join(
                str(sum(v[0] == st for v in steps.values()))
                for st in ("succeeded", "failed", "cancelled")
            ),
            "designed to fail, then succeed": len(designed("fail")),
            "designed to fail always": len(designed("perm")),
            "slower than their vt": len(slow),
            "slow ones run to the end twice": sum(
                sum(e["e"] == "done" for e in log.get(k, [])) > 1 for k in slow
            ),
            "acked": len(acked),
            "poisoned": len(poisoned),
            "lost": len(lost) + len(no_run),
            "stuck": len(present),
            "duplicate callbacks": len(twice),
            "delivered after ack": len(after_ack),
            "handler executions": executions,
            "duplicate executions": duplicates,
            "duplicate bound": bound,
        }
    )
    # Every exit accounted for: what left the queue had entered it, and what
    # the poison table holds left the queue (so sent = acked + poisoned + stuck + lost).
    strays = [k for k in deleted if k not in inserted] + [k for k in poisoned if k not in deleted]
    rep.fail(
        "exits without a matching entry (not in the audit, or poisoned but not removed)",
        len(strays),
        strays,
    )
    rep.fail("lost: in the queue once, then gone with no trace", len(lost), lost)
    rep.fail("acked without a successful run", len(no_run), no_run)
    rep.fail("stuck in the queue after the drain", len(present), sorted(present))
    rep.fail("deleted twice", len(deleted_twice), deleted_twice)
    rep.fail("outcome other than designed", len(unexpected), unexpected)
    rep.fail("delivered after its ack", len(after_ack), after_ack)
    rep.fail("barriers not fired", len(stranded), stranded)
    rep.fail("barriers called back twice", len(twice), twice)
    rep.fail("fired barriers without their callback", len(missing), missing)
    rep.fail("barriers with wrong counts", len(wrong), wrong)
    rep.fail("members without an outcome", len(bad_members), bad_members)
    for what, found in flow_problems.items():
        rep.fail(what, len(found), found)
    rep.fail(
        "cancelled members that started after their cancellation", len(ran_cancelled), ran_cancelled
    )
    rep.fail("sends the producers confirmed but the database lacks", len(unconfirmed), unconfirmed)
    if bound is not None and duplicates > bound:
        rep.failures.append(f"duplicate executions {duplicates} exceed their bound {bound}")
    return rep


def check_workflows(
    flows: dict[str, str],
    steps: dict[tuple[str, str], tuple[Any, ...]],
    deps: dict[tuple[str, str], list[str]],
    sends: Counter[tuple[str, str]],
    effects: Counter[str],
    inserted: dict[tuple[str, int], tuple[Any, dict[str, Any]]],
    members: dict[str, list[tuple[int, str | None]]],
    log: dict[tuple[str, int], list[dict[str, Any]]],
    ledger: Ledger | None,
) -> dict[str, list[Any]]:
    """Every workflow's books: finished, each step sent once (or never, cancelled) after
    its dependencies ended, its state what its dependencies and its members made it, and
    one final callback carrying the workflow's state."""
    finals: dict[str, list[str]] = defaultdict(list)
    for _message, headers in inserted.values():
        if headers.get("_pg_transport") and headers.get("workflow_id"):
            finals[headers["workflow_id"]].append(headers.get("state"))
    found: dict[str, list[Any]] = {
        "workflows not finished": [w for w, st in flows.items() if st == "running"],
        "workflows without exactly one final callback (and one effect)": [
            w
            for w, st in flows.items()
            if finals.get(w) != [st] or (st != "running" and effects[w] != 1)
        ],
        "workflows the producers confirmed but the database lacks": [
            w for w in (ledger.workflows if ledger else []) if w not in flows
        ],
        "workflow steps sent twice, or sent when cancelled": [],
        "workflow steps whose state their dependencies or members contradict": [],
        "workflow steps started before a dependency ended": [],
        "workflows whose state their steps contradict": [],
    }
    by_flow: dict[str, list[str]] = defaultdict(list)
    for (wid, step), (state, on_failure, bid, _ended, outcome) in steps.items():
        by_flow[wid].append(state)
        expected_sends = 0 if state == "cancelled" else 1
        if sends[(wid, step)] != expected_sends:
            found["workflow steps sent twice, or sent when cancelled"].append((wid, step))
        dep_states = [steps[(wid, d)][0] for d in deps[(wid, step)]]
        failed_dep = any(d != "succeeded" for d in dep_states)
        should_cancel = failed_dep and on_failure == "cancel"
        consistent = (state == "cancelled") == should_cancel
        if state in ("succeeded", "failed"):
            consistent = consistent and (state == "succeeded") == (outcome == "succeeded")
        if not consistent:
            found["workflow steps whose state their dependencies or members contradict"].append(
                (wid, step, state)
            )
        if bid is not None and deps[(wid, step)]:
            dep_ended = max(float(steps[(wid, d)][3] or 0) for d in deps[(wid, step)])
            starts = [
                e["t"]
                for mid, _ in members.get(bid, [])
                for e in log.get(("soak_work", mid), [])
                if e["e"] == "start"
            ]
            if starts and min(starts) < dep_ended:
                found["workflow steps started before a dependency ended"].append((wid, step))
    for wid, st in flows.items():
        if st == "running":
            continue
        ok = all(s == "succeeded" for s in by_flow[wid])
        if st != ("succeeded" if ok else "failed"):
            found["workflows whose state their steps contradict"].append((wid, st))
    return found


def row_fired(row: tuple[Any, ...]) -> bool:
    """A barrier row whose state says it fired (or expired)."""
    return bool(row[3] in ("fired", "expired"))


# -- part 1: the soak ------------------------------------------------------------------


def wait_drained(dsn: str, timeout: float) -> float:
    """Seconds until no message is live, no barrier open and no workflow running; nan past it."""
    started = time.monotonic()
    while True:
        live, open_ = patiently(
            lambda c: c.execute(
                "SELECT (SELECT count(*) FROM pgqueue.message),"
                " (SELECT count(*) FROM pgqueue.barrier WHERE state = 'open')"
                " + (SELECT count(*) FROM pgqueue.workflow WHERE state = 'running')"
            ).fetchone(),
            dsn,
        )
        if live == 0 and open_ == 0:
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            return float("nan")
        time.sleep(0.5)


def soak(cfg: Config, server_dsn: str, restart: Callable[[], None] | None, workdir: Path) -> Report:
    """Part 1: producers, consumers and faults for cfg.duration seconds; then the books.

    Whatever happens, every worker it started is gone and its database dropped
    when it returns or raises.
    """
    queues = {WORK: cfg.max_attempts, CALLBACKS: cfg.max_attempts}
    with contextlib.ExitStack() as undo:
        dsn = undo.enter_context(soak_database(server_dsn, queues))
        logdir = workdir / "soak"
        logdir.mkdir(parents=True)
        proxy = FaultProxy(dsn)
        undo.callback(proxy.close)
        producer_dsn, consumer_dsn = login_roles(proxy.dsn, cfg.roles)
        consumers = undo.enter_context(Consumers(consumer_dsn, logdir, [WORK, CALLBACKS], cfg))
        for _ in range(cfg.consumers):
            consumers.spawn()
        ledger, stop_producing, stop_faults = Ledger(), threading.Event(), threading.Event()
        undo.callback(stop_producing.set)
        producers = [
            Producer(i, producer_dsn, cfg, ledger, stop_producing) for i in range(cfg.producers)
        ]
        faults = Faults(cfg, dsn, consumers, proxy, restart, stop_faults)
        undo.callback(stop_thread, faults, stop_faults)  # it starts workers: stop it first
        t0 = time.time()
        for p in producers:
            p.start()
        faults.start()
        time.sleep(cfg.duration)
        stop_producing.set()
        for p in producers:
            p.join(120)
        stop_faults.set()
        faults.join(120)
        t1 = time.time()
        drain = wait_drained(dsn, cfg.drain_timeout)
        unexpected = consumers.unexpected_exits()
        codes = consumers.stop()
        proxy.close()

        # What one consumer can have finished but not yet acked when a fault hits:
        # its running handlers, the messages waiting locally (the prefetch: 25 ms of
        # completions, under concurrency at the producers' 300 msg/s),
        # and one more read's worth that finished while the ack was being retried.
        held = cfg.concurrency * 3
        c = faults.counts
        bound = (
            c["sigkill"] * held
            + (c["restart"] + c["terminate"] + c["cut"] + c["stall"]) * cfg.consumers * held
        )
        rep = check(dsn, logdir, ledger, bound)
        acked_in_chaos = patiently(
            lambda conn: conn.execute(
                "SELECT count(*) FROM soak_audit WHERE op = 'D'"
                " AND at BETWEEN to_timestamp(%s) AND to_timestamp(%s)",
                (t0, t1),
            ).fetchone()[0],
            dsn,
        )
        rep.figures.update(
            {
                "chaos seconds": round(t1 - t0),
                "consumers": cfg.consumers,
                "logged in as": "soak_producer, soak_consumer" if cfg.roles else "the owner",
                "consumer processes started": consumers.started,
                "faults": dict(sorted(c.items())),
                "producer retries": ledger.retries,
                "acks/s during chaos": round(acked_in_chaos / (t1 - t0)),
                "drain seconds": round(drain, 1),
                "worker exit codes at the end": codes,
            }
        )
        rep.fail("workers that exited on their own", len(unexpected), unexpected)
        rep.fail("workers that did not stop cleanly", sum(x != 0 for x in codes), codes)
        for p in producers:
            if p.error is not None:
                rep.failures.append(f"producer {p.idx} died: {p.error!r}")
        if faults.error is not None:
            rep.failures.append(f"fault thread died: {faults.error!r}")
        if drain != drain:
            rep.failures.append(f"not drained within {cfg.drain_timeout:.0f} s")
        return rep


# -- part 2: the five scenarios ------------------------------------------------------------


@dataclass
class Phase:
    """One batch of jobs: how much finished in time, and how long it took."""

    done: int = 0
    jobs: int = 0
    seconds: float = 0.0
    # From the moment the server answered again after the fault to the first
    # job completed after it, in seconds (None: no fault, or none completed).
    recovery: float | None = None

    @property
    def completion(self) -> float:
        """Fraction of the batch completed within the timeout."""
        return self.done / self.jobs if self.jobs else 0.0


def _completed(dsn: str, qid: int, ids: list[int]) -> int:
    return int(
        patiently(
            lambda c: c.execute(
                "SELECT count(*) FROM soak_audit"
                " WHERE op = 'D' AND queue_id = %s AND msg_id = ANY(%s)",
                (qid, ids),
            ).fetchone()[0],
            dsn,
        )
    )


def run_phase(dsn: str, client: Client, cfg: Config, fault: Callable[[], None] | None) -> Phase:
    """Send a batch; inject `fault` once a quarter of it is done; wait for all or the timeout."""
    qid = patiently(
        lambda c: c.execute(
            "SELECT queue_id FROM pgqueue.queue WHERE queue_name = %s", (JOBS,)
        ).fetchone()[0],
        dsn,
    )
    ids: list[int] = []
    for start in range(0, cfg.scenario_jobs, 500):
        n = min(500, cfg.scenario_jobs - start)
        ids += client.send_batch(JOBS, [{"ms": 20}] * n)
    started = time.monotonic()
    phase = Phase(jobs=len(ids))
    injected = fault is None
    ready_at = None
    while time.monotonic() - started < cfg.scenario_timeout:
        phase.done = _completed(dsn, qid, ids)
        if phase.done == len(ids):
            break
        if not injected and phase.done >= len(ids) // 4:
            fault()  # type: ignore[misc]
            injected = True
            # the server's clock when it answers again: what the audit stamps
            ready_at = patiently(lambda c: c.execute("SELECT clock_timestamp()").fetchone()[0], dsn)
        time.sleep(0.1)
    phase.seconds = time.monotonic() - started
    if ready_at is not None:
        first = patiently(
            lambda c: c.execute(
                "SELECT extract(epoch FROM min(at) - %s) FROM soak_audit"
                " WHERE op = 'D' AND queue_id = %s AND msg_id = ANY(%s) AND at >= %s",
                (ready_at, qid, ids, ready_at),
            ).fetchone()[0],
            dsn,
        )
        phase.recovery = None if first is None else float(first)
    return phase


class Hogs:
    """Other clients holding every connection slot but `free` of them."""

    def __init__(self, server_dsn: str, free: int) -> None:
        self.conns: list[psycopg.Connection[Any]] = []
        with psycopg.connect(server_dsn, autocommit=True) as c:
            limit = int(c.execute("SHOW max_connections").fetchone()[0])  # type: ignore[index]
        while True:
            try:
                self.conns.append(psycopg.connect(server_dsn, autocommit=True, connect_timeout=3))
            except psycopg.OperationalError:
                break
            if len(self.conns) > limit:
                break
        for conn in self.conns[:free]:  # the server is full now: free `free` slots again
            conn.close()
        self.conns = self.conns[free:]

    def release(self) -> None:
        """Close every held connection."""
        for conn in self.conns:
            conn.close()


def scenario(
    name: str,
    cfg: Config,
    server_dsn: str,
    restart: Callable[[], None] | None,
    workdir: Path,
    stop_start: tuple[Callable[[], None], Callable[[], None]] | None = None,
) -> dict[str, Any]:
    """One scenario: a baseline batch, then a batch with the fault; the books for both.

    Whatever happens, its workers are gone, the fault undone and its database
    dropped when it returns or raises.
    """
    with contextlib.ExitStack() as undo:
        dsn = undo.enter_context(soak_database(server_dsn, {JOBS: cfg.max_attempts}))
        logdir = workdir / name
        logdir.mkdir(parents=True)
        producer_dsn, consumer_dsn = login_roles(dsn, cfg.roles)
        consumers = undo.enter_context(
            Consumers(
                consumer_dsn, logdir, [JOBS], Config(**{**cfg.__dict__, "concurrency": 4, "vt": 3})
            )
        )
        for _ in range(2):
            consumers.spawn()
        rng = random.Random(cfg.seed + 11)
        undo_fault = undo.enter_context(contextlib.ExitStack())  # before the drain, or on error
        notes: list[str] = []

        def repeated_kills() -> None:
            stop_kills = threading.Event()

            def loop() -> None:
                while not stop_kills.wait(2.0):
                    live = consumers.alive()
                    if live:
                        consumers.kill(rng.choice(live))

            killer = threading.Thread(target=loop, daemon=True)
            killer.start()
            undo_fault.callback(stop_thread, killer, stop_kills)

        def exhaust() -> None:
            hogs = Hogs(server_dsn, free=4)
            notes.append(f"other clients held {len(hogs.conns)} connections, 4 left free")
            undo_fault.callback(hogs.release)
            terminate_backends(dsn, 1.0, rng)  # the consumers must come back through 4 slots

        def outage() -> None:
            # down for 10 s: long enough for reconnection back-offs to grow
            if stop_start is None:
                return
            stop_start[0]()
            try:
                time.sleep(10)
            finally:
                stop_start[1]()

        faults: dict[str, Callable[[], None]] = {
            "postgres_restart": restart or (lambda: None),
            "postgres_outage": outage,
            "pg_backend_kill": lambda: (terminate_backends(dsn, 1.0, rng), None)[1],
            "pool_exhaustion": exhaust,
            "crash_recovery": lambda: consumers.kill(consumers.alive()[0]),
            "repeated_kills": repeated_kills,
        }
        with Client.from_dsn(
            producer_dsn, max_size=2, retry=RetryPolicy(attempts=30, deadline_seconds=60)
        ) as client:
            wait_for_consumers(dsn)
            base = run_phase(dsn, client, cfg, None)
            hit = run_phase(dsn, client, cfg, faults[name])
            undo_fault.close()
            drain = wait_drained(dsn, cfg.scenario_timeout)
        unexpected = consumers.unexpected_exits()
        consumers.stop()
        rep = check(dsn, logdir, None, None)
    ratio = hit.completion / base.completion if base.completion else 0.0
    return {
        "scenario": name,
        "baseline completed": f"{base.completion:.0%} in {base.seconds:.1f} s",
        "with fault completed": f"{hit.completion:.0%} in {hit.seconds:.1f} s",
        "recovered / baseline": ratio,
        "throughput ratio": base.seconds / hit.seconds if hit.seconds else 0.0,
        "ready to first completion": hit.recovery,
        "lost": rep.figures["lost"],
        "stuck": rep.figures["stuck"],
        "drained": drain == drain,
        "notes": notes,
        "failures": rep.failures
        + ([f"workers that exited on their own: {unexpected}"] if unexpected else [])
        + (
            []
            if restart or name not in ("postgres_restart", "postgres_outage")
            else ["no private server to restart"]
        ),
    }


def wait_for_consumers(dsn: str, timeout: float = 60) -> None:
    """Until a worker has connected (their start-up imports take a moment)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        n = patiently(
            lambda c: c.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND application_name = 'pgqueue'"
            ).fetchone()[0],
            dsn,
        )
        if n:
            return
        time.sleep(0.2)


SCENARIOS = (
    "postgres_restart",
    "postgres_outage",
    "pg_backend_kill",
    "pool_exhaustion",
    "crash_recovery",
    "repeated_kills",
)


# -- output -------------------------------------------------------------------------------


def print_soak(rep: Report) -> None:
    """The soak's one table."""
    print("\n| soak | value |\n|---|---|")
    for key, value in rep.figures.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v}" for k, v in value.items()) or "none"
        print(f"| {key} | {value} |")


def print_scenarios(rows: list[dict[str, Any]]) -> None:
    """The scenarios' table: completion in time with the fault against the baseline."""
    print("\n| scenario | baseline | with fault | recovered / baseline | throughput ratio", end="")
    print(" | server ready to first completion | lost | stuck |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        gap = r["ready to first completion"]
        print(
            f"| {r['scenario']} | {r['baseline completed']} | {r['with fault completed']} |"
            f" {r['recovered / baseline']:.0%} | {r['throughput ratio']:.2f} |"
            f" {'-' if gap is None else f'{gap:.2f} s'} | {r['lost']} | {r['stuck']} |"
        )
    for r in rows:
        for note in r["notes"]:
            print(f"\n{r['scenario']}: {note}")


def main(argv: list[str] | None = None) -> int:
    """Run the soak and the scenarios; 0 only when every promise held."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--mode", choices=["short", "long"], default="short")
    ap.add_argument("--only", choices=["soak", "scenarios"], help="run one part only")
    ap.add_argument("--duration", type=float, help="seconds of chaos (overrides the mode)")
    ap.add_argument("--consumers", type=int, help="worker processes (overrides the mode)")
    ap.add_argument("--rate", type=float, help="messages per second sent (overrides the mode)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--no-roles",
        action="store_true",
        help="producers and consumers log in as the owner, not as pgqueue_producer/_consumer",
    )
    ap.add_argument(
        "--dsn",
        help="use this server instead of a private one (no server restarts then)",
    )
    ap.add_argument("--workdir", type=Path, help="where logs go (default: a temporary directory)")
    ap.add_argument("--json", type=Path, help="also write the figures here as JSON")
    args = ap.parse_args(argv)
    # SIGTERM (a CI job cancelled) unwinds like an error: workers stopped, databases dropped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    # the runner's own retries (and psycopg_pool's warnings about them) are expected here
    configure_logging(level="ERROR")
    cfg = Config.preset(args.mode)
    for name in ("duration", "consumers", "rate"):
        if getattr(args, name) is not None:
            setattr(cfg, name, getattr(args, name))
    cfg.seed = args.seed
    workdir = args.workdir or Path(f"/tmp/pgqueue-soak-{uuid.uuid4().hex[:8]}")
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"pgqueue soak ({args.mode}): logs in {workdir}", flush=True)

    with contextlib.ExitStack() as stack:
        server_dsn, restart = args.dsn, None
        if not server_dsn:
            from benchmarks.server import private_cluster

            try:
                cluster = stack.enter_context(private_cluster())
                server_dsn, restart = cluster.dsn, cluster.restart
                cfg.roles = not args.no_roles
            except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
                server_dsn = os.environ.get("PGQUEUE_TEST_DSN", LOCAL_DSN)
                print(f"no private server ({exc}): using {server_dsn}, without restarts")
        failures: list[str] = []
        out: dict[str, Any] = {"mode": args.mode, "config": cfg.__dict__}
        if args.only != "scenarios":
            rep = soak(cfg, server_dsn, restart, workdir)
            print_soak(rep)
            failures += rep.failures
            out["soak"] = rep.figures
        if args.only != "soak":
            rows = []
            fast = partial(cluster.restart, "fast") if restart else None
            stop_start = (partial(cluster.stop, "fast"), cluster.start) if restart else None
            for name in SCENARIOS:
                row = scenario(name, cfg, server_dsn, fast, workdir, stop_start)
                print(f"{name}: {row['recovered / baseline']:.0%}", flush=True)
                rows.append(row)
                failures += [f"{name}: {f}" for f in row["failures"]]
                if row["recovered / baseline"] < 0.95:
                    failures.append(f"{name}: recovered {row['recovered / baseline']:.0%} < 95%")
            print_scenarios(rows)
            out["scenarios"] = rows
        if args.json:
            args.json.write_text(json.dumps(out, indent=2, default=str))
    if failures:
        print("\nFAILED:\n- " + "\n- ".join(failures))
        return 1
    print("\nevery promise held")
    return 0


if __name__ == "__main__":
    sys.exit(main())
