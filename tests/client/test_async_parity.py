"""AsyncClient and Client cannot drift: the same methods, the same parameters, the same results."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import pytest

from pgqueue import AsyncClient, Client

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
