"""Seeded load dynamics for simulated nodes, and the plan of a simulated task's run.

Pure: every random draw comes from a generator seeded by (fleet seed, node id) or
(fleet seed, allocation id), so the same seed and the same placements replay the same numbers,
whatever order nodes are stepped in. Stepping a node costs a handful of draws per GPU, which
keeps a tick of thousands of nodes cheap.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field

from crater.contracts import GpuMetrics, NodeMetricsReported, NodeTopology

IDLE_GPU_MEMORY_MB = 64  # an idle card still holds a little for the driver
IDLE_CPU_PERCENT = (1.0, 5.0)
HOST_MEMORY_BASELINE = 0.03  # kernel, page tables, daemons
BUSY_GPU_UTILIZATION = (80.0, 99.0)
IDLE_GPU_UTILIZATION = (0.0, 2.0)
# A task that did not say how much GPU memory it needs is taken to fill most of its cards.
DEFAULT_GPU_MEMORY_SHARE = 0.6
UTILIZATION_RESPONSE = 0.6  # share of the gap to the target closed in one tick
TEMPERATURE_RESPONSE = 0.3  # heat sinks lag behind the load
DEGREES_PER_UTILIZATION_POINT = 0.45


@dataclass(frozen=True)
class SimulatedNode:
    """A node's topology and the power figures its cards draw idle and at full load."""

    topology: NodeTopology
    gpu_idle_w: float = 50.0
    gpu_max_w: float = 300.0


@dataclass(frozen=True)
class Load:
    """What a placed task puts on its node."""

    allocation_id: str
    gpu_ids: tuple[int, ...]
    gpu_memory_mb: int
    cpu_cores: int
    memory_mb: int


@dataclass
class _Gpu:
    total_mb: int
    ambient_c: float
    utilization: float = 0.0
    memory_used_mb: float = float(IDLE_GPU_MEMORY_MB)
    temperature_c: float = 0.0


@dataclass
class _NodeState:
    node: SimulatedNode
    rng: random.Random
    gpus: dict[int, _Gpu]
    loads: dict[str, Load] = field(default_factory=dict)
    last: NodeMetricsReported | None = None


class FleetSimulator:
    """The load of every simulated node, moved one tick at a time by `step()`."""

    def __init__(self, nodes: Iterable[SimulatedNode], seed: int) -> None:
        self.seed = seed
        self._nodes: dict[str, _NodeState] = {}
        self._node_of: dict[str, str] = {}
        for node in nodes:
            node_id = node.topology.node_id
            rng = random.Random(f"{seed}:{node_id}:load")
            gpus = {}
            for gpu in node.topology.gpus:
                ambient = rng.uniform(28.0, 36.0)
                gpus[gpu.index] = _Gpu(gpu.memory_mb, ambient, temperature_c=ambient)
            self._nodes[node_id] = _NodeState(node, rng, gpus)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._nodes

    def __len__(self) -> int:
        return len(self._nodes)

    @property
    def node_ids(self) -> list[str]:
        return list(self._nodes)

    @property
    def topologies(self) -> list[NodeTopology]:
        return [state.node.topology for state in self._nodes.values()]

    def topology(self, node_id: str) -> NodeTopology:
        return self._nodes[node_id].node.topology

    def place(self, node_id: str, load: Load) -> bool:
        """Put a task's load on a node; False when the node is not simulated here or the
        allocation is already placed (a redelivered grant)."""
        state = self._nodes.get(node_id)
        if state is None or load.allocation_id in self._node_of:
            return False
        state.loads[load.allocation_id] = load
        self._node_of[load.allocation_id] = node_id
        return True

    def release(self, allocation_id: str) -> bool:
        node_id = self._node_of.pop(allocation_id, None)
        if node_id is None:
            return False
        del self._nodes[node_id].loads[allocation_id]
        return True

    def placed(self, allocation_id: str) -> bool:
        return allocation_id in self._node_of

    def busy_gpus(self, node_id: str) -> set[int]:
        return {g for load in self._nodes[node_id].loads.values() for g in load.gpu_ids}

    @property
    def running(self) -> int:
        return len(self._node_of)

    def gpu_counts(self) -> tuple[int, int]:
        """(busy, total) GPUs over the fleet."""
        busy = sum(len(self.busy_gpus(n)) for n in self._nodes)
        return busy, sum(len(s.gpus) for s in self._nodes.values())

    def step(self) -> list[NodeMetricsReported]:
        """Advance every node one tick; returns their new metrics, in fleet order."""
        return [self._step(state) for state in self._nodes.values()]

    def step_node(self, node_id: str) -> NodeMetricsReported:
        """Advance one node one tick (a big fleet is stepped in chunks between publishes)."""
        return self._step(self._nodes[node_id])

    def last_metrics(self, node_id: str) -> NodeMetricsReported | None:
        return self._nodes[node_id].last

    def _step(self, state: _NodeState) -> NodeMetricsReported:
        rng = state.rng
        topology = state.node.topology
        reserved: dict[int, int] = {}
        for load in state.loads.values():
            for g in load.gpu_ids:
                if g in state.gpus:
                    wanted = load.gpu_memory_mb or int(
                        state.gpus[g].total_mb * DEFAULT_GPU_MEMORY_SHARE
                    )
                    reserved[g] = reserved.get(g, 0) + wanted

        idle_w, max_w = state.node.gpu_idle_w, state.node.gpu_max_w
        readings = []
        for index, gpu in state.gpus.items():
            busy = index in reserved
            target = rng.uniform(*(BUSY_GPU_UTILIZATION if busy else IDLE_GPU_UTILIZATION))
            gpu.utilization += UTILIZATION_RESPONSE * (target - gpu.utilization)
            memory_target = (
                min(gpu.total_mb, reserved[index] * rng.uniform(0.85, 1.0))
                if busy
                else rng.uniform(0, IDLE_GPU_MEMORY_MB)
            )
            gpu.memory_used_mb = memory_target
            heat = gpu.ambient_c + gpu.utilization * DEGREES_PER_UTILIZATION_POINT
            gpu.temperature_c += TEMPERATURE_RESPONSE * (heat - gpu.temperature_c)
            gpu.temperature_c += rng.gauss(0.0, 0.4)
            power = idle_w + (max_w - idle_w) * gpu.utilization / 100 * rng.uniform(0.93, 1.0)
            readings.append(
                GpuMetrics(
                    index=index,
                    utilization_percent=round(min(max(gpu.utilization, 0.0), 100.0), 1),
                    memory_used_mb=int(min(gpu.memory_used_mb, gpu.total_mb)),
                    memory_total_mb=gpu.total_mb,
                    temperature_c=round(gpu.temperature_c, 1),
                    power_w=round(power, 1),
                )
            )

        threads = topology.cpu.threads
        cores_busy = min(threads, sum(load.cpu_cores for load in state.loads.values()))
        cpu = rng.uniform(*IDLE_CPU_PERCENT) + 100.0 * cores_busy / threads * rng.uniform(0.7, 0.95)
        baseline = topology.memory_mb * HOST_MEMORY_BASELINE * rng.uniform(0.9, 1.1)
        used = baseline + sum(load.memory_mb for load in state.loads.values())
        state.last = NodeMetricsReported(
            node_id=topology.node_id,
            cpu_utilization_percent=round(min(cpu, 100.0), 1),
            memory_used_mb=int(min(used, topology.memory_mb)),
            memory_total_mb=topology.memory_mb,
            gpus=readings,
        )
        return state.last


@dataclass(frozen=True)
class RunPlan:
    """When a simulated task reports running, how long it runs, and how it ends."""

    start_delay_seconds: float
    duration_seconds: float
    succeeds: bool


def plan_run(
    allocation_id: str,
    seed: int,
    *,
    seconds_min: float,
    seconds_max: float,
    start_max_seconds: float = 1.0,
    failure_rate: float = 0.0,
) -> RunPlan:
    """The same allocation under the same seed always runs the same way, however often its
    grant is delivered and in whatever order grants arrive."""
    rng = random.Random(f"{seed}:{allocation_id}:run")
    low, high = sorted((seconds_min, seconds_max))
    return RunPlan(
        start_delay_seconds=rng.uniform(0.0, start_max_seconds),
        duration_seconds=rng.uniform(low, high),
        succeeds=rng.random() >= failure_rate,
    )
