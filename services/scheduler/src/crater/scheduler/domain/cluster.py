"""Cluster state: each node's hardware and what is free on it, mirrored into arrays so that
filters and scores run vectorised over every node at once."""

from __future__ import annotations

import bisect
import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Literal

import numpy as np
import numpy.typing as npt

from crater.contracts import FABRIC_LEVELS, Disk, FabricLevel, NodeCondition, NodeTopology, Taint
from crater.contracts.gpus import gpu_of_inventory
from crater.scheduler.domain.mig import MigProfile, card_geometry
from crater.scheduler.domain.workload import WorkloadModel

IntArray = npt.NDArray[np.int64]
WHOLE = 1000  # a whole card, in thousandths
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class Overcommit:
    """How far a pool's nodes may be promised past their hardware: CPU and memory may exceed
    1 (tasks rarely use all they ask); a GPU ratio above 1 time-slices whole cards."""

    cpu: float = 1.0
    memory: float = 1.0
    gpu: float = 1.0


NO_OVERCOMMIT = Overcommit()


# A fault's identity as the probe reports it (GpuFault.key): card, kind, Xid, first seen.
FaultKey = tuple[int, str, int | None, datetime]


@dataclass(frozen=True)
class CardCordon:
    """Why a card takes no new work, and what lifts it: the probe reporting the card healthy
    (`healthy`), or an operator (`operator`)."""

    reason: str
    until: Literal["healthy", "operator"]
    fault: FaultKey | None = None  # None: an operator's own cordon


@dataclass
class Node:
    """One node's hardware and what is promised on it (the truth the arrays mirror)."""

    topology: NodeTopology
    condition: NodeCondition = NodeCondition.READY
    # The probe's health score, 0..100 (the integration's convention: 95 and up passes,
    # below 90 the node takes no high-priority work); 100 until a heartbeat says otherwise.
    health_score: int = 100
    last_heartbeat_at: float | None = None  # event time, seconds since the epoch
    overcommit: Overcommit = NO_OVERCOMMIT
    # free thousandths of each card: 1000 is a whole free card (GPU sharing takes less;
    # a GPU over-commit ratio r gives each card 1000 * r); 0 while the card is cut into MIG
    gpu_milli_free: list[int] = field(default_factory=list)
    # tasks holding each CPU core: at most ceil(cpu ratio) each, floor(cores * ratio) in all
    cpu_held: dict[int, int] = field(default_factory=dict)
    memory_free_mb: int = 0
    # anti-affinity groups of the allocations on this node, with how many each
    groups: dict[str, int] = field(default_factory=dict)
    # MIG cards in use: card -> (compute slices, memory slices) held
    mig_used: dict[int, tuple[int, int]] = field(default_factory=dict)
    # running counts over `cpu_held`, so that a refresh does not walk every core
    cpu_taken: int = 0  # core-slots held
    cpu_cores_full: int = 0  # cores held by as many tasks as they may be
    numa_room: dict[int, int] = field(default_factory=dict)  # NUMA node -> cores with room
    # each solid-state disk's space not promised to a task, GB (tasks asking ssd.capacity_gb
    # hold it on the one disk chosen for them)
    disk_free_gb: dict[str, int] = field(default_factory=dict)
    # Cards a task the core does not hold here runs on (its node reports it: reconcile.py):
    # card -> the thousandths taken off its free share for it. What the core's own
    # allocations give back on such a card stays blocked until the unknown task goes.
    blocked: dict[int, int] = field(default_factory=dict)
    # Cards cordoned for a fault or by an operator (cordons.py): card -> why and until what.
    # A cordoned card's free share is blocked (`blocked`) until the cordon lifts.
    cordons: dict[int, CardCordon] = field(default_factory=dict)
    # Faults whose cordon an operator lifted: re-reported, they stay lifted; a new one cordons.
    cleared: set[FaultKey] = field(default_factory=set)
    # Why the whole node takes no new work (a fault that needs a reboot); None: it may.
    node_cordon: str | None = None
    faults_at: float | None = None  # event time of the heartbeat the cordons follow
    # Of the last heartbeat's readings, each card's penalty in (0, 1] (another process's
    # memory on it, heat, a degraded link): the LiveReadings score ranks such cards lower.
    readings: dict[int, float] = field(default_factory=dict)
    # Fixed for the Node's life (a topology report makes a new Node), read by every refresh:
    # computed once.
    _cpu_total: int = field(init=False, repr=False, compare=False)
    _cpu_capacity: int = field(init=False, repr=False, compare=False)
    _cpu_holders_max: int = field(init=False, repr=False, compare=False)
    # What every placement on the node reads (placement.select): built here, not each time.
    _numa_cpus: dict[int, frozenset[int]] = field(init=False, repr=False, compare=False)
    _nvlink_peers: dict[int, frozenset[int]] = field(init=False, repr=False, compare=False)
    _pci_roots: dict[int, str | None] = field(init=False, repr=False, compare=False)
    _pcie_links: dict[int, float | None] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._cpu_total = sum(len(n.cpus) for n in self.topology.numa_nodes)
        self._cpu_capacity = math.floor(self._cpu_total * self.overcommit.cpu)
        self._cpu_holders_max = max(1, math.ceil(self.overcommit.cpu))
        topology = self.topology
        self._numa_cpus = {numa.id: frozenset(numa.cpus) for numa in topology.numa_nodes}
        self._nvlink_peers = {g.index: frozenset(g.nvlink_peers) for g in topology.gpus}
        self._pci_roots = {g.index: g.pci_root for g in topology.gpus}
        self._pcie_links = {g.index: g.pcie_link_gbps() for g in topology.gpus}

    @classmethod
    def empty(cls, topology: NodeTopology, overcommit: Overcommit = NO_OVERCOMMIT) -> Node:
        node = cls(topology=topology, overcommit=overcommit)
        node.gpu_milli_free = [node.gpu_capacity_milli] * len(topology.gpus)
        node.cpu_held = {cpu: 0 for numa in topology.numa_nodes for cpu in numa.cpus}
        node.numa_room = {numa.id: len(numa.cpus) for numa in topology.numa_nodes}
        node.memory_free_mb = node.memory_capacity_mb
        node.disk_free_gb = {d.name: d.capacity_gb for d in node._ssds}
        return node

    def emptied(self) -> Node:
        """This node with nothing held (what `empty` would build from its topology), sharing
        the figures fixed for its life instead of computing them again."""
        node = copy.copy(self)
        node.gpu_milli_free = [self.gpu_capacity_milli] * len(self.topology.gpus)
        node.cpu_held = dict.fromkeys(self.cpu_held_empty, 0)
        node.numa_room = {numa.id: len(numa.cpus) for numa in self.topology.numa_nodes}
        node.memory_free_mb = self.memory_capacity_mb
        node.disk_free_gb = {d.name: d.capacity_gb for d in self._ssds}
        node.groups, node.mig_used, node.blocked = {}, {}, {}
        node.cpu_taken = node.cpu_cores_full = 0
        return node

    @cached_property
    def cpu_held_empty(self) -> tuple[int, ...]:
        """Every CPU of the topology, in its order (the keys of `cpu_held` when empty)."""
        return tuple(cpu for numa in self.topology.numa_nodes for cpu in numa.cpus)

    @cached_property
    def cpu_numa(self) -> dict[int, int]:
        """Each CPU's NUMA node (the topology never changes under a Node)."""
        return {cpu: numa.id for numa in self.topology.numa_nodes for cpu in numa.cpus}

    @property
    def numa_cpus(self) -> dict[int, frozenset[int]]:
        """Each NUMA node's CPUs."""
        return self._numa_cpus

    @property
    def nvlink_peers(self) -> dict[int, frozenset[int]]:
        """Each card's NVLink peers."""
        return self._nvlink_peers

    @property
    def pci_roots(self) -> dict[int, str | None]:
        """Each card's PCIe root complex."""
        return self._pci_roots

    @property
    def pcie_links(self) -> dict[int, float | None]:
        """Each card's PCIe link, GB/s one way: measured, else nominal; None: unknown."""
        return self._pcie_links

    @property
    def disk_free_most_gb(self) -> int:
        """The most space free on one solid-state disk, GB."""
        return max(self.disk_free_gb.values(), default=0)

    @property
    def gpu_capacity_milli(self) -> int:
        return math.floor(WHOLE * self.overcommit.gpu)

    @property
    def memory_capacity_mb(self) -> int:
        return math.floor(self.topology.memory_mb * self.overcommit.memory)

    @property
    def cpu_capacity(self) -> int:
        return self._cpu_capacity

    @property
    def cpu_holders_max(self) -> int:
        """How many tasks may hold one core at once."""
        return self._cpu_holders_max

    @property
    def cpu_free(self) -> set[int]:
        """Cores that can take one more task."""
        limit = self.cpu_holders_max
        return {cpu for cpu, held in self.cpu_held.items() if held < limit}

    @property
    def cpu_slots_free(self) -> int:
        """Cores a task can be given now: within the node's promise and on distinct cores."""
        room = self.cpu_capacity - self.cpu_taken
        return max(0, min(room, len(self.cpu_held) - self.cpu_cores_full))

    @property
    def whole_gpus_free(self) -> int:
        return sum(1 for m in self.gpu_milli_free if m >= WHOLE)

    @property
    def largest_share_free(self) -> int:
        return max(self.gpu_milli_free, default=0)

    def mig_fits(self, profile: MigProfile, gpu: int) -> bool:
        """Card `gpu` can carve a slice of `profile` now: it supports the profile and is
        untouched, or is cut into MIG already with room left."""
        if gpu in self.cordons:
            return False  # cordoned: not even a slice
        card = self.topology.gpus[gpu]
        shape = card_geometry(card.mig_profiles) if card.mig_capable else None
        if shape is None:
            return False
        used = self.mig_used.get(gpu)
        if used is None:
            if self.gpu_milli_free[gpu] != self.gpu_capacity_milli:
                return False  # shared or held whole: not cut
            used = (0, 0)
        return shape.fits(profile, used)

    def take(
        self,
        gpu_ids: tuple[int, ...],
        milli: int,
        cores: tuple[int, ...],
        memory_mb: int,
        group: str | None,
        mig: str | None = None,
        disk: tuple[str, int] | None = None,
    ) -> None:
        """Hold devices for a task; `disk`: (SSD name, GB) of its space on that disk."""
        if disk is not None:
            self._disk_space(disk, -1)
        cards = len(self.gpu_milli_free)
        if mig is not None:
            if gpu_ids[0] < cards:  # a card gone from a re-reported topology holds nothing
                self._mig_slice(gpu_ids[0], MigProfile.parse(mig), +1)
        else:
            for gpu in gpu_ids:
                if gpu < cards:
                    self.gpu_milli_free[gpu] -= milli
        limit = self.cpu_holders_max
        for core in cores:
            held = self.cpu_held.get(core, 0) + 1
            self.cpu_held[core] = held
            if held == limit:
                self.cpu_cores_full += 1
                self._numa_room(core, -1)
        self.cpu_taken += len(cores)
        self.memory_free_mb -= memory_mb
        if group is not None:
            self.groups[group] = self.groups.get(group, 0) + 1

    def give_back(
        self,
        gpu_ids: tuple[int, ...],
        milli: int,
        cores: tuple[int, ...],
        memory_mb: int,
        group: str | None,
        mig: str | None = None,
        disk: tuple[str, int] | None = None,
    ) -> None:
        if disk is not None:
            self._disk_space(disk, +1)
        cards = len(self.gpu_milli_free)
        if mig is not None:
            if gpu_ids[0] < cards:
                self._mig_slice(gpu_ids[0], MigProfile.parse(mig), -1)
        else:
            for gpu in gpu_ids:
                if gpu in self.blocked:
                    self.blocked[gpu] += milli  # an unknown task still runs there
                elif gpu < cards:
                    self.gpu_milli_free[gpu] += milli
        limit = self.cpu_holders_max
        for core in cores:
            if self.cpu_held[core] == limit:
                self.cpu_cores_full -= 1
                self._numa_room(core, +1)
            self.cpu_held[core] -= 1
        self.cpu_taken -= len(cores)
        self.memory_free_mb += memory_mb
        if group is not None:
            self.groups[group] -= 1
            if not self.groups[group]:
                del self.groups[group]

    def block(self, gpu: int) -> None:
        """Count card `gpu` busy for a task the core does not hold here: its free share is
        taken (a card cut into MIG has none free; its slices are not blocked)."""
        if gpu in self.blocked or gpu >= len(self.gpu_milli_free):
            return
        taken = 0 if gpu in self.mig_used else max(0, self.gpu_milli_free[gpu])
        self.gpu_milli_free[gpu] -= taken
        self.blocked[gpu] = taken

    def unblock(self, gpu: int) -> None:
        """The unknown task on card `gpu` is gone: what it kept from the card is free (a
        cordoned card stays held out until its cordon lifts)."""
        if gpu in self.cordons:
            return
        taken = self.blocked.pop(gpu, None)
        if taken is not None and gpu not in self.mig_used and gpu < len(self.gpu_milli_free):
            self.gpu_milli_free[gpu] += taken

    def _disk_space(self, disk: tuple[str, int], sign: int) -> None:
        # a disk gone from a re-reported topology still counts its holders (below zero)
        name, gb = disk
        self.disk_free_gb[name] = self.disk_free_gb.get(name, 0) + sign * gb

    def _numa_room(self, core: int, change: int) -> None:
        numa = self.cpu_numa.get(core)
        if numa is not None:
            self.numa_room[numa] = self.numa_room.get(numa, 0) + change

    def _mig_slice(self, gpu: int, profile: MigProfile, sign: int) -> None:
        shape = card_geometry(self.topology.gpus[gpu].mig_profiles)
        if shape is None:
            raise ValueError(f"GPU {gpu} of {self.name} has no MIG profiles")
        compute, memory = shape.cost(profile)
        used = self.mig_used.get(gpu, (0, 0))
        now = (used[0] + sign * compute, used[1] + sign * memory)
        if now == (0, 0):
            del self.mig_used[gpu]
            if gpu in self.blocked:  # whole again, but an unknown task still runs there
                self.blocked[gpu] = self.gpu_capacity_milli
                self.gpu_milli_free[gpu] = 0
            else:
                self.gpu_milli_free[gpu] = self.gpu_capacity_milli  # a whole card again
        else:
            self.mig_used[gpu] = now
            self.gpu_milli_free[gpu] = 0  # cut: no whole or shared use

    @property
    def name(self) -> str:
        return self.topology.node_id

    @property
    def gpu_model(self) -> str:
        return self.topology.gpus[0].model if self.topology.gpus else ""

    @property
    def gpu_memory_mb(self) -> int:
        return min((g.memory_mb for g in self.topology.gpus), default=0)

    @property
    def cpu_total(self) -> int:
        return self._cpu_total

    @property
    def disk_gb(self) -> int:
        return max((d.capacity_gb for d in self.topology.disks if not d.rotational), default=0)

    @property
    def memory_bandwidth_gbps(self) -> float:
        """The best measured NUMA node (a NUMA-local task gets one); NaN: not measured."""
        measured = [n.memory_bandwidth_gbps for n in self.topology.numa_nodes]
        return max((b for b in measured if b is not None), default=math.nan)

    @property
    def ssd_iops(self) -> float:
        """The best measured random-read IOPS of a solid-state disk; NaN: not measured."""
        measured = [d.random_read_iops for d in self._ssds]
        return max((v for v in measured if v is not None), default=math.nan)

    @property
    def memory_bandwidth_all_cores_gbps(self) -> float:
        """The best NUMA node's aggregate bandwidth (all its cores at once), where a node was
        measured only one thread at a time its single-thread figure (a lower bound of it);
        NaN: not measured. What AllData's memory.bandwidth_gbps is compared with."""
        known = [
            n.memory_bandwidth_gbps
            if n.memory_bandwidth_gbps_all_cores is None
            else n.memory_bandwidth_gbps_all_cores
            for n in self.topology.numa_nodes
        ]
        return max((b for b in known if b is not None), default=math.nan)

    @property
    def ssd_iops_at_depth(self) -> float:
        """The best solid-state disk's random-read IOPS at depth (datasheet, operator or
        measured), where a disk has none its queue-depth-1 figure (a lower bound of it);
        NaN: neither known. What AllData's ssd.iops_min is compared with."""
        known = [disk_iops(d) for d in self._ssds]
        return max((v for v in known if v is not None), default=math.nan)

    @property
    def ssd_latency_us(self) -> float:
        """The lowest measured median read latency of a solid-state disk; NaN: not measured."""
        measured = [d.read_latency_us_p50 for d in self._ssds]
        return min((v for v in measured if v is not None), default=math.nan)

    @property
    def _ssds(self) -> list[Disk]:
        return [d for d in self.topology.disks if not d.rotational]

    @property
    def mig_cards(self) -> int:
        return sum(1 for g in self.topology.gpus if g.mig_capable and g.mig_profiles)

    def has_flag(self, flag: str) -> bool:
        flags = self.topology.cpu.flags
        return flag in flags or (flag == "avx512" and "avx512f" in flags)


FloatArray = npt.NDArray[np.float64]

# Columns: name -> dtype. Capacities count over-commit; totals are the hardware.
_COLUMNS: dict[str, str] = {
    "gpus_total": "int64",
    "gpus_free": "int64",  # whole free cards
    "gpu_share_free": "int64",  # most milli free on one card
    "gpu_milli_free": "int64",  # free milli over all cards
    "gpu_memory_mb": "int64",
    "cpu_total": "int64",
    "cpu_capacity": "int64",
    "cpu_free": "int64",  # cores a task can be given now
    "memory_total_mb": "int64",
    "memory_capacity_mb": "int64",
    "memory_free_mb": "int64",
    "disk_gb": "int64",
    "disk_free_gb": "int64",  # most space free on one SSD
    "memory_bandwidth_gbps": "float64",  # NaN: not measured
    "ssd_iops": "float64",
    "ssd_latency_us": "float64",
    # what the filters compare AllData's figures with (see Node): NaN, unknown
    "memory_bandwidth_all_cores_gbps": "float64",
    "ssd_iops_at_depth": "float64",
    "mig_cards": "int64",
    "label_set": "int64",  # index into `label_sets`
    "taint_set": "int64",  # index into `taint_sets`
    "ready": "bool",
    "health": "int64",  # the node's health score
    "gpus_cordoned": "int64",  # cards held out for a fault or by an operator
    "cordoned": "bool",  # the whole node takes no new work (a fault that needs a reboot)
    "pool": "U63",
    "gpu_model": "U96",
    "gpu_family": "U32",  # the cards' model, as GpuProduct reads it off the name (a100)
    "gpu_form": "U8",  # their form factor (pcie, sxm, nvl); "": the name does not say
    # The node's domain at each level of the network fabric: an index into `fabric_domains`;
    # 0: it declares no name at that level
    "fabric_nvlink_domain": "int64",
    "fabric_leaf": "int64",
    "fabric_spine": "int64",
}
FABRIC_COLUMNS: dict[FabricLevel, str] = {
    FabricLevel.NVLINK_DOMAIN: "fabric_nvlink_domain",
    FabricLevel.LEAF: "fabric_leaf",
    FabricLevel.SPINE: "fabric_spine",
}


def _no_caches() -> dict[str, object]:
    """What a snapshot leaves out of `ClusterArrays`: its caches, rebuilt on use."""
    return {"_topology_rows": {}, "_topology_rows_for": -1, "_profiles_for": -1}


class ClusterArrays:
    """Column arrays over nodes, row i = `nodes[i]`. Rows are rewritten when a node changes.

    Labels and taints are interned: nodes share a few distinct sets, so a filter judges each
    set once and maps the verdicts back to the rows."""

    gpus_total: IntArray
    gpus_free: IntArray
    gpu_share_free: IntArray
    gpu_milli_free: IntArray
    gpu_memory_mb: IntArray
    cpu_total: IntArray
    cpu_capacity: IntArray
    cpu_free: IntArray
    memory_total_mb: IntArray
    memory_capacity_mb: IntArray
    memory_free_mb: IntArray
    disk_gb: IntArray
    disk_free_gb: IntArray
    memory_bandwidth_gbps: FloatArray
    ssd_iops: FloatArray
    ssd_latency_us: FloatArray
    memory_bandwidth_all_cores_gbps: FloatArray
    ssd_iops_at_depth: FloatArray
    mig_cards: IntArray
    label_set: IntArray
    taint_set: IntArray
    ready: BoolArray
    health: IntArray
    gpus_cordoned: IntArray
    cordoned: BoolArray
    pool: npt.NDArray[np.str_]
    gpu_model: npt.NDArray[np.str_]
    gpu_family: npt.NDArray[np.str_]
    gpu_form: npt.NDArray[np.str_]

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        # the request shapes seen (fed by the core): what fragmentation is measured against
        self.workload = WorkloadModel()
        self.index: dict[str, int] = {}
        # Each column is a view of the first len(nodes) rows of a larger array, which
        # doubles when full: adding n nodes copies O(n) rows in all, not O(n^2).
        self._room = 0
        self._backing: dict[str, npt.NDArray[np.generic]] = {}
        for name, dtype in _COLUMNS.items():
            self._backing[name] = np.zeros(0, dtype)
            setattr(self, name, self._backing[name])
        self._rank_backing: IntArray = np.zeros(0, np.int64)
        self.name_rank: IntArray = self._rank_backing  # each row's place in name order
        self._sorted_names: list[str] = []
        self._everywhere_backing: BoolArray = _read_only(np.ones(0, np.bool_))
        self.everywhere: BoolArray = self._everywhere_backing  # True on every row
        # Each node's cards, free thousandths, one row each padded with 0 (as wide as the
        # node with most cards): what fragmentation is measured on, kept by `refresh`.
        self._cards_backing: IntArray = np.zeros((0, 1), np.int64)
        self.card_milli: IntArray = self._cards_backing
        # Counts node additions and topology changes: what depends on totals caches on it.
        self.topology_version = 0
        # Rows picked by what only an upsert changes (`topology_rows`: a pool, a GPU model),
        # valid for `_topology_rows_for` (a topology_version) only.
        self._topology_rows: dict[tuple[str, str], BoolArray] = {}
        self._topology_rows_for = -1
        # Rows with the same capacity and cards share a profile (`capacity_profiles`), valid
        # for `_profiles_for` (a topology_version) only.
        self._profiles: tuple[IntArray, IntArray] = (np.zeros(0, np.int64), np.zeros(0, np.int64))
        self._profiles_for = -1
        self.label_sets: list[dict[str, str]] = []
        # Fabric domains as (level, names from the spine down), interned: index 0 is none.
        # Ids follow the order nodes declared them (the event log's), never a decision's order.
        self.fabric_domains: list[tuple[FabricLevel | None, tuple[str, ...]]] = [(None, ())]
        self._fabric_ids: dict[tuple[FabricLevel | None, tuple[str, ...]], int] = {}
        self.fabric_nodes = 0  # nodes that declare a place: 0 keeps every fabric path idle
        # nodes whose last heartbeat carried live readings: empty keeps LiveReadings idle
        self.read_nodes: set[str] = set()
        self.taint_sets: list[tuple[Taint, ...]] = []
        self._label_ids: dict[tuple[tuple[str, str], ...], int] = {}
        self._taint_ids: dict[tuple[Taint, ...], int] = {}

    def __len__(self) -> int:
        return len(self.nodes)

    def note_readings(self, node: Node) -> None:
        """Keep `read_nodes` true to `node.readings` (set by its latest heartbeat)."""
        if node.readings:
            self.read_nodes.add(node.name)
        else:
            self.read_nodes.discard(node.name)

    # A snapshot (audit log) pickles the backing arrays only: pickle would copy each column
    # view apart from its backing array, and the next node added would resurrect stale rows.
    _VIEWS: tuple[str, ...] = (*_COLUMNS, "name_rank", "everywhere", "card_milli")

    def __getstate__(self) -> dict[str, object]:
        kept = {k: v for k, v in self.__dict__.items() if k not in self._VIEWS}
        return kept | _no_caches()

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(_no_caches() | state)
        _read_only(self._everywhere_backing)
        self._views()

    def _views(self) -> None:
        """The columns as views of the first len(nodes) rows of their backing arrays."""
        rows = len(self.nodes)
        for name, backing in self._backing.items():
            setattr(self, name, backing[:rows])
        self.name_rank = self._rank_backing[:rows]
        self.everywhere = self._everywhere_backing[:rows]
        self.card_milli = self._cards_backing[:rows]

    def fabric(self, level: FabricLevel) -> IntArray:
        """Each row's domain at `level` (0: none declared)."""
        column: IntArray = getattr(self, FABRIC_COLUMNS[level])
        return column

    def fabric_name(self, domain: int) -> str:
        """A domain as operators read it: its names from the spine down (spine-1/leaf-3)."""
        return "/".join(name for name in self.fabric_domains[domain][1] if name)

    def pool_of(self, name: str) -> str | None:
        """The pool of node `name` (None: unknown node)."""
        i = self.index.get(name)
        return None if i is None else str(self.pool[i])

    def in_pool(self, pool: str) -> BoolArray:
        """Which rows are in `pool` (read-only, shared)."""
        return self.topology_rows("pool", pool, lambda: np.asarray(self.pool == pool))

    def topology_rows(self, kind: str, key: str, pick: Callable[[], BoolArray]) -> BoolArray:
        """The rows `pick` selects (read-only, shared), for what depends only on columns an
        upsert writes (a node's pool, its cards' model): kept, by `kind` and `key`, until the
        topology changes. Comparing such columns (strings) costs more than the rest of a
        filter walk or a score on a large fleet, asked once per placement."""
        if self._topology_rows_for != self.topology_version:
            self._topology_rows, self._topology_rows_for = {}, self.topology_version
        rows = self._topology_rows.get((kind, key))
        if rows is None:
            rows = self._topology_rows[(kind, key)] = _read_only(pick())
        return rows

    def capacity_profiles(self) -> tuple[IntArray, IntArray]:
        """Each row's profile (what could ever run there: its cards, their model and memory,
        its CPU and memory capacity) and one row of each profile. A fleet has few; what
        depends only on them is computed once a profile, not once a node."""
        if self._profiles_for != self.topology_version:
            seen: dict[tuple[object, ...], int] = {}
            of = np.zeros(len(self.nodes), np.int64)
            first: list[int] = []
            for row in range(len(self.nodes)):
                key = (
                    int(self.gpus_total[row]),
                    int(self.cpu_capacity[row]),
                    int(self.memory_capacity_mb[row]),
                    str(self.gpu_model[row]),
                    str(self.gpu_family[row]),
                    str(self.gpu_form[row]),
                    int(self.gpu_memory_mb[row]),
                )
                if key not in seen:
                    seen[key] = len(first)
                    first.append(row)
                of[row] = seen[key]
            self._profiles = (of, np.asarray(first, np.int64))
            self._profiles_for = self.topology_version
        return self._profiles

    def get(self, name: str) -> Node | None:
        i = self.index.get(name)
        return None if i is None else self.nodes[i]

    def upsert(self, node: Node) -> None:
        i = self.index.get(node.name)
        if i is None:
            self.index[node.name] = len(self.nodes)
            self.nodes.append(node)
            self._grow()
            self._rank_name(node.name)
        else:
            self.nodes[i] = node
        self.topology_version += 1
        self._describe(self.index[node.name])
        self.refresh(node.name)

    def refresh(self, name: str) -> None:
        """Rewrite a node's row after what is free on it, or its condition, changed."""
        i = self.index[name]
        node = self.nodes[i]
        self.gpus_free[i] = node.whole_gpus_free
        self.gpu_share_free[i] = node.largest_share_free
        self.gpu_milli_free[i] = sum(node.gpu_milli_free)
        self.cpu_free[i] = node.cpu_slots_free
        self.memory_free_mb[i] = node.memory_free_mb
        self.disk_free_gb[i] = node.disk_free_most_gb
        self.ready[i] = node.condition is not NodeCondition.NOT_READY
        self.cordoned[i] = node.node_cordon is not None
        self.health[i] = node.health_score
        self.gpus_cordoned[i] = len(node.cordons)
        cards = node.gpu_milli_free
        if len(cards) > self._cards_backing.shape[1]:
            self._widen(len(cards))
        row = self.card_milli[i]
        row[: len(cards)] = cards
        row[len(cards) :] = 0

    def _describe(self, i: int) -> None:
        """The row's hardware columns: they change only with the topology (an upsert)."""
        node = self.nodes[i]
        self.gpus_total[i] = len(node.gpu_milli_free)
        self.gpu_memory_mb[i] = node.gpu_memory_mb
        self.cpu_total[i] = node.cpu_total
        self.cpu_capacity[i] = node.cpu_capacity
        self.memory_total_mb[i] = node.topology.memory_mb
        self.memory_capacity_mb[i] = node.memory_capacity_mb
        self.disk_gb[i] = node.disk_gb
        self.memory_bandwidth_gbps[i] = node.memory_bandwidth_gbps
        self.ssd_iops[i] = node.ssd_iops
        self.ssd_latency_us[i] = node.ssd_latency_us
        self.memory_bandwidth_all_cores_gbps[i] = node.memory_bandwidth_all_cores_gbps
        self.ssd_iops_at_depth[i] = node.ssd_iops_at_depth
        self.mig_cards[i] = node.mig_cards
        self.label_set[i] = self._intern_labels(node.topology.labels)
        self._place(i, node)
        self.taint_set[i] = self._intern_taints(tuple(node.topology.taints))
        self.pool[i] = node.topology.pool
        self.gpu_model[i] = _model_key(node.gpu_model)
        product = gpu_of_inventory(node.gpu_model)
        self.gpu_family[i] = product.model
        self.gpu_form[i] = product.form_factor or ""

    def _place(self, i: int, node: Node) -> None:
        """The row's fabric domains, and the count of nodes that declare one."""
        was = any(self.fabric(level)[i] for level in FABRIC_LEVELS)
        fabric = node.topology.fabric
        for level in FABRIC_LEVELS:
            path = None if fabric is None else fabric.path_to(level)
            self.fabric(level)[i] = 0 if path is None else self._intern_domain(level, path)
        now = any(self.fabric(level)[i] for level in FABRIC_LEVELS)
        self.fabric_nodes += int(now) - int(was)

    def _intern_domain(self, level: FabricLevel, path: tuple[str, ...]) -> int:
        key = (level, path)
        if key not in self._fabric_ids:
            self._fabric_ids[key] = len(self.fabric_domains)
            self.fabric_domains.append(key)
        return self._fabric_ids[key]

    def _intern_labels(self, labels: dict[str, str]) -> int:
        key = tuple(sorted(labels.items()))
        if key not in self._label_ids:
            self._label_ids[key] = len(self.label_sets)
            self.label_sets.append(dict(key))
        return self._label_ids[key]

    def _intern_taints(self, taints: tuple[Taint, ...]) -> int:
        if taints not in self._taint_ids:
            self._taint_ids[taints] = len(self.taint_sets)
            self.taint_sets.append(taints)
        return self._taint_ids[taints]

    def _grow(self) -> None:
        """One row more (zeros): the backing arrays double when full."""
        rows = len(self.nodes)
        if rows > self._room:
            self._room = max(16, 2 * self._room)
            for name, old in self._backing.items():
                grown = np.zeros(self._room, old.dtype)
                grown[: len(old)] = old
                self._backing[name] = grown
            rank = np.zeros(self._room, np.int64)
            rank[: len(self._rank_backing)] = self._rank_backing
            self._rank_backing = rank
            self._everywhere_backing = _read_only(np.ones(self._room, np.bool_))
            cards = np.zeros((self._room, self._cards_backing.shape[1]), np.int64)
            cards[: len(self._cards_backing)] = self._cards_backing
            self._cards_backing = cards
        self._views()

    def _widen(self, width: int) -> None:
        """Room for `width` cards a node: the card matrix gets as many columns."""
        cards = np.zeros((len(self._cards_backing), width), np.int64)
        cards[:, : self._cards_backing.shape[1]] = self._cards_backing
        self._cards_backing = cards
        self._views()

    def _rank_name(self, name: str) -> None:
        """The new last row's place in name order; the names after it move down one."""
        place = bisect.bisect_left(self._sorted_names, name)
        self._sorted_names.insert(place, name)
        ranks = self.name_rank
        ranks[:-1][ranks[:-1] >= place] += 1
        ranks[-1] = place


def disk_iops(disk: Disk) -> float | None:
    """A disk's random-read IOPS in the datasheets' sense (at depth: rated, an operator's or
    measured), else its queue-depth-1 figure (a lower bound of it); None: neither known."""
    if disk.random_read_iops_at_depth is not None:
        return disk.random_read_iops_at_depth
    return disk.random_read_iops


def _read_only(column: BoolArray) -> BoolArray:
    column.setflags(write=False)
    return column


def _model_key(model: str) -> str:
    """Model names compared without case, spaces or dashes: "RTX 4090" matches "rtx4090"."""
    return model.lower().replace(" ", "").replace("-", "").replace("_", "")


def model_key(model: str) -> str:
    return _model_key(model)
