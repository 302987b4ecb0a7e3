"""Each pool's capacity at a glance, as the scheduler holds it: what its nodes hold, what is
allocated, free and unavailable (on NotReady nodes), and how much of the free GPU share is
fragmented. Read models for the metrics (`crater_pool_*`); nothing here decides anything.

- capacity: what the scheduler may promise on the pool's nodes (the hardware times the
  pool's over-commit ratios), Ready or not;
- allocated: held by allocations (a MIG-cut card counts whole, a shared card its shares);
- free: left on Ready nodes; unavailable: left on NotReady nodes (nothing is placed there);
  capacity = allocated + free + unavailable;
- fragmented (GPUs only): of the free GPU share, what the workload the core has seen could
  not use where it lies, as FGD measures it (Weng et al., ATC'23): per request shape
  weighted by its popularity, the free share on cards too small for the shape, or all of a
  node's free share when the shape cannot run there at all (too few fitting cards, the
  wrong model, too little CPU or memory left). Before any GPU request was seen, the shape is
  one whole card: the free share on cards partly taken is fragmented.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from crater.contracts import NodeCondition
from crater.scheduler.domain.cluster import WHOLE, ClusterArrays, IntArray
from crater.scheduler.domain.fragmentation import card_matrix, expected_fragmentation, models_ok
from crater.scheduler.domain.workload import LearnedShape

# Before the core has seen a GPU request: the shape fragmentation is measured against.
ONE_WHOLE_CARD = LearnedShape(1, WHOLE, None, 1.0, 0.0, 0.0)


@dataclass
class Amounts:
    """One resource of one pool, in its unit (GPUs, cores, MiB, GB)."""

    capacity: float = 0.0
    allocated: float = 0.0
    free: float = 0.0
    unavailable: float = 0.0

    def states(self) -> dict[str, float]:
        return {
            "capacity": self.capacity,
            "allocated": self.allocated,
            "free": self.free,
            "unavailable": self.unavailable,
        }


@dataclass
class PoolTotals:
    gpus: Amounts = field(default_factory=Amounts)
    gpu_memory_mb: Amounts = field(default_factory=Amounts)
    cpu_cores: Amounts = field(default_factory=Amounts)
    memory_mb: Amounts = field(default_factory=Amounts)
    disk_gb: float = 0.0
    gpus_fragmented: float = 0.0
    nodes: dict[NodeCondition, int] = field(default_factory=lambda: dict.fromkeys(NodeCondition, 0))

    @property
    def fragmentation_ratio(self) -> float:
        """Fragmented over free GPU share (0 with nothing free)."""
        return self.gpus_fragmented / self.gpus.free if self.gpus.free > 0 else 0.0


def _add(amounts: Amounts, capacity: float, left: float, ready: bool) -> None:
    amounts.capacity += capacity
    amounts.allocated += capacity - left
    if ready:
        amounts.free += left
    else:
        amounts.unavailable += left


def pool_totals(cluster: ClusterArrays) -> dict[str, PoolTotals]:
    """Every pool's totals, by pool name."""
    pools: dict[str, PoolTotals] = {}
    rows: dict[str, list[int]] = {}
    for i, node in enumerate(cluster.nodes):
        pool = node.topology.pool
        totals = pools.setdefault(pool, PoolTotals())
        totals.nodes[node.condition] = totals.nodes.get(node.condition, 0) + 1
        ready = node.condition is not NodeCondition.NOT_READY
        per_card = node.gpu_capacity_milli
        cards = len(node.gpu_milli_free)
        left_milli = sum(node.gpu_milli_free)
        _add(totals.gpus, cards * per_card / WHOLE, left_milli / WHOLE, ready)
        memory_per_milli = node.gpu_memory_mb / per_card if per_card else 0.0
        _add(
            totals.gpu_memory_mb,
            cards * node.gpu_memory_mb,
            left_milli * memory_per_milli,
            ready,
        )
        _add(totals.cpu_cores, node.cpu_capacity, node.cpu_capacity - node.cpu_taken, ready)
        _add(totals.memory_mb, node.memory_capacity_mb, node.memory_free_mb, ready)
        totals.disk_gb += sum(d.capacity_gb for d in node.topology.disks)
        if ready and cards:
            rows.setdefault(pool, []).append(i)
    shapes = tuple(s for s in cluster.workload.shapes() if s.gpus) or (ONE_WHOLE_CARD,)
    for pool, idx in rows.items():
        pools[pool].gpus_fragmented = fragmented_gpus(cluster, np.asarray(idx, np.int64), shapes)
    return pools


def fragmented_gpus(
    cluster: ClusterArrays, idx: IntArray, shapes: tuple[LearnedShape, ...]
) -> float:
    """The free GPU share (in GPUs) of nodes `idx` that `shapes` could not use, summed."""
    if not len(idx):
        return 0.0
    cards = card_matrix(cluster, idx)
    ok = models_ok(cluster, idx, shapes)
    fragment = expected_fragmentation(
        cards, cluster.cpu_free[idx], cluster.memory_free_mb[idx], ok, shapes
    )
    return float(np.minimum(fragment, cards.sum(axis=1)).sum()) / WHOLE
