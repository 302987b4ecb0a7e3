"""Seeded load dynamics for simulated nodes, and the plan of a simulated task's run.

Pure: every random draw comes from a generator seeded by (fleet seed, node id) or
(fleet seed, allocation id), so the same seed and the same placements replay the same numbers,
whatever order nodes are stepped in. Stepping a node costs a handful of draws per GPU, NUMA
node and disk, which keeps a tick of thousands of nodes cheap.

Faults are scheduled on the simulation's own clock (seconds since the fleet started, set with
`advance_to`), so a test drives them without sleeping. They draw nothing from a node's
generator: a faulty node's load follows the same numbers it would have healthy.

- gpu-failing: one card heats up and collects corrected ECC errors (Degraded once they pass
  the warning limit), then an uncorrectable one (the card is cordoned: its heartbeat's
  gpu_faults), and at last too hot (NotReady).
- silent: the node sends no metrics and no health (the scheduler's heartbeat timeout marks it
  NotReady) until the window ends.
- ecc: one card reports uncorrectable ECC errors (Degraded; the card is cordoned).
- degraded-link: one card's PCIe link trains down to half its width (Degraded).
- xid: one card delivers the Xid event `xid` once, when the fault starts (what the probe
  then does with it follows the Xid table: docs/health.md).

A fault with `for_seconds` ends after it (a reset clears the counters); without, it lasts.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from enum import StrEnum

from crater.contracts import GpuMetrics, NodeMetricsReported, NodeTopology, RunningAllocation
from crater.contracts.nodes import DiskMetrics

IDLE_GPU_MEMORY_MB = 64  # an idle card still holds a little for the driver
IDLE_CPU_PERCENT = (1.0, 5.0)
HOST_MEMORY_BASELINE = 0.03  # kernel, page tables, daemons
BUSY_GPU_UTILIZATION = (80.0, 99.0)
IDLE_GPU_UTILIZATION = (0.0, 2.0)
# A task that did not say how much GPU memory it needs is taken to fill most of its cards.
DEFAULT_GPU_MEMORY_SHARE = 0.6
# A simulated task's true use against the predictor's model: a bias per (model family, task
# type), within which the demo's workloads still fit their pools' cards, and per task jitter.
USE_BIAS = (0.85, 1.1)
USE_JITTER = 0.03
UTILIZATION_RESPONSE = 0.6  # share of the gap to the target closed in one tick
TEMPERATURE_RESPONSE = 0.3  # heat sinks lag behind the load
DEGREES_PER_UTILIZATION_POINT = 0.45
NUMA_SPREAD = (0.85, 1.15)  # NUMA nodes share a node's CPU load unevenly
DEFAULT_PCIE_GENERATION = 4
DEFAULT_PCIE_WIDTH = 16
# Disk IO: an idle disk trickles (logs, page cache writeback); a busy node streams its
# datasets and checkpoints. (peak MiB/s, mean request KiB, service time s) per disk kind.
DISK_IDLE_SHARE = 0.002
DISK_NVME = (2000.0, 128.0, 0.0002)
DISK_SSD = (450.0, 64.0, 0.0005)
DISK_HDD = (180.0, 256.0, 0.008)
# SM clock: idle, and boosted once the card has work (MHz).
SM_CLOCK_MHZ = (210.0, 1410.0)
# Memory bandwidth in use: a NUMA node's busy CPUs copy at this share of its aggregate (its
# measured all-cores figure, else the default below, GB/s).
MEMORY_BANDWIDTH_SHARE = 0.6
DEFAULT_NUMA_BANDWIDTH_GBPS = 100.0
# gpu-failing: degrees per second on top of the load, corrected ECC errors per second, and
# when the first uncorrectable one comes.
FAILING_DEGREES_PER_SECOND = 0.5
FAILING_CORRECTED_PER_SECOND = 25.0
FAILING_UNCORRECTABLE_AFTER_SECONDS = 90.0
ECC_FAULT_CORRECTED = 120  # ecc: a burst of corrected errors with the uncorrectable one


class FaultKind(StrEnum):
    GPU_FAILING = "gpu-failing"
    SILENT = "silent"
    ECC = "ecc"
    DEGRADED_LINK = "degraded-link"
    XID = "xid"


GPU_FAULTS = frozenset(
    {FaultKind.GPU_FAILING, FaultKind.ECC, FaultKind.DEGRADED_LINK, FaultKind.XID}
)


@dataclass(frozen=True)
class Fault:
    """Something going wrong on a simulated node, from `at_seconds` of simulation time."""

    node: str
    kind: FaultKind
    at_seconds: float = 0.0
    for_seconds: float | None = None  # None: until the simulation ends
    gpu: int = 0  # the card, for GPU faults
    xid: int | None = None  # the Xid code, for kind xid

    def active(self, seconds: float) -> bool:
        if seconds < self.at_seconds:
            return False
        return self.for_seconds is None or seconds < self.at_seconds + self.for_seconds


@dataclass(frozen=True)
class SimulatedNode:
    """A node's topology and the power figures its cards draw idle and at full load."""

    topology: NodeTopology
    gpu_idle_w: float = 50.0
    gpu_max_w: float = 300.0


@dataclass(frozen=True)
class Load:
    """What a placed task puts on its node. `gpu_memory_mb` is what was reserved per card;
    `used_mb`, when the fleet knows it (`true_use_mb`), what the task really uses per card,
    whatever was reserved. None: a task the fleet cannot model (or whose profile it has not
    seen yet), taken to fill most of its reservation."""

    allocation_id: str
    gpu_ids: tuple[int, ...]
    gpu_memory_mb: int
    cpu_cores: int
    memory_mb: int
    used_mb: int | None = None
    task_id: str = ""  # what the node's inventory names it by (RunningAllocation)


def true_use_mb(seed: int, family: str, task_type: str, modelled_mb: int, task_id: str) -> int:
    """What a simulated task really uses per card: the predictor's modelled figure (before
    any learned correction), off by a bias per (model family, task type) that the model does
    not know, and a little per task. It never depends on what was reserved for the task, so a
    prediction cannot feed itself through the fleet's readings."""
    bias = random.Random(f"{seed}:{family}:{task_type}:use").uniform(*USE_BIAS)
    jitter = random.Random(f"{seed}:{task_id}:use").uniform(1 - USE_JITTER, 1 + USE_JITTER)
    return max(round(modelled_mb * bias * jitter), 0)


@dataclass
class _Gpu:
    total_mb: int
    ambient_c: float
    utilization: float = 0.0
    memory_used_mb: float = float(IDLE_GPU_MEMORY_MB)
    temperature_c: float = 0.0


@dataclass(frozen=True)
class _Disk:
    name: str
    peak_mb_s: float
    request_kib: float
    service_s: float


@dataclass
class _NodeState:
    node: SimulatedNode
    rng: random.Random
    gpus: dict[int, _Gpu]
    numa: tuple[int, ...]
    disks: tuple[_Disk, ...]
    pcie: dict[int, tuple[int, int]]  # GPU index -> (max generation, max width)
    loads: dict[str, Load] = field(default_factory=dict)
    faults: list[Fault] = field(default_factory=list)
    last: NodeMetricsReported | None = None


def _disk_kind(nvme: bool, rotational: bool) -> tuple[float, float, float]:
    return DISK_NVME if nvme else DISK_HDD if rotational else DISK_SSD


class FleetSimulator:
    """The load of every simulated node, moved one tick at a time by `step()`."""

    def __init__(
        self, nodes: Iterable[SimulatedNode], seed: int, faults: Iterable[Fault] = ()
    ) -> None:
        self.seed = seed
        self.seconds = 0.0  # simulation time: seconds since the fleet started
        self._nodes: dict[str, _NodeState] = {}
        self._node_of: dict[str, str] = {}
        for node in nodes:
            topology = node.topology
            node_id = topology.node_id
            rng = random.Random(f"{seed}:{node_id}:load")
            gpus = {}
            for gpu in topology.gpus:
                ambient = rng.uniform(28.0, 36.0)
                gpus[gpu.index] = _Gpu(gpu.memory_mb, ambient, temperature_c=ambient)
            self._nodes[node_id] = _NodeState(
                node,
                rng,
                gpus,
                numa=tuple(n.id for n in topology.numa_nodes),
                disks=tuple(
                    _Disk(d.name, *_disk_kind(d.nvme, d.rotational)) for d in topology.disks
                ),
                pcie={
                    g.index: (
                        g.pcie_generation_max or DEFAULT_PCIE_GENERATION,
                        g.pcie_width_max or DEFAULT_PCIE_WIDTH,
                    )
                    for g in topology.gpus
                },
            )
        for fault in faults:
            state = self._nodes.get(fault.node)
            if state is None:
                raise ValueError(f"fault on {fault.node}: no such simulated node")
            if fault.kind in GPU_FAULTS and fault.gpu not in state.gpus:
                raise ValueError(f"{fault.kind} fault on {fault.node}: no GPU {fault.gpu}")
            if (fault.kind is FaultKind.XID) != (fault.xid is not None):
                raise ValueError(f"{fault.kind} fault on {fault.node}: xid goes with kind xid")
            state.faults.append(fault)
        self._xids_delivered: set[Fault] = set()

    def xid_events(self, node_id: str) -> dict[int, tuple[int, ...]]:
        """The Xid events a node's cards deliver now, by card: each xid fault's code once,
        when it starts (as NVML's event set delivers an event once)."""
        found: dict[int, tuple[int, ...]] = {}
        for fault in self._nodes[node_id].faults:
            if fault.kind is not FaultKind.XID or fault in self._xids_delivered:
                continue
            if fault.xid is not None and fault.active(self.seconds):
                self._xids_delivered.add(fault)
                found[fault.gpu] = (*found.get(fault.gpu, ()), fault.xid)
        return found

    def advance_to(self, seconds: float) -> None:
        """Set the simulation clock (seconds since the fleet started); faults follow it."""
        self.seconds = seconds

    def reporting(self, node_id: str) -> bool:
        """False while a silent fault holds the node: it sends neither metrics nor health."""
        return not any(
            f.kind is FaultKind.SILENT and f.active(self.seconds)
            for f in self._nodes[node_id].faults
        )

    @property
    def reporting_ids(self) -> list[str]:
        return [n for n, s in self._nodes.items() if not s.faults or self.reporting(n)]

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

    def set_use(self, allocation_id: str, used_mb: int | None) -> bool:
        """What a placed task really uses per card, learned after it was placed."""
        node_id = self._node_of.get(allocation_id)
        if node_id is None:
            return False
        loads = self._nodes[node_id].loads
        loads[allocation_id] = replace(loads[allocation_id], used_mb=used_mb)
        return True

    def card_memory_mb(self, allocation_id: str) -> int | None:
        """The memory of the first card a placed task holds (its cards are alike)."""
        node_id = self._node_of.get(allocation_id)
        if node_id is None:
            return None
        state = self._nodes[node_id]
        gpus = [g for g in state.loads[allocation_id].gpu_ids if g in state.gpus]
        return int(state.gpus[gpus[0]].total_mb) if gpus else None

    def release(self, allocation_id: str) -> bool:
        node_id = self._node_of.pop(allocation_id, None)
        if node_id is None:
            return False
        del self._nodes[node_id].loads[allocation_id]
        return True

    def placed(self, allocation_id: str) -> bool:
        return allocation_id in self._node_of

    def inventory(self, node_id: str) -> list[RunningAllocation]:
        """What the node runs now, as its agent would list it with a heartbeat."""
        return [
            RunningAllocation(
                allocation_id=load.allocation_id,
                task_id=load.task_id or load.allocation_id,
                gpu_ids=list(load.gpu_ids),
            )
            for load in sorted(self._nodes[node_id].loads.values(), key=lambda x: x.allocation_id)
        ]

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
        """Advance every reporting (not silent) node one tick; returns their new metrics, in
        fleet order."""
        return [self._step(self._nodes[n]) for n in self.reporting_ids]

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
                    wanted = load.used_mb
                    if wanted is None:
                        wanted = load.gpu_memory_mb or int(
                            state.gpus[g].total_mb * DEFAULT_GPU_MEMORY_SHARE
                        )
                    reserved[g] = reserved.get(g, 0) + wanted

        idle_w, max_w = state.node.gpu_idle_w, state.node.gpu_max_w
        active = [f for f in state.faults if f.active(self.seconds)] if state.faults else []
        readings = []
        for index, gpu in state.gpus.items():
            generation, width = state.pcie[index]
            corrected = uncorrected = 0
            extra_heat = 0.0
            for fault in active:
                if fault.gpu != index:
                    continue
                elapsed = self.seconds - fault.at_seconds
                if fault.kind is FaultKind.GPU_FAILING:
                    extra_heat = FAILING_DEGREES_PER_SECOND * elapsed
                    corrected += int(FAILING_CORRECTED_PER_SECOND * elapsed)
                    uncorrected += int(elapsed >= FAILING_UNCORRECTABLE_AFTER_SECONDS)
                elif fault.kind is FaultKind.ECC:
                    corrected += ECC_FAULT_CORRECTED
                    uncorrected += 1
                elif fault.kind is FaultKind.DEGRADED_LINK:
                    width = max(1, width // 2)
            busy = index in reserved
            target = rng.uniform(*(BUSY_GPU_UTILIZATION if busy else IDLE_GPU_UTILIZATION))
            gpu.utilization += UTILIZATION_RESPONSE * (target - gpu.utilization)
            memory_target = (
                min(gpu.total_mb, reserved[index] * rng.uniform(0.85, 1.0))
                if busy
                else rng.uniform(0, IDLE_GPU_MEMORY_MB)
            )
            gpu.memory_used_mb = memory_target
            heat = gpu.ambient_c + gpu.utilization * DEGREES_PER_UTILIZATION_POINT + extra_heat
            gpu.temperature_c += TEMPERATURE_RESPONSE * (heat - gpu.temperature_c)
            gpu.temperature_c += rng.gauss(0.0, 0.4)
            power = idle_w + (max_w - idle_w) * gpu.utilization / 100 * rng.uniform(0.93, 1.0)
            low, high = SM_CLOCK_MHZ
            clock = low + (high - low) * min(1.0, max(gpu.utilization, 0.0) / 50.0)
            readings.append(
                GpuMetrics(
                    index=index,
                    utilization_percent=round(min(max(gpu.utilization, 0.0), 100.0), 1),
                    memory_used_mb=int(min(gpu.memory_used_mb, gpu.total_mb)),
                    memory_total_mb=gpu.total_mb,
                    temperature_c=round(gpu.temperature_c, 1),
                    power_w=round(power, 1),
                    sm_clock_mhz=round(clock),
                    pcie_generation=generation,
                    pcie_width=width,
                    ecc_errors_corrected=corrected,
                    ecc_errors_uncorrected=uncorrected,
                )
            )

        threads = topology.cpu.threads
        cores_busy = min(threads, sum(load.cpu_cores for load in state.loads.values()))
        cpu = rng.uniform(*IDLE_CPU_PERCENT) + 100.0 * cores_busy / threads * rng.uniform(0.7, 0.95)
        baseline = topology.memory_mb * HOST_MEMORY_BASELINE * rng.uniform(0.9, 1.1)
        used = baseline + sum(load.memory_mb for load in state.loads.values())
        # Per NUMA node: uneven shares whose mean is the node's figure.
        shares = [rng.uniform(*NUMA_SPREAD) for _ in state.numa]
        mean = sum(shares) / len(shares) if shares else 1.0
        numa = {
            n: round(min(cpu * s / mean, 100.0), 1) for n, s in zip(state.numa, shares, strict=True)
        }
        # Memory traffic follows each NUMA node's CPU load (no draw: the load's numbers stay).
        peaks = {
            n.id: n.memory_bandwidth_gbps_all_cores or DEFAULT_NUMA_BANDWIDTH_GBPS
            for n in topology.numa_nodes
        }
        bandwidth = {n: round(peaks[n] * MEMORY_BANDWIDTH_SHARE * numa[n] / 100, 2) for n in numa}
        # Disk IO follows the share of the node's CPUs busy with tasks (data loading).
        activity = DISK_IDLE_SHARE + (1.0 - DISK_IDLE_SHARE) * cores_busy / threads
        disks = []
        for disk in state.disks:
            read = disk.peak_mb_s * activity * rng.uniform(0.3, 1.0)
            write = read * rng.uniform(0.05, 0.4)
            read_iops = read * 1024 / disk.request_kib
            write_iops = write * 1024 / disk.request_kib
            # Queued behind the others in flight (M/M/1): the wait a data transfer sees.
            occupied = min((read_iops + write_iops) * disk.service_s, 0.95)
            disks.append(
                DiskMetrics(
                    name=disk.name,
                    read_mb_s=round(read, 2),
                    write_mb_s=round(write, 2),
                    read_iops=round(read_iops, 1),
                    write_iops=round(write_iops, 1),
                    # Little's law: requests in flight = arrival rate x service time.
                    in_flight=int((read_iops + write_iops) * disk.service_s),
                    wait_ms=round(disk.service_s * 1000 / (1 - occupied), 3),
                )
            )
        state.last = NodeMetricsReported(
            node_id=topology.node_id,
            cpu_utilization_percent=round(min(cpu, 100.0), 1),
            memory_used_mb=int(min(used, topology.memory_mb)),
            memory_total_mb=topology.memory_mb,
            gpus=readings,
            numa_cpu_utilization_percent=numa,
            disks=disks,
            numa_memory_bandwidth_gbps=bandwidth,
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
