"""Read models of the cluster for people: one summary line per node, one per pool."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import get_args

import numpy as np

from crater.contracts import (
    Capacity,
    NodeCondition,
    NodeSummary,
    PoolsAnswer,
    PoolSummary,
    QuotaUse,
    TenantHolding,
    TenantQuota,
)
from crater.contracts.queries import QuotaResource
from crater.scheduler.domain.cluster import WHOLE, ClusterArrays, Node
from crater.scheduler.domain.fragmentation import stranded_free
from crater.scheduler.domain.queue import dominant_share, pool_capacity
from crater.scheduler.domain.quotas import Usage
from crater.scheduler.domain.state import Allocation, SchedulerState


def node_summaries(cluster: ClusterArrays, pool: str | None = None) -> list[NodeSummary]:
    return [
        NodeSummary(
            node_id=node.name,
            pool=node.topology.pool,
            condition=node.condition,
            gpu_model=node.gpu_model or None,
            gpu_memory_mb=node.gpu_memory_mb,
            gpus_total=len(node.gpu_milli_free),
            gpus_free=node.whole_gpus_free,
            cpu_cores_total=node.cpu_total,
            cpu_cores_free=node.cpu_slots_free,
            memory_mb_total=node.topology.memory_mb,
            memory_mb_free=node.memory_free_mb,
            labels=node.topology.labels,
            cordoned_gpus={gpu: c.reason for gpu, c in sorted(node.cordons.items())},
            cordoned=node.node_cordon,
            fabric=node.topology.fabric,
        )
        for node in sorted(cluster.nodes, key=lambda n: n.name)
        if pool is None or node.topology.pool == pool
    ]


class _Sums:
    """One pool's totals and allocations, added up node by node."""

    def __init__(self) -> None:
        self.nodes = self.ready = self.whole_free = 0
        self.total: defaultdict[str, float] = defaultdict(float)
        self.allocated: defaultdict[str, float] = defaultdict(float)

    def add(self, node: Node, members: list[tuple[Allocation, Allocation]]) -> None:
        self.nodes += 1
        self.ready += node.condition is not NodeCondition.NOT_READY
        self.whole_free += node.whole_gpus_free
        cards = len(node.gpu_milli_free)
        self.total["gpus"] += cards * node.gpu_capacity_milli / WHOLE
        held = cards * node.gpu_capacity_milli - sum(node.gpu_milli_free)
        self.allocated["gpus"] += held / WHOLE
        self.total["gpu_memory_mb"] += sum(g.memory_mb for g in node.topology.gpus)
        self.total["cpu_cores"] += node.cpu_capacity
        self.allocated["cpu_cores"] += node.cpu_taken
        self.total["memory_mb"] += node.memory_capacity_mb
        self.allocated["memory_mb"] += node.memory_capacity_mb - node.memory_free_mb
        self.total["disk_gb"] += sum(d.capacity_gb for d in node.topology.disks if not d.rotational)
        for member, head in members:
            self.allocated["gpu_memory_mb"] += member.usage.gpu_memory_mb
            self.allocated["disk_gb"] += head.task.demand.disk_gb if head.task else 0

    def capacity(self, resource: str) -> Capacity:
        return Capacity(total=self.total[resource], allocated=max(0.0, self.allocated[resource]))


def pool_summaries(
    state: SchedulerState, pool: str | None = None, tenant: str | None = None
) -> PoolsAnswer:
    """Every pool's capacity, allocation and fragmentation, its tenants' holdings (only
    `tenant`'s, when given), and the tenants' quotas."""
    cluster = state.cluster
    on_node: dict[str, list[tuple[Allocation, Allocation]]] = defaultdict(list)
    placed: Counter[str] = Counter()
    for head in state.allocations.values():
        placed[head.pool] += 1
        for member in head.members():
            on_node[member.node].append((member, head))
    waiting = Counter(t.request.pool for t in state.pending.values())
    sums: dict[str, _Sums] = defaultdict(_Sums)
    for node in cluster.nodes:
        sums[node.topology.pool].add(node, on_node.get(node.name, []))
    names = set(sums) | set(state.config.pools) | set(waiting) | set(placed)
    holdings: dict[str, list[TenantHolding]] = defaultdict(list)
    for (of_pool, who), used in state.pool_usage.items():
        if used and (tenant is None or who == tenant):
            share = dominant_share(used, pool_capacity(cluster, of_pool))
            holdings[of_pool].append(_holding(who, used, share))
    pools = []
    for name in sorted(n for n in names if pool is None or n == pool):
        found = sums.get(name) or _Sums()
        stranded, fragmentation = _fragmentation(cluster, name)
        pools.append(
            PoolSummary(
                pool=name,
                nodes=found.nodes,
                nodes_ready=found.ready,
                gpus=found.capacity("gpus"),
                gpu_memory_mb=found.capacity("gpu_memory_mb"),
                cpu_cores=found.capacity("cpu_cores"),
                memory_mb=found.capacity("memory_mb"),
                disk_gb=found.capacity("disk_gb"),
                gpus_free_whole=found.whole_free,
                fragmented_gpus=stranded,
                fragmentation=fragmentation,
                tasks_waiting=waiting[name],
                tasks_placed=placed[name],
                tenants=sorted(holdings[name], key=lambda h: (-h.share, h.tenant)),
            )
        )
    return PoolsAnswer(pools=pools, quotas=_quotas(state, tenant))


def _holding(tenant: str, used: Usage, share: float) -> TenantHolding:
    return TenantHolding(
        tenant=tenant,
        gpus=used.gpus,
        gpu_memory_mb=used.gpu_memory_mb,
        cpu_cores=used.cpu_cores,
        memory_mb=used.memory_mb,
        share=share,
    )


def _fragmentation(cluster: ClusterArrays, pool: str) -> tuple[float | None, float | None]:
    """(free GPU cards the workload seen could not use, that over the free GPU capacity)."""
    idx = np.flatnonzero((cluster.pool == pool) & (cluster.gpus_total > 0))
    stranded = stranded_free(cluster, idx)
    if stranded is None:
        return None, None
    free = float(cluster.gpu_milli_free[idx].sum())
    cards = round(float(stranded.sum()) / WHOLE, 3)
    return cards, (min(1.0, round(float(stranded.sum()) / free, 4)) if free > 0 else None)


def _quotas(state: SchedulerState, tenant: str | None) -> list[TenantQuota]:
    quotas = state.quotas
    tenants = set(quotas.limits) | {t for t, used in quotas.used.items() if used}
    resources: tuple[QuotaResource, ...] = get_args(QuotaResource)
    found = []
    for who in sorted(t for t in tenants if tenant is None or t == tenant):
        limit, used = quotas.limits.get(who), quotas.used.get(who, Usage())
        share = quotas.shares.get(who)
        borrowed = share.above(used) if share is not None else Usage()
        found.append(
            TenantQuota(
                tenant=who,
                resources=[
                    QuotaUse(
                        resource=r,
                        used=getattr(used, r),
                        limit=getattr(limit, r) if limit is not None else None,
                        guarantee=getattr(share.guarantee, r) if share is not None else None,
                        reserved=getattr(share.reserved, r) if share is not None else None,
                        borrowed=getattr(borrowed, r),
                    )
                    for r in resources
                ],
            )
        )
    return found
