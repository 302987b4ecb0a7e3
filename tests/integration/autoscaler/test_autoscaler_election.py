"""Two autoscalers on one bus: one leads and consumes, the other waits bound to nothing, and
takes over when the leader stops (crater.runtime.leadership)."""

from __future__ import annotations

import asyncio

import nats
import pytest
from faststream import TestApp

from crater.autoscaler.app import AutoscalerSettings, build
from crater.runtime.nats_server import NatsServer

pytestmark = pytest.mark.integration


async def bound_consumers(url: str) -> set[str]:
    """The autoscaler's durable consumers that someone is pulling from now."""
    connection = await nats.connect(url)
    try:
        js = connection.jetstream()
        bound = set()
        for stream in ("CRATER_AUTOSCALING", "CRATER_ALLOCATIONS", "CRATER_NODE_TELEMETRY"):
            for info in await js.consumers_info(stream):
                if info.name.startswith("autoscaler-") and info.num_waiting:
                    bound.add(info.name)
        return bound
    finally:
        await connection.close()


async def test_one_autoscaler_leads_and_the_standby_takes_over_on_a_clean_stop(
    fresh_nats: NatsServer,
) -> None:
    settings = AutoscalerSettings(nats_url=fresh_nats.url, lease_seconds=1.0)
    first, first_app = build(settings)
    second, second_app = build(settings)
    async with TestApp(first_app):
        assert first.leadership is not None
        assert first.leadership.epoch is not None
        async with TestApp(second_app):
            assert second.leadership is not None
            await asyncio.sleep(1.5)  # longer than a lease: the leader renews, nothing moves
            assert second.leadership.epoch is None
            assert first.leadership.epoch is not None
            assert await bound_consumers(fresh_nats.url)  # the leader's pulls, only
            epoch = first.leadership.epoch
            await first_app.stop()  # hands the lease back: taken at once
            for _ in range(20):
                if second.leadership.epoch is not None:
                    break
                await asyncio.sleep(0.1)
            assert second.leadership.epoch is not None
            assert second.leadership.epoch > epoch
