"""Durations: every one the API takes accepts whole floats and timedeltas, and nothing else.

Before, `fan_out(deadline_seconds=timedelta(hours=1).total_seconds())`,
`open_barrier(deadline_seconds=60.0)` and `claim(lease_seconds=30.0)` reached
the database as a float, which no function takes: the error said the
database was not migrated.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from pgqueue import AsyncClient, Client, InvalidArgument, NotMigrated
from pgqueue._calls import Call, scalar, seconds


@pytest.fixture
def queues(client: Client) -> None:
    for q in ("work", "done"):
        client.create_queue(q)


def deadline_in(client: Client, barrier_id: str) -> float:
    status = client.barrier_status(barrier_id)
    assert status.deadline is not None
    return (status.deadline - status.created_at).total_seconds()


@pytest.mark.parametrize(
    "hour", [3600, 3600.0, timedelta(hours=1), timedelta(hours=1).total_seconds()]
)
def test_a_deadline_takes_whole_floats_and_timedeltas(
    client: Client, queues: None, hour: Any
) -> None:
    bid = client.fan_out(
        "work", [1], callback_queue="done", callback_message={}, deadline_seconds=hour
    )
    assert round(deadline_in(client, bid)) == 3600
    opened = client.open_barrier(
        "work", callback_queue="done", callback_message={}, deadline_seconds=hour
    )
    assert round(deadline_in(client, opened)) == 3600


def test_delays_leases_and_ages_take_them_too(client: Client, queues: None) -> None:
    client.send("work", {"n": 1}, delay=5.0)
    client.send("work", {"n": 2}, delay=timedelta(seconds=5))
    client.send_batch("work", [{"n": 3}], delay=timedelta(0))
    [got] = client.read("work", vt=timedelta(minutes=1), qty=5)
    assert got.message == {"n": 3}
    assert (got.vt - got.enqueued_at).total_seconds() > 55
    assert client.set_vt("work", got.msg_id, 0.0, read_ct=got.read_ct) is not None
    with client.claim("job-1", lease_seconds=30.0) as claim:
        assert claim.acquired
    with client.claim("job-2", lease_seconds=timedelta(seconds=30)) as claim:
        assert claim.acquired
    assert client.purge_claims(older_than_seconds=timedelta(days=1)) == 0


def test_an_async_client_takes_them_as_the_blocking_one(
    dsn: str, client: Client, queues: None
) -> None:
    async def go() -> str:
        async with await AsyncClient.from_dsn(dsn, max_size=2) as ac:
            await ac.send("work", {}, delay=timedelta(seconds=1))
            return await ac.fan_out(
                "work", [1], callback_queue="done", callback_message={}, deadline_seconds=60.0
            )

    assert round(deadline_in(client, asyncio.run(go()))) == 60


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (1.5, "whole seconds, got 1.5"),
        (timedelta(milliseconds=1500), "whole seconds"),
        ("60", "a number of seconds"),
        (True, "a number of seconds"),
        (None, "a number of seconds"),
        (float("nan"), "whole seconds"),
    ],
)
def test_anything_else_is_a_clear_invalid_argument(value: Any, said: str) -> None:
    with pytest.raises(InvalidArgument, match=said):
        seconds("deadline_seconds", value)


def test_a_fractional_duration_is_refused_before_anything_is_sent(
    client: Client, queues: None
) -> None:
    with pytest.raises(InvalidArgument, match="deadline_seconds must be whole seconds"):
        client.fan_out(
            "work", [1], callback_queue="done", callback_message={}, deadline_seconds=0.5
        )
    with pytest.raises(InvalidArgument, match="lease_seconds must be whole seconds"):
        client.claim("job", lease_seconds=2.5)
    assert client.metrics("work").queue_length == 0


def test_a_type_the_functions_do_not_take_is_not_reported_as_a_missing_migration(
    client: Client, queues: None
) -> None:
    """A float that reaches an API function (past every check of the Python API) is an
    InvalidArgument that says so, not NotMigrated."""
    call = Call("claim", "SELECT pgqueue.claim(%s, %s, %s)", ("k", "me", 1.5), scalar)
    with pytest.raises(InvalidArgument, match="takes whole numbers") as err:
        client.run(call)
    assert not isinstance(err.value, NotMigrated)
    # a function that is missing for real still says to migrate
    missing = Call("x", "SELECT pgqueue.no_such_function(%s)", (1,), scalar)
    with pytest.raises(NotMigrated, match="pgqueue migrate"):
        client.run(missing)


def test_worker_settings_and_retry_take_durations_by_the_same_rule() -> None:
    from pgqueue import Retry, WorkerSettings
    from pgqueue._errors import InvalidSettings

    assert WorkerSettings(vt=60.0).vt == 60 and isinstance(WorkerSettings(vt=60.0).vt, int)
    assert WorkerSettings(vt=timedelta(minutes=2)).vt == 120
    assert WorkerSettings(poll_interval=timedelta(milliseconds=250)).poll_interval == 0.25
    with pytest.raises(InvalidSettings, match="vt must be whole seconds"):
        WorkerSettings(vt=1.5)
    assert Retry("later", delay=timedelta(seconds=5)).delay == 5
    assert Retry("later", delay=5.0).delay == 5
    with pytest.raises(InvalidArgument, match="delay must be whole seconds"):
        Retry("later", delay=0.5)
