"""What a node tells the scheduler it runs, with each heartbeat: the simulated fleet's placed
loads, the executing agent's runs, and the processes NVML sees on the cards (this machine's
real discovery, its cards answered by the NVML stand-in: the development machine has none)."""

from __future__ import annotations

from crater.contracts import NodeCondition
from crater.probe.adapters.nvml import GpuSampler
from crater.probe.domain.faults import XidSeen
from crater.probe.service_layer.nodes import FleetNodes, LocalNode
from crater.probe.settings import ProbeSettings
from crater.probe.sim.fleet import open_fleet
from crater.probe.sim.simulation import FleetSimulator, Load
from tests.unit.probe.fake_nvml import FakeNvml, pcie_only


async def test_fleet_heartbeats_list_what_each_node_runs() -> None:
    fleet = open_fleet(None, 5)
    sim = FleetSimulator(fleet.nodes, fleet.seed)
    nodes = FleetNodes(sim)
    await nodes.open()
    sim.place("a100-01", Load("alloc-2", (2, 3), 40000, 8, 65536, task_id="task-2"))
    sim.place("a100-01", Load("alloc-1", (0,), 40000, 8, 65536, task_id="task-1"))
    reports = {r.node_id: r for batch in nodes.health(100) for r in batch}
    running = reports["a100-01"].running
    assert running is not None
    assert [(r.allocation_id, r.task_id, r.gpu_ids) for r in running] == [
        ("alloc-1", "task-1", [0]),
        ("alloc-2", "task-2", [2, 3]),
    ]
    assert reports["a100-02"].running == []  # runs nothing: said, not left out
    assert reports["a100-01"].gpu_processes is None  # simulated: no NVML reading
    sim.release("alloc-1")
    reports = {r.node_id: r for batch in nodes.health(100) for r in batch}
    assert [r.allocation_id for r in reports["a100-01"].running or []] == ["alloc-2"]


async def test_a_fleet_that_does_not_see_all_its_work_sends_no_inventory() -> None:
    fleet = open_fleet(None, 5)
    nodes = FleetNodes(FleetSimulator(fleet.nodes, fleet.seed), inventory=False)
    await nodes.open()
    reports = [r for batch in nodes.health(100) for r in batch]
    assert reports
    assert all(r.running is None for r in reports)
    assert '"running"' not in reports[0].model_dump_json()  # left out: reads as before


async def test_a_local_heartbeat_carries_the_agents_runs_and_the_cards_processes() -> None:
    node = LocalNode(ProbeSettings(mode="local", node_id="here-01"))
    await node.open()
    cards = pcie_only(2)
    cards[1].processes = [(4242, 2048 * FakeNvml.MIB)]
    node._gpus = GpuSampler(FakeNvml(cards))
    assert node._gpus.open()
    [report] = next(node.health(1))
    assert report.running is None  # no executing agent: nothing said of allocations
    assert report.gpu_processes is None  # no metrics round yet: not read
    async for _ in node.metrics(1):
        pass
    [report] = next(node.health(1))
    assert [(p.gpu, p.pid, p.memory_mb) for p in report.gpu_processes or []] == [(1, 4242, 2048)]
    node.inventory = list  # an executing agent that runs nothing now
    [report] = next(node.health(1))
    assert report.running == []
    await node.close()


async def test_a_local_heartbeat_carries_the_cards_faults_and_counts_each_xid() -> None:
    seen: list[XidSeen] = []
    node = LocalNode(ProbeSettings(mode="local", node_id="here-01"), on_xid=seen.append)
    await node.open()
    [report] = next(node.health(1))
    assert '"gpu_faults"' not in report.model_dump_json()  # no card sampled: reads as before
    cards = pcie_only(2)
    cards[0].xids = [31, 79]
    node._gpus = GpuSampler(FakeNvml(cards))
    node._sampling_gpus = node._gpus.open()
    async for _ in node.metrics(1):
        pass
    [report] = next(node.health(1))
    assert [(f.gpu, f.xid, f.action.value) for f in report.gpu_faults or []] == [
        (0, 79, "reboot-node")
    ]
    assert report.condition is NodeCondition.NOT_READY  # Xid 79: the node needs a reboot
    assert [(x.code, x.action.value, x.known) for x in seen] == [
        (31, "none", True),
        (79, "reboot-node", True),
    ]
    await node.close()
