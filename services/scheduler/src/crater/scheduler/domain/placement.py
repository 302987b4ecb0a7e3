"""Inside the chosen node: which GPUs, which CPU cores, which NUMA node."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from crater.contracts import Disk
from crater.scheduler.domain.cluster import WHOLE, Node, disk_iops
from crater.scheduler.domain.demand import Demand
from crater.scheduler.domain.mig import MigProfile, card_geometry


@dataclass(frozen=True)
class Selection:
    gpu_ids: tuple[int, ...]
    cpu_cores: tuple[int, ...]
    numa_node: int | None
    mig_profile: str | None = None  # a MIG slice of gpu_ids[0]
    disk: str | None = None  # the SSD chosen for a task asking local space or speed

    def disk_hold(self, demand: Demand) -> tuple[str, int] | None:
        """What the selection holds of its disk: (name, GB), for `Node.take`."""
        return None if self.disk is None else (self.disk, demand.disk_gb)


def select(node: Node, demand: Demand, card: int | None = None) -> Selection | None:
    """The exact devices for `demand` on `node`, or None when they cannot be had together
    (for example `numa: strict` and no NUMA node has the GPUs and the cores, or no one SSD
    has the space and speed asked). `card`: the card a share takes, where the pool's score
    chose it (`Pipeline.card_for`)."""
    if node.memory_free_mb < demand.memory_mb or node.topology.memory_mb < demand.memory_mb:
        return None
    if node.cpu_slots_free < demand.cpu_cores:
        return None
    if demand.mig_profile is not None:
        picked = _mig_card(node, MigProfile.parse(demand.mig_profile), demand)
        if picked is None:
            return None
        gpu_ids, numa = picked
    elif demand.gpus:
        picked = _gpus(node, demand, card)
        if picked is None:
            return None
        gpu_ids, numa = picked
    else:
        gpu_ids = ()
        numa = _roomiest_numa(node)
    cores = _cores(node, demand, numa)
    if cores is None:
        return None
    disk = None
    if demand.wants_ssd:
        chosen = choose_disk(node, demand, gpu_ids, numa)
        if chosen is None:
            return None
        disk = chosen.name
    return Selection(gpu_ids, cores, numa, demand.mig_profile, disk)


def unplaceable(demand: Demand) -> str:
    """Why the filters' survivors still cannot take `demand` (`select` found no devices),
    written for one node."""
    if demand.wants_ssd:
        return (
            "cannot give the GPUs, cores and one SSD with the space and speed asked together (NUMA)"
        )
    return "cannot give the GPUs and cores together (NUMA)"


def link_ok(node: Node, gpu: int, demand: Demand) -> bool:
    """Card `gpu`'s PCIe link carries what the task asks (measured, else nominal figure);
    an unknown link (no measure, no generation or width) does not."""
    if demand.pcie_bandwidth_gbps is None:
        return True
    link = node.pcie_links.get(gpu)
    return link is not None and link >= demand.pcie_bandwidth_gbps


def usable_cards(node: Node, demand: Demand, free: bool) -> int:
    """Cards whose link carries the ask, and, with `free`, that can take the task now (a
    whole card, the share, or the MIG slice it asks)."""
    profile = MigProfile.parse(demand.mig_profile) if demand.mig_profile else None
    need = WHOLE if demand.gpu_milli >= WHOLE else demand.gpu_milli
    count = 0
    for g in node.topology.gpus:
        if not link_ok(node, g.index, demand):
            continue
        if free and profile is not None:
            count += node.mig_fits(profile, g.index)
        else:
            count += not free or node.gpu_milli_free[g.index] >= need
    return count


# How far a disk sits from the task's GPUs (its cores, without GPUs): lower is closer.
SAME_PCI_ROOT, SAME_NUMA, ELSEWHERE = 0, 1, 2


def disk_distance(disk: Disk, roots: set[str], homes: set[int]) -> int:
    if disk.pci_root is not None and disk.pci_root in roots:
        return SAME_PCI_ROOT
    if disk.numa_node is not None and disk.numa_node in homes:
        return SAME_NUMA
    return ELSEWHERE


def disk_serves(node: Node, disk: Disk, demand: Demand) -> bool:
    """A solid-state disk with the free space, the IOPS (at depth, else at queue depth 1)
    and the median latency the task asks; a figure asked but unknown fails."""
    if disk.rotational or node.disk_free_gb.get(disk.name, 0) < demand.disk_gb:
        return False
    if demand.ssd_iops_min is not None:
        iops = disk_iops(disk)
        if iops is None or iops < demand.ssd_iops_min:
            return False
    if demand.ssd_latency_us_max is not None:
        latency = disk.read_latency_us_p50
        if latency is None or latency > demand.ssd_latency_us_max:
            return False
    return True


def choose_disk(
    node: Node, demand: Demand, gpu_ids: tuple[int, ...], numa: int | None
) -> Disk | None:
    """The SSD for a task asking local space or speed, chosen with its GPUs: of the disks
    that serve the ask, the closest to the GPUs (same PCIe root, then same NUMA node, then
    elsewhere; a CPU task's NUMA node stands in for GPUs), NVMe first, then the most space
    free (spreads the tasks' IO over the disks, and leaves a small OS disk for last), then
    the node's order. With `numa: strict`, a disk known to sit on another NUMA node is out."""
    gpus = node.topology.gpus
    roots = {r for i in gpu_ids if (r := gpus[i].pci_root) is not None}
    homes = {h for i in gpu_ids if (h := gpus[i].numa_node) is not None}
    if not gpu_ids and numa is not None:
        homes = {numa}
    ranked: list[tuple[int, bool, int, int]] = []
    for order, disk in enumerate(node.topology.disks):
        if not disk_serves(node, disk, demand):
            continue
        distance = disk_distance(disk, roots, homes)
        if demand.numa_strict and homes and disk.numa_node not in (None, *homes):
            continue
        free = node.disk_free_gb.get(disk.name, 0)
        ranked.append((distance, not disk.nvme, -free, order))
    return node.topology.disks[min(ranked)[3]] if ranked else None


def _mig_card(
    node: Node, profile: MigProfile, demand: Demand
) -> tuple[tuple[int, ...], int | None] | None:
    """The card to carve the slice from: one cut already with the least room that holds it,
    else an untouched card (lowest index), so whole cards stay whole."""
    fitting = [
        (0 if g.index in node.mig_used else 1, _mig_room(node, g.index), g.index, g.numa_node)
        for g in node.topology.gpus
        if node.mig_fits(profile, g.index) and link_ok(node, g.index, demand)
    ]
    if not fitting:
        return None
    _, _, index, numa = min(fitting)
    return (index,), numa


def _mig_room(node: Node, gpu: int) -> int:
    shape = card_geometry(node.topology.gpus[gpu].mig_profiles)
    return 0 if shape is None else shape.room(node.mig_used.get(gpu, (0, 0)))


def locality(node: Node, selection: Selection) -> float:
    """How close a selection's devices sit, in [0, 1]. GPUs: 1 when every pair is joined by
    NVLink (or there is one card), 2/3 on one PCIe root complex, 1/3 on one NUMA node, 0
    spread wider. Cores: 1 when all are on the GPUs' one NUMA node (a task without GPUs: on
    one NUMA node), else 0. A GPU task scores 3/4 GPUs + 1/4 cores; a CPU task its cores."""
    core_homes = {node.cpu_numa.get(cpu) for cpu in selection.cpu_cores}
    if not selection.gpu_ids:
        return 1.0 if len(core_homes) <= 1 else 0.0
    gpu_homes = {node.topology.gpus[i].numa_node for i in selection.gpu_ids}
    cores_local = len(gpu_homes) == 1 and (not selection.cpu_cores or core_homes <= gpu_homes)
    return _blend(_linked(node, selection.gpu_ids), cores_local)


def expected_locality(node: Node, demand: Demand) -> float:
    """`locality` of the devices `select` would pick, without picking the cores: the GPUs
    the same way, and whether their NUMA node has room for every core. For scoring many
    nodes at once."""
    if demand.mig_profile is not None:
        picked = _mig_card(node, MigProfile.parse(demand.mig_profile), demand)
    elif demand.gpus:
        picked = _gpus(node, demand)
    else:
        numa = _roomiest_numa(node)
        return 1.0 if numa is None or node.numa_room.get(numa, 0) >= demand.cpu_cores else 0.0
    if picked is None:
        return 0.0
    gpu_ids, numa = picked
    cores_local = numa is not None and node.numa_room.get(numa, 0) >= demand.cpu_cores
    return _blend(_linked(node, gpu_ids), cores_local)


def _linked(node: Node, gpu_ids: tuple[int, ...]) -> float:
    gpus = [node.topology.gpus[i] for i in gpu_ids]
    homes = {g.numa_node for g in gpus}
    if all(b.index in a.nvlink_peers for a in gpus for b in gpus if a is not b):
        return 1.0
    if len({g.pci_root for g in gpus}) == 1 and gpus[0].pci_root is not None:
        return 2 / 3
    if len(homes) == 1 and None not in homes:
        return 1 / 3
    return 0.0


def _blend(linked: float, cores_local: bool) -> float:
    return 0.75 * linked + 0.25 * (1.0 if cores_local else 0.0)


def _gpus(
    node: Node, demand: Demand, card: int | None = None
) -> tuple[tuple[int, ...], int | None] | None:
    if demand.gpu_milli < WHOLE:
        return _shared_card(node, demand, card)
    free = [
        g
        for g in node.topology.gpus
        if node.gpu_milli_free[g.index] >= WHOLE and link_ok(node, g.index, demand)
    ]
    if node.readings:
        # Cards with live readings (another process, heat, a degraded link) only when the
        # others are too few (cordons.py); a node without readings chooses as it always has.
        clean = [g for g in free if g.index not in node.readings]
        if len(clean) >= demand.gpus:
            free = clean
    by_numa: dict[int, list[int]] = {}
    for gpu in free:
        by_numa.setdefault(gpu.numa_node if gpu.numa_node is not None else -1, []).append(gpu.index)
    # The tightest NUMA node that holds them all: keeps the roomier ones whole; of equally
    # tight ones, one with an SSD that serves the task (its data path stays local).
    fitting = sorted(
        (len(ids), _no_ssd_on(node, demand, numa), numa)
        for numa, ids in by_numa.items()
        if len(ids) >= demand.gpus
    )
    if fitting:
        numa = fitting[0][2]
        chosen = _nvlink_set(node, by_numa[numa], demand.gpus)
        return chosen, (numa if numa >= 0 else None)
    if demand.numa_strict or len(free) < demand.gpus:
        return None
    return _nvlink_set(node, [g.index for g in free], demand.gpus), None


def _no_ssd_on(node: Node, demand: Demand, numa: int) -> bool:
    """The task asks for an SSD and none that serves it sits on NUMA node `numa`."""
    if not demand.wants_ssd:
        return False
    return not any(
        d.numa_node == numa and disk_serves(node, d, demand) for d in node.topology.disks
    )


def _shared_card(
    node: Node, demand: Demand, card: int | None = None
) -> tuple[tuple[int, ...], int | None] | None:
    """`card` where it holds the share, else the card with the least room that still holds
    it: keeps whole cards whole."""
    fitting = [
        (node.gpu_milli_free[g.index], g.index, g.numa_node)
        for g in node.topology.gpus
        if node.gpu_milli_free[g.index] >= demand.gpu_milli and link_ok(node, g.index, demand)
    ]
    chosen = [f for f in fitting if f[1] == card]
    if chosen:
        return (chosen[0][1],), chosen[0][2]
    if not fitting:
        return None
    if node.readings:  # the card with the least penalty first (cordons.py), then as before
        _, _, index, numa = min((node.readings.get(f[1], 0.0), *f) for f in fitting)
        return (index,), numa
    _, index, numa = min(fitting)
    return (index,), numa


def _nvlink_set(node: Node, candidates: list[int], count: int) -> tuple[int, ...]:
    """Greedy: start from the lowest index, add the GPU with most NVLinks into the set, then
    the one sharing most PCIe root complexes with it."""
    peers, roots = node.nvlink_peers, node.pci_roots
    pool = sorted(candidates)
    chosen = [pool.pop(0)]
    while len(chosen) < count:
        best = max(
            pool,
            key=lambda g: (
                len(peers[g] & set(chosen)),
                sum(1 for c in chosen if roots[g] is not None and roots[c] == roots[g]),
                -g,
            ),
        )
        pool.remove(best)
        chosen.append(best)
    return tuple(sorted(chosen))


def _roomiest_numa(node: Node) -> int | None:
    """The NUMA node with the most cores that can take a task (lowest id on ties)."""
    if not node.numa_room:
        return None
    return max(sorted(node.numa_room), key=lambda n: node.numa_room[n])


def _cores(node: Node, demand: Demand, numa: int | None) -> tuple[int, ...] | None:
    """Distinct cores, the least shared first (over-commit), lowest number on ties."""
    free = node.cpu_free

    def order(cores: Iterable[int]) -> list[int]:
        # By (tasks holding it, number): numbers first, then a stable sort by holders, with
        # the dict's own look-up as the key (every free core is one of cpu_held's).
        return sorted(sorted(cores), key=node.cpu_held.__getitem__)

    local = order(node.numa_cpus.get(numa, frozenset()) & free) if numa is not None else []
    if len(local) >= demand.cpu_cores:
        return tuple(sorted(local[: demand.cpu_cores]))
    if demand.numa_strict and numa is not None:
        return None
    rest = order(free - set(local))
    cores = local + rest[: demand.cpu_cores - len(local)]
    return tuple(sorted(cores)) if len(cores) >= demand.cpu_cores else None
