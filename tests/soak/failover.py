"""The failover soak: the chaos soak's load on a pg_auto_failover formation whose primary moves.

    python tests/soak/failover.py --mode short                       # CI: about 3 minutes
    python tests/soak/failover.py --mode long --failovers 12         # by hand
    python tests/soak/failover.py --mode long --failovers 12 --async

A monitor and three nodes (docs/design/failover.md, sections 2 and 6) run on
local ports under a temporary directory. Producers and `pgqueue worker`
processes (chaos.py's, imported) reach the primary through the formation's
multi-host URI (`target_session_attrs=read-write`), while a fault thread moves
the primary in a shuffled cycle: `pg_autoctl perform switchover`, `perform
failover`, and a SIGKILL of the primary's keeper and Postgres followed by
`pg_autoctl run` to bring it back as a standby. Each fault waits until the
formation is whole again, plus a jittered 5-10 s.

The books are the chaos soak's (nothing lost, stuck, delivered after its ack or
called back twice; duplicates within the bound, each failover counted like a
restart), plus: no consumer exited unless told, no pgqueue connection on a
standby at the end, and no commit that was cancelled while it waited for
synchronous replication (`commit.not_replicated`, or the server's "canceling
wait for synchronous replication" warning). With `--async`
(`synchronous_commit = local`) a confirmed send may be missing only when the
LSN read after it is past the switch point of its timeline (section 5): those
are reported as lost to async, with the WAL bytes past the switch point.

Skips (exit 0, the reason printed first) without pg_autoctl, without
PostgreSQL 15's pg_ctl, or as root without a way to run as `postgres`. Exits 1
when a promise is broken; the engine's and the workers' logs then go to
$PGQUEUE_ARTIFACTS when it is set.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import itertools
import json
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parent.parent)]

import psycopg  # noqa: E402
from chaos import (  # noqa: E402
    Config,
    Consumers,
    Ledger,
    Producer,
    Report,
    check,
    login_roles,
    patiently,
    print_soak,
    read_log,
    soak_database,
    stop_thread,
    wait_drained,
)
from soak_app import CALLBACKS, WORK  # noqa: E402
from support.db import with_dbname  # noqa: E402

from pgqueue._log import configure_logging  # noqa: E402

PG_BIN = Path("/usr/lib/postgresql/15/bin")
SUPERUSER = "postgres"
KINDS = ("switchover", "failover", "sigkill")
# Engine stalls (EngineStall) a run retries before it fails, and their figure's name.
MAX_STALLS = 1
STALLS_FIGURE = "engine stalls retried (no new primary after a SIGKILL)"

# Fast failure detection (section 2): a dead primary is noticed in about 3 s and
# demoted after 5, instead of 20 and 30.
MONITOR_SETTINGS = {
    "shared_buffers": "'128MB'",
    "pgautofailover.health_check_period": "1000",
    "pgautofailover.health_check_timeout": "1000",
    "pgautofailover.health_check_max_retries": "1",
    "pgautofailover.health_check_retry_delay": "500",
    "pgautofailover.node_considered_unhealthy_timeout": "3000",
    "pgautofailover.primary_demote_timeout": "5000",
}
# pg_autoctl sizes memory from the host's RAM (6 GB of shared_buffers each on a
# 24 GB machine). The first node's postgresql.auto.conf is copied by every
# standby's pg_basebackup, so these reach all nodes before their first start.
# checkpoint_completion_target 0: pg_basebackup starts with a spread
# checkpoint, which kept a standby in `catchingup` for 94 s; unspread, it is
# done at once (a standby is `secondary` about 2 s after it starts).
NODE_SETTINGS = {
    "shared_buffers": "'128MB'",
    "effective_cache_size": "'512MB'",
    "maintenance_work_mem": "'64MB'",
    "work_mem": "'4MB'",
    "wal_keep_size": "'256MB'",
    "checkpoint_completion_target": "0",
}
ASYNC_SETTINGS = {"synchronous_commit": "'local'"}

# The server's WARNING when a commit waiting for its standby is cancelled: the
# client is told "committed" for what the standby may not have (section 5).
NOT_REPLICATED = "canceling wait for synchronous replication"
# The same wait ended by a terminated connection: the client gets an error, not
# a success, and retries (counted, not a failure).
TERMINATED_IN_SYNC_WAIT = "canceling the wait for synchronous replication"
# What a node logs when pg_autoctl turns synchronous replication off (a primary
# entering wait_primary). pg_autoctl then runs `SELECT pg_cancel_backend(pid)
# FROM pg_stat_activity WHERE wait_event = 'SyncRep'` (in its binary): the
# commits that waited on a standby that is gone are cancelled into "committed
# locally". The monitor refuses a failover until a standby has caught up
# again, so those commits are not lost by one (docs/design/failover.md,
# section 5); they are reported apart from any other cancelled wait.
SYNC_OFF = 'parameter "synchronous_standby_names" changed to ""'
ENGINE_CANCEL_WINDOW = 5.0  # seconds after SYNC_OFF that a cancel is pg_autoctl's
AFTER_ACK = "delivered after its ack"  # chaos.check's name for the broken promise
LOG_EVENTS = ("connection.retry", "listen.reconnecting", "listen.failed", "commit.not_replicated")


def skip_reason() -> str | None:
    """Why this machine cannot run the soak (None: it can)."""
    if shutil.which("pg_autoctl") is None:
        return "no pg_autoctl (apt-get install postgresql-15-auto-failover)"
    if not (PG_BIN / "pg_ctl").exists():
        return f"no PostgreSQL 15 pg_ctl in {PG_BIN}"
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            return "running as root without runuser: Postgres and pg_autoctl refuse root"
        try:
            pwd.getpwnam(SUPERUSER)
        except KeyError:
            return f"running as root without a {SUPERUSER} user to run Postgres as"
    return None


def as_owner(cmd: list[str]) -> list[str]:
    """Postgres and pg_autoctl refuse to run as root: run as postgres there."""
    return ["runuser", "-u", SUPERUSER, "--", *cmd] if os.geteuid() == 0 else cmd


def free_ports(n: int) -> list[int]:
    """n distinct ports free on every interface (the nodes listen on '*')."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def lsn(text: str) -> int:
    """An LSN ('16/B374D848') as a byte position."""
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) + int(lo, 16)


# -- processes by PID ------------------------------------------------------------------


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time) of a live process; None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    if fields[0] == "Z":
        return None
    return int(fields[1]), int(fields[19])


def descendants(roots: Iterable[int]) -> list[int]:
    """Every live process below the given PIDs, found by parent PID, never by name."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            children.setdefault(st[0], []).append(int(entry))
    found: list[int] = []
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def postmaster_pid(pgdata: Path) -> int | None:
    """The PID in pgdata/postmaster.pid, when there is one."""
    try:
        first = (pgdata / "postmaster.pid").read_text().split("\n", 1)[0]
    except OSError:
        return None
    return int(first) if first.strip().isdigit() else None


# -- the engine ------------------------------------------------------------------------


@dataclass
class Node:
    """One pg_autoctl service: the monitor or a Postgres node."""

    name: str
    port: int
    pgdata: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None


class FormationError(RuntimeError):
    """The engine did not do what it was asked within its time."""


class EngineStall(FormationError):
    """After a SIGKILL, the engine named no new primary in time (its fault, not pgqueue's)."""


class Formation:
    """A pg_auto_failover monitor and Postgres nodes on free local ports, under `root`.

    Every process it starts is recorded by PID (and start time, against PID
    reuse); `teardown` stops them all and is safe to call more than once.
    """

    def __init__(self, root: Path, nodes: int = 3, synchronous: bool = True) -> None:
        self.root = root
        self.synchronous = synchronous
        root.mkdir(parents=True)
        ports = free_ports(nodes + 1)
        self.monitor = Node("monitor", ports[0], root / "monitor", root / "monitor.log")
        self.nodes = [
            Node(f"node{i}", port, root / f"node{i}", root / f"node{i}.log")
            for i, port in enumerate(ports[1:], start=1)
        ]
        self.monitor_uri = (
            f"postgres://autoctl_node@localhost:{self.monitor.port}/pg_auto_failover"
            "?sslmode=disable"
        )
        self.recorded: dict[int, int] = {}  # pid -> start time
        self._lock = threading.Lock()
        self._torn_down = False
        for sub in ("config", "data", "run"):
            (root / sub).mkdir()
        if os.geteuid() == 0:
            for path in (root, root / "config", root / "data", root / "run"):
                shutil.chown(path, SUPERUSER, SUPERUSER)
            os.chmod(root / "run", 0o700)

    # -- running pg_autoctl

    def _env(self) -> dict[str, str]:
        return {
            "PATH": f"{PG_BIN}:/usr/bin:/bin",
            "HOME": str(self.root),
            "XDG_CONFIG_HOME": str(self.root / "config"),
            "XDG_DATA_HOME": str(self.root / "data"),
            "XDG_RUNTIME_DIR": str(self.root / "run"),
            "PG_AUTOCTL_MONITOR": self.monitor_uri,
            "LANG": "C.UTF-8",
        }

    def _command(self, *args: str) -> list[str]:
        """pg_autoctl with these arguments, as the owner, in this formation's environment."""
        env = [f"{k}={v}" for k, v in self._env().items()]
        return as_owner(["env", *env, "pg_autoctl", *args])

    def autoctl(self, *args: str, timeout: float = 90) -> str:
        """Run one pg_autoctl command to its end; its stdout (FormationError on failure)."""
        try:
            done = subprocess.run(
                self._command(*args),
                capture_output=True,
                timeout=timeout,
                cwd=self.root,
            )
        except subprocess.TimeoutExpired as exc:
            raise FormationError(f"pg_autoctl {' '.join(args)}: no answer in {timeout} s") from exc
        if done.returncode != 0:
            tail = done.stderr.decode(errors="replace").strip().splitlines()[-5:]
            raise FormationError(f"pg_autoctl {' '.join(args)} failed: {' | '.join(tail)}")
        return done.stdout.decode()

    def _spawn(self, node: Node, *args: str) -> None:
        """Start a long-running pg_autoctl service for `node`, its output to the node's log."""
        with self._lock:
            if self._torn_down:
                raise FormationError("the formation is torn down")
            out = node.log.open("ab")
            node.proc = subprocess.Popen(
                self._command(*args),
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.root,
                start_new_session=True,
            )
            out.close()
        self._record([node.proc.pid])

    def _record(self, pids: Iterable[int]) -> None:
        with self._lock:
            for pid in pids:
                st = _stat(pid)
                if st is not None:
                    self.recorded[pid] = st[1]

    def _ours(self, pid: int) -> bool:
        """A live process this formation started or that descends from one (same start time)."""
        st = _stat(pid)
        return st is not None and self.recorded.get(pid) == st[1]

    def record_tree(self) -> list[int]:
        """Record every process now below the services (Postgres included); those alive.

        Only by descent from what was started here: a PID read from a file
        (postmaster.pid, pg_autoctl.pid) may be stale and reused by a stranger.
        """
        services = [self.monitor, *self.nodes]
        self._record(n.proc.pid for n in services if n.proc is not None and n.proc.poll() is None)
        with self._lock:
            known = list(self.recorded)
        live = [p for p in known if self._ours(p)]
        self._record(descendants(live))
        with self._lock:
            known = list(self.recorded)
        return [p for p in known if self._ours(p)]

    def _append_settings(self, node: Node, settings: dict[str, str]) -> None:
        """Settings that win over pg_autoctl's (postgresql.auto.conf is read last)."""
        with (node.pgdata / "postgresql.auto.conf").open("a") as conf:
            conf.write("# the failover soak's settings\n")
            for name, value in settings.items():
                conf.write(f"{name} = {value}\n")

    # -- building it

    def create(self, timeout: float = 60) -> float:
        """Monitor, primary and standbys, each created then tuned before its first run; seconds."""
        started = time.monotonic()
        deadline = started + timeout
        common = ["--hostname", "localhost", "--auth", "trust", "--no-ssl"]
        m = self.monitor
        self.autoctl(
            "create", "monitor", "--pgdata", str(m.pgdata), "--pgport", str(m.port), *common
        )
        self._append_settings(m, MONITOR_SETTINGS)
        self._spawn(m, "run", "--pgdata", str(m.pgdata))
        self._until(deadline, "the monitor answers", lambda: self._answers(m, "pg_auto_failover"))
        first, *standbys = self.nodes
        node_settings = NODE_SETTINGS | ({} if self.synchronous else ASYNC_SETTINGS)
        self.autoctl("create", "postgres", *self._node_args(first), *common)
        self._append_settings(first, node_settings)
        self._spawn(first, "run", "--pgdata", str(first.pgdata))
        self._until(deadline, "the first node is single", lambda: self._states() == ["single"])
        for node in standbys:
            self._spawn(node, "create", "postgres", *self._node_args(node), *common, "--run")
        self.wait_whole(max(1.0, deadline - time.monotonic()))
        self.record_tree()
        return time.monotonic() - started

    def _node_args(self, node: Node) -> list[str]:
        return [
            "--pgdata",
            str(node.pgdata),
            "--pgport",
            str(node.port),
            "--name",
            node.name,
            "--dbname",
            "soak",
            "--pgctl",
            str(PG_BIN / "pg_ctl"),
            "--monitor",
            self.monitor_uri,
        ]

    def _answers(self, node: Node, dbname: str) -> bool:
        try:
            with psycopg.connect(
                self.node_dsn(node, dbname, user="autoctl_node"), connect_timeout=2
            ):
                return True
        except psycopg.OperationalError:
            return False

    @staticmethod
    def _until(deadline: float, what: str, ready: Any) -> None:
        while not ready():
            if time.monotonic() > deadline:
                raise FormationError(f"timed out waiting until {what}")
            time.sleep(0.25)

    # -- reading it

    def state(self) -> list[dict[str, Any]]:
        """The monitor's view, one dict per node (`pg_autoctl show state --json`)."""
        found: list[dict[str, Any]] = json.loads(
            self.autoctl("show", "state", "--json", "--monitor", self.monitor_uri, timeout=20)
        )
        return found

    def _states(self) -> list[str]:
        try:
            return [n["current_group_state"] for n in self.state()]
        except (FormationError, ValueError):
            return []

    def node(self, name: str) -> Node:
        """A node by its name."""
        return next(n for n in self.nodes if n.name == name)

    def primary(self) -> Node:
        """The node the monitor has as primary now."""
        for n in self.state():
            if n["current_group_state"] in ("primary", "wait_primary", "single"):
                return self.node(n["nodename"])
        raise FormationError("the monitor reports no primary")

    def whole(self) -> bool:
        """One primary, every other node a secondary, every node where it was assigned."""
        try:
            states = self.state()
        except (FormationError, ValueError):
            return False
        current = sorted(n["current_group_state"] for n in states)
        settled = all(n["current_group_state"] == n["assigned_group_state"] for n in states)
        return settled and current == ["primary"] + ["secondary"] * (len(self.nodes) - 1)

    def wait_whole(self, timeout: float) -> float:
        """Seconds until the formation is whole (FormationError past the timeout)."""
        started = time.monotonic()
        self._until(started + timeout, "the formation is whole", self.whole)
        return time.monotonic() - started

    def wait_new_primary(self, old: str, timeout: float = 90) -> tuple[str, int]:
        """Until a node other than `old` is promoted: its name and timeline."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                for n in self.state():
                    promoted = n["current_group_state"] in ("primary", "wait_primary")
                    if promoted and n["nodename"] != old:
                        return str(n["nodename"]), int(n.get("reported_tli") or 0)
            except (FormationError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise FormationError(f"no new primary within {timeout} s of leaving {old}")
            time.sleep(0.2)

    def uri(self) -> str:
        """The formation's multi-host URI (`pg_autoctl show uri`), as the superuser."""
        shown = self.autoctl("show", "uri", "--formation", "default", "--monitor", self.monitor_uri)
        return with_dbname(shown.strip(), "soak", user=SUPERUSER, connect_timeout=2)

    def node_dsn(self, node: Node, dbname: str, user: str = SUPERUSER) -> str:
        """A direct DSN to one node (no failover in it)."""
        return f"host=localhost port={node.port} dbname={dbname} user={user} sslmode=disable"

    def timeline(self, node: Node) -> int:
        """The timeline a primary writes on now (the monitor's reported_tli may lag)."""
        with psycopg.connect(self.node_dsn(node, "postgres"), connect_timeout=5) as conn:
            row = conn.execute("SELECT pg_walfile_name(pg_current_wal_lsn())").fetchone()
        return int(str(row[0])[:8], 16) if row else 0

    def switch_points(self, dbname: str) -> dict[int, int]:
        """Where each timeline ended: {timeline: LSN}, from the current timeline's history file."""
        with psycopg.connect(self.node_dsn(self.primary(), dbname), autocommit=True) as conn:
            row = conn.execute("SELECT pg_walfile_name(pg_current_wal_lsn())").fetchone()
            tli = int(str(row[0])[:8], 16) if row else 1
            if tli <= 1:
                return {}
            text = conn.execute(
                "SELECT pg_read_file(%s)", (f"pg_wal/{tli:08X}.history",)
            ).fetchone()
        points: dict[int, int] = {}
        for line in str(text[0] if text else "").splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[0].isdigit():
                points[int(parts[0])] = lsn(parts[1])
        return points

    def server_logs(self) -> list[list[str]]:
        """Every node's server log files, as lines.

        pg_basebackup and pg_rewind copy the log directory too, so one file
        may be found on several nodes: classify_sync_waits counts a line once.
        """
        found = []
        for node in self.nodes:
            for path in sorted((node.pgdata / "log").glob("*")):
                with contextlib.suppress(OSError):
                    found.append(path.read_text(errors="replace").splitlines())
        return found

    # -- faults

    def perform(self, what: str) -> subprocess.Popen[bytes]:
        """`pg_autoctl perform switchover|failover`, running (it returns once promoted)."""
        log = (self.root / f"perform-{what}.log").open("ab")
        proc = subprocess.Popen(
            self._command("perform", what, "--monitor", self.monitor_uri),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.root,
            start_new_session=True,
        )
        log.close()
        self._record([proc.pid])
        return proc

    def keeper_pid(self, node: Node) -> int | None:
        """The PID pg_autoctl wrote for the node's keeper (under XDG_RUNTIME_DIR)."""
        path = self.root / "run" / "pg_autoctl" / str(node.pgdata).lstrip("/") / "pg_autoctl.pid"
        try:
            first = path.read_text().split("\n", 1)[0].strip()
        except OSError:
            return None
        return int(first) if first.isdigit() else None

    def _node_pids(self, node: Node) -> set[int]:
        """The node's keeper, postmaster and everything below them, by PID (ours only)."""
        self.record_tree()
        files = (self.keeper_pid(node), postmaster_pid(node.pgdata))
        roots = {p for p in files if p and self._ours(p)}
        service = node.proc.pid if node.proc is not None and node.proc.poll() is None else None
        found = roots | set(descendants([*roots, *([service] if service else [])]))
        self._record(found)
        return found - {service} if service else found

    def kill(self, node: Node) -> float:
        """SIGKILL the node's keeper, everything below it and its postmaster, by PID.

        Returns the epoch of the SIGKILL: finding the PIDs first (a walk of
        /proc) took seconds on a loaded machine, and must not count. Looks
        again afterwards: a keeper that outlived the sweep restarted Postgres
        at once, and no failover followed.
        """
        self.record_tree()
        pids = self._node_pids(node)
        at = time.time()
        for _ in range(5):
            self._sigkill(pids)
            time.sleep(0.2)
            pids = self._node_pids(node)
            if not pids:
                break
        else:
            raise FormationError(f"{node.name} keeps coming back after SIGKILL: {sorted(pids)}")
        if node.proc is not None:
            node.proc.wait(10)
        return at

    def _sigkill(self, pids: set[int], timeout: float = 10) -> int:
        """SIGKILL these PIDs, those recorded with their start time only: never a reused PID."""
        deadline = time.monotonic() + timeout
        killed = 0
        while True:
            live = [p for p in pids if self._ours(p)]
            if not live:
                return killed
            for p in live:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGKILL)
                    killed += 1
            if time.monotonic() > deadline:
                raise FormationError(f"processes survived SIGKILL: {live}")
            time.sleep(0.1)

    def restart_node(self, node: Node) -> None:
        """`pg_autoctl run` on a node whose service was killed: it rejoins as a standby."""
        self._spawn(node, "run", "--pgdata", str(node.pgdata))

    # -- leaving

    def copy_logs(self, dest: Path) -> None:
        """The services' output and every server log, into dest."""
        dest.mkdir(parents=True, exist_ok=True)
        for path in self.root.glob("*.log"):
            shutil.copy(path, dest / path.name)
        for node in [self.monitor, *self.nodes]:
            for path in sorted((node.pgdata / "log").glob("*")):
                with contextlib.suppress(OSError):
                    shutil.copy(path, dest / f"{node.name}-{path.name}")

    def teardown(self) -> None:
        """Stop every service, then SIGKILL whatever it left (by recorded PID); remove the data."""
        with self._lock:
            if self._torn_down:
                return
            self._torn_down = True
        with contextlib.suppress(OSError, FileNotFoundError):
            self.record_tree()
        services = [*self.nodes, self.monitor]
        for node in services:
            if node.proc is not None and node.proc.poll() is None and node.pgdata.exists():
                with contextlib.suppress(FormationError):
                    self.autoctl("stop", "--pgdata", str(node.pgdata), "--immediate", timeout=20)
        for node in services:
            if node.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    node.proc.wait(15)
        left = set(self.record_tree())
        self._sigkill(left)
        for node in services:
            if node.proc is not None:
                node.proc.wait(5)
        shutil.copytree(self.root, self.root.with_name("engine-logs"), ignore=_not_logs)
        shutil.rmtree(self.root, ignore_errors=True)


def _not_logs(directory: str, names: list[str]) -> list[str]:
    """copytree's filter: keep the services' and the servers' logs only."""
    base = Path(directory)
    keep_all = base.name == "log"
    return [
        n
        for n in names
        if not keep_all
        and not n.endswith(".log")
        and not (base / n / "log").is_dir()
        and n != "log"
    ]


# -- the load's receipts ------------------------------------------------------------------


UNREAD = -1  # a receipt's timeline when its LSN could not be read
# How long before a SIGKILL a commit or a read may have been lost to async
# replication. The lag here is milliseconds; a second is generous, and keeps a
# loss far from any failover a bug.
LOSS_WINDOW = 1.0


@dataclass(frozen=True, slots=True)
class Receipt:
    """When a send was confirmed, and (async) an LSN read after it on its timeline."""

    at: float
    timeline: int = 0
    lsn: int = 0


class WalClock:
    """Reads (timeline, pg_current_wal_lsn()) on the primary, one connection per thread.

    Read after a send returned, it is an upper bound of the send's commit LSN
    on that timeline (section 5).
    """

    def __init__(self, dsn: str | None) -> None:
        self.dsn = dsn
        self._local = threading.local()

    def stamp(self) -> Receipt:
        """Now, and the WAL position when asked to read it (UNREAD when the read failed).

        One try: a read after a reconnection would be on another server, maybe
        the new primary, and say nothing about where the send committed.
        """
        if self.dsn is None:
            return Receipt(time.time())
        at = time.time()
        conn = getattr(self._local, "conn", None)
        try:
            if conn is None or conn.closed:
                conn = psycopg.connect(
                    self.dsn, autocommit=True, connect_timeout=2, application_name="soak-wal-clock"
                )
                self._local.conn = conn
            row = conn.execute(
                "SELECT pg_current_wal_lsn()::text, pg_walfile_name(pg_current_wal_lsn())"
            ).fetchone()
        except psycopg.Error:
            if conn is not None:
                conn.close()
            self._local.conn = None
            return Receipt(at, UNREAD)
        assert row is not None
        return Receipt(at, int(row[1][:8], 16), lsn(row[0]))


class Receipts(dict[str, int]):
    """The ledger's confirmed singles or barriers, each stamped when the producer records it."""

    def __init__(self, clock: WalClock) -> None:
        super().__init__()
        self.clock = clock
        self.receipts: dict[str, Receipt] = {}

    def __setitem__(self, key: str, value: int) -> None:
        super().__setitem__(key, value)
        self.receipts[key] = self.clock.stamp()


class ReceiptList(list[str]):
    """The ledger's confirmed workflows, stamped likewise."""

    def __init__(self, clock: WalClock) -> None:
        super().__init__()
        self.clock = clock
        self.receipts: dict[str, Receipt] = {}

    def append(self, key: str) -> None:
        super().append(key)
        self.receipts[key] = self.clock.stamp()


def stamped_ledger(clock: WalClock) -> Ledger:
    """chaos.Ledger whose entries carry their receipts."""
    return Ledger(singles=Receipts(clock), barriers=Receipts(clock), workflows=ReceiptList(clock))


def receipts(ledger: Ledger) -> dict[str, Receipt]:
    """Every receipt of a stamped ledger, by key."""
    found: dict[str, Receipt] = {}
    for part in (ledger.singles, ledger.barriers, ledger.workflows):
        found.update(getattr(part, "receipts", {}))
    return found


class TimedProducer(Producer):
    """chaos.Producer, also recording how long each confirmed call blocked, retries included."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[float, float]] = []

    def _until_confirmed(self, fn: Callable[[], Any]) -> Any:
        started = time.time()
        result = super()._until_confirmed(fn)
        self.calls.append((started, time.time()))
        return result


# -- the faults ------------------------------------------------------------------------------


@dataclass
class Failover:
    """One fault and what it did."""

    kind: str
    old: str
    started: float  # epoch seconds
    new: str = "-"
    timeline: int = 0
    to_primary: float = float("nan")  # seconds from the fault to the monitor's new primary
    to_whole: float = float("nan")  # seconds from the fault to one primary and all secondaries
    error: str | None = None
    killed_at: float | None = None  # epoch of the SIGKILL (sigkill only)
    producer_gap: float = float("nan")  # the longest gap between confirmed sends around it
    send_blocked: float = float("nan")  # the longest a producer's call waited to be confirmed
    ack_gap: float = float("nan")  # the longest gap between acks around it
    events: Counter[str] = field(default_factory=Counter)  # log events until the next fault
    switch_point: int | None = None  # where its old timeline ended
    lost_to_async: int = 0
    # bytes from the switch point to the last send confirmed on the old timeline
    # (its LSN read after it): > 0 is WAL the promoted node never had; None: no stamps
    wal_past_switch: int | None = None


class Failovers(threading.Thread):
    """Moves the primary `count` times, in a shuffled cycle of the three kinds."""

    def __init__(self, formation: Formation, count: int, seed: int, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.formation, self.count, self.stopping = formation, count, stop
        self.rng = random.Random(seed + 22)
        self.done: list[Failover] = []
        # faults the engine stalled on and the formation recovered from: retried, at most
        # MAX_STALLS of them, each with the monitor's last events (see inject)
        self.stalls: list[str] = []
        self.stall_kills: list[float] = []  # their SIGKILLs' epochs, which may excuse async losses
        self.error: BaseException | None = None
        self.finished = threading.Event()

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported by the runner
            self.error = exc
        finally:
            self.finished.set()

    def _run(self) -> None:
        kinds: list[str] = []
        while len(self.done) < self.count and not self.stopping.is_set():
            self.formation.wait_whole(120)
            if self.stopping.wait(self.rng.uniform(5.0, 10.0)):
                return
            if not kinds:
                kinds = list(KINDS)
                self.rng.shuffle(kinds)
            kind = kinds.pop()
            try:
                record = self.inject(kind)
            except EngineStall as stall:
                self.stalls.append(str(stall))
                print(f"{kind}: retried: {stall}", flush=True)
                if len(self.stalls) > MAX_STALLS:
                    raise
                kinds.append(kind)
                continue
            self.done.append(record)
            if record.error is not None:
                return

    def inject(self, kind: str) -> Failover:
        """One fault, timed until a new primary and until the formation is whole again."""
        f = self.formation
        old = f.primary()
        started = time.time()
        record = Failover(kind, old.name, started)
        t0 = time.monotonic()
        try:
            perform = None
            if kind == "sigkill":
                record.started = record.killed_at = f.kill(old)
                t0 += record.started - started
            else:
                perform = f.perform(kind)
            try:
                record.new, record.timeline = f.wait_new_primary(old.name)
            except FormationError as exc:
                if kind != "sigkill":
                    raise
                self.stall_kills.append(record.started)
                raise self._stalled(old, exc) from exc
            record.to_primary = time.monotonic() - t0
            if perform is not None and perform.wait(90) != 0:
                record.error = f"pg_autoctl perform {kind} exited {perform.returncode}"
            if kind == "sigkill":
                f.restart_node(old)
            f.wait_whole(120)
            record.to_whole = time.monotonic() - t0
            f.record_tree()
            record.timeline = f.timeline(f.node(record.new))
        except EngineStall:
            raise
        except (FormationError, subprocess.TimeoutExpired, psycopg.Error) as exc:
            record.error = str(exc)
        print(
            f"{kind}: {record.old} -> {record.new} (timeline {record.timeline}) new primary"
            f" after {record.to_primary:.1f} s, whole after {record.to_whole:.1f} s",
            flush=True,
        )
        return record

    def _stalled(self, old: Node, exc: FormationError) -> BaseException:
        """The engine stalled after a SIGKILL: its last events, and the formation whole again.

        Seen once in CI: the monitor named no new primary within 90 s of a SIGKILL
        (the run's other faults, and its books, were fine). The killed node is
        started again so the formation can recover, and the fault is retried;
        the stall is reported with the events that explain it. A formation that
        does not recover is a failed run.
        """
        f = self.formation
        try:
            events = f.autoctl(
                "show", "events", "--count", "12", "--monitor", f.monitor_uri, timeout=20
            )
        except FormationError as shown:
            events = f"(no events: {shown})"
        try:
            f.restart_node(old)
            f.wait_whole(180)
        except (FormationError, subprocess.TimeoutExpired, psycopg.Error) as again:
            return FormationError(f"{exc}; and the formation did not recover: {again}")
        tail = " | ".join(line.strip() for line in events.strip().splitlines()[-12:])
        return EngineStall(f"{exc}; recovered by restarting {old.name}; monitor events: {tail}")


# -- the books ----------------------------------------------------------------------------------


def longest_gap(times: list[float], start: float, end: float, within: bool = False) -> float:
    """The longest gap between consecutive sorted `times` that overlaps [start, end].

    within: only gaps that lie wholly inside it.
    """
    gap = 0.0
    for a, b in itertools.pairwise(times):
        inside = a >= start and b <= end if within else b >= start and a <= end
        if inside:
            gap = max(gap, b - a)
    return gap


def longest_call(
    calls: list[tuple[float, float]], start: float, end: float, within: bool = False
) -> float:
    """The longest (start, end) call that overlaps [start, end] (within: lies inside it)."""
    return max(
        [
            b - a
            for a, b in calls
            if (a >= start and b <= end if within else b >= start and a <= end)
        ]
        or [0.0]
    )


def log_events(logdir: Path, pattern: str) -> list[tuple[float, str]]:
    """(epoch, event) of the pgqueue events worth counting in these JSON logs."""
    found = []
    for path in sorted(logdir.glob(pattern)):
        for line in path.read_text(errors="replace").splitlines():
            if not any(name in line for name in (*LOG_EVENTS, NOT_REPLICATED)):
                continue
            try:
                e = json.loads(line)
                at = datetime.fromisoformat(e["timestamp"]).timestamp()
            except (ValueError, KeyError, TypeError):
                continue
            name = str(e.get("event", ""))
            if NOT_REPLICATED in line and name not in LOG_EVENTS:
                name = "commit.not_replicated"
            found.append((at, name))
    return found


def classify_sync_waits(logs: list[list[str]]) -> Counter[str]:
    """Sync waits the servers ended, each line counted once: `terminated`, `engine` or `other`.

    `engine`: cancelled within ENGINE_CANCEL_WINDOW after the same server
    turned synchronous replication off (pg_autoctl entering wait_primary);
    `other`: any other cancel, a commit the client was told happened that no
    standby may have.
    """
    seen: set[str] = set()
    found: Counter[str] = Counter()
    for lines in logs:
        sync_off: float | None = None
        for line in lines:
            if SYNC_OFF in line:
                sync_off = _log_time(line)
                continue
            if TERMINATED_IN_SYNC_WAIT in line or NOT_REPLICATED in line:
                if line in seen:
                    continue
                seen.add(line)
                at = _log_time(line)
                if TERMINATED_IN_SYNC_WAIT in line:
                    found["terminated"] += 1
                elif (
                    sync_off is not None
                    and at is not None
                    and 0 <= at - sync_off <= ENGINE_CANCEL_WINDOW
                ):
                    found["engine"] += 1
                else:
                    found["other"] += 1
    return found


def _log_time(line: str) -> float | None:
    """The epoch of a server log line ('2026-11-25 09:34:19.950 UTC [pid] ...')."""
    try:
        return datetime.fromisoformat(line[:23] + "+00:00").timestamp()
    except ValueError:
        return None


def attribute(records: list[Failover], events: list[tuple[float, str]], who: str) -> None:
    """Count each event against the fault it followed (until the next fault)."""
    starts = [r.started for r in records]
    for at, name in events:
        before = [i for i, s in enumerate(starts) if s <= at]
        if before:
            records[before[-1]].events[f"{who} {name}"] += 1


def classify_missing(
    ledger: Ledger, present: set[str], points: dict[int, int], kills: list[float]
) -> tuple[list[str], list[str]]:
    """Confirmed sends the database lacks: (lost to async, bugs).

    A miss is allowed when the LSN read after its confirmation is past the
    end of its timeline (the switch point): the promoted standby never had
    it. When that LSN could not be read (the primary died first), when it was
    confirmed within LOSS_WINDOW before a SIGKILL. Any other miss is a bug.
    """
    stamped = receipts(ledger)
    allowed: list[str] = []
    bugs: list[str] = []
    confirmed = [*ledger.singles, *ledger.barriers, *ledger.workflows]
    for key in confirmed:
        if key in present:
            continue
        r = stamped.get(key)
        if r is None:
            bugs.append(key)
            continue
        end = points.get(r.timeline)
        past_switch = end is not None and r.lsn > end
        unread_at_kill = r.timeline == UNREAD and near_kill(r.at, kills)
        (allowed if past_switch or unread_at_kill else bugs).append(key)
    return allowed, bugs


def near_kill(at: float, kills: list[float]) -> bool:
    """Whether `at` lies within LOSS_WINDOW before a SIGKILL (or just after it)."""
    return any(k - LOSS_WINDOW <= at <= k + 0.1 for k in kills)


def lost_reads(
    log: dict[tuple[str, int], list[dict[str, Any]]],
    deleted: dict[tuple[str, int], int],
    kills: list[float],
) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """Messages delivered after their ack (chaos.check's test): (excused, not excused).

    Excused (async only): each execution the final history does not know of
    (a read count above the one the message left with) started within
    LOSS_WINDOW before a SIGKILL. Its read was lost with the old timeline,
    so the new primary handed the message out, or cancelled it, afresh.
    """
    excused, not_excused = [], []
    for key, events in log.items():
        if key not in deleted or max(e["rc"] for e in events) <= deleted[key]:
            continue
        unknown = [e for e in events if e["e"] == "start" and e["rc"] > deleted[key]]
        if unknown and all(near_kill(e["t"], kills) for e in unknown):
            excused.append(key)
        else:
            not_excused.append(key)
    return excused, not_excused


def without(ledger: Ledger, keys: set[str]) -> Ledger:
    """A plain copy of the ledger, leaving out `keys`."""
    return Ledger(
        singles={k: v for k, v in ledger.singles.items() if k not in keys},
        barriers={k: v for k, v in ledger.barriers.items() if k not in keys},
        workflows=[w for w in ledger.workflows if w not in keys],
        open_barriers=ledger.open_barriers,
        retries=ledger.retries,
    )


def present_keys(dsn: str) -> set[str]:
    """The singles, barriers and workflows the database holds (or ever held, by the audit)."""

    def read(conn: psycopg.Connection[Any]) -> set[str]:
        keys = {
            str(r[0])
            for r in conn.execute(
                "SELECT message->>'single' FROM soak_audit WHERE op = 'I' AND message ? 'single'"
            )
        }
        keys |= {str(r[0]) for r in conn.execute("SELECT barrier_id FROM pgqueue.barrier")}
        keys |= {str(r[0]) for r in conn.execute("SELECT workflow_id FROM pgqueue.workflow")}
        return keys

    found: set[str] = patiently(read, dsn)
    return found


def deleted_read_counts(dsn: str) -> dict[tuple[str, int], int]:
    """The read count each message left the queue with, by (queue, msg_id), from the audit."""
    rows = patiently(
        lambda c: c.execute(
            "SELECT q.queue_name, a.msg_id, a.read_ct FROM soak_audit a"
            " JOIN pgqueue.queue q USING (queue_id) WHERE a.op = 'D'"
        ).fetchall(),
        dsn,
    )
    return {(str(q), int(m)): int(rc) for q, m, rc in rows}


def ack_times(dsn: str) -> list[float]:
    """When each message left the queue (the audit's server clock), sorted."""
    rows = patiently(
        lambda c: c.execute(
            "SELECT extract(epoch FROM at)::float8 FROM soak_audit WHERE op = 'D' ORDER BY at"
        ).fetchall(),
        dsn,
    )
    return [float(r[0]) for r in rows]


def standby_connections(formation: Formation, dbname: str) -> dict[str, int]:
    """pgqueue sessions on each node that is not the primary."""
    primary = formation.primary()
    found = {}
    for node in formation.nodes:
        if node is primary:
            continue
        with psycopg.connect(formation.node_dsn(node, dbname), autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pgqueue%'"
            ).fetchone()
        found[node.name] = int(row[0]) if row else 0
    return found


@dataclass
class Books:
    """What the failover soak promises beyond the chaos soak's books, as recorded by a run."""

    failovers: list[Failover]
    wanted: int  # failovers the plan asked for
    consumers: int  # worker processes started, none of them told to stop before the end
    alive: int  # of them, alive when the drain was done
    exited: list[tuple[int, int]]  # (pid, exit code) of workers that exited on their own
    on_standbys: dict[str, int]  # pgqueue sessions per standby at the end
    not_replicated: int  # commits cancelled while waiting for their standby
    missing_below_switch: list[str]  # confirmed sends lost where no failover excuses it

    def check(self, rep: Report) -> None:
        """Add every broken promise to rep."""
        errors = [f"{r.kind} {r.old}: {r.error}" for r in self.failovers if r.error]
        rep.fail("failovers that did not complete", len(errors), errors)
        if len(self.failovers) < self.wanted:
            rep.failures.append(f"only {len(self.failovers)} of {self.wanted} failovers were made")
        rep.fail("consumers that exited on their own", len(self.exited), self.exited)
        if self.alive < self.consumers:
            rep.failures.append(f"consumers alive at the end: {self.alive} of {self.consumers}")
        on = sorted((n, c) for n, c in self.on_standbys.items() if c)
        rep.fail("pgqueue connections on a standby at the end", sum(c for _, c in on), on)
        if self.not_replicated:
            rep.failures.append(
                "commits cancelled while waiting for synchronous replication"
                f" (commit.not_replicated): {self.not_replicated}"
            )
        missing = self.missing_below_switch
        rep.fail("confirmed sends missing at or below their switch point", len(missing), missing)


# -- the run ------------------------------------------------------------------------------------


@dataclass
class Plan:
    """One run's shape: the chaos load plus the failovers."""

    load: Config
    failovers: int
    synchronous: bool
    drain_timeout: float = 120.0

    @classmethod
    def preset(cls, mode: str, failovers: int | None, synchronous: bool) -> Plan:
        """`short` (CI: one failover of each kind, about 75 s of load) or `long` (by hand)."""
        if mode == "long":
            load = Config(duration=240.0, consumers=4, rate=500.0)
            return cls(load, failovers or 12, synchronous)
        load = Config(duration=75.0, consumers=2, rate=150.0)
        return cls(load, failovers or 3, synchronous)


@dataclass
class Outcome:
    """What a run found."""

    report: Report
    failovers: list[Failover]
    setup_seconds: float
    stalls: list[str]


def run(plan: Plan, workdir: Path, formation: Formation) -> Outcome:
    """Build the formation, load it, move its primary, drain, and balance the books."""
    cfg = plan.load
    setup = formation.create()
    print(f"formation whole after {setup:.1f} s: primary {formation.primary().name}", flush=True)
    uri = formation.uri()
    queues = {WORK: cfg.max_attempts, CALLBACKS: cfg.max_attempts}
    with contextlib.ExitStack() as undo:
        dsn = undo.enter_context(soak_database(uri, queues))
        dbname = str(psycopg.conninfo.conninfo_to_dict(dsn)["dbname"])
        logdir = workdir / "soak"
        logdir.mkdir(parents=True)
        cfg.roles = True
        producer_dsn, consumer_dsn = login_roles(dsn, cfg.roles)
        consumers = undo.enter_context(Consumers(consumer_dsn, logdir, [WORK, CALLBACKS], cfg))
        for _ in range(cfg.consumers):
            consumers.spawn()
        clock = WalClock(None if plan.synchronous else dsn)
        ledger = stamped_ledger(clock)
        stop_producing, stop_faults = threading.Event(), threading.Event()
        undo.callback(stop_producing.set)
        producers = [
            TimedProducer(i, producer_dsn, cfg, ledger, stop_producing)
            for i in range(cfg.producers)
        ]
        faults = Failovers(formation, plan.failovers, cfg.seed, stop_faults)
        undo.callback(stop_thread, faults, stop_faults)
        t0 = time.time()
        for p in producers:
            p.start()
        faults.start()
        # Load for the duration, and on until every failover is made.
        faults.finished.wait(max(0.0, cfg.duration))
        while not faults.finished.wait(1.0):
            pass
        left = cfg.duration - (time.time() - t0)
        if left > 0:
            time.sleep(left)
        time.sleep(3.0)  # the last failover's aftermath under load
        stop_producing.set()
        for p in producers:
            p.join(120)
        t1 = time.time()
        with contextlib.suppress(FormationError):
            formation.wait_whole(60)
        drain = wait_drained(dsn, plan.drain_timeout)
        on_standbys = standby_connections(formation, dbname)
        alive = len(consumers.alive())
        unexpected = consumers.unexpected_exits()
        codes = consumers.stop()

        records = faults.done
        points = formation.switch_points(dbname)
        allowed: list[str] = []
        async_bugs: list[str] = []
        present = present_keys(dsn)
        kills = [r.killed_at for r in records if r.killed_at is not None] + faults.stall_kills
        allowed, async_bugs = classify_missing(ledger, present, points, kills)
        if plan.synchronous:  # no miss is allowed: chaos.check reports them all
            async_bugs, allowed = [], []
        held = cfg.concurrency * 3
        bound = len(records) * cfg.consumers * held
        rep = check(dsn, logdir, without(ledger, set(allowed)), bound)
        excused_reads: list[tuple[str, int]] = []
        if not plan.synchronous:
            excused_reads, after_ack = lost_reads(read_log(logdir), deleted_read_counts(dsn), kills)
            rep.failures = [f for f in rep.failures if not f.startswith(AFTER_ACK)]
            rep.fail(f"{AFTER_ACK}, no lost read excusing it", len(after_ack), after_ack)

        stamped = receipts(ledger)
        confirmed = sorted(r.at for r in stamped.values())
        acks = ack_times(dsn)
        calls = [c for p in producers for c in p.calls]
        quiet = [(t0, records[0].started if records else t1)]
        for r, nxt in zip(records, [*records[1:], None], strict=False):
            end = r.started + (r.to_whole if r.to_whole == r.to_whole else 30.0)
            r.producer_gap = longest_gap(confirmed, r.started, end)
            r.send_blocked = longest_call(calls, r.started, end)
            r.ack_gap = longest_gap(acks, r.started, end)
            r.switch_point = points.get(r.timeline - 1)
            quiet.append((end + 2.0, nxt.started if nxt else t1))
            if r.switch_point is not None:
                old_tl = [x for x in stamped.values() if x.timeline == r.timeline - 1]
                if old_tl:
                    r.wal_past_switch = max(x.lsn - r.switch_point for x in old_tl)
                r.lost_to_async = sum(
                    1
                    for k in allowed
                    if stamped[k].timeline == r.timeline - 1 and stamped[k].lsn > r.switch_point
                )
        attribute(records, log_events(logdir, "worker-*.log"), "consumers")
        attribute(records, log_events(workdir, "producers.log"), "producers")
        sync_waits = classify_sync_waits(formation.server_logs())
        not_replicated = sync_waits["other"] + sum(
            r.events[f"{who} commit.not_replicated"]
            for r in records
            for who in ("consumers", "producers")
        )
        Books(
            failovers=records,
            wanted=plan.failovers,
            consumers=cfg.consumers,
            alive=alive,
            exited=unexpected,
            on_standbys=on_standbys,
            not_replicated=not_replicated,
            missing_below_switch=async_bugs,
        ).check(rep)
        for p in producers:
            if p.error is not None:
                rep.failures.append(f"producer {p.idx} died: {p.error!r}")
            if p.is_alive():
                rep.failures.append(f"producer {p.idx} did not stop (a send retried forever?)")
        if faults.error is not None:
            rep.failures.append(f"failover thread died: {faults.error!r}")
        if drain != drain:
            rep.failures.append(f"not drained within {plan.drain_timeout:.0f} s")
        rep.fail("workers that did not stop cleanly", sum(x != 0 for x in codes), codes)
        quiet_gaps = [longest_gap(confirmed, a, b, within=True) for a, b in quiet if b > a]
        quiet_calls = [longest_call(calls, a, b, within=True) for a, b in quiet if b > a]
        rep.figures.update(
            {
                "replication": "synchronous" if plan.synchronous else "asynchronous (local)",
                "formation set up in seconds": round(setup, 1),
                "load seconds": round(t1 - t0),
                "consumers": cfg.consumers,
                "failovers": dict(sorted(Counter(r.kind for r in records).items())),
                STALLS_FIGURE: len(faults.stalls),
                "producer retries": ledger.retries,
                "drain seconds": round(drain, 1),
                "worker exit codes at the end": codes,
                "pgqueue connections on standbys at the end": sum(on_standbys.values()),
                "commit.not_replicated": not_replicated,
                "sync waits ended by a terminated connection (server log)": sync_waits[
                    "terminated"
                ],
                "sync waits cancelled by pg_autoctl entering wait_primary": sync_waits["engine"],
                "longest gap between confirmed sends away from failovers (s)": round(
                    max(quiet_gaps or [0]), 2
                ),
                "longest blocked send away from failovers (s)": round(max(quiet_calls or [0]), 2),
                "confirmed sends lost to async": len(allowed),
                "delivered after ack, excused by a read lost to async": len(excused_reads),
                "lost to async, e.g. (key, timeline, LSN past switch or UNREAD)": [
                    (k, stamped[k].timeline, stamped[k].lsn - points.get(stamped[k].timeline, 0))
                    for k in allowed[:5]
                ],
                "excused deliveries after ack, e.g.": excused_reads[:5],
                "confirmed sends stamped with their timeline and LSN": sum(
                    r.timeline > 0 for r in stamped.values()
                ),
                "confirmed sends missing at or below the switch point": len(async_bugs),
            }
        )
        return Outcome(rep, records, setup, faults.stalls)


# -- output -------------------------------------------------------------------------------------


def _s(x: float) -> str:
    return "-" if x != x else f"{x:.1f}"


def print_failovers(records: list[Failover], synchronous: bool) -> None:
    """One row per failover, then the longest times per kind."""
    columns = [
        "#",
        "kind",
        "old -> new",
        "timeline",
        "new primary (s)",
        "whole (s)",
        "send blocked (s)",
        "confirmation gap (s)",
        "ack gap (s)",
        "consumer retries / listen reconnects",
        "producer retries",
    ]
    if not synchronous:
        columns += ["switch point", "lost to async", "last confirmed send past switch (bytes)"]
    print("\n| " + " | ".join(columns) + " |\n" + "|---" * len(columns) + "|")
    for i, r in enumerate(records, start=1):
        listen = r.events["consumers listen.reconnecting"] + r.events["consumers listen.failed"]
        cells = [
            i,
            r.kind,
            f"{r.old} -> {r.new}",
            r.timeline,
            _s(r.to_primary),
            _s(r.to_whole),
            _s(r.send_blocked),
            _s(r.producer_gap),
            _s(r.ack_gap),
            f"{r.events['consumers connection.retry']} / {listen}",
            r.events["producers connection.retry"],
        ]
        if not synchronous:
            point = r.switch_point
            sp = "-" if point is None else f"{point >> 32:X}/{point & 0xFFFFFFFF:X}"
            past = "-" if r.wal_past_switch is None else r.wal_past_switch
            cells += [sp, r.lost_to_async, past]
        print("| " + " | ".join(str(c) for c in cells) + " |")
    print("\n| kind | failovers | longest to new primary (s) | longest send blocked (s)", end="")
    print(" | longest confirmation gap (s) | longest ack gap (s) |\n|---|---|---|---|---|---|")
    for kind in KINDS:
        of = [r for r in records if r.kind == kind]
        if of:
            print(
                f"| {kind} | {len(of)} | {_s(max(r.to_primary for r in of))} |"
                f" {_s(max(r.send_blocked for r in of))} |"
                f" {_s(max(r.producer_gap for r in of))} | {_s(max(r.ack_gap for r in of))} |"
            )


def print_summary(out: Outcome) -> None:
    """The headline table: what a reader of docs/reliability.md needs."""
    f = out.report.figures
    print("\n| summary | value |\n|---|---|")
    for key in (
        "replication",
        "failovers",
        STALLS_FIGURE,
        "messages sent",
        "lost",
        "stuck",
        "duplicate callbacks",
        "delivered after ack",
        "duplicate executions",
        "duplicate bound",
        "confirmed sends lost to async",
        "delivered after ack, excused by a read lost to async",
        "commit.not_replicated",
        "sync waits cancelled by pg_autoctl entering wait_primary",
        "pgqueue connections on standbys at the end",
    ):
        value = f.get(key, "-")
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v}" for k, v in value.items()) or "none"
        print(f"| {key} | {value} |")
    for kind in KINDS:
        of = [r for r in out.failovers if r.kind == kind]
        if of:
            print(
                f"| longest stall, {kind}: send blocked / ack gap (s) |"
                f" {_s(max(r.send_blocked for r in of))} / {_s(max(r.ack_gap for r in of))} |"
            )


def save_artifacts(workdir: Path, formation: Formation) -> Path | None:
    """Copy the engine's and the workers' logs to $PGQUEUE_ARTIFACTS, when it is set."""
    root = os.environ.get("PGQUEUE_ARTIFACTS")
    if not root:
        return None
    dest = Path(root) / f"failover-soak-{workdir.name}"
    formation.copy_logs(dest / "engine")
    if (workdir / "soak").is_dir():
        shutil.copytree(workdir / "soak", dest / "soak", dirs_exist_ok=True)
    if (workdir / "producers.log").exists():
        shutil.copy(workdir / "producers.log", dest / "producers.log")
    return dest


@contextlib.contextmanager
def producers_log(path: Path) -> Iterator[None]:
    """This process's pgqueue warnings (the producers' retries) as JSON lines in `path`."""
    with path.open("a") as out:
        real, sys.stderr = sys.stderr, out
        try:
            configure_logging(json=True, level="WARNING")
        finally:
            sys.stderr = real
        try:
            yield
        finally:
            configure_logging(level="ERROR")


def main(argv: list[str] | None = None) -> int:
    """Run the failover soak; 0 when every promise held (or when this machine cannot run it)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--mode", choices=["short", "long"], default="short")
    ap.add_argument("--failovers", type=int, help="how many failovers (default: 3 short, 12 long)")
    ap.add_argument(
        "--async",
        dest="asynchronous",
        action="store_true",
        help="synchronous_commit = local on every node: losses past the switch point allowed",
    )
    ap.add_argument("--duration", type=float, help="seconds of load at least (overrides the mode)")
    ap.add_argument("--consumers", type=int, help="worker processes (overrides the mode)")
    ap.add_argument("--rate", type=float, help="messages per second sent (overrides the mode)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", type=Path, help="where logs go (default: a temporary directory)")
    ap.add_argument("--json", type=Path, help="also write the figures here as JSON")
    args = ap.parse_args(argv)
    reason = skip_reason()
    if reason is not None:
        print(f"failover soak skipped: {reason}", flush=True)
        return 0
    plan = Plan.preset(args.mode, args.failovers, not args.asynchronous)
    for name in ("duration", "consumers", "rate"):
        if getattr(args, name) is not None:
            setattr(plan.load, name, getattr(args, name))
    plan.load.seed = args.seed
    workdir = args.workdir or Path(f"/tmp/pgqueue-failover-{uuid.uuid4().hex[:8]}")
    workdir.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        os.chmod(workdir, 0o755)  # postgres walks into the engine's directory below it
    started = time.monotonic()
    print(
        f"pgqueue failover soak ({args.mode}, {plan.failovers} failovers,"
        f" {'synchronous' if plan.synchronous else 'asynchronous'}): logs in {workdir}",
        flush=True,
    )
    formation = Formation(workdir / "engine", synchronous=plan.synchronous)
    # Whatever ends this process, no engine process outlives it.
    atexit.register(formation.teardown)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, lambda signum, frame: sys.exit(128 + signum))
    failures: list[str] = []
    out: Outcome | None = None
    try:
        with producers_log(workdir / "producers.log"):
            out = run(plan, workdir, formation)
        failures = out.report.failures
    except (FormationError, psycopg.Error, OSError, subprocess.SubprocessError) as exc:
        failures = [f"the run broke off: {exc!r}"]
    finally:
        if failures:
            dest = save_artifacts(workdir, formation)
            if dest is not None:
                print(f"logs copied to {dest}")
        formation.teardown()
    if out is not None:
        print_soak(out.report)
        print_failovers(out.failovers, plan.synchronous)
        print_summary(out)
        for stall in out.stalls:
            print(f"\nengine stall, retried: {stall}")
        if args.json:
            args.json.write_text(
                json.dumps(
                    {
                        "mode": args.mode,
                        "figures": out.report.figures,
                        "failovers": [
                            {**r.__dict__, "events": dict(r.events)} for r in out.failovers
                        ],
                    },
                    indent=2,
                    default=str,
                )
            )
    print(f"\ntotal {time.monotonic() - started:.0f} s")
    if failures:
        print("\nFAILED:\n- " + "\n- ".join(failures))
        return 1
    print("\nevery promise held")
    return 0


if __name__ == "__main__":
    sys.exit(main())
