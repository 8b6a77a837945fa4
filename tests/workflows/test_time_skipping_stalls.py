"""The time-skipping helper's own report: a sleep that virtual time is slow to pass
warns, while it still waits, with what the open workflows are waiting on (their
pending activities and children), so a stall that recovers says what held time too."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest
from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import Worker

from tests.workflows import time_skipping as time_skipping_module
from tests.workflows.time_skipping import StalledVirtualTime, TimeSkippingServer


class Held:
    """The activity runs (and holds virtual time) from `started` until `release`."""

    started = asyncio.Event()
    release = asyncio.Event()


@activity.defn(name="Hold time")
async def hold_time() -> None:
    Held.started.set()
    await Held.release.wait()  # an activity running holds virtual time


@workflow.defn(name="Holds time", sandboxed=False)
class HoldsTime:
    @workflow.run
    async def run(self) -> None:
        await workflow.execute_activity(hold_time, start_to_close_timeout=timedelta(seconds=30))


async def test_a_slow_sleep_warns_with_what_holds_virtual_time(
    time_skipping: TimeSkippingServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(time_skipping_module, "STALL_NOTICE", timedelta(seconds=0.3))
    Held.started, Held.release = asyncio.Event(), asyncio.Event()
    listed = time_skipping_module.holding_time

    async def listed_then_released(client: Client) -> str:
        """What holds time, as the warning says it; then the activity may end."""
        found = await listed(client)
        Held.release.set()
        return found

    monkeypatch.setattr(time_skipping_module, "holding_time", listed_then_released)
    client = time_skipping.env.client
    queue = f"stalls-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=queue, workflows=[HoldsTime], activities=[hold_time]):
        handle = await client.start_workflow(HoldsTime.run, id=f"holds-{queue}", task_queue=queue)
        await asyncio.wait_for(Held.started.wait(), timeout=30)
        with pytest.warns(StalledVirtualTime, match=rf"holds-{queue}: activities \['Hold time"):
            await time_skipping.sleep(timedelta(minutes=1))
        await handle.result()
