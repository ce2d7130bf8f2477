"""AsyncClient and Client cannot drift: the same methods, types, errors and guarantees."""

from __future__ import annotations

import asyncio
import inspect
import re
from collections.abc import Callable
from typing import Any

import pytest

import pgqueue
from pgqueue import AsyncClient, Client, Step

SYNC_ONLY_SHAPES = {"claim", "connection", "conninfo"}  # context managers and plain values


def public_methods(cls: type) -> dict[str, Any]:
    return {n: f for n, f in inspect.getmembers(cls) if callable(f) and not n.startswith("_")}


def test_async_client_has_every_client_method_with_the_same_parameters() -> None:
    sync, asyn = public_methods(Client), public_methods(AsyncClient)
    assert sorted(sync) == sorted(asyn)
    for name, fn in sync.items():
        ps = list(inspect.signature(fn).parameters.values())
        pa = list(inspect.signature(asyn[name]).parameters.values())
        assert [(p.name, p.kind, p.default) for p in ps] == [
            (p.name, p.kind, p.default) for p in pa
        ], name
        if name not in SYNC_ONLY_SHAPES:
            assert inspect.iscoroutinefunction(asyn[name]), f"AsyncClient.{name} is not async"
        assert (asyn[name].__doc__ or "").strip(), f"AsyncClient.{name} has no docstring"


def test_async_client_leases_nacks_claims_and_waits_like_the_sync_one(dsn: str, queue: str) -> None:
    async def main() -> dict[str, Any]:
        async with await AsyncClient.from_dsn(dsn, max_size=3) as ac:
            await ac.send(queue, {"n": 1})
            [m] = await ac.read(queue, vt=30, qty=1)
            out: dict[str, Any] = {
                "stale": await ac.set_vt(queue, m.msg_id, 0, read_ct=m.read_ct + 1),
                "nack": await ac.nack(queue, m.msg_id, read_ct=m.read_ct, delay=0),
            }
            out["waited"] = [x.msg_id for x in await ac.read_or_wait(queue, max_wait_seconds=1)]
            async with ac.claim("k", lease_seconds=5) as c, ac.claim("k", lease_seconds=5) as d:
                out["claims"] = (c.acquired, d.acquired)
            out["metrics"] = (await ac.metrics(queue)).queue_length
            return out

    got = asyncio.run(main())
    assert got["stale"] is None and got["nack"] == "retry"
    assert got["waited"] == [1] and got["claims"] == (True, False) and got["metrics"] == 1


@pytest.mark.parametrize("env", ["off", "7"])
def test_both_clients_take_the_prepare_threshold_from_the_environment(
    dsn: str, env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGQUEUE_PREPARE_THRESHOLD", env)
    expected = None if env == "off" else 7
    with Client.from_dsn(dsn, max_size=1) as c:
        assert c.pool.kwargs["prepare_threshold"] == expected

    async def main() -> Any:
        async with await AsyncClient.from_dsn(dsn, max_size=1) as ac:
            return ac.pool.kwargs["prepare_threshold"]

    assert asyncio.run(main()) == expected


# Names that differ only because one side is async: compared after this mapping.
ASYNC_NAMES = {
    "AsyncConnArg": "ConnArg",
    "AsyncConnection": "Connection",
    "AsyncClaim": "Claim",
    "AsyncClient": "Client",
    "AsyncIterator": "Iterator",
}


def sync_spelling(annotation: Any) -> str:
    text = str(annotation)
    for asyn, sync in ASYNC_NAMES.items():
        text = re.sub(rf"\b{asyn}\b", sync, text)
    return text


def test_async_client_takes_and_returns_the_same_types() -> None:
    sync, asyn = public_methods(Client), public_methods(AsyncClient)
    for name, fn in sync.items():
        s, a = inspect.signature(fn), inspect.signature(asyn[name])
        assert sync_spelling(a.return_annotation) == sync_spelling(s.return_annotation), name
        for p in s.parameters.values():
            q = a.parameters[p.name].annotation
            assert sync_spelling(q) == sync_spelling(p.annotation), f"{name}({p.name})"


# Whose docstrings differ on purpose: claim is an `async with` context manager
# there, and from_dsn opens another kind of pool; every other method makes the
# same promise in both clients, word for word.
OWN_DOCSTRINGS = {"claim", "from_dsn"}


def test_async_client_documents_the_same_guarantees() -> None:
    sync, asyn = public_methods(Client), public_methods(AsyncClient)
    for name, fn in sync.items():
        if name not in OWN_DOCSTRINGS:
            assert inspect.getdoc(asyn[name]) == inspect.getdoc(fn), f"AsyncClient.{name}"


def outcome(call: Callable[[], Any]) -> tuple[str, str]:
    """What a call did: the error it raised (class and message), else the type it returned."""
    try:
        return ("returned", type(call()).__name__)
    except pgqueue.PgQueueError as exc:
        return (type(exc).__name__, str(exc))


# (method, args, kwargs): each fails the same way on both clients, whatever the error.
SAME_ERRORS: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    ("send", ("nope", {"n": 1}), {}),
    ("send", ("jobs", {"n": 1}), {"headers": {"_pg_x": 1}}),
    ("send", ("jobs", {"n": float("nan")}), {}),
    ("send", ("jobs", {"n": 1}), {"delay": -1}),
    ("send_keyed", ("nope", {"n": 1}), {"dedupe_key": "k"}),
    ("send_batch", ("nope", [{"n": 1}]), {}),
    ("send_batch", ("jobs", [{"n": 1}, "x\u0000"]), {}),
    ("fan_out", ("nope", [{"n": 1}]), {"callback_queue": "jobs", "callback_message": {}}),
    ("fan_out", ("jobs", [{"n": 1}]), {"callback_queue": "nope", "callback_message": {}}),
    ("fan_out", ("jobs", [1]), {"callback_queue": "jobs", "callback_message": {}, "policy": "x"}),
    ("open_barrier", ("jobs",), {"callback_queue": "nope", "callback_message": {}}),
    ("add_members", ("no-such-barrier", [{"n": 1}]), {}),
    ("add_members", ("sealed", [{"n": 1}]), {}),
    ("seal", ("no-such-barrier",), {}),
    ("barrier_status", ("no-such-barrier",), {}),
    ("barrier_results", ("no-such-barrier",), {}),
    ("start_workflow", ("running", [Step("other", "jobs", {"n": 2})]), {}),
    ("start_workflow", ("w2", [Step("a", "jobs", depends_on=("missing",))]), {}),
    ("add_steps", ("running", [Step("b", "jobs", {})]), {}),
    ("workflow_status", ("no-such-workflow",), {}),
    ("cancel_workflow", ("no-such-workflow",), {}),
    ("metrics", ("nope",), {}),
    ("create_queue", ("bad name!",), {}),
    ("poison", ("nope", 1, "why"), {}),
    ("poison_requeue", ("nope", [1]), {}),
    ("poison_purge", ("nope",), {}),
]


def test_async_client_raises_what_client_raises(client: Client, dsn: str, queue: str) -> None:
    client.open_barrier(queue, callback_queue=queue, callback_message={}, barrier_id="sealed")
    client.seal("sealed")
    client.start_workflow("running", [Step("a", queue, {"n": 1})], sealed=True)

    async def async_outcomes() -> list[tuple[str, str]]:
        async with await AsyncClient.from_dsn(dsn, max_size=2) as ac:
            found = []
            for name, args, kwargs in SAME_ERRORS:
                try:
                    got = await getattr(ac, name)(*args, **kwargs)
                    found.append(("returned", type(got).__name__))
                except pgqueue.PgQueueError as exc:
                    found.append((type(exc).__name__, str(exc)))
            return found

    expected = [
        outcome(lambda n=name, a=args, k=kwargs: getattr(client, n)(*a, **k))
        for name, args, kwargs in SAME_ERRORS
    ]
    assert all(kind != "returned" for kind, _ in expected), expected
    assert asyncio.run(async_outcomes()) == expected


class Boom(Exception):
    """Whatever fails in the caller's transaction after its sends."""


async def send_everything(ac: AsyncClient, conn: Any, queue: str) -> None:
    """Every sending call a web app makes, on the caller's connection."""
    await ac.create_queue("extra", conn=conn)
    await ac.send(queue, {"n": 1}, conn=conn)
    await ac.send_keyed(queue, {"n": 2}, dedupe_key="k", conn=conn)
    await ac.send_batch(queue, [{"n": 3}, {"n": 4}], conn=conn)
    await ac.fan_out(
        queue,
        [{"m": 1}, {"m": 2}],
        callback_queue="extra",
        callback_message={},
        barrier_id="fanned",
        conn=conn,
    )
    await ac.open_barrier(
        queue,
        callback_queue="extra",
        callback_message={},
        messages=[{"o": 1}],
        barrier_id="opened",
        conn=conn,
    )
    await ac.add_members("opened", [{"o": 2}], conn=conn)
    await ac.seal("opened", conn=conn)
    await ac.start_workflow("flow", [Step("a", queue, {"w": 1})], sealed=False, conn=conn)
    await ac.add_steps("flow", [Step("b", queue, {"w": 2}, depends_on=("a",))], conn=conn)
    await ac.seal_workflow("flow", conn=conn)


@pytest.mark.parametrize("commit", [True, False])
def test_async_sends_commit_or_roll_back_with_the_callers_transaction(
    client: Client, dsn: str, queue: str, commit: bool
) -> None:
    async def main() -> None:
        async with await AsyncClient.from_dsn(dsn, max_size=2) as ac, ac.connection() as conn:
            try:
                async with conn.transaction():
                    await send_everything(ac, conn, queue)
                    if not commit:
                        raise Boom
            except Boom:
                pass

    asyncio.run(main())
    if commit:
        # send 1, send_keyed 1, send_batch 2, fan_out 2, the open barrier 2, step a 1
        assert client.metrics(queue).queue_length == 9
        assert client.barrier_status("fanned").total == 2
        assert (client.barrier_status("opened").total, client.barrier_status("opened").sealed) == (
            2,
            True,
        )
        assert client.workflow_status("flow").steps == 2
        assert "extra" in [q.queue_name for q in client.list_queues()]
    else:
        assert client.metrics(queue).queue_length == 0
        assert "extra" not in [q.queue_name for q in client.list_queues()]
        with pytest.raises(pgqueue.BarrierNotFound):
            client.barrier_status("fanned")
        with pytest.raises(pgqueue.BarrierNotFound):
            client.barrier_status("opened")
        with pytest.raises(pgqueue.WorkflowNotFound):
            client.workflow_status("flow")


def test_async_reads_of_barriers_metrics_and_poison_match_the_sync_ones(
    client: Client, dsn: str, queue: str
) -> None:
    async def main() -> dict[str, Any]:
        async with await AsyncClient.from_dsn(dsn, max_size=2) as ac:
            bid = await ac.fan_out(
                queue, [{"m": 1}, {"m": 2}], callback_queue=queue, callback_message={"cb": 1}
            )
            members = await ac.read(queue, vt=30, qty=2)
            await ac.complete_members(
                queue, [m.msg_id for m in members], results=[{"r": m.msg_id} for m in members]
            )
            sent = await ac.send(queue, {"bad": True})
            [bad] = [m for m in await ac.read(queue, vt=30, qty=5) if m.msg_id == sent]
            poisoned = await ac.poison(queue, bad.msg_id, "broken", read_ct=bad.read_ct)
            out: dict[str, Any] = {
                "bid": bid,
                "poisoned": poisoned,
                "status": await ac.barrier_status(bid),
                "results": await ac.barrier_results(bid),
                "failures": await ac.barrier_failures(bid),
                "queues": await ac.list_queues(),
                "metrics": await ac.metrics(queue),
                "metrics_all": await ac.metrics_all(),
                "poison_list": await ac.poison_list(queue),
                "poison_get": await ac.poison_get(queue, bad.msg_id),
                "poison_count": await ac.poison_count(queue),
                "poison_ids": await ac.poison_ids(queue),
            }
            out["requeued"] = await ac.poison_requeue(queue, [bad.msg_id])
            await ac.poison(queue, out["requeued"][0], "again")
            out["purged"] = await ac.poison_purge(queue)
            return out

    got = asyncio.run(main())
    bid = got["bid"]
    assert got["poisoned"] is True and got["status"].state == "fired"
    assert got["status"] == client.barrier_status(bid)
    assert got["results"] == client.barrier_results(bid)
    assert [r.outcome for r in got["results"]] == ["succeeded", "succeeded"]
    assert got["failures"] == client.barrier_failures(bid) == []
    assert got["queues"] == client.list_queues()
    assert got["metrics"].queue_length == 1  # the callback; the requeued one was poisoned again
    assert got["metrics"].poison_length == 1 and len(got["metrics_all"]) == 1
    assert [p.msg_id for p in got["poison_list"]] == [got["poison_get"].msg_id]
    assert got["poison_count"] == 1 and got["poison_ids"] == [got["poison_get"].msg_id]
    assert len(got["requeued"]) == 1 and got["requeued"][0] != got["poison_get"].msg_id
    assert got["purged"] == 1 and client.poison_count(queue) == 0
