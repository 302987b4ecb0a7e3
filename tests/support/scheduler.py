"""A scheduler service in integration tests: its settings with a quotas file that reloads at
once, and a node made known before any task (the topology comes on another stream)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from crater.contracts import NodeTopology, NodeTopologyReported
from crater.runtime.bus import publish
from crater.scheduler.app import SchedulerSettings


def with_quotas(nats_url: str, database_url: str, quotas: Path) -> SchedulerSettings:
    """Settings reading `quotas`, looked at again on every event (a reload is seen at once)."""
    return SchedulerSettings(
        nats_url=nats_url,
        database_url=database_url,
        quotas_file=quotas,
        config_reload_seconds=0.01,
    )


async def node_known(service: Any, topology: NodeTopology) -> None:
    """Report `topology` and wait until the scheduler knows the node."""
    await publish(service.broker, NodeTopologyReported(node=topology))
    for _ in range(200):
        if service.state.scheduler.cluster.get(topology.node_id) is not None:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the scheduler never knew {topology.node_id}")


async def leading(service: Any, seconds: float = 30.0) -> None:
    """Wait until `service` leads: it has taken the lease and loaded its core from the
    database (`take_over` replaces the core, so one read before that is the empty one; under
    load that moment comes a while after the app starts)."""
    for _ in range(int(seconds / 0.05)):
        if service.state.epoch is not None:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the scheduler did not take the lead within {seconds:g} s")
