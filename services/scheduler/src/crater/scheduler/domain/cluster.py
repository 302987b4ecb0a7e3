"""Cluster state: each node's hardware and what is free on it, mirrored into arrays so that
filters and scores run vectorised over every node at once."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from crater.contracts import NodeCondition, NodeTopology

IntArray = npt.NDArray[np.int64]
WHOLE = 1000  # a whole card, in thousandths
BoolArray = npt.NDArray[np.bool_]


@dataclass
class Node:
    """One node's hardware and its free resources (the truth the arrays mirror)."""

    topology: NodeTopology
    condition: NodeCondition = NodeCondition.READY
    last_heartbeat_at: float | None = None  # event time, seconds since the epoch
    # free thousandths of each card: 1000 is a whole free card (GPU sharing takes less)
    gpu_milli_free: list[int] = field(default_factory=list)
    cpu_free: set[int] = field(default_factory=set)
    memory_free_mb: int = 0
    # anti-affinity groups of the allocations on this node, with how many each
    groups: dict[str, int] = field(default_factory=dict)

    @classmethod
    def empty(cls, topology: NodeTopology) -> Node:
        return cls(
            topology=topology,
            gpu_milli_free=[WHOLE] * len(topology.gpus),
            cpu_free={cpu for numa in topology.numa_nodes for cpu in numa.cpus},
            memory_free_mb=topology.memory_mb,
        )

    @property
    def whole_gpus_free(self) -> int:
        return sum(1 for m in self.gpu_milli_free if m == WHOLE)

    @property
    def largest_share_free(self) -> int:
        return max(self.gpu_milli_free, default=0)

    def take(
        self,
        gpu_ids: tuple[int, ...],
        milli: int,
        cores: tuple[int, ...],
        memory_mb: int,
        group: str | None,
    ) -> None:
        for gpu in gpu_ids:
            self.gpu_milli_free[gpu] -= milli
        self.cpu_free -= set(cores)
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
    ) -> None:
        for gpu in gpu_ids:
            self.gpu_milli_free[gpu] += milli
        self.cpu_free |= set(cores)
        self.memory_free_mb += memory_mb
        if group is not None:
            self.groups[group] -= 1
            if not self.groups[group]:
                del self.groups[group]

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
        return sum(len(n.cpus) for n in self.topology.numa_nodes)

    @property
    def disk_gb(self) -> int:
        return max((d.capacity_gb for d in self.topology.disks if not d.rotational), default=0)

    def has_flag(self, flag: str) -> bool:
        flags = self.topology.cpu.flags
        return flag in flags or (flag == "avx512" and "avx512f" in flags)


class ClusterArrays:
    """Column arrays over nodes, row i = `nodes[i]`. Rows are rewritten when a node changes."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.index: dict[str, int] = {}
        self.gpus_total: IntArray = np.zeros(0, np.int64)
        self.gpus_free: IntArray = np.zeros(0, np.int64)  # whole free cards
        self.gpu_share_free: IntArray = np.zeros(0, np.int64)  # most milli free on one card
        self.gpu_memory_mb: IntArray = np.zeros(0, np.int64)
        self.cpu_total: IntArray = np.zeros(0, np.int64)
        self.cpu_free: IntArray = np.zeros(0, np.int64)
        self.memory_total_mb: IntArray = np.zeros(0, np.int64)
        self.memory_free_mb: IntArray = np.zeros(0, np.int64)
        self.disk_gb: IntArray = np.zeros(0, np.int64)
        self.ready: BoolArray = np.zeros(0, np.bool_)
        self.pool: npt.NDArray[np.str_] = np.zeros(0, "U63")
        self.gpu_model: npt.NDArray[np.str_] = np.zeros(0, "U96")
        self.name_rank: IntArray = np.zeros(0, np.int64)

    def __len__(self) -> int:
        return len(self.nodes)

    def get(self, name: str) -> Node | None:
        i = self.index.get(name)
        return None if i is None else self.nodes[i]

    def upsert(self, node: Node) -> None:
        i = self.index.get(node.name)
        if i is None:
            self.index[node.name] = len(self.nodes)
            self.nodes.append(node)
            self._grow()
            self._rank_names()
        else:
            self.nodes[i] = node
        self.refresh(node.name)

    def refresh(self, name: str) -> None:
        i = self.index[name]
        node = self.nodes[i]
        self.gpus_total[i] = len(node.gpu_milli_free)
        self.gpus_free[i] = node.whole_gpus_free
        self.gpu_share_free[i] = node.largest_share_free
        self.gpu_memory_mb[i] = node.gpu_memory_mb
        self.cpu_total[i] = node.cpu_total
        self.cpu_free[i] = len(node.cpu_free)
        self.memory_total_mb[i] = node.topology.memory_mb
        self.memory_free_mb[i] = node.memory_free_mb
        self.disk_gb[i] = node.disk_gb
        self.ready[i] = node.condition is not NodeCondition.NOT_READY
        self.pool[i] = node.topology.pool
        self.gpu_model[i] = _model_key(node.gpu_model)

    def _grow(self) -> None:
        for name in (
            "gpus_total",
            "gpus_free",
            "gpu_share_free",
            "gpu_memory_mb",
            "cpu_total",
            "cpu_free",
            "memory_total_mb",
            "memory_free_mb",
            "disk_gb",
            "ready",
            "pool",
            "gpu_model",
        ):
            column = getattr(self, name)
            setattr(self, name, np.append(column, np.zeros(1, column.dtype)))

    def _rank_names(self) -> None:
        order = sorted(range(len(self.nodes)), key=lambda i: self.nodes[i].name)
        rank = np.empty(len(order), np.int64)
        rank[order] = np.arange(len(order))
        self.name_rank = rank


def _model_key(model: str) -> str:
    """Model names compared without case, spaces or dashes: "RTX 4090" matches "rtx4090"."""
    return model.lower().replace(" ", "").replace("-", "").replace("_", "")


def model_key(model: str) -> str:
    return _model_key(model)
