"""The scheduler's pool totals and waits as Prometheus scrapes them: uvicorn serving the
app, a real nats-server and database, the figures those of the events it decided on."""

from __future__ import annotations

import asyncio

from crater.contracts import AllocationGranted, NodeTopologyReported, TaskPending
from crater.runtime.bus import publish
from crater.runtime.nats_server import NatsServer
from crater.scheduler.app import SchedulerSettings, build
from crater.scheduler.service_layer.cluster_metrics import MIB
from tests.integration.scheduler.test_scheduler_over_nats import profiled
from tests.support.events import EventTap
from tests.support.scrape import scrape, served, value
from tests.support.topologies import node


async def test_pool_capacity_allocation_and_waits_after_real_decisions(
    fresh_nats: NatsServer, tap: EventTap, tmp_path: object
) -> None:
    database = f"sqlite+aiosqlite:///{tmp_path}/scheduler.db"
    service, app = build(SchedulerSettings(nats_url=fresh_nats.url, database_url=database))
    async with served(app) as http:
        for _ in range(250):  # elected, consumers bound
            if service.leadership is not None and service.leadership.leading.is_set():
                break
            await asyncio.sleep(0.02)
        for topology in (node("a100-01", gpus=4), node("v100-01", gpus=2, gpu_memory_mb=16384)):
            await publish(service.broker, NodeTopologyReported(node=topology))
        await publish(service.broker, profiled("train-1", gpus=4))
        [granted] = await tap.wait_for(AllocationGranted)
        await publish(service.broker, profiled("train-2", gpus=4))
        await tap.wait_for(TaskPending)
        samples = await scrape(http)
    pool = {"pool": "default"}
    assert value(samples, "crater_pool_gpus", **pool, state="capacity") == 6
    assert value(samples, "crater_pool_gpus", **pool, state="allocated") == 4
    assert value(samples, "crater_pool_gpus", **pool, state="free") == 2
    assert value(samples, "crater_pool_gpus", **pool, state="unavailable") == 0
    assert value(samples, "crater_pool_gpu_memory_bytes", **pool, state="capacity") == (
        (4 * 81920 + 2 * 16384) * MIB
    )
    assert value(samples, "crater_pool_cpu_cores", **pool, state="allocated") == len(
        granted.cpu_cores
    )
    assert value(samples, "crater_pool_memory_bytes", **pool, state="allocated") == (
        granted.memory_mb * MIB
    )
    assert value(samples, "crater_pool_nodes", **pool, condition="Ready") == 2
    ratio = value(samples, "crater_pool_gpu_fragmentation_ratio", **pool)
    assert ratio is not None
    assert 0 <= ratio <= 1
    waited = value(samples, "crater_task_wait_seconds", task_id="train-2", tenant="default", **pool)
    assert waited is not None
    assert 0 <= waited < 60
    assert (
        value(samples, "crater_task_wait_seconds", task_id="train-1", tenant="default", **pool)
        is None
    )
    assert value(samples, "crater_scheduler_pending_tasks") == 1
    # train-1's wait before its placement: one observation, under a minute
    assert value(samples, "crater_task_placement_wait_seconds_count", **pool) == 1
    assert value(samples, "crater_task_placement_wait_seconds_bucket", **pool, le="60.0") == 1
