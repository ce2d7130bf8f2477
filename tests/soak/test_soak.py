"""The soak's checker catches every broken promise, and a short soak under faults balances.

CI also runs the full short soak (`python tests/soak/chaos.py --mode short`),
server restart and the five scenarios included; these tests keep the checker
honest: each tampering below breaks one promise, and the checker must say so.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import chaos
import psycopg
import pytest
import soak_app

from pgqueue import Client


@pytest.fixture
def soak_db(server_dsn: str) -> Iterator[str]:
    """A database set up as the soak sets up its own."""
    with chaos.soak_database(server_dsn, {soak_app.WORK: 5, soak_app.CALLBACKS: 5}) as dsn:
        yield dsn


@pytest.fixture
def logdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SOAK_LOG_DIR", str(tmp_path))
    monkeypatch.setattr(soak_app, "_fd", None)
    return tmp_path


def run_by_hand(client: Client, dsn: str) -> str:
    """What consumers would do, done by hand: two singles and a barrier of three, all handled."""
    client.send(soak_app.WORK, {"single": "a"}, dedupe_key="a")
    client.send(soak_app.WORK, {"single": "b"}, dedupe_key="b")
    bid = client.fan_out(
        soak_app.WORK,
        [{"ms": 0}, {"ms": 0}, {"perm": "poison"}],
        callback_queue=soak_app.CALLBACKS,
        callback_message={},
    )
    for msg in client.read(soak_app.WORK, vt=30, qty=10):
        soak_app.log(msg, "start")
        if msg.message.get("perm"):
            soak_app.log(msg, "fail")
            client.poison(soak_app.WORK, msg.msg_id, reason="designed")
            continue
        soak_app.log(msg, "done")
        if msg.barrier_id:
            client.complete_member(soak_app.WORK, msg.msg_id)
        else:
            client.archive(soak_app.WORK, msg.msg_id)
    [cb] = client.read(soak_app.CALLBACKS, vt=30, qty=10)
    soak_app.log(cb, "start")
    h = cb.callback
    assert h is not None
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO soak_callback VALUES (%s, %s, %s, %s, %s)",
            (bid, cb.msg_id, h.total, h.succeeded, h.failed),
        )
    soak_app.log(cb, "done")
    client.archive(soak_app.CALLBACKS, cb.msg_id)
    return bid


def failures(dsn: str, logdir: Path) -> str:
    return "\n".join(chaos.check(dsn, logdir, None, bound=0).failures)


def test_the_books_balance_when_every_message_was_handled_once(soak_db: str, logdir: Path) -> None:
    with Client.from_dsn(soak_db) as client:
        run_by_hand(client, soak_db)
    rep = chaos.check(soak_db, logdir, None, bound=0)
    assert rep.failures == []
    f = rep.figures
    assert (f["messages sent"], f["acked"], f["poisoned"], f["callbacks"]) == (6, 5, 1, 1)
    assert (f["lost"], f["stuck"], f["duplicate executions"]) == (0, 0, 0)


def test_the_checker_finds_a_message_acked_without_a_run(soak_db: str, logdir: Path) -> None:
    with Client.from_dsn(soak_db) as client:
        run_by_hand(client, soak_db)
        client.send(soak_app.WORK, {"single": "c"}, dedupe_key="c")
        [msg] = client.read(soak_app.WORK, vt=30)
        client.archive(soak_app.WORK, msg.msg_id)  # acked, but no handler ever finished it
    assert "acked without a successful run: 1" in failures(soak_db, logdir)


def test_the_checker_finds_a_stuck_message_and_an_open_barrier(soak_db: str, logdir: Path) -> None:
    with Client.from_dsn(soak_db) as client:
        run_by_hand(client, soak_db)
        client.fan_out(
            soak_app.WORK, [{"ms": 0}], callback_queue=soak_app.CALLBACKS, callback_message={}
        )
    found = failures(soak_db, logdir)
    assert "stuck in the queue after the drain: 1" in found
    assert "barriers not fired: 1" in found


def test_the_checker_finds_a_delivery_after_the_ack(soak_db: str, logdir: Path) -> None:
    with Client.from_dsn(soak_db) as client:
        run_by_hand(client, soak_db)
        client.send(soak_app.WORK, {"single": "d"}, dedupe_key="d")
        [msg] = client.read(soak_app.WORK, vt=30)
        soak_app.log(msg, "start")
        soak_app.log(msg, "done")
        client.archive(soak_app.WORK, msg.msg_id)
        # A second execution that saw a read count the ack never knew of.
        later = dataclasses.replace(msg, read_ct=msg.read_ct + 1)
        soak_app.log(later, "start")
        soak_app.log(later, "done")
    found = failures(soak_db, logdir)
    assert "delivered after its ack: 1" in found
    assert "duplicate executions 1 exceed their bound 0" in found


def test_the_checker_finds_a_second_callback_and_wrong_counts(soak_db: str, logdir: Path) -> None:
    with Client.from_dsn(soak_db) as client:
        bid = run_by_hand(client, soak_db)
    with psycopg.connect(soak_db, autocommit=True) as conn:
        conn.execute("INSERT INTO soak_callback (barrier_id, msg_id) VALUES (%s, 0)", (bid,))
        conn.execute("UPDATE pgqueue.barrier SET succeeded = 3, failed = 0")
    found = failures(soak_db, logdir)
    assert "barriers called back twice: 1" in found
    assert "barriers with wrong counts: 1" in found


def test_the_checker_finds_an_outcome_the_payload_did_not_design(
    soak_db: str, logdir: Path
) -> None:
    with Client.from_dsn(soak_db) as client:
        run_by_hand(client, soak_db)
        client.send(soak_app.WORK, {"single": "e"}, dedupe_key="e")
        [msg] = client.read(soak_app.WORK, vt=30)
        client.poison(soak_app.WORK, msg.msg_id, reason="not designed")
    assert "outcome other than designed: 1" in failures(soak_db, logdir)


def test_a_short_soak_under_faults_loses_nothing_and_calls_back_once(
    server_dsn: str, tmp_path: Path
) -> None:
    """Workers, producers, SIGKILLs, terminations, cuts and stalls for 15 s (no restart here)."""
    # the drain's bound is for a loaded machine: it ends when the books balance
    cfg = chaos.Config(duration=15, consumers=2, rate=150, fault_every=2, drain_timeout=240)
    rep = chaos.soak(cfg, server_dsn, None, tmp_path)
    assert rep.failures == [], rep.failures
    faults: dict[str, Any] = rep.figures["faults"]
    assert {"sigkill", "terminate", "cut", "stall"} <= set(faults)
    assert rep.figures["barriers"] > 0 and rep.figures["lost"] == 0
    assert os.listdir(tmp_path / "soak")


def test_the_checker_finds_an_exit_without_an_entry(soak_db: str, logdir: Path) -> None:
    with Client.from_dsn(soak_db) as client:
        run_by_hand(client, soak_db)
    with psycopg.connect(soak_db, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO pgqueue.poison (queue_id, msg_id, read_ct, enqueued_at, reason, message)"
            " SELECT queue_id, 999999, 1, now(), 'forged', '{}' FROM pgqueue.queue LIMIT 1"
        )
    assert "exits without a matching entry" in failures(soak_db, logdir)
