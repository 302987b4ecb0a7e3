"""Read models of the cluster for people: one summary line per node."""

from __future__ import annotations

from crater.contracts import NodeSummary
from crater.scheduler.domain.cluster import ClusterArrays


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
        )
        for node in sorted(cluster.nodes, key=lambda n: n.name)
        if pool is None or node.topology.pool == pool
    ]
