"""The waiting queue's rules, apart from placement.

Order: priority (0..1000, larger first; low 100, medium 500, high 900), then, inside one
priority, the tenant's dominant share of the task's pool (dominant-resource fairness: the
tenant holding the smallest share of its scarcest resource goes first), then FIFO.

Backfill (EASY): per pool, the first task of that order that cannot be placed, and is not held
back by its own tenant's quota, is the head. It reserves the node(s) it waits on: those that
could hold it once emptied, ready, the closest to fitting now (most whole GPUs free, then CPU
cores, then memory, then name), one per member it needs there. Tasks behind it in the order
may run now only on other nodes, so they can never delay it.

Claims: a task reclaiming its tenant's guarantee from other tenants' borrowing has the room
its victims leave first: no task of another tenant that claimed later, nor any that claims
nothing, is placed where it would take that room, and owners whose victims are all gone are
tried before the queue, in the order they claimed. Without it a later claimant ranked ahead in
the queue (a lower share, a higher priority) could take the room, and the first owner would
need new victims and wait a second grace period. A pool's reclaim of its lent cards is the
pool's: whichever of its tasks its queue serves first takes the room.

Escalation: a task waiting past `sla.max_queue_time_seconds` ranks one class (+400) higher,
and may preempt below that rank.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from crater.contracts import PRIORITY_MAX
from crater.scheduler.domain.cluster import WHOLE, BoolArray, ClusterArrays
from crater.scheduler.domain.demand import Demand
from crater.scheduler.domain.quotas import Usage

ESCALATION_STEP = 400  # one named class: low 100 -> medium 500 -> high 900
QueueKey = tuple[str, str]  # (pool, tenant)
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Backfill:
    """The blocked head of a pool's queue and the nodes kept for it."""

    task_id: str
    order: tuple[int, float, int]
    nodes: tuple[str, ...]

    def mask(self, cluster: ClusterArrays) -> BoolArray:
        return node_mask(cluster, self.nodes)


def node_mask(cluster: ClusterArrays, names: Iterable[str]) -> BoolArray:
    """The rows of the nodes named (those the cluster no longer has are left out)."""
    rows = np.zeros(len(cluster), np.bool_)
    for name in names:
        row = cluster.index.get(name)
        if row is not None:
            rows[row] = True
    return rows


def escalated_priority(priority: int) -> int:
    return min(PRIORITY_MAX, priority + ESCALATION_STEP)


def pool_capacity(cluster: ClusterArrays, pool: str) -> Usage:
    rows = cluster.in_pool(pool)
    return Usage(
        gpus=float(cluster.gpus_total[rows].sum()),
        cpu_cores=int(cluster.cpu_total[rows].sum()),
        memory_mb=int(cluster.memory_total_mb[rows].sum()),
    )


def dominant_share(used: Usage, capacity: Usage) -> float:
    """The largest fraction of the pool the tenant holds of any one resource."""
    shares = [
        held / total
        for held, total in (
            (used.gpus, capacity.gpus),
            (used.cpu_cores, capacity.cpu_cores),
            (used.memory_mb, capacity.memory_mb),
        )
        if total > 0
    ]
    return round(max(shares, default=0.0), 9)  # equal shares compare equal on every machine


def gang_demand(demand: Demand, members: int) -> Demand:
    """What one node must offer to hold `members` copies of `demand`: the filters judge it,
    the exact devices are then chosen member by member."""
    if demand.gpu_milli and demand.gpu_milli < WHOLE:
        gpus, milli = demand.gpus, min(WHOLE, demand.gpu_milli * members)  # shares of cards
        if milli == WHOLE:
            gpus, milli = -(-demand.gpu_milli * members // WHOLE), WHOLE
    else:
        gpus, milli = demand.gpus * members, demand.gpu_milli
    return replace(
        demand,
        gpus=gpus,
        gpu_milli=milli,
        cpu_cores=demand.cpu_cores * members,
        memory_mb=demand.memory_mb * members,
    )


def members_per_node(cluster: ClusterArrays, demand: Demand, rows: IntArray) -> IntArray:
    """How many members of `demand` each of `rows` could hold when empty."""
    unbounded = np.full(len(rows), 1 << 30, np.int64)
    fit = unbounded.copy()
    if demand.gpus:
        per_card = WHOLE // demand.gpu_milli if demand.gpu_milli < WHOLE else 1
        fit = np.minimum(fit, cluster.gpus_total[rows] * per_card // demand.gpus)
    if demand.cpu_cores:
        fit = np.minimum(fit, cluster.cpu_total[rows] // demand.cpu_cores)
    if demand.memory_mb:
        fit = np.minimum(fit, cluster.memory_total_mb[rows] // demand.memory_mb)
    return fit


def closest_to_fitting(cluster: ClusterArrays, rows: IntArray, count: int) -> list[int]:
    """Of `rows`, the `count` with the most whole GPUs free, then CPU cores, then memory,
    then the smallest name: where a waiting task is likeliest to fit first."""
    order = np.lexsort(
        (
            cluster.name_rank[rows],
            -cluster.memory_free_mb[rows],
            -cluster.cpu_free[rows],
            -cluster.gpus_free[rows],
        )
    )
    return [int(rows[k]) for k in order[:count]]
