"""The filters: each judges one request field against every node at once, vectorised over
the cluster's columns. Adding one: its function and its `Filter` in `ALL` here, and its test;
the registry, the rejections naming its field and the docs' list read it from `ALL`."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from crater.contracts import Taint, TaintEffect, Toleration
from crater.scheduler.domain.cluster import WHOLE, BoolArray, ClusterArrays
from crater.scheduler.domain.demand import Demand
from crater.scheduler.domain.gpu_match import model_matches
from crater.scheduler.domain.mig import MigProfile
from crater.scheduler.domain.placement import usable_cards
from crater.scheduler.domain.plugins.framework import Filter


def _all(c: ClusterArrays) -> BoolArray:
    """Every node passes: one shared read-only array (a filter that asks nothing is free)."""
    return c.everywhere


def _ready(c: ClusterArrays, d: Demand, free: bool) -> BoolArray:
    return c.ready.copy() if free else _all(c)


# Below this health score a node takes no high-priority work (the integration's convention).
RESTRICTED_BELOW = 90


def _health(c: ClusterArrays, d: Demand, free: bool) -> BoolArray:
    """High-priority work stays off nodes whose health score is restricted; placing only, as
    readiness (a node's health may come back)."""
    if not (free and d.high_priority):
        return _all(c)
    healthy = c.health >= RESTRICTED_BELOW
    return _all(c) if healthy.all() else healthy


def _not_cordoned(c: ClusterArrays, d: Demand, free: bool) -> BoolArray:
    """A node cordoned for a fault that needs a reboot takes no new work; placing only, as
    readiness (the cordon lifts when the node reports healthy)."""
    if not free or not c.cordoned.any():
        return _all(c)
    return ~c.cordoned


def _cards_not_cordoned(c: ClusterArrays, d: Demand, free: bool) -> BoolArray:
    """Says where cordoned cards are what keeps a task of whole cards off: the node would
    have enough free cards with its cordoned ones. Placing only; passes everywhere without
    cordons (GpuCount judges the rest)."""
    if not free or not d.gpus or d.mig_profile is not None or d.gpu_milli < WHOLE:
        return _all(c)
    if not c.gpus_cordoned.any():
        return _all(c)
    short = c.gpus_free < d.gpus
    return ~(short & (c.gpus_free + c.gpus_cordoned >= d.gpus))


def _pool(c: ClusterArrays, d: Demand, free: bool) -> BoolArray:
    return c.in_pool(d.pool)


def _node_labels(c: ClusterArrays, d: Demand, free: bool) -> BoolArray:
    """The node carries every label of the task's node selector."""
    if not d.node_selector:
        return _all(c)
    verdicts = np.fromiter(
        (all(labels.get(k) == v for k, v in d.node_selector) for labels in c.label_sets),
        np.bool_,
        len(c.label_sets),
    )
    return np.asarray(verdicts[c.label_set])


def tolerated(taints: Sequence[Taint], tolerations: Sequence[Toleration]) -> bool:
    """Every taint that keeps tasks off (NoSchedule, NoExecute) is tolerated;
    PreferNoSchedule only discourages, so the filter lets it pass."""
    return all(
        any(t.tolerates(taint) for t in tolerations)
        for taint in taints
        if taint.effect is not TaintEffect.PREFER_NO_SCHEDULE
    )


def _taints(c: ClusterArrays, d: Demand, free: bool) -> BoolArray:
    if not any(c.taint_sets):  # no node is tainted
        return _all(c)
    verdicts = np.fromiter(
        (tolerated(taints, d.tolerations) for taints in c.taint_sets),
        np.bool_,
        len(c.taint_sets),
    )
    return np.asarray(verdicts[c.taint_set])


def _gpu_count(c: ClusterArrays, d: Demand, free: bool) -> BoolArray:
    if d.mig_profile is not None:  # a slice, not a card: MigProfile judges it
        return _all(c)
    if d.gpus == 1 and d.gpu_milli < WHOLE:  # a share of one card
        room = c.gpu_share_free if free else np.where(c.gpus_total > 0, WHOLE, 0)
        return np.asarray(room >= d.gpu_milli)
    return (c.gpus_free if free else c.gpus_total) >= d.gpus


def _gpu_model(c: ClusterArrays, d: Demand, free: bool) -> BoolArray:
    """`type` names one product, or alternatives separated by `|` ("V100|A100"): any of them."""
    if not d.gpus or not d.gpu_model:
        return _all(c)
    return model_matches(c, np.arange(len(c)), d.gpu_model)


def _mig(c: ClusterArrays, d: Demand, free: bool) -> BoolArray:
    """A card that offers the profile; with `free`, one that can carve the slice now."""
    if d.mig_profile is None:
        return _all(c)
    profile = MigProfile.parse(d.mig_profile)
    out = np.zeros(len(c), np.bool_)
    for i in np.flatnonzero(c.mig_cards > 0):
        node = c.nodes[i]
        if free:
            out[i] = any(node.mig_fits(profile, g.index) for g in node.topology.gpus)
        else:
            out[i] = any(
                g.mig_capable and profile.name in g.mig_profiles for g in node.topology.gpus
            )
    return out


def _pcie_bandwidth(c: ClusterArrays, d: Demand, free: bool) -> BoolArray:
    """Enough cards (free ones when placing) whose PCIe link carries the ask: its measured
    copy bandwidth, else its nominal generation x width figure; unknown links fail."""
    if d.pcie_bandwidth_gbps is None or not d.gpus:
        return _all(c)
    wanted = _cards_wanted(d)
    out = np.zeros(len(c), np.bool_)
    for i in np.flatnonzero(c.gpus_total > 0):
        out[i] = usable_cards(c.nodes[i], d, free) >= wanted
    return out


def _gpu_memory(c: ClusterArrays, d: Demand, free: bool) -> BoolArray:
    if not d.gpus:
        return _all(c)
    if d.mig_profile is not None:  # the slice's memory, the same on every card offering it
        fits = MigProfile.parse(d.mig_profile).memory_gb * 1024 >= d.gpu_memory_mb
        return np.full(len(c), fits, np.bool_)
    return c.gpu_memory_mb >= d.gpu_memory_mb


def _cpu(c: ClusterArrays, d: Demand, free: bool) -> BoolArray:
    # distinct cores: never more than the hardware has, whatever the over-commit
    fits = c.cpu_total >= d.cpu_cores
    return fits & (c.cpu_free >= d.cpu_cores) if free else fits


def _memory(c: ClusterArrays, d: Demand, free: bool) -> BoolArray:
    fits = c.memory_total_mb >= d.memory_mb
    return fits & (c.memory_free_mb >= d.memory_mb) if free else fits


def _memory_bandwidth(c: ClusterArrays, d: Demand, free: bool) -> BoolArray:
    """A NUMA node at the asked bandwidth or more, in the asker's sense: its aggregate (all
    its cores copying at once); where only one thread was measured, that figure, a lower
    bound (the node passes when even one thread reaches the ask). Unmeasured nodes fail."""
    if d.memory_bandwidth_gbps is None:
        return _all(c)
    return np.asarray(c.memory_bandwidth_all_cores_gbps >= d.memory_bandwidth_gbps)  # NaN: False


def _ssd_iops(c: ClusterArrays, d: Demand, free: bool) -> BoolArray:
    """A solid-state disk at the asked IOPS or more, in the datasheets' sense: 4 KiB random
    reads at depth (rated, an operator's or measured); where a disk has no such figure, its
    queue-depth-1 one, a lower bound (it passes when even one read at a time reaches the
    ask). Disks known by neither fail."""
    if d.ssd_iops_min is None:
        return _all(c)
    return np.asarray(c.ssd_iops_at_depth >= d.ssd_iops_min)


def _ssd_latency(c: ClusterArrays, d: Demand, free: bool) -> BoolArray:
    if d.ssd_latency_us_max is None:
        return _all(c)
    return np.asarray(c.ssd_latency_us <= d.ssd_latency_us_max)


def _disk(c: ClusterArrays, d: Demand, free: bool) -> BoolArray:
    """One SSD with the space (space not held by other tasks when placing)."""
    if not d.disk_gb:
        return _all(c)
    return (c.disk_free_gb if free else c.disk_gb) >= d.disk_gb


def _avx(c: ClusterArrays, d: Demand, free: bool) -> BoolArray:
    if d.avx is None:
        return _all(c)
    avx = d.avx
    return np.fromiter((n.has_flag(avx) for n in c.nodes), np.bool_, len(c))


def _anti_affinity(c: ClusterArrays, d: Demand, free: bool) -> BoolArray:
    """Replicas of one group spread: a node holding one already is out."""
    group = d.anti_affinity_group
    if group is None or not free:
        return _all(c)
    return np.fromiter((group not in n.groups for n in c.nodes), np.bool_, len(c))


def _fabric(c: ClusterArrays, d: Demand, free: bool) -> BoolArray:
    """The node declares a domain at the level the task requires (network_topology.required):
    a node of unknown place cannot be shown to share one with the other members."""
    if d.fabric_required is None:
        return _all(c)
    return np.asarray(c.fabric(d.fabric_required) > 0)


def _models_text(d: Demand) -> str:
    models = d.gpu_models
    return models[0] if len(models) == 1 else ", ".join(models[:-1]) + f" or {models[-1]}"


def _count(n: int, noun: str) -> str:
    """`1 free GPU`, `2 free GPUs`."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _cards_wanted(d: Demand) -> int:
    """Cards the task takes: one for a share or a MIG slice."""
    return 1 if d.mig_profile is not None or d.gpu_milli < WHOLE else d.gpus


def _slow_links(d: Demand) -> str:
    return (
        f"has fewer than {_count(_cards_wanted(d), 'free GPU')} with a PCIe link of "
        f"{d.pcie_bandwidth_gbps:g} GB/s (measured, else nominal generation x width)"
    )


def _fewer_gpus(d: Demand) -> str:
    if d.gpus == 1 and d.gpu_milli < 1000:
        return f"has no card with {d.gpu_milli / 10:g}% of a GPU free"
    return f"has fewer than {_count(d.gpus, 'free GPU')}"


# Every filter, in the order the default pipeline runs them (and reasons are listed).
ALL: tuple[Filter, ...] = (
    Filter(
        "NodeReady",
        "NodeNotReady",
        field=None,
        checks="the node is ready (only when placing: one down now may come back)",
        passes=_ready,
        explain=lambda d: "is not ready",
    ),
    Filter(
        "NodeCordon",
        "NodeCordoned",
        field=None,
        checks="the node is not cordoned for a card fault that needs a reboot (only when "
        "placing: the cordon lifts when the node reports healthy)",
        passes=_not_cordoned,
        explain=lambda d: "is cordoned: a card fault needs a reboot",
    ),
    Filter(
        "Pool",
        "OtherPool",
        field="pool",
        checks="the node is in the task's pool",
        passes=_pool,
        explain=lambda d: f"is not in pool {d.pool}",
    ),
    Filter(
        "NodeHealth",
        "NodeHealthRestricted",
        field=None,
        checks=f"high-priority work (900 and up) only on a node whose health score is "
        f"{RESTRICTED_BELOW} or more (only when placing: the score may come back)",
        passes=_health,
        explain=lambda d: (
            f"has a health score below {RESTRICTED_BELOW}, restricted from high-priority work"
        ),
    ),
    Filter(
        "NodeLabels",
        "NodeSelectorMismatch",
        field="node_selector",
        checks="the node carries every label of the task's node selector",
        passes=_node_labels,
        explain=lambda d: "lacks the labels " + ", ".join(f"{k}={v}" for k, v in d.node_selector),
    ),
    Filter(
        "TaintToleration",
        "UntoleratedTaint",
        field="tolerations",
        checks="every NoSchedule or NoExecute taint of the node is tolerated "
        "(PreferNoSchedule passes)",
        passes=_taints,
        explain=lambda d: "has a taint the task does not tolerate",
    ),
    Filter(
        "GpuCordon",
        "GpusCordoned",
        field=None,
        checks="the task's whole cards are not short only because cards are cordoned for a "
        "fault or by an operator (only when placing)",
        passes=_cards_not_cordoned,
        explain=lambda d: (
            f"has fewer than {_count(d.gpus, 'free GPU')} only because cards "
            "are cordoned (a fault, or an operator)"
        ),
    ),
    Filter(
        "GpuCount",
        "InsufficientGpus",
        field="resource_requirements.gpu.count",
        checks="enough GPUs (free ones when placing); for a share of one card, a card with "
        "that share free",
        passes=_gpu_count,
        explain=_fewer_gpus,
    ),
    Filter(
        "GpuModel",
        "GpuModelMismatch",
        field="resource_requirements.gpu.type",
        checks="cards of the product asked (or of one of the alternatives), its memory or "
        "more, its form factor where named",
        passes=_gpu_model,
        explain=lambda d: f"has no {_models_text(d)} GPU",
    ),
    Filter(
        "MigProfile",
        "NoMigSlice",
        field="resource_requirements.gpu.mig_profile",
        checks="a card offering the MIG profile (when placing: one that can carve the slice now)",
        passes=_mig,
        explain=lambda d: f"has no card with a free MIG {d.mig_profile} slice",
    ),
    Filter(
        "PcieBandwidth",
        "InsufficientPcieBandwidth",
        field="resource_requirements.gpu.pcie_bandwidth_gbps",
        checks="enough cards (free ones when placing) whose PCIe link carries the ask: its "
        "measured host-to-card bandwidth, else nominal generation x width; unknown links fail",
        passes=_pcie_bandwidth,
        explain=_slow_links,
    ),
    Filter(
        "GpuMemory",
        "InsufficientGpuMemory",
        field="resource_requirements.gpu.memory_mb",
        checks="GPU memory per card (a MIG slice's own memory) at least the ask",
        passes=_gpu_memory,
        explain=lambda d: (
            f"has less than {d.gpu_memory_mb} MiB of GPU memory per card"
            + (f" (MIG {d.mig_profile})" if d.mig_profile else "")
        ),
    ),
    Filter(
        "CpuCores",
        "InsufficientCpu",
        field="resource_requirements.cpu.cores",
        checks="enough CPU cores (distinct cores, whatever the over-commit; free ones when "
        "placing)",
        passes=_cpu,
        explain=lambda d: f"has fewer than {_count(d.cpu_cores, 'free CPU core')}",
    ),
    Filter(
        "Memory",
        "InsufficientMemory",
        field="resource_requirements.memory.capacity_mb",
        checks="enough host memory (free memory when placing)",
        passes=_memory,
        explain=lambda d: f"has less than {d.memory_mb} MiB of free memory",
    ),
    Filter(
        "MemoryBandwidth",
        "InsufficientMemoryBandwidth",
        field="resource_requirements.memory.bandwidth_gbps",
        checks="a NUMA node's measured memory bandwidth, all its cores copying (one "
        "thread's where that is all), at least the ask; unmeasured nodes fail",
        passes=_memory_bandwidth,
        explain=lambda d: (
            f"has less than {d.memory_bandwidth_gbps:g} GB/s of memory bandwidth over a NUMA "
            "node's cores (one thread's where no such figure), or none measured"
        ),
    ),
    Filter(
        "DiskCapacity",
        "InsufficientDisk",
        field="resource_requirements.ssd.capacity_gb",
        checks="one SSD with the space (space not held by other tasks when placing)",
        passes=_disk,
        explain=lambda d: f"has no SSD with {d.disk_gb} GB free",
    ),
    Filter(
        "SsdIops",
        "InsufficientSsdIops",
        field="resource_requirements.ssd.iops_min",
        checks="an SSD's 4 KiB random reads at depth (at queue depth 1 where no such figure) "
        "at least the ask; unmeasured disks fail",
        passes=_ssd_iops,
        explain=lambda d: (
            f"has no SSD doing {d.ssd_iops_min} random-read IOPS at depth (at QD1 where no "
            "such figure), or none measured"
        ),
    ),
    Filter(
        "SsdLatency",
        "SsdLatencyTooHigh",
        field="resource_requirements.ssd.latency_us_max",
        checks="an SSD's median read latency at queue depth 1 at most the ask; unmeasured "
        "disks fail",
        passes=_ssd_latency,
        explain=lambda d: f"has no SSD reading within {d.ssd_latency_us_max} us, or none measured",
    ),
    Filter(
        "AvxSupport",
        "NoAvx",
        field="resource_requirements.cpu.avx_support",
        checks="the CPU has the AVX flag asked",
        passes=_avx,
        explain=lambda d: f"has a CPU without {d.avx}",
    ),
    Filter(
        "NetworkTopology",
        "NoFabricPlace",
        field="network_topology.required",
        checks="the node declares a domain at the level the task requires (its NVLink "
        "domain, leaf or spine switch); one domain for all of a gang is judged with the gang",
        passes=_fabric,
        explain=lambda d: f"declares no {d.fabric_required} in the network fabric",
    ),
    Filter(
        "AntiAffinity",
        "AntiAffinityConflict",
        field="anti_affinity.group",
        checks="no replica of the task's anti-affinity group on the node already (placing only)",
        passes=_anti_affinity,
        explain=lambda d: f"already runs a replica of {d.anti_affinity_group}",
    ),
)
