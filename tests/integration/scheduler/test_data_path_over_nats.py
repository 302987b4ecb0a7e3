"""The data path as the scheduler runs: real nats-server, real database. A task asking SSD
space and PCIe bandwidth is granted the cards on fast links and the SSD by them, named in
its grant; the space stays held across a restart (restored from the stored grant), so a
second task cannot be promised the same bytes, and comes back when the task ends."""

from __future__ import annotations

import asyncio

from faststream import TestApp

from crater.contracts import (
    AllocationGranted,
    Disk,
    NodeTopology,
    TaskPending,
    TaskStatus,
    TaskStatusReported,
)
from crater.runtime.bus import publish
from crater.runtime.nats_server import NatsServer
from crater.scheduler.app import SchedulerSettings, build
from tests.support.events import EventTap
from tests.support.profiles import profiled
from tests.support.scheduler import node_known
from tests.support.topologies import node


def data_node() -> NodeTopology:
    """Four cards, two per NUMA node (0-1 on NUMA 0); card 2's link trained down to x4
    (measured 6.0); one NVMe drive per NUMA node."""
    t = node("dp-01", gpus=4)
    cards = [
        g.model_copy(
            update={
                "pcie_generation_max": 4,
                "pcie_width_max": 16,
                "pcie_bandwidth_gbps": 6.0 if g.index == 2 else None,
            }
        )
        for g in t.gpus
    ]
    disks = [
        Disk(
            name=f"nvme{n}n1",
            capacity_gb=1000,
            rotational=False,
            nvme=True,
            numa_node=n,
            mount_path=f"/mnt/nvme{n}",
        )
        for n in (0, 1)
    ]
    return t.model_copy(update={"gpus": cards, "disks": disks})


async def test_the_ssd_and_fast_links_are_chosen_with_the_gpus_and_held_across_a_restart(
    fresh_nats: NatsServer, tap: EventTap, database_url: str
) -> None:
    settings = SchedulerSettings(nats_url=fresh_nats.url, database_url=database_url)
    service, app = build(settings)
    async with TestApp(app):
        await node_known(service, data_node())
        await publish(service.broker, profiled("cards-0-1", 2))
        [first] = await tap.wait_for(AllocationGranted)
        assert first.gpu_ids == [0, 1]
        needs = {"gpu": {"count": 1, "pcie_bandwidth_gbps": 25}, "ssd": {"capacity_gb": 700}}
        await publish(service.broker, profiled("data", 1, resource_requirements=needs))
        [_, data] = await tap.wait_for(AllocationGranted, count=2)
        # card 2 is free but on a slow link: card 3, on NUMA 1, and the NVMe drive there
        assert (data.task_id, data.gpu_ids, data.disk) == ("data", [3], "nvme1n1")
        assert data.environment["CRATER_SSD_DEVICE"] == "nvme1n1"
        assert data.environment["CRATER_SSD_PATH"] == "/mnt/nvme1"
        assert "SSD nvme1n1 on NUMA 1 with GPUs 3, 700 GB held, 300 GB left" in data.explanation

    # a new process: the space held on nvme1n1 comes back from the database
    service, app = build(settings)
    async with TestApp(app):
        for _ in range(200):
            if "data" in service.state.scheduler.allocations:
                break
            await asyncio.sleep(0.05)
        restored = service.state.scheduler.cluster.get("dp-01")
        assert restored is not None
        assert restored.disk_free_gb == {"nvme0n1": 1000, "nvme1n1": 300}
        # card 2 is free, nvme0n1 has the space; nvme1n1 would not
        wants = {"gpu": {"count": 1}, "ssd": {"capacity_gb": 900}}
        await publish(service.broker, profiled("big", 1, resource_requirements=wants))
        [*_, big] = await tap.wait_for(AllocationGranted, count=3)
        assert (big.task_id, big.gpu_ids, big.disk) == ("big", [2], "nvme0n1")
        # every card is taken now: a CPU task asking the same space waits for the space alone
        space = {"ssd": {"capacity_gb": 900}}
        await publish(service.broker, profiled("bigger", 0, resource_requirements=space))
        [pending] = await tap.wait_for(TaskPending, lambda e: e.task_id == "bigger")
        assert [r.code for r in pending.reasons] == ["InsufficientDisk"]
        assert "has no SSD with 900 GB free" in pending.summary
        done = TaskStatusReported(
            task_id="data", status=TaskStatus.SUCCEEDED, allocation_id=data.allocation_id
        )
        await publish(service.broker, done)
        [*_, bigger] = await tap.wait_for(AllocationGranted, count=4)
        assert (bigger.task_id, bigger.disk) == ("bigger", "nvme1n1")
