"""Workflows: steps with dependencies, each enqueued exactly once, on the real server.

The races run on real concurrent connections, many times over.
"""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from support.db import run_threads, wait_until

from pgqueue import (
    Client,
    InvalidArgument,
    Message,
    QueueInUse,
    QueueNotFound,
    Step,
    WorkflowConflict,
    WorkflowNotFound,
)
from pgqueue._calls import workflow as _workflow


@pytest.fixture
def queues(client: Client) -> None:
    for q in ("steps", "fan", "done"):
        client.create_queue(q, max_attempts=2)


def run_ready(client: Client, queue: str = "steps", outcome: str = "succeeded") -> list[Message]:
    """Read what is visible and complete it; the messages run."""
    msgs = client.read(queue, vt=60, qty=100)
    for m in msgs:
        client.complete_member(queue, m.msg_id, outcome=outcome, result={"step": m.step})
    return msgs


def states(client: Client, wid: str) -> dict[str, str]:
    return {s.step: s.state for s in client.workflow_steps(wid)}


def final_callbacks(client: Client, sql: Any) -> list[dict[str, Any]]:
    return [
        r[0]
        for r in sql.execute(
            "SELECT m.headers -> '_pg_callback' FROM pgqueue.message m"
            " JOIN pgqueue.queue q USING (queue_id)"
            " WHERE q.queue_name = 'done' ORDER BY m.msg_id"
        )
    ]


def test_a_diamond_runs_each_step_once_after_its_dependencies_and_calls_back_once(
    client: Client, queues: None, sql: Any
) -> None:
    wid = client.start_workflow(
        "order-7",
        [
            Step("ship", "steps", {"n": 4}, depends_on=("charge", "pack")),
            Step("charge", "steps", {"n": 2}, depends_on=("check",)),
            Step("pack", "steps", {"n": 3}, depends_on=("check",)),
            Step("check", "steps", {"n": 1}),
        ],
        callback_queue="done",
        callback_message={"order": 7},
    )
    assert states(client, wid) == {
        "check": "enqueued",
        "charge": "waiting",
        "pack": "waiting",
        "ship": "waiting",
    }
    assert [m.step for m in run_ready(client)] == ["check"]
    assert sorted(m.step or "" for m in run_ready(client)) == ["charge", "pack"]
    [ship] = run_ready(client)
    assert (ship.step, ship.workflow_id, ship.message) == ("ship", wid, {"n": 4})
    assert run_ready(client) == []
    s = client.workflow_status(wid)
    assert (s.state, s.steps, s.succeeded, s.steps_left) == ("succeeded", 4, 4, 0)
    [callback] = final_callbacks(client, sql)
    assert callback["kind"] == "workflow" and callback["workflow_id"] == wid
    [final] = client.read("done", vt=30, qty=5)
    assert final.is_callback and final.workflow_id == wid and final.barrier_id is None
    assert final.callback is not None and final.callback.kind == "workflow"
    assert callback["state"] == "succeeded"
    assert callback["steps"] == dict.fromkeys(["check", "charge", "pack", "ship"], "succeeded")
    [packed] = client.step_results(wid, "pack")
    assert (packed.outcome, packed.result) == ("succeeded", {"step": "pack"})


def test_a_chain_of_200_steps_runs_in_order(client: Client, queues: None) -> None:
    steps = [Step("s0", "steps", 0)] + [
        Step(f"s{i}", "steps", i, depends_on=(f"s{i - 1}",)) for i in range(1, 200)
    ]
    wid = client.start_workflow("chain", steps)
    order = []
    while batch := run_ready(client):
        assert len(batch) == 1
        order.append(batch[0].message)
    assert order == list(range(200))
    assert client.workflow_status(wid).state == "succeeded"


def test_a_failed_step_cancels_its_dependents_transitively_unless_they_run_anyway(
    client: Client, queues: None, sql: Any
) -> None:
    wid = client.start_workflow(
        "w",
        [
            Step("a", "steps", 1),
            Step("b", "steps", 2, depends_on=("a",)),
            Step("c", "steps", 3, depends_on=("b",)),
            Step("cleanup", "steps", 4, depends_on=("b",), on_dependency_failure="run"),
        ],
        callback_queue="done",
    )
    run_ready(client)  # a
    run_ready(client, outcome="failed")  # b fails
    assert states(client, wid) == {
        "a": "succeeded",
        "b": "failed",
        "c": "cancelled",
        "cleanup": "enqueued",
    }
    assert [m.step for m in run_ready(client)] == ["cleanup"]
    s = client.workflow_status(wid)
    assert (s.state, s.succeeded, s.failed, s.cancelled) == ("failed", 2, 1, 1)
    [callback] = final_callbacks(client, sql)
    assert callback["state"] == "failed" and callback["steps"]["c"] == "cancelled"


def test_a_fan_out_step_is_joined_and_its_results_read_by_reference(
    client: Client, queues: None
) -> None:
    wid = client.start_workflow(
        "fanin",
        [
            Step("split", "fan", messages=[{"part": i} for i in range(50)], max_failures=2),
            Step("join", "steps", {"join": True}, depends_on=("split",)),
        ],
    )
    parts = client.read("fan", vt=60, qty=100)
    assert len(parts) == 50 and {m.step for m in parts} == {"split"}
    for i, m in enumerate(parts):
        outcome = "failed" if i < 2 else "succeeded"  # two tolerated
        client.complete_member("fan", m.msg_id, outcome=outcome, result={"sum": i})
    [join] = client.read("steps", vt=60, qty=10)
    assert join.message == {"join": True}  # no results copied into the payload
    results = client.step_results(join.workflow_id or "", "split")
    assert [r.result for r in results] == [{"sum": i} for i in range(50)]
    client.complete_member("steps", join.msg_id)
    assert client.workflow_status(wid).state == "succeeded"


def test_a_workflow_id_is_single_flight_while_it_runs(client: Client, queues: None) -> None:
    steps = [Step("a", "steps", 1)]
    assert client.start_workflow("root-A", steps) == "root-A"
    assert client.start_workflow("root-A", steps) == "root-A"  # a retry: nothing new
    assert client.metrics("steps").queue_length == 1
    with pytest.raises(WorkflowConflict, match="running"):
        client.start_workflow("root-A", [Step("b", "steps", 2)])
    assert client.list_workflows(state="running")[0].workflow_id == "root-A"
    run_ready(client)
    assert client.workflow_status("root-A").state == "succeeded"
    client.start_workflow("root-A", [Step("b", "steps", 2)])  # finished: may run again
    assert states(client, "root-A") == {"b": "enqueued"}


def test_a_start_retried_after_its_run_finished_does_not_start_it_again(
    client: Client, queues: None
) -> None:
    call = _workflow.start_workflow("once", [Step("a", "steps", 1)])
    assert client.run(call) == "once"
    run_ready(client)
    assert client.workflow_status("once").state == "succeeded"
    assert client.run(call) == "once"  # the same call (a lost reply, retried): no second run
    assert client.metrics("steps").queue_length == 0
    assert client.workflow_status("once").state == "succeeded"


def test_steps_grafted_while_it_runs_then_sealed(client: Client, queues: None, sql: Any) -> None:
    wid = client.start_workflow(
        "crawl", [Step("root", "steps", "/")], sealed=False, callback_queue="done"
    )
    [root] = client.read("steps", vt=60, qty=10)
    # the root's handler grafts what it found, in its own transaction
    with client.connection() as conn, conn.transaction():
        client.add_steps(
            wid,
            [
                Step("/a", "steps", "/a", depends_on=("root",)),
                Step("merge", "steps", "merge", depends_on=("/a", "root")),
            ],
            conn=conn,
        )
        client.complete_member("steps", root.msg_id, conn=conn)
    assert [m.step for m in run_ready(client)] == ["/a"]
    assert [m.step for m in run_ready(client)] == ["merge"]
    s = client.workflow_status(wid)
    assert (s.state, s.steps_left, s.sealed) == ("running", 0, False)  # not sealed: not over
    assert final_callbacks(client, sql) == []
    # a step grafted on after its dependency ended runs at once
    client.add_steps(wid, [Step("late", "steps", "late", depends_on=("merge",))])
    assert [m.step for m in run_ready(client)] == ["late"]
    assert client.seal_workflow(wid).state == "succeeded"
    assert len(final_callbacks(client, sql)) == 1
    with pytest.raises(WorkflowConflict, match="no more steps"):
        client.add_steps(wid, [Step("x", "steps", 1)])


def test_cancel_cancels_what_has_not_started_and_lets_running_members_finish(
    client: Client, queues: None, sql: Any
) -> None:
    wid = client.start_workflow(
        "big",
        [
            Step("split", "fan", messages=list(range(10))),
            Step("after", "steps", 1, depends_on=("split",)),
        ],
        callback_queue="done",
    )
    running = client.read("fan", vt=60, qty=3)
    s = client.cancel_workflow(wid)
    assert (s.state, s.cancelled) == ("cancelled", 2)
    assert client.metrics("fan").queue_length == 3  # the seven not started are gone
    [split] = [x for x in client.workflow_steps(wid) if x.step == "split"]
    assert (split.cancelled, split.remaining) == (7, 3)
    for m in running:
        client.complete_member("fan", m.msg_id)  # recorded, changes nothing
    assert client.workflow_status(wid).state == "cancelled"
    assert client.metrics("steps").queue_length == 0  # "after" never sent
    [callback] = final_callbacks(client, sql)
    assert callback["state"] == "cancelled"
    assert client.cancel_workflow(wid).state == "cancelled"  # again: nothing


def test_bad_workflows_are_refused_and_nothing_is_started(client: Client, queues: None) -> None:
    with pytest.raises(InvalidArgument, match="cycle"):
        client.start_workflow(
            "w",
            [Step("a", "steps", 1, depends_on=("b",)), Step("b", "steps", 1, depends_on=("a",))],
        )
    with pytest.raises(InvalidArgument, match="not in workflow"):
        client.start_workflow("w", [Step("a", "steps", 1, depends_on=("ghost",))])
    with pytest.raises(InvalidArgument, match="policy"):
        client.start_workflow(
            "w", [Step("a", "fan", messages=[1], policy="fail_fast", max_failures=1)]
        )
    with pytest.raises(InvalidArgument, match="listed twice"):
        client.start_workflow("w", [Step("a", "steps", 1), Step("a", "steps", 2)])
    with pytest.raises(WorkflowNotFound):
        client.workflow_status("w")
    assert client.metrics("steps").queue_length == 0 and client.metrics("fan").queue_length == 0


def test_a_step_whose_dependencies_end_at_once_on_many_connections_is_enqueued_once(
    client: Client, queues: None, dsn: str
) -> None:
    """The with_items incident: 8 dependencies complete at the same instant, 20 times over."""
    n = 8
    clients = [Client.from_dsn(dsn, max_size=1) for _ in range(n)]
    try:
        for round_ in range(20):
            wid = f"items-{round_}"
            deps = [Step(f"item{i}", "fan", i) for i in range(n)]
            client.start_workflow(
                wid,
                [*deps, Step("validate", "steps", round_, depends_on=tuple(d.name for d in deps))],
            )
            items = client.read("fan", vt=60, qty=n)
            assert len(items) == n

            def complete(i: int, items: list[Message] = items) -> None:
                clients[i].complete_member("fan", items[i].msg_id)

            run_threads(n, complete)
            sent = client.read("steps", vt=60, qty=10)
            assert [m.message for m in sent] == [round_], "validate dispatched once"
            client.complete_member("steps", sent[0].msg_id)
            assert client.workflow_status(wid).state == "succeeded"
    finally:
        for c in clients:
            c.close()


def test_a_10000_member_fan_out_then_a_join_then_another_fan_out(
    client: Client, queues: None
) -> None:
    wid = client.start_workflow(
        "wide",
        [
            Step("split", "fan", messages=list(range(10_000))),
            Step("join", "steps", "join", depends_on=("split",)),
            Step("again", "fan", messages=list(range(100)), depends_on=("join",)),
        ],
    )
    done = 0
    while parts := client.read("fan", vt=60, qty=1000):
        client.complete_members("fan", [m.msg_id for m in parts], results=[1] * len(parts))
        done += len(parts)
    assert done == 10_000
    assert states(client, wid)["join"] == "enqueued"
    assert [m.step for m in run_ready(client)] == ["join"]
    again = client.read("fan", vt=60, qty=1000)
    assert len(again) == 100 and {m.step for m in again} == {"again"}
    client.complete_members("fan", [m.msg_id for m in again])
    s = client.workflow_status(wid)
    assert (s.state, s.succeeded) == ("succeeded", 3)
    assert len(client.step_results(wid, "split")) == 10_000


def _wait_for_lock_wait(sql: Any, timeout: float = 30) -> None:
    """Until some session of this database waits for a lock (the call under test blocks)."""
    wait_until(
        lambda: (
            sql.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock'"
            ).fetchone()[0]
            > 0
        ),
        timeout,
    )


def _cancel_in_thread(dsn: str, wid: str) -> tuple[threading.Thread, list[Any]]:
    got: list[Any] = []

    def cancel() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            got.append(
                conn.execute("SELECT state FROM pgqueue.cancel_workflow(%s)", (wid,)).fetchone()
            )

    thread = threading.Thread(target=cancel)
    thread.start()
    return thread, got


def test_a_step_enqueued_by_a_completion_cancel_waited_for_is_cancelled_and_never_read(
    client: Client, queues: None, sql: Any, dsn: str
) -> None:
    """cancel_workflow listed the barriers to cancel before it locked the workflow: a step that
    a completion still in flight enqueued kept its message, under a step marked cancelled."""
    wid = client.start_workflow(
        "w", [Step("a", "steps", 1), Step("b", "steps", 2, depends_on=("a",))]
    )
    [a] = client.read("steps", vt=60, qty=5)
    with psycopg.connect(dsn) as completing:
        completing.execute("SELECT pgqueue.complete_member('steps', %s)", (a.msg_id,))
        thread, got = _cancel_in_thread(dsn, wid)
        _wait_for_lock_wait(sql)
        completing.commit()  # b is enqueued now, while cancel waits
    thread.join(30)
    assert got == [("cancelled",)]
    assert states(client, wid) == {"a": "succeeded", "b": "cancelled"}
    assert client.read("steps", vt=60, qty=5) == []  # b's message is gone, not run
    assert client.metrics("steps").queue_length == 0


def test_a_step_grafted_by_add_steps_cancel_waited_for_is_cancelled_and_never_read(
    client: Client, queues: None, sql: Any, dsn: str
) -> None:
    wid = client.start_workflow("w", [Step("a", "steps", 1)], sealed=False)
    with psycopg.connect(dsn) as grafting:
        grafting.execute(
            'SELECT pgqueue.add_steps(%s, \'[{"step": "g", "queue": "steps", "message": 2}]\')',
            (wid,),
        )
        thread, got = _cancel_in_thread(dsn, wid)
        _wait_for_lock_wait(sql)
        grafting.commit()
    thread.join(30)
    assert got == [("cancelled",)]
    assert states(client, wid) == {"a": "cancelled", "g": "cancelled"}
    assert client.read("steps", vt=60, qty=5) == []


@pytest.mark.parametrize("round_", range(8))
def test_cancel_racing_completions_leaves_no_message_of_a_cancelled_step(
    client: Client, queues: None, dsn: str, round_: int
) -> None:
    """Real threads, no held transaction: every step's completion and a cancel at once."""
    width = 6
    wid = client.start_workflow(
        f"r{round_}",
        [Step(f"a{i}", "steps", i) for i in range(width)]
        + [Step(f"b{i}", "steps", i, depends_on=(f"a{i}",)) for i in range(width)],
    )
    firsts = client.read("steps", vt=60, qty=width)
    assert len(firsts) == width

    def act(i: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            if i == width:
                conn.execute("SELECT pgqueue.cancel_workflow(%s)", (wid,))
            else:
                conn.execute("SELECT pgqueue.complete_member('steps', %s)", (firsts[i].msg_id,))

    run_threads(width + 1, act)
    assert client.workflow_status(wid).state == "cancelled"
    cancelled = {s.step for s in client.workflow_steps(wid) if s.state == "cancelled"}
    left = client.read("steps", vt=60, qty=100)
    assert [m.step for m in left if m.step in cancelled] == []
    # nothing was leased when the cancel ran: every step not run is cancelled
    assert {m.step for m in left} == set()


def test_a_queue_a_running_workflow_calls_back_into_cannot_be_dropped(
    client: Client, queues: None, sql: Any
) -> None:
    """Dropping it lost the final callback: the workflow said succeeded, with no callback."""
    wid = client.start_workflow("w", [Step("a", "steps", 1)], callback_queue="done")
    with pytest.raises(QueueInUse, match="final callbacks of 1 running workflow"):
        client.drop_queue("done")
    run_ready(client)
    s = client.workflow_status(wid)
    assert s.state == "succeeded" and s.callback_msg_id is not None
    [final] = client.read("done", vt=30, qty=5)
    assert final.msg_id == s.callback_msg_id and final.workflow_id == wid
    assert client.drop_queue("done")  # nothing calls back into it any more


@pytest.mark.parametrize("round_", range(10))
def test_start_workflow_and_drop_queue_racing_never_both_win(
    client: Client, queues: None, dsn: str, round_: int
) -> None:
    client.create_queue("cb")
    outcome: dict[str, Any] = {}

    def act(i: int) -> None:
        c = Client.from_dsn(dsn, max_size=1)
        try:
            if i == 0:
                c.start_workflow("w", [Step("a", "steps", 1)], callback_queue="cb")
                outcome["started"] = True
            else:
                outcome["dropped"] = c.drop_queue("cb")
        except (QueueInUse, QueueNotFound) as exc:
            outcome[type(exc).__name__] = True
        finally:
            c.close()

    run_threads(2, act)
    if outcome.get("started"):
        assert "dropped" not in outcome and outcome.get("QueueInUse")
        assert client.workflow_status("w").callback_queue == "cb"
    else:
        assert outcome.get("dropped") is True and outcome.get("QueueNotFound")
        with pytest.raises(WorkflowNotFound):
            client.workflow_status("w")
