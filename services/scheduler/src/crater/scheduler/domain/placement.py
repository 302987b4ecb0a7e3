"""Inside the chosen node: which GPUs, which CPU cores, which NUMA node."""

from __future__ import annotations

from dataclasses import dataclass

from crater.scheduler.domain.cluster import WHOLE, Node
from crater.scheduler.domain.demand import Demand


@dataclass(frozen=True)
class Selection:
    gpu_ids: tuple[int, ...]
    cpu_cores: tuple[int, ...]
    numa_node: int | None


def select(node: Node, demand: Demand) -> Selection | None:
    """The exact devices for `demand` on `node`, or None when they cannot be had together
    (for example `numa: strict` and no NUMA node has the GPUs and the cores)."""
    if node.memory_free_mb < demand.memory_mb:
        return None
    numa_cpus = {n.id: set(n.cpus) for n in node.topology.numa_nodes}
    if demand.gpus:
        picked = _gpus(node, demand)
        if picked is None:
            return None
        gpu_ids, numa = picked
    else:
        gpu_ids = ()
        numa = _roomiest_numa(node, numa_cpus)
    cores = _cores(node, demand, numa_cpus, numa)
    if cores is None:
        return None
    return Selection(gpu_ids, cores, numa)


def _gpus(node: Node, demand: Demand) -> tuple[tuple[int, ...], int | None] | None:
    if demand.gpu_milli < WHOLE:
        return _shared_card(node, demand)
    free = [g for g in node.topology.gpus if node.gpu_milli_free[g.index] == WHOLE]
    by_numa: dict[int, list[int]] = {}
    for gpu in free:
        by_numa.setdefault(gpu.numa_node if gpu.numa_node is not None else -1, []).append(gpu.index)
    # The tightest NUMA node that holds them all: keeps the roomier ones whole.
    fitting = sorted((len(ids), numa) for numa, ids in by_numa.items() if len(ids) >= demand.gpus)
    if fitting:
        numa = fitting[0][1]
        chosen = _nvlink_set(node, by_numa[numa], demand.gpus)
        return chosen, (numa if numa >= 0 else None)
    if demand.numa_strict or len(free) < demand.gpus:
        return None
    return _nvlink_set(node, [g.index for g in free], demand.gpus), None


def _shared_card(node: Node, demand: Demand) -> tuple[tuple[int, ...], int | None] | None:
    """The card with the least room that still holds the share: keeps whole cards whole."""
    fitting = [
        (node.gpu_milli_free[g.index], g.index, g.numa_node)
        for g in node.topology.gpus
        if node.gpu_milli_free[g.index] >= demand.gpu_milli
    ]
    if not fitting:
        return None
    _, index, numa = min(fitting)
    return (index,), numa


def _nvlink_set(node: Node, candidates: list[int], count: int) -> tuple[int, ...]:
    """Greedy: start from the lowest index, add the GPU with most NVLinks into the set."""
    peers = {g.index: set(g.nvlink_peers) for g in node.topology.gpus}
    pool = sorted(candidates)
    chosen = [pool.pop(0)]
    while len(chosen) < count:
        best = max(pool, key=lambda g: (len(peers[g] & set(chosen)), -g))
        pool.remove(best)
        chosen.append(best)
    return tuple(sorted(chosen))


def _roomiest_numa(node: Node, numa_cpus: dict[int, set[int]]) -> int | None:
    if not numa_cpus:
        return None
    return max(sorted(numa_cpus), key=lambda n: len(numa_cpus[n] & node.cpu_free))


def _cores(
    node: Node, demand: Demand, numa_cpus: dict[int, set[int]], numa: int | None
) -> tuple[int, ...] | None:
    local = sorted(numa_cpus.get(numa, set()) & node.cpu_free) if numa is not None else []
    if len(local) >= demand.cpu_cores:
        return tuple(local[: demand.cpu_cores])
    if demand.numa_strict and numa is not None:
        return None
    rest = sorted(node.cpu_free - set(local))
    cores = local + rest[: demand.cpu_cores - len(local)]
    return tuple(cores) if len(cores) >= demand.cpu_cores else None
