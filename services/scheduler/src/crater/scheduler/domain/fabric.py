"""Network topology across nodes: nodes declare their place in the fabric (NVLink domain,
leaf switch, spine: `NodeTopology.fabric`), and a gang that requires or prefers a level
(`TaskRequest.network_topology`) is placed within one domain of it.

The domains a gang may take are tried best fit first: the one whose room now holds the gang
most tightly, so that roomier domains stay whole for larger gangs (as a node's fragmentation
keeps whole cards for larger tasks). The members' ranks then follow the fabric: those sharing
a domain are consecutive, so a ring all-reduce crosses each switch as few times as it can.
Nodes that declare no place take no part: a fleet without any decides exactly as before."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import numpy as np

from crater.contracts import FABRIC_LEVELS, FabricLevel, FieldError, FilterReason
from crater.scheduler.domain.cluster import WHOLE, BoolArray, ClusterArrays, IntArray, Node
from crater.scheduler.domain.demand import Demand
from crater.scheduler.domain.queue import members_per_node

# Unbounded room: a member that asks nothing of a resource.
_UNBOUNDED = 1 << 30
# What a gang's reason and rejection name: the field that asked for one domain.
REQUIRED_FIELD = "network_topology.required"

P = TypeVar("P", bound=tuple[Node, object, float, object])


def members_free(cluster: ClusterArrays, demand: Demand, rows: IntArray) -> IntArray:
    """How many members of `demand` each of `rows` could take now, at most: free whole cards
    (shares: free thousandths), free cores and free memory. An upper bound (NUMA and links
    may allow fewer): it only rules out domains that cannot hold a gang."""
    fit = np.full(len(rows), _UNBOUNDED, np.int64)
    if demand.gpus and demand.mig_profile is None:
        if demand.gpu_milli < WHOLE:
            fit = np.minimum(fit, cluster.gpu_milli_free[rows] // max(demand.gpu_milli, 1))
        else:
            fit = np.minimum(fit, cluster.gpus_free[rows] // demand.gpus)
    if demand.cpu_cores:
        fit = np.minimum(fit, cluster.cpu_free[rows] // demand.cpu_cores)
    if demand.memory_mb:
        fit = np.minimum(fit, cluster.memory_free_mb[rows] // demand.memory_mb)
    return fit


def domain_rooms(
    cluster: ClusterArrays, level: FabricLevel, rows: IntArray, room: IntArray
) -> dict[int, int]:
    """Each domain at `level` among `rows`, with the members its rows hold (`room`, one
    figure a row); rows that declare no domain there are left out."""
    ids = cluster.fabric(level)[rows]
    declared = ids > 0
    sums = np.bincount(ids[declared], weights=room[declared].astype(np.float64))
    return {int(d): int(sums[d]) for d in np.unique(ids[declared])}


def domains_for(
    cluster: ClusterArrays, level: FabricLevel, demand: Demand, candidates: BoolArray, members: int
) -> list[int]:
    """The domains at `level` whose candidate nodes could hold all `members` now, best fit
    first: the least room, then the name (deterministic on every machine)."""
    rows = np.flatnonzero(candidates)
    rooms = domain_rooms(cluster, level, rows, members_free(cluster, demand, rows))
    fitting = [d for d, room in rooms.items() if room >= members]
    return sorted(fitting, key=lambda d: (rooms[d], cluster.fabric_domains[d][1]))


def along_ring(cluster: ClusterArrays, picks: Sequence[P]) -> list[P]:
    """The members in ring order: grouped by spine, then leaf, then NVLink domain, then
    node, each group where its first member was (the best-scored stays rank 0). Unchanged
    where no picked node declares a place."""
    if not cluster.fabric_nodes:
        return list(picks)
    rows = [cluster.index[pick[0].name] for pick in picks]
    columns = [cluster.fabric(level) for level in reversed(FABRIC_LEVELS)]  # spine first
    if not any(column[row] for row in rows for column in columns):
        return list(picks)
    first: dict[tuple[int, int], int] = {}
    keys: list[tuple[int, ...]] = []
    for k, row in enumerate(rows):
        groups = [(level, int(column[row])) for level, column in enumerate(columns)]
        groups.append((len(columns), row))  # the node itself
        keys.append((*(first.setdefault(g, k) for g in groups), k))
    return [picks[k] for k in sorted(range(len(picks)), key=keys.__getitem__)]


def too_small(
    cluster: ClusterArrays, demand: Demand, fits: BoolArray, members: int
) -> FilterReason | None:
    """Why a gang that requires one domain waits although enough nodes could each take a
    member: no domain of its level has room for all of them now. None when one has (or the
    gang requires no level)."""
    level = demand.fabric_required
    if level is None or members < 2:
        return None
    rows = np.flatnonzero(fits)
    if not len(rows):
        return None
    rooms = domain_rooms(cluster, level, rows, members_free(cluster, demand, rows))
    if not rooms:
        return None
    best = min(rooms, key=lambda d: (-rooms[d], cluster.fabric_name(d)))  # roomiest
    if rooms[best] >= members:
        return None
    return FilterReason(
        filter="FabricDomain",
        code="GangExceedsDomain",
        nodes=len(rows),
        message=f"no {level} has room for all {members} gang members now "
        f"({REQUIRED_FIELD}: {level}): at most {rooms[best]}, "
        f"under {cluster.fabric_name(best)}",
    )


def never_in_one(
    cluster: ClusterArrays, demand: Demand, fits: BoolArray, members: int
) -> list[FieldError]:
    """Why a gang that requires one domain can never be placed: no domain of its level holds
    all of its members even empty. [] when one could."""
    level = demand.fabric_required
    if level is None or members < 2:
        return []
    rows = np.flatnonzero(fits)
    rooms = domain_rooms(cluster, level, rows, members_per_node(cluster, demand, rows))
    best = max(rooms.values(), default=0)
    if best >= members:
        return []
    largest = ", ".join(
        sorted(cluster.fabric_name(d) for d, room in rooms.items() if room == best)[:3]
    )
    return [
        FieldError(
            field=REQUIRED_FIELD,
            reason=f"no {level} of pool {demand.pool!r} could hold all {members} members even "
            f"empty: at most {best}" + (f" (under {largest})" if largest else ""),
        )
    ]
