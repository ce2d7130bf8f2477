"""A disk that fills up: sends fail clearly, nothing is half-written, and all resumes after.

The plan is docs/design/failover.md section 7. Each case runs a private
cluster with part of it on a 48 MB filesystem of its own (tmpfs, else ext4 on
a loop device; skipped with the mount's error where neither can be mounted),
a `pgqueue worker` process in archive mode, and a producer in this process.
A filler file on that filesystem makes space scarce, and deleting it frees it.

- Data full: pgqueue's tables and indexes live in a tablespace there. A write
  that needs a new page fails with 53100, an ERROR that rolls back: the call
  raises StorageError at once, and the server stays up.
- WAL full: pg_wal lives there. The server PANICs when it cannot make a
  segment (a backend outside a critical section gets 53100 first, rolled
  back); calls fail as ConnectionLost after their retry deadline, and the
  worker resumes once the space is freed and the server started again.

Both check the books afterwards: every send that returned is handled, none
is lost or stuck, and a call that raised left nothing of itself behind.
Figures are printed (`pytest -s`) and, with PGQUEUE_DISK_FULL_FIGURES=FILE,
appended to FILE (one run of them: docs/soak/disk-full.txt).
"""

from __future__ import annotations

import base64
import contextlib
import errno
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support.db import migrated_database, wait_until
from support.processes import prepare

from pgqueue import Client, ConnectionLost, RetryPolicy
from pgqueue._errors import StorageError

FS_MB = 48
# What the filler leaves free before the producer starts: a few hundred sends.
DATA_HEADROOM = 2 * 1024 * 1024
# Less than one 16 MB WAL segment: the next segment switch cannot be done.
WAL_HEADROOM = 8 * 1024 * 1024
VT = 4  # the worker's lease: a message whose ack failed comes back this soon
# Archive mode: every message handled stays in the database, to check against.
ARCHIVE = ("--ack", "archive", "--vt", str(VT))
FULL_SECONDS = 3.0  # how long the producer and the worker go on against the full disk
FAN = 3  # members of each fan-out
BATCH = 5  # messages of each send_batch
KINDS = ("send", "keyed", "batch", "fan")
# worker_app's queues whose every message is checked: `jobs` (its handler
# sleeps when told to), `callbacks` (the fan-outs'), `async_jobs` (the worker
# stopped on the full disk).
BOOK_QUEUES = ("jobs", "callbacks", "async_jobs")
# Slow handlers run across the full disk: their leases need heartbeats then,
# and the stopped worker's need giving back.
SLOW = 8.0
# The stopped worker's handlers run until it is stopped, however long the
# disk takes to fill: their redeliveries (after a give-back, or a lease that
# ran out) do not sleep.
UNTIL_STOPPED = 600.0

# A small message (about 1 kB) fits wherever a page has room left; a big one
# (7 kB that does not compress) goes out of line to the TOAST table, which no
# small one uses, so it always needs a new page there: on a full disk it fails.
SMALL = "x" * 900


def big() -> str:
    return base64.b64encode(os.urandom(5400)).decode()


# ---------------------------------------------------------------- the filesystem


def _postgres_uid() -> int:
    return pwd.getpwnam("postgres").pw_uid if os.geteuid() == 0 else os.getuid()


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def _mount(base: Path, mnt: Path, uid: int) -> str | None:
    """Mount a FS_MB filesystem on mnt, owned by uid; None, or why none could be."""
    tried = _run(
        "mount", "-t", "tmpfs", "-o", f"size={FS_MB}m,mode=0700,uid={uid}", "tmpfs", str(mnt)
    )
    if tried.returncode == 0:
        return None
    why = f"tmpfs: {tried.stderr.strip() or tried.returncode}"
    if not Path("/dev/loop-control").exists() or not shutil.which("mkfs.ext4"):
        return f"{why}; no loop devices (or mkfs.ext4) for an ext4 image"
    image = base / "fs.img"
    steps = [
        ("truncate", "-s", f"{FS_MB + 16}M", str(image)),
        ("mkfs.ext4", "-q", "-F", "-m", "0", str(image)),
        ("mount", "-o", "loop", str(image), str(mnt)),
    ]
    for step in steps:
        done = _run(*step)
        if done.returncode != 0:
            return f"{why}; ext4 on a loop device: {step[0]}: {done.stderr.strip()}"
    os.chown(mnt, uid, -1)
    mnt.chmod(0o700)
    return None


@contextlib.contextmanager
def small_filesystem() -> Iterator[Path]:
    """A FS_MB filesystem of this test's own that only postgres may enter; unmounted after."""
    base = Path(tempfile.mkdtemp(prefix="pgqueue-disk-full-"))
    base.chmod(0o755)
    mnt = base / "fs"
    mnt.mkdir()
    try:
        why = _mount(base, mnt, _postgres_uid())
        if why is not None:
            pytest.skip(f"cannot mount a small filesystem: {why}")
        try:
            yield mnt
        finally:
            # The server is stopped by now; a lazy unmount covers a straggler.
            if _run("umount", str(mnt)).returncode != 0:
                _run("umount", "-l", str(mnt))
    finally:
        shutil.rmtree(base, ignore_errors=True)


def free_bytes(fs: Path) -> int:
    st = os.statvfs(fs)
    return st.f_bavail * st.f_frsize


def fill(fs: Path, leave: int = 0) -> None:
    """Grow the filler until `leave` bytes are free on fs; with 0, until it is full."""
    size = 1 << 20
    with (fs / "filler").open("ab", buffering=0) as out:
        while size >= 4096:
            room = free_bytes(fs) - leave
            if leave and room <= 0:
                return
            try:
                out.write(b"\0" * (min(size, room) if leave else size))
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                size //= 2


# ---------------------------------------------------------------- the producer and its books


def msg(tag: str, pad: str = SMALL) -> dict[str, str]:
    return {"tag": tag, "pad": pad}


@dataclass
class Outcome:
    kind: str
    seconds: float
    error: BaseException | None


@dataclass
class Producer:
    """Sends of every kind, and what each call returned: the truth the database must match."""

    client: Client
    calls: int = 0
    confirmed: set[str] = field(default_factory=set)  # tags of messages whose call returned
    failed: set[str] = field(default_factory=set)  # tags of calls that raised StorageError
    unsure: list[set[str]] = field(default_factory=list)  # the tags of each ConnectionLost call
    fans_ok: set[str] = field(default_factory=set)
    fans_failed: set[str] = field(default_factory=set)
    outcomes: list[Outcome] = field(default_factory=list)

    def slow(self, queue: str, tag: str) -> None:
        """A message whose handler takes SLOW seconds (worker_app's jobs and async_jobs)."""
        self.client.send(queue, {"tag": tag, "sleep": SLOW})
        self.confirmed.add(tag)

    def until_stopped(self, queue: str, tag: str) -> None:
        """A message whose first handler runs until its worker is stopped (async_jobs)."""
        self.client.send(queue, {"tag": tag, "first_sleep": UNTIL_STOPPED})
        self.confirmed.add(tag)

    def call(self, kind: str, pad: str = SMALL, batch: int = BATCH) -> Outcome:
        """One call of this kind; StorageError and ConnectionLost are recorded, the rest raised."""
        i = self.calls
        self.calls += 1
        one = [f"{kind}-{i}"]
        tags = [f"{kind}-{i}-{m}" for m in range(batch if kind == "batch" else FAN)]
        started = time.monotonic()
        error: BaseException | None = None
        try:
            if kind == "send":
                self.client.send("jobs", msg(one[0], pad))
            elif kind == "keyed":  # a dedupe_key: the client sends a send_token with it
                self.client.send("jobs", msg(one[0], pad), dedupe_key=one[0])
            elif kind == "batch":
                self.client.send_batch("jobs", [msg(t, pad) for t in tags])
            else:
                self.client.fan_out(
                    "jobs",
                    [msg(t, pad) for t in tags],
                    callback_queue="callbacks",
                    callback_message={"tag": f"cb-{i}"},
                    barrier_id=one[0],
                )
                tags.append(f"cb-{i}")
        except (StorageError, ConnectionLost) as exc:
            error = exc
        sent = set(tags if kind in ("batch", "fan") else one)
        if error is None:
            self.confirmed |= sent
            if kind == "fan":
                self.fans_ok.add(one[0])
        elif isinstance(error, StorageError):
            self.failed |= sent
            if kind == "fan":
                self.fans_failed.add(one[0])
        else:
            self.unsure.append(sent)
        outcome = Outcome(kind, time.monotonic() - started, error)
        self.outcomes.append(outcome)
        return outcome


def rows_by_tag(dsn: str) -> dict[str, list[tuple[str, str, int]]]:
    """Every message of the books' queues in the database: tag -> [(where, queue, msg_id)].

    Where: live, archived, poisoned, or "member <outcome>" (a fan-out's member).
    """
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT m.message->>'tag', w, q.queue_name, m.msg_id FROM ("
            " SELECT queue_id, msg_id, message, 'live' AS w FROM pgqueue.message"
            " UNION ALL SELECT queue_id, msg_id, message, 'archived' FROM pgqueue.archive"
            " UNION ALL SELECT queue_id, msg_id, message, 'poisoned' FROM pgqueue.poison"
            # A member's message is deleted when it completes; its row stays.
            " UNION ALL SELECT queue_id, msg_id,"
            "   jsonb_build_object('tag', barrier_id || '-' || member_index),"
            "   'member ' || coalesce(outcome, 'pending') FROM pgqueue.barrier_member) m"
            " JOIN pgqueue.queue q USING (queue_id)"
            " WHERE q.queue_name = ANY(%s)",
            (list(BOOK_QUEUES),),
        ).fetchall()
    found: dict[str, list[tuple[str, str, int]]] = {}
    for tag, where, queue, msg_id in rows:
        found.setdefault(tag, []).append((where, queue, msg_id))
    return found


def handled_counts(dsn: str) -> dict[tuple[str, int], int]:
    """How many times worker_app finished each message: (queue, msg_id) -> runs."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT queue, msg_id, count(*) FROM handled"
            " WHERE event IN ('done', 'callback') GROUP BY queue, msg_id"
        ).fetchall()
    return {(q, m): n for q, m, n in rows}


def count_events(dsn: str, event: str, queue: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM handled WHERE event = %s AND queue = %s", (event, queue)
        ).fetchone()
    return int(row[0]) if row else 0


def drained(dsn: str, fans: set[str]) -> bool:
    """Nothing of the books' queues is live, and every confirmed fan-out has fired."""
    try:
        with psycopg.connect(dsn, connect_timeout=2) as conn:
            row = conn.execute(
                "SELECT (SELECT count(*) FROM pgqueue.message m JOIN pgqueue.queue q"
                "         USING (queue_id) WHERE q.queue_name = ANY(%s)),"
                "       (SELECT count(*) FROM pgqueue.barrier"
                "         WHERE barrier_id = ANY(%s) AND state <> 'fired')",
                (list(BOOK_QUEUES), sorted(fans)),
            ).fetchone()
    except psycopg.OperationalError:
        return False
    return row == (0, 0)


STUCK = ("live", "member pending")
FAILED = ("poisoned", "member failed", "member poisoned", "member purged", "member timed_out")


@dataclass
class Balance:
    """The books after the run: each list names the tags at fault, and should be empty."""

    half_written: list[str]  # in the database, though their call raised StorageError
    not_atomic: list[str]  # a call of unknown outcome that left part of itself
    lost: list[str]  # a call returned, but the message is not there or was never handled
    stuck: list[str]  # still live after the drain
    poisoned: list[str]  # poisoned, or a member that did not succeed
    duplicates: int  # handled more than once (at-least-once allows it; counted)


def balance(dsn: str, producer: Producer) -> Balance:
    found = rows_by_tag(dsn)
    runs = handled_counts(dsn)
    lost = []
    for tag in sorted(producer.confirmed):
        places = found.get(tag, [])
        if not places or not any(runs.get((q, m), 0) for _, q, m in places):
            lost.append(tag)
    return Balance(
        half_written=sorted(t for t in found if t in producer.failed),
        # all of a call or none, as often as it was committed (a retry may commit it twice)
        not_atomic=sorted(
            t
            for call in producer.unsure
            if len({len(found.get(t, [])) for t in call}) > 1
            for t in call
        ),
        lost=lost,
        stuck=sorted(t for t, places in found.items() if any(w in STUCK for w, _, _ in places)),
        poisoned=sorted(t for t, places in found.items() if any(w in FAILED for w, _, _ in places)),
        duplicates=sum(1 for n in runs.values() if n > 1),
    )


def unknown_tags(dsn: str, producer: Producer) -> list[str]:
    """Tags in the database that no call of the producer ever made (should be none)."""
    unsure = set().union(*producer.unsure) if producer.unsure else set()
    known = producer.confirmed | producer.failed | unsure
    return sorted(t for t in rows_by_tag(dsn) if t not in known and not t.startswith("cli-"))


# ---------------------------------------------------------------- figures


def report(case: str, figures: dict[str, Any]) -> None:
    """Print the figures of one case; append them to $PGQUEUE_DISK_FULL_FIGURES when set."""
    width = max(len(k) for k in figures)
    lines = [f"== {case}"] + [f"{k.ljust(width)}  {v}" for k, v in figures.items()]
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    target = os.environ.get("PGQUEUE_DISK_FULL_FIGURES")
    if target:
        with open(target, "a") as out:
            out.write(text + "\n")


def worker_events(proc: Any) -> dict[str, int]:
    """How often the worker logged each warning or error (its failures against the full disk)."""
    seen: dict[str, int] = {}
    for entry in proc.events():
        if entry.get("level") in ("warning", "error", "critical"):
            # psycopg_pool's lines are sentences: their first words name them
            event = re.split(r"[:<]", entry["event"])[0].strip()
            seen[event] = seen.get(event, 0) + 1
    return dict(sorted(seen.items()))


def server_log_lines(cluster: Any, needle: str) -> list[str]:
    log = Path(cluster.root) / "log"
    if not log.exists():
        return []
    return [line for line in log.read_text(errors="replace").splitlines() if needle in line]


def seconds(x: float) -> str:
    return f"{x:.3f} s"


# ---------------------------------------------------------------- case 1: the data disk


def move_pgqueue_to(dsn: str, tablespace: str, location: Path) -> int:
    """Every table and index of pgqueue's schema (TOAST included) into a new tablespace."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLESPACE {tablespace} LOCATION '{location}'")
        rels = conn.execute(
            "SELECT c.relname, c.relkind FROM pg_class c"
            " WHERE c.relnamespace = 'pgqueue'::regnamespace AND c.relkind IN ('r', 'i', 'm')"
            " ORDER BY c.relkind DESC, c.relname"
        ).fetchall()
        for name, kind in rels:
            what = {"r": "TABLE", "i": "INDEX", "m": "MATERIALIZED VIEW"}[kind]
            conn.execute(f"ALTER {what} pgqueue.{name} SET TABLESPACE {tablespace}")
        # The tables' TOAST tables (and their indexes) move with them; check it.
        left = conn.execute(
            "SELECT count(*) FROM pg_class c"
            " LEFT JOIN pg_class t ON t.oid = c.reltoastrelid"
            " LEFT JOIN pg_index ti ON ti.indrelid = t.oid"
            " LEFT JOIN pg_class tic ON tic.oid = ti.indexrelid"
            " WHERE c.relnamespace = 'pgqueue'::regnamespace AND c.relkind IN ('r', 'i', 'm')"
            "   AND (c.reltablespace = 0 OR t.reltablespace = 0 OR tic.reltablespace = 0)"
        ).fetchone()
    assert left == (0,), "a pgqueue relation is still in the default tablespace"
    return len(rels)


def test_a_full_data_disk_fails_sends_clearly_and_everything_resumes_when_freed(
    own_cluster: Any, spawn: Callable[..., Any]
) -> None:
    figures: dict[str, Any] = {}
    run_started = time.monotonic()
    with small_filesystem() as fs, own_cluster() as cluster:
        target = migrated_database(cluster.dsn)
        prepare(target, "held", "async_jobs").close()
        ts = fs / "ts"
        ts.mkdir()
        os.chown(ts, _postgres_uid(), -1)
        figures["relations moved"] = move_pgqueue_to(target, "small", ts)

        worker = spawn(target, *ARCHIVE, "--concurrency", "8")
        # A second worker, stopped (SIGTERM) on the full disk while its handlers run.
        stopper = spawn(target, "--queue", "async_jobs", "--vt", str(VT), "--shutdown-grace", "1")
        # A policy that would retry for 20 s: a StorageError back in < 1 s was not retried.
        policy = RetryPolicy(attempts=100, deadline_seconds=20)
        client = Client.from_dsn(target, max_size=4, retry=policy)
        retried: list[str] = []
        client.observers.retried.append(retried.append)
        producer = Producer(client)
        try:
            assert producer.call("send").error is None  # the worker's first message
            wait_until(lambda: drained(target, set()), timeout=120)
            # A delete-mode consumer's leases, taken before the disk fills.
            for n in range(10):  # big: archiving them would need new TOAST pages
                client.send("held", msg(f"held-{n}", big()))
            held = [m.msg_id for m in client.read("held", vt=600, qty=10)]
            assert len(held) == 10

            # Handlers that will still run when the disk is full.
            for n in range(3):
                producer.slow("jobs", f"slow-{n}")
                producer.until_stopped("async_jobs", f"stopped-{n}")
            wait_until(lambda: count_events(target, "start", "async_jobs") == 3, timeout=120)

            # -- fill: the producer sends (with the worker archiving) until 53100
            fill(fs, DATA_HEADROOM)
            filling = time.monotonic()
            first: Outcome | None = None
            while time.monotonic() - filling < 40:
                outcome = producer.call(KINDS[producer.calls % len(KINDS)])
                if outcome.error is not None:
                    first = outcome
                    break
            assert first is not None, "the disk never filled up: no send raised StorageError"
            figures["sends before full (calls)"] = producer.calls - 1
            figures["messages confirmed before full"] = len(producer.confirmed)
            figures["seconds to fill"] = seconds(time.monotonic() - filling)
            figures["first error, from"] = f"{first.kind} after {seconds(first.seconds)}"
            figures["first error"] = str(first.error)

            # -- full: every kind of send fails at once, the same way, and is not retried
            for kind in KINDS:
                fill(fs)
                outcome = producer.call(kind, pad=big())
                assert isinstance(outcome.error, StorageError), (kind, outcome.error)
                assert "out of disk space (SQLSTATE 53100" in str(outcome.error)
                assert outcome.seconds < 1.0, (kind, outcome.seconds)
                figures[f"{kind} on a full disk"] = seconds(outcome.seconds)
            assert retried == []

            # A delete-mode ack needs no new page: it works on the full disk.
            fill(fs)
            assert sorted(client.delete_many("held", held)) == sorted(held)
            figures["delete-mode ack of 10 on a full disk"] = "ok"

            # The command line says it in one line, and exits 1.
            fill(fs)
            cli = subprocess.run(
                [sys.executable, "-m", "pgqueue", "send", "jobs", json.dumps(msg("cli-1", big()))],
                env=dict(os.environ, PGQUEUE_DSN=target),
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert cli.returncode == 1, cli
            assert cli.stderr.startswith(
                "pgqueue: error: the database is out of disk space (SQLSTATE 53100"
            ), cli.stderr
            assert cli.stderr.count("\n") == 1, cli.stderr
            figures["pgqueue send on a full disk"] = f"exit 1: {cli.stderr.strip()}"

            # A worker stopped now gives its running messages back, or says it could not.
            stopper.signal(signal.SIGTERM)
            assert stopper.wait(30) == 0, stopper.log.read_text()
            gave_back = stopper.events("worker.gave_back")
            release_failed = stopper.events("message.release_failed")
            assert gave_back or release_failed, stopper.log.read_text()
            figures["SIGTERM on a full disk: give-back"] = (
                f"released {sum(e['count'] for e in gave_back)} of 3"
                + (f"; release_failed: {release_failed[0]['error']}" if release_failed else "")
            )

            # The producer and the worker go on against the full disk for a while.
            fill(fs)
            full_from = time.monotonic()
            while time.monotonic() - full_from < FULL_SECONDS:
                producer.call(KINDS[producer.calls % len(KINDS)])
                time.sleep(0.02)
            during = [o for o in producer.outcomes if o.error is not None]
            assert all(isinstance(o.error, StorageError) for o in during), during
            assert max(o.seconds for o in during) < 1.0
            assert retried == []
            assert not producer.unsure
            figures["calls failed with StorageError"] = len(during)
            figures["slowest failed call"] = seconds(max(o.seconds for o in during))
            ok_while_full = [o for o in producer.outcomes[producer.outcomes.index(first) :]]
            figures["small calls that still fit while full"] = sum(
                1 for o in ok_while_full if o.error is None
            )
            assert worker.p.poll() is None, "the worker exited on the full disk"
            figures["worker events while full"] = worker_events(worker)

            # -- freed: sends succeed within 5 s, the backlog drains, the books balance
            (fs / "filler").unlink()
            freed = time.monotonic()
            while producer.call("send").error is not None:
                # within 5 s on a quiet machine (the figure below says how long it took);
                # the room is for a loaded one, and still catches sends that never resume
                assert time.monotonic() - freed < 30, "sends did not resume within 30 s"
                time.sleep(0.05)
            figures["seconds to resume"] = seconds(time.monotonic() - freed)
            stopper = spawn(target, "--queue", "async_jobs", *ARCHIVE)
            wait_until(lambda: drained(target, producer.fans_ok), timeout=60)
            figures["seconds to drain"] = seconds(time.monotonic() - freed)

            books = balance(target, producer)
            figures["messages confirmed"] = len(producer.confirmed)
            figures["lost"] = len(books.lost)
            figures["stuck"] = len(books.stuck)
            figures["half-written"] = len(books.half_written)
            figures["poisoned"] = len(books.poisoned)
            figures["handled more than once (at-least-once)"] = books.duplicates
            assert books.half_written == [], books.half_written
            assert books.lost == [], books.lost
            assert books.stuck == [], books.stuck
            assert books.poisoned == [], books.poisoned
            assert unknown_tags(target, producer) == []
            with psycopg.connect(target) as conn:
                barriers = dict(
                    conn.execute("SELECT barrier_id, state FROM pgqueue.barrier").fetchall()
                )
                orphans = conn.execute(
                    "SELECT count(*) FROM pgqueue.barrier_member WHERE barrier_id = ANY(%s)",
                    (sorted(producer.fans_failed),),
                ).fetchone()
            assert barriers == dict.fromkeys(producer.fans_ok, "fired"), barriers
            assert orphans == (0,)
            callbacks = {t for t in rows_by_tag(target) if t.startswith("cb-")}
            assert callbacks == {f"cb-{b.split('-')[1]}" for b in producer.fans_ok}
            figures["fan-outs fired / failed"] = (
                f"{len(producer.fans_ok)} / {len(producer.fans_failed)}"
            )
            figures["server log: 'No space left on device'"] = len(
                server_log_lines(cluster, "No space left on device")
            )

            assert worker.p.poll() is None, "the worker exited"
            figures["worker events, whole run"] = worker_events(worker)
            for proc in (worker, stopper):
                proc.signal(signal.SIGTERM)
                assert proc.wait(30) == 0
        finally:
            client.close()
    figures["run time"] = seconds(time.monotonic() - run_started)
    report("data disk full (tablespace on a 48 MB filesystem)", figures)


# ---------------------------------------------------------------- case 2: the WAL disk

WAL_DEADLINE = 3.0  # the producer's retry deadline: ConnectionLost comes this long after


def move_wal(cluster: Any, to: Path) -> None:
    """Stop the cluster, put its pg_wal on `to` (a symlink, as `initdb --waldir` makes), start."""
    cluster.stop()
    to.mkdir()
    os.chown(to, _postgres_uid(), -1)
    to.chmod(0o700)
    wal = Path(cluster.data) / "pg_wal"
    copied = _run("cp", "-a", f"{wal}/.", str(to))
    assert copied.returncode == 0, copied.stderr
    shutil.rmtree(wal)
    wal.symlink_to(to)
    cluster.start()


def postmaster_running(cluster: Any) -> bool:
    pidfile = Path(cluster.data) / "postmaster.pid"
    try:
        os.kill(int(pidfile.read_text().split()[0]), 0)
    except (OSError, ValueError, IndexError):
        return False
    return True


# The server log's lines that tell the crash and the restart.
SERVER_EVENTS = (
    "PANIC",
    "terminated by signal",
    "aborting startup",
    "ready to accept",
    "ERROR:  could not write",
)


def up(cluster: Any) -> bool:
    """Whether the server answers; starts it if its postmaster gave up (not while it restarts)."""
    if answers(cluster.dsn):
        return True
    if not postmaster_running(cluster):
        with contextlib.suppress(subprocess.CalledProcessError):
            cluster.start()
    return answers(cluster.dsn)


def answers(dsn: str) -> bool:
    try:
        with psycopg.connect(dsn, connect_timeout=2):
            return True
    except psycopg.OperationalError:
        return False


def test_a_full_wal_disk_stops_the_server_and_the_worker_resumes_after_its_restart(
    own_cluster: Any, spawn: Callable[..., Any]
) -> None:
    figures: dict[str, Any] = {}
    run_started = time.monotonic()
    with small_filesystem() as fs, own_cluster() as cluster:
        target = migrated_database(cluster.dsn)
        prepare(target).close()
        move_wal(cluster, fs / "wal")
        figures["pg_wal on the small filesystem"] = f"{(FS_MB * 2**20 - free_bytes(fs)) >> 20} MB"

        worker = spawn(target, *ARCHIVE)
        policy = RetryPolicy(attempts=1000, deadline_seconds=WAL_DEADLINE)
        client = Client.from_dsn(target, max_size=2, retry=policy)
        producer = Producer(client)
        try:
            assert producer.call("send").error is None
            wait_until(lambda: drained(target, set()), timeout=120)

            # -- fill: batches of sends until the server cannot make a WAL segment;
            # big messages (100 kB that do not compress), so that the few
            # hundred it takes drain in seconds
            wal_pad = base64.b64encode(os.urandom(75_000)).decode()
            fill(fs, WAL_HEADROOM)
            filling = time.monotonic()
            lost: Outcome | None = None
            while time.monotonic() - filling < 90:
                # A segment that cannot be made outside a critical section is
                # an ERROR (53100, rolled back): StorageError, and we go on.
                outcome = producer.call("batch", pad=wal_pad, batch=10)
                if isinstance(outcome.error, ConnectionLost):
                    lost = outcome
                    break
            assert lost is not None, "the WAL never filled up: no send raised ConnectionLost"
            wal_errors = [o for o in producer.outcomes if isinstance(o.error, StorageError)]
            figures["calls failed with StorageError first"] = len(wal_errors)
            if wal_errors:
                figures["first StorageError"] = str(wal_errors[0].error)
            figures["sends before the crash (batches of 10 x 100 kB)"] = producer.calls - 2
            figures["messages confirmed before the crash"] = len(producer.confirmed)
            figures["seconds to fill"] = seconds(time.monotonic() - filling)
            figures["ConnectionLost after"] = seconds(lost.seconds)
            figures["ConnectionLost"] = str(lost.error)
            assert WAL_DEADLINE <= lost.seconds < WAL_DEADLINE + 10, lost.seconds
            panics = server_log_lines(cluster, "PANIC")
            assert panics, "the server did not PANIC"
            figures["server log: first PANIC"] = panics[0].split("PANIC:", 1)[1].strip()

            # The server stays away while the disk is full; the worker waits for it.
            time.sleep(2)
            assert not answers(cluster.dsn)
            assert worker.p.poll() is None, "the worker exited while the server was down"
            figures["postmaster after the crash"] = (
                "running (restarting)" if postmaster_running(cluster) else "exited"
            )

            # -- freed: start the server again if it gave up; sends and the worker resume
            (fs / "filler").unlink()
            freed = time.monotonic()
            wait_until(lambda: up(cluster), timeout=60)
            figures["seconds to a server that answers"] = seconds(time.monotonic() - freed)
            while producer.call("send").error is not None:
                assert time.monotonic() - freed < 60, "sends did not resume"
            figures["seconds to resume sends"] = seconds(time.monotonic() - freed)
            wait_until(lambda: drained(target, producer.fans_ok), timeout=60)
            figures["seconds to drain"] = seconds(time.monotonic() - freed)

            books = balance(target, producer)
            figures["messages confirmed"] = len(producer.confirmed)
            figures["calls of unknown outcome (ConnectionLost)"] = len(producer.unsure)
            figures["lost"] = len(books.lost)
            figures["stuck"] = len(books.stuck)
            figures["partly written"] = len(books.not_atomic)
            figures["handled more than once (at-least-once)"] = books.duplicates
            assert books.lost == [], books.lost
            assert books.stuck == [], books.stuck
            assert books.not_atomic == [], books.not_atomic
            assert books.poisoned == [], books.poisoned
            assert unknown_tags(target, producer) == []

            assert worker.p.poll() is None, "the worker exited"
            figures["worker events, whole run"] = worker_events(worker)
            worker.signal(signal.SIGTERM)
            assert worker.wait(30) == 0
        finally:
            client.close()
            figures["server log"] = [
                line.split(" UTC ", 1)[-1]
                for line in server_log_lines(cluster, "")
                if any(w in line for w in SERVER_EVENTS)
            ]
            figures["run time"] = seconds(time.monotonic() - run_started)
            report("WAL disk full (pg_wal on a 48 MB filesystem)", figures)
