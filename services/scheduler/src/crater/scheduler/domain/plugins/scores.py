"""The scores every pool can name by weight alone: bin packing, card fit, the field's
weighted formula, topology locality and Crater's own, least fragmentation growth
(`domain/fragmentation.py`). Adding one: its function and its entry in `ALL` here."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from crater.contracts import FABRIC_LEVELS
from crater.scheduler.domain.cluster import WHOLE, ClusterArrays
from crater.scheduler.domain.demand import Demand
from crater.scheduler.domain.fragmentation import rate_fragmentation
from crater.scheduler.domain.placement import expected_locality
from crater.scheduler.domain.plugins.framework import (
    FloatArray,
    IntArray,
    Score,
    ScorePlugin,
    plain_score,
)


def _leftover(free: npt.NDArray[np.int64], total: npt.NDArray[np.int64], asked: int) -> FloatArray:
    # integers over at least 1: no division can warn, so no errstate (ranked per placement)
    share = np.where(total > 0, (free - asked) / np.maximum(total, 1), 0.0)
    return np.asarray(share, np.float64)


def _gpu_binpack(c: ClusterArrays, d: Demand, idx: npt.NDArray[np.int64]) -> FloatArray:
    """Fill the fullest GPU node first, so whole nodes stay free for large tasks; a CPU-only
    task scores best where there are no GPUs to strand."""
    if not d.gpus:
        return np.where(c.gpus_total[idx] == 0, 1.0, 0.0)
    if d.mig_profile is not None:
        return _mig_binpack(c, idx)
    if d.gpu_milli < WHOLE:  # a share: the card it lands on is left fullest
        return np.asarray(1.0 - (c.gpu_share_free[idx] - d.gpu_milli) / WHOLE, np.float64)
    return 1.0 - _leftover(c.gpus_free[idx], c.gpus_total[idx], d.gpus)


def _cpu_binpack(c: ClusterArrays, d: Demand, idx: npt.NDArray[np.int64]) -> FloatArray:
    return 1.0 - _leftover(c.cpu_free[idx], c.cpu_capacity[idx], d.cpu_cores)


def _memory_binpack(c: ClusterArrays, d: Demand, idx: npt.NDArray[np.int64]) -> FloatArray:
    return 1.0 - _leftover(c.memory_free_mb[idx], c.memory_capacity_mb[idx], d.memory_mb)


def _gpu_memory_fit(c: ClusterArrays, d: Demand, idx: npt.NDArray[np.int64]) -> FloatArray:
    """Prefer the smallest card that is big enough: keep 80 GB cards for those who need them."""
    if not d.gpus or not d.gpu_memory_mb:
        return np.ones(len(idx))
    return np.asarray(d.gpu_memory_mb / np.maximum(c.gpu_memory_mb[idx], 1), np.float64)


def _healthier(c: ClusterArrays, d: Demand, idx: npt.NDArray[np.int64]) -> FloatArray:
    """The healthier node first: its health score (the probe's checks: temperature, ECC,
    a degraded link, memory pressure) over 100."""
    return np.asarray(c.health[idx] / 100.0, np.float64)


def _live_readings(c: ClusterArrays, d: Demand, idx: npt.NDArray[np.int64]) -> FloatArray:
    """1 less the mean penalty of the cards the task would take at best: the node's free,
    uncordoned cards with the lowest penalties (Node.readings: another process holding
    memory on the card, heat, a degraded PCIe or NVLink link); 1 without readings or GPUs."""
    out = np.ones(len(idx))
    if not d.gpus:
        return out
    wanted = 1 if d.mig_profile is not None or d.gpu_milli < WHOLE else d.gpus
    for k, row in enumerate(idx):
        node = c.nodes[row]
        if not node.readings:
            continue
        free = sorted(
            node.readings.get(g, 0.0)
            for g, milli in enumerate(node.gpu_milli_free)
            if milli > 0 and g not in node.cordons
        )
        if free:
            taken = free[:wanted]
            out[k] = 1.0 - sum(taken) / len(taken)
    return out


def _with_readings(c: ClusterArrays, idx: IntArray) -> bool:
    """Whether any candidate has readings: without, the score is left out altogether, so
    decisions (and their score details) read as they did before readings existed."""
    return bool(c.read_nodes) and any(c.nodes[row].readings for row in idx)


def _live_score(weight: float) -> Score:
    return Score("LiveReadings", weight, _live_readings, applies=_with_readings)


def _with_places(c: ClusterArrays, idx: IntArray) -> bool:
    """Whether any node declares a place in the fabric: without, the score is left out."""
    return bool(c.fabric_nodes)


def _fabric_pack(c: ClusterArrays, d: Demand, idx: npt.NDArray[np.int64]) -> FloatArray:
    """The node whose fabric domains (NVLink domain, leaf, spine) are busiest already: the
    share of their GPUs (CPU cores, for a CPU-only task) in use, averaged over the levels
    the node declares. Small work fills domains begun, so whole ones stay free for a gang
    that needs one; 0 where a node declares no place."""
    out = np.zeros(len(idx))
    if not c.fabric_nodes:
        return out
    total, free = (c.gpus_total, c.gpus_free) if d.gpus else (c.cpu_capacity, c.cpu_free)
    levels = np.zeros(len(idx))
    for level in FABRIC_LEVELS:
        column = c.fabric(level)
        ids = column[idx]
        if not ids.any():
            continue
        size = len(c.fabric_domains)
        held = np.bincount(column, weights=total.astype(np.float64), minlength=size)
        left = np.bincount(column, weights=free.astype(np.float64), minlength=size)
        used = np.where(held[ids] > 0, 1.0 - left[ids] / np.maximum(held[ids], 1.0), 0.0)
        out += np.where(ids > 0, used, 0.0)
        levels += ids > 0
    return np.asarray(np.where(levels > 0, out / np.maximum(levels, 1.0), 0.0), np.float64)


# The field's weighted score: what a node offers, each resource relative to the best
# candidate. Weights sum to 1.
FIELD_WEIGHTS = {"gpu_memory": 0.45, "cpu": 0.20, "memory_bandwidth": 0.20, "ssd_iops": 0.15}


def _relative(values: FloatArray) -> FloatArray:
    """Each value over the largest among the candidates, in [0, 1]; unknown (NaN) and
    negative count 0, and a resource no candidate has scores 0 everywhere."""
    known = np.nan_to_num(np.maximum(values, 0.0), nan=0.0)
    top = float(known.max(initial=0.0))
    return known / top if top > 0 else np.zeros(len(values))


def _field_weighted(c: ClusterArrays, d: Demand, idx: npt.NDArray[np.int64]) -> FloatArray:
    """score = 0.45 * g + 0.20 * p + 0.20 * b + 0.15 * s, where, over the candidates,
    g = free GPU memory (per-card memory x free cards, shares counted) / the most any has,
    p = free CPU cores / the most, b = best NUMA node's measured memory bandwidth / the best,
    s = best SSD's measured random-read IOPS / the best. Unmeasured figures count 0. A task
    without GPUs leaves g at 0, so the score does not pull it onto GPU nodes."""
    free_gpu_memory = c.gpu_memory_mb[idx] * c.gpu_milli_free[idx] / WHOLE
    gpu = _relative(free_gpu_memory.astype(np.float64)) if d.gpus else np.zeros(len(idx))
    return np.asarray(
        FIELD_WEIGHTS["gpu_memory"] * gpu
        + FIELD_WEIGHTS["cpu"] * _relative(c.cpu_free[idx].astype(np.float64))
        + FIELD_WEIGHTS["memory_bandwidth"] * _relative(c.memory_bandwidth_gbps[idx])
        + FIELD_WEIGHTS["ssd_iops"] * _relative(c.ssd_iops[idx]),
        np.float64,
    )


def _topology_locality(c: ClusterArrays, d: Demand, idx: npt.NDArray[np.int64]) -> FloatArray:
    """How close the devices the task would get sit together on each node, from the GPUs
    `placement.select` picks there (see `placement.locality`)."""
    return np.fromiter((expected_locality(c.nodes[i], d) for i in idx), np.float64, len(idx))


def _mig_binpack(c: ClusterArrays, idx: npt.NDArray[np.int64]) -> FloatArray:
    """A MIG slice goes where cards are cut already: whole cards stay whole."""
    return np.fromiter(
        (len(c.nodes[i].mig_used) / max(int(c.gpus_total[i]), 1) for i in idx),
        np.float64,
        len(idx),
    )


ALL: tuple[ScorePlugin, ...] = (
    plain_score(
        "GpuBinPack",
        "the fullest GPU node first (a share: the card it lands on left fullest; a MIG slice: "
        "where cards are cut already); a CPU-only task best where there are no GPUs",
        _gpu_binpack,
    ),
    plain_score(
        "GpuMemoryFit",
        "the smallest card that is big enough (memory asked over the card's)",
        _gpu_memory_fit,
    ),
    plain_score("CpuBinPack", "the node left with the fewest free CPU cores", _cpu_binpack),
    plain_score(
        "Healthier",
        "the node with the higher health score (the probe's checks), over 100; not in the "
        "default pipeline: a pool names it with a weight",
        _healthier,
    ),
    plain_score("MemoryBinPack", "the node left with the least free memory", _memory_binpack),
    ScorePlugin(
        "LiveReadings",
        "1 less the penalty of the cards the task would take at best (another process "
        "holding GPU memory there, heat, a degraded PCIe or NVLink link: the heartbeat's "
        "readings); left out where no candidate has readings, so decisions without them are "
        "unchanged",
        _live_score,
    ),
    plain_score(
        "FieldWeighted",
        "0.45 g + 0.20 p + 0.20 b + 0.15 s: free GPU memory, free CPU cores, memory bandwidth "
        "and SSD IOPS, each over the largest among the candidates",
        _field_weighted,
    ),
    plain_score(
        "TopologyLocality",
        "how close the devices the task would get sit together (NVLink, PCIe root, NUMA node)",
        _topology_locality,
    ),
    ScorePlugin(
        "FabricPack",
        "the node whose fabric domains (NVLink domain, leaf, spine) have the largest share of "
        "their GPUs in use already, so whole domains stay free for gangs that need one; 0 "
        "where a node declares no place (left out where no node of the fleet declares one)",
        lambda weight: Score("FabricPack", weight, _fabric_pack, applies=_with_places),
    ),
    # least growth of GPU fragmentation against the workload seen (fragmentation.py)
    plain_score(
        "Fragmentation",
        "least growth of the node's expected GPU fragmentation, against the workload seen",
        rate_fragmentation,
    ),
)
