"""Cluster state: each node's hardware and what is free on it, mirrored into arrays so that
filters and scores run vectorised over every node at once."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from crater.contracts import NodeCondition, NodeTopology

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass
class Node:
    """One node's hardware and its free resources (the truth the arrays mirror)."""

    topology: NodeTopology
    condition: NodeCondition = NodeCondition.READY
    last_heartbeat_at: float | None = None  # event time, seconds since the epoch
    gpu_free: list[bool] = field(default_factory=list)
    cpu_free: set[int] = field(default_factory=set)
    memory_free_mb: int = 0
    # anti-affinity groups of the allocations on this node, with how many each
    groups: dict[str, int] = field(default_factory=dict)

    @classmethod
    def empty(cls, topology: NodeTopology) -> Node:
        return cls(
            topology=topology,
            gpu_free=[True] * len(topology.gpus),
            cpu_free={cpu for numa in topology.numa_nodes for cpu in numa.cpus},
            memory_free_mb=topology.memory_mb,
        )

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
        self.gpus_free: IntArray = np.zeros(0, np.int64)
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
        self.gpus_total[i] = len(node.gpu_free)
        self.gpus_free[i] = sum(node.gpu_free)
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
