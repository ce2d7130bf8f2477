"""The failover soak's own books catch every broken promise; no engine needed.

CI runs the soak itself (`python tests/soak/failover.py --mode short`) on a
pg_auto_failover formation. These tests start from a clean run as the soak
recorded it (the short mode's first green run), tamper with one thing at a
time, and check that exactly that promise is reported broken.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path

import chaos
import failover
import pytest
from failover import Books, Failover, Receipt, WalClock


def recorded_failovers() -> list[Failover]:
    """The three failovers of a clean short run, as the soak recorded them."""
    return [
        Failover("switchover", "node1", 1000.0, "node2", 2, 3.5, 5.6),
        Failover("sigkill", "node2", 1020.0, "node1", 3, 12.0, 14.0),
        Failover("failover", "node1", 1045.0, "node2", 4, 2.5, 3.1),
    ]


def clean_books() -> Books:
    return Books(
        failovers=recorded_failovers(),
        wanted=3,
        consumers=2,
        alive=2,
        exited=[],
        on_standbys={"node1": 0, "node3": 0},
        not_replicated=0,
        missing_below_switch=[],
    )


def broken(books: Books) -> list[str]:
    rep = chaos.Report()
    books.check(rep)
    return rep.failures


def test_a_clean_run_breaks_no_promise() -> None:
    assert broken(clean_books()) == []


def test_a_failover_that_did_not_complete_is_reported() -> None:
    books = clean_books()
    books.failovers[1].error = "no new primary within 90 s of leaving node2"
    [found] = broken(books)
    assert found.startswith("failovers that did not complete: 1")
    assert "sigkill node2" in found


def test_fewer_failovers_than_planned_is_reported() -> None:
    books = dataclasses.replace(clean_books(), failovers=recorded_failovers()[:2])
    assert broken(books) == ["only 2 of 3 failovers were made"]


def test_a_consumer_that_exited_on_its_own_is_reported() -> None:
    books = dataclasses.replace(clean_books(), alive=1, exited=[(4242, 1)])
    found = broken(books)
    assert found[0].startswith("consumers that exited on their own: 1")
    assert found[1] == "consumers alive at the end: 1 of 2"


def test_a_consumer_gone_with_exit_code_zero_is_still_reported() -> None:
    # unexpected_exits() leaves out code 0: only the live count shows it
    assert broken(dataclasses.replace(clean_books(), alive=1)) == [
        "consumers alive at the end: 1 of 2"
    ]


def test_a_pgqueue_connection_left_on_a_standby_is_reported() -> None:
    books = dataclasses.replace(clean_books(), on_standbys={"node1": 0, "node3": 2})
    [found] = broken(books)
    assert found.startswith("pgqueue connections on a standby at the end: 2")
    assert "node3" in found


def test_a_commit_cancelled_in_its_sync_wait_is_reported() -> None:
    [found] = broken(dataclasses.replace(clean_books(), not_replicated=1))
    assert "commit.not_replicated" in found and found.endswith(": 1")


def test_a_send_missing_below_its_switch_point_is_reported() -> None:
    [found] = broken(dataclasses.replace(clean_books(), missing_below_switch=["p0-s17"]))
    assert found.startswith("confirmed sends missing at or below their switch point: 1")


# -- async: which missing sends a failover excuses ---------------------------------------


def stamped(entries: dict[str, Receipt]) -> chaos.Ledger:
    """A stamped ledger holding singles with the given receipts."""
    ledger = failover.stamped_ledger(WalClock(None))
    for key, receipt in entries.items():
        ledger.singles[key] = 1
        ledger.singles.receipts[key] = receipt  # type: ignore[attr-defined]
    return ledger


# timeline 1 ended at 0/5000000, timeline 2 at 0/9000000; timeline 3 is current
POINTS = {1: 0x5000000, 2: 0x9000000}
KILLS = [1020.0]  # the recorded run's SIGKILL


def test_only_sends_past_their_switch_point_are_lost_to_async() -> None:
    ledger = stamped(
        {
            "present": Receipt(1.0, 1, 0x4000000),
            "past": Receipt(2.0, 1, 0x5000100),
            "at": Receipt(3.0, 2, 0x9000000),
            "below": Receipt(4.0, 2, 0x8FFFFFF),
            "current": Receipt(5.0, 3, 0xA000000),
        }
    )
    allowed, bugs = failover.classify_missing(ledger, {"present"}, POINTS, KILLS)
    assert allowed == ["past"]
    assert bugs == ["at", "below", "current"]


def test_a_send_whose_lsn_went_unread_is_excused_only_just_before_a_kill() -> None:
    # the primary died before the LSN could be read after the send
    ledger = stamped(
        {
            "just before": Receipt(KILLS[0] - 0.3, failover.UNREAD),
            "long before": Receipt(KILLS[0] - 30, failover.UNREAD),
            "no kill near": Receipt(5000.0, failover.UNREAD),
        }
    )
    allowed, bugs = failover.classify_missing(ledger, set(), POINTS, KILLS)
    assert allowed == ["just before"]
    assert bugs == ["long before", "no kill near"]


def test_a_missing_send_without_a_receipt_is_a_bug() -> None:
    ledger = failover.stamped_ledger(WalClock(None))
    dict.__setitem__(ledger.singles, "unstamped", 1)
    ledger.barriers["b"] = 3  # stamped, timeline 0: no switch point excuses it
    assert failover.classify_missing(ledger, set(), POINTS, KILLS) == ([], ["unstamped", "b"])


def test_sends_lost_to_async_leave_the_ledger_the_checker_sees() -> None:
    ledger = stamped({"kept": Receipt(1.0, 1, 1), "lost": Receipt(2.0, 1, 0x6000000)})
    ledger.workflows.append("w1")
    plain = failover.without(ledger, {"lost"})
    assert (plain.singles, plain.workflows) == ({"kept": 1}, ["w1"])
    assert "lost" in ledger.singles


def test_a_delivery_after_the_ack_is_excused_only_by_a_read_lost_at_a_kill() -> None:
    def run(t: float, rc: int) -> list[dict[str, object]]:
        return [{"e": "start", "rc": rc, "t": t}, {"e": "done", "rc": rc, "t": t + 0.01}]

    log = {
        # read (rc 1) on the old primary just before the kill, that read lost:
        # cancelled on the new primary with the read count it had there
        ("soak_work", 1): run(KILLS[0] - 0.05, 1),
        # the same, but the unknown execution was long before any kill
        ("soak_work", 2): run(KILLS[0] - 60, 1),
        # a second execution after the ack, nowhere near a kill
        ("soak_work", 3): run(900.0, 1) + run(1100.0, 2),
        # acked with the read count of its last execution: fine
        ("soak_work", 4): run(900.0, 1),
    }
    deleted = {("soak_work", 1): 0, ("soak_work", 2): 0, ("soak_work", 3): 1, ("soak_work", 4): 1}
    excused, not_excused = failover.lost_reads(log, deleted, KILLS)
    assert excused == [("soak_work", 1)]
    assert not_excused == [("soak_work", 2), ("soak_work", 3)]


# -- cancelled sync waits: pg_autoctl's own, or a commit nobody excuses ---------------------


SYNC_OFF_LINE = (
    '2026-11-25 09:34:19.938 UTC [25770] LOG:  parameter "synchronous_standby_names" changed to ""'
)


def cancel_line(at: str, pid: int) -> str:
    return (
        f"2026-11-25 {at} UTC [{pid}] WARNING:  canceling wait for synchronous replication"
        " due to user request"
    )


def test_cancels_right_after_sync_rep_went_off_are_the_engines() -> None:
    node3 = [
        cancel_line("09:34:10.000", 1),  # before: nothing excuses it
        SYNC_OFF_LINE,
        cancel_line("09:34:19.950", 2),
        cancel_line("09:34:19.951", 3),
        cancel_line("09:34:40.000", 4),  # long after
        "2026-11-25 09:35:16.341 UTC [5] WARNING:  canceling the wait for synchronous"
        " replication and terminating connection due to administrator command",
    ]
    node1 = node3[:3]  # the same file, copied by pg_rewind: counted once
    found = failover.classify_sync_waits([node3, node1])
    assert found == {"engine": 2, "other": 2, "terminated": 1}


# -- the figures -------------------------------------------------------------------------


def test_the_stall_is_the_longest_gap_touching_the_window() -> None:
    times = [0.0, 1.0, 2.0, 9.0, 9.5, 20.0]
    assert failover.longest_gap(times, 3.0, 4.0) == 7.0  # 2 -> 9 spans the window
    assert failover.longest_gap(times, 9.1, 9.4) == 0.5
    assert failover.longest_gap(times, 0.0, 9.5, within=True) == 7.0
    assert failover.longest_gap(times, 2.5, 19.0, within=True) == 0.5
    calls = [(0.0, 0.1), (5.0, 17.0), (18.0, 18.2)]
    assert failover.longest_call(calls, 10.0, 11.0) == 12.0
    assert failover.longest_call(calls, 6.0, 19.0, within=True) == pytest.approx(0.2)


def test_log_events_are_counted_against_the_failover_they_followed(tmp_path: Path) -> None:
    lines = [
        {"event": "connection.retry", "timestamp": "1970-01-01T00:16:50Z"},  # 1010: switchover
        {"event": "listen.reconnecting", "timestamp": "1970-01-01T00:17:05Z"},  # 1025: sigkill
        {"event": "message.failed", "timestamp": "1970-01-01T00:17:06Z"},  # not counted
        {"event": "connection.retry", "timestamp": "1970-01-01T00:10:00Z"},  # before any
    ]
    text = "\n".join(json.dumps(e) for e in lines)
    text += "\nnot json connection.retry\n"
    text += "WARNING:  canceling wait for synchronous replication due to user request\n"
    (tmp_path / "worker-0.log").write_text(text)
    records = recorded_failovers()
    found = failover.log_events(tmp_path, "worker-*.log")
    failover.attribute(records, found, "consumers")
    assert records[0].events == {"consumers connection.retry": 1}
    assert records[1].events == {"consumers listen.reconnecting": 1}
    assert not records[2].events


def test_the_summary_prints_every_failover_and_each_kind(
    capsys: pytest.CaptureFixture[str],
) -> None:
    records = recorded_failovers()
    records[0].switch_point = 0x1_0000_40D8
    failover.print_failovers(records, synchronous=False)
    out = capsys.readouterr().out
    assert "| 1 | switchover | node1 -> node2 | 2 | 3.5 | 5.6 |" in out
    assert "| 1/40D8 |" in out
    assert "| sigkill | 1 | 12.0 |" in out


def test_an_lsn_reads_as_its_byte_position() -> None:
    assert failover.lsn("0/40003C8") == 0x40003C8
    assert failover.lsn("16/B374D848") == (0x16 << 32) + 0xB374D848


class _Formation:
    """Whole at once: the fault loop's only call on the formation between faults."""

    def wait_whole(self, timeout: float) -> float:
        return 0.0


class _Faults(failover.Failovers):
    """The fault loop with the engine replaced by a script: the first `stalls` faults stall."""

    def __init__(self, count: int, stalls: int) -> None:
        super().__init__(_Formation(), count, seed=1, stop=threading.Event())  # type: ignore[arg-type]
        self.to_stall = stalls
        self.stopping.wait = lambda timeout=None: False  # type: ignore[method-assign]

    def inject(self, kind: str) -> Failover:
        if self.to_stall:
            self.to_stall -= 1
            raise failover.EngineStall(f"no new primary within 90 s of leaving node{self.to_stall}")
        return Failover(kind, "node1", 1000.0, "node2", 2, 1.0, 2.0)


def test_an_engine_stall_is_retried_once_and_every_kind_still_runs() -> None:
    faults = _Faults(count=3, stalls=1)
    faults.run()
    assert faults.error is None
    assert sorted(r.kind for r in faults.done) == sorted(failover.KINDS)
    assert faults.stalls == ["no new primary within 90 s of leaving node0"]


def test_a_second_engine_stall_fails_the_run() -> None:
    faults = _Faults(count=3, stalls=failover.MAX_STALLS + 1)
    faults.run()
    assert isinstance(faults.error, failover.EngineStall)
    assert len(faults.stalls) == failover.MAX_STALLS + 1
    assert faults.done == []
