"""Placement as a pipeline of small plugins, after the kube-scheduler framework.

A filter returns, for every node at once, whether the node can host the demand, and names
its reason code; a score rates the nodes that passed. Pipelines are composed by name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from crater.scheduler.domain.cluster import WHOLE, BoolArray, ClusterArrays, model_key
from crater.scheduler.domain.demand import Demand

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Filter:
    name: str
    code: str
    # (cluster, demand, use free amounts?) -> which nodes pass
    passes: Callable[[ClusterArrays, Demand, bool], BoolArray]
    explain: Callable[[Demand], str]


@dataclass(frozen=True)
class Score:
    name: str
    weight: float
    # (cluster, demand, candidate indexes) -> score in [0, 1] per candidate
    rate: Callable[[ClusterArrays, Demand, npt.NDArray[np.int64]], FloatArray]


def _all(c: ClusterArrays) -> BoolArray:
    return np.ones(len(c), np.bool_)


def _ready(c: ClusterArrays, d: Demand, free: bool) -> BoolArray:
    return c.ready.copy() if free else _all(c)


def _pool(c: ClusterArrays, d: Demand, free: bool) -> BoolArray:
    return np.asarray(c.pool == d.pool)


def _gpu_count(c: ClusterArrays, d: Demand, free: bool) -> BoolArray:
    if d.gpus == 1 and d.gpu_milli < WHOLE:  # a share of one card
        room = c.gpu_share_free if free else np.where(c.gpus_total > 0, WHOLE, 0)
        return np.asarray(room >= d.gpu_milli)
    return (c.gpus_free if free else c.gpus_total) >= d.gpus


def _gpu_model(c: ClusterArrays, d: Demand, free: bool) -> BoolArray:
    if not d.gpus or not d.gpu_model:
        return _all(c)
    wanted = model_key(d.gpu_model)
    return np.char.find(c.gpu_model, wanted) >= 0


def _gpu_memory(c: ClusterArrays, d: Demand, free: bool) -> BoolArray:
    if not d.gpus:
        return _all(c)
    return c.gpu_memory_mb >= d.gpu_memory_mb


def _cpu(c: ClusterArrays, d: Demand, free: bool) -> BoolArray:
    return (c.cpu_free if free else c.cpu_total) >= d.cpu_cores


def _memory(c: ClusterArrays, d: Demand, free: bool) -> BoolArray:
    return (c.memory_free_mb if free else c.memory_total_mb) >= d.memory_mb


def _disk(c: ClusterArrays, d: Demand, free: bool) -> BoolArray:
    return c.disk_gb >= d.disk_gb


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


FILTERS: dict[str, Filter] = {
    f.name: f
    for f in (
        Filter("NodeReady", "NodeNotReady", _ready, lambda d: "node not ready"),
        Filter("Pool", "OtherPool", _pool, lambda d: f"not in pool {d.pool}"),
        Filter("GpuCount", "InsufficientGpus", _gpu_count, lambda d: f"fewer than {d.gpus} GPUs"),
        Filter(
            "GpuModel", "GpuModelMismatch", _gpu_model, lambda d: f"GPU model not {d.gpu_model}"
        ),
        Filter(
            "GpuMemory",
            "InsufficientGpuMemory",
            _gpu_memory,
            lambda d: f"GPU memory per card < {d.gpu_memory_mb} MiB",
        ),
        Filter(
            "CpuCores", "InsufficientCpu", _cpu, lambda d: f"fewer than {d.cpu_cores} CPU cores"
        ),
        Filter("Memory", "InsufficientMemory", _memory, lambda d: f"memory < {d.memory_mb} MiB"),
        Filter("DiskCapacity", "InsufficientDisk", _disk, lambda d: f"SSD < {d.disk_gb} GB"),
        Filter("AvxSupport", "NoAvx", _avx, lambda d: f"CPU without {d.avx}"),
        Filter(
            "AntiAffinity",
            "AntiAffinityConflict",
            _anti_affinity,
            lambda d: f"already runs a replica of {d.anti_affinity_group}",
        ),
    )
}


def _leftover(free: npt.NDArray[np.int64], total: npt.NDArray[np.int64], asked: int) -> FloatArray:
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(total > 0, (free - asked) / np.maximum(total, 1), 0.0)
    return np.asarray(share, np.float64)


def _gpu_binpack(c: ClusterArrays, d: Demand, idx: npt.NDArray[np.int64]) -> FloatArray:
    """Fill the fullest GPU node first, so whole nodes stay free for large tasks; a CPU-only
    task scores best where there are no GPUs to strand."""
    if not d.gpus:
        return np.where(c.gpus_total[idx] == 0, 1.0, 0.0)
    if d.gpu_milli < WHOLE:  # a share: the card it lands on is left fullest
        return np.asarray(1.0 - (c.gpu_share_free[idx] - d.gpu_milli) / WHOLE, np.float64)
    return 1.0 - _leftover(c.gpus_free[idx], c.gpus_total[idx], d.gpus)


def _cpu_binpack(c: ClusterArrays, d: Demand, idx: npt.NDArray[np.int64]) -> FloatArray:
    return 1.0 - _leftover(c.cpu_free[idx], c.cpu_total[idx], d.cpu_cores)


def _memory_binpack(c: ClusterArrays, d: Demand, idx: npt.NDArray[np.int64]) -> FloatArray:
    return 1.0 - _leftover(c.memory_free_mb[idx], c.memory_total_mb[idx], d.memory_mb)


def _gpu_memory_fit(c: ClusterArrays, d: Demand, idx: npt.NDArray[np.int64]) -> FloatArray:
    """Prefer the smallest card that is big enough: keep 80 GB cards for those who need them."""
    if not d.gpus or not d.gpu_memory_mb:
        return np.ones(len(idx))
    return np.asarray(d.gpu_memory_mb / np.maximum(c.gpu_memory_mb[idx], 1), np.float64)


SCORES: dict[str, Callable[[float], Score]] = {
    "GpuBinPack": lambda w: Score("GpuBinPack", w, _gpu_binpack),
    "GpuMemoryFit": lambda w: Score("GpuMemoryFit", w, _gpu_memory_fit),
    "CpuBinPack": lambda w: Score("CpuBinPack", w, _cpu_binpack),
    "MemoryBinPack": lambda w: Score("MemoryBinPack", w, _memory_binpack),
}


@dataclass(frozen=True)
class Pipeline:
    filters: tuple[Filter, ...]
    scores: tuple[Score, ...]

    @classmethod
    def from_names(cls, filters: list[str], scores: dict[str, float]) -> Pipeline:
        unknown = [n for n in [*filters, *scores] if n not in FILTERS and n not in SCORES]
        if unknown:
            raise ValueError(f"unknown plugins: {', '.join(unknown)}")
        return cls(
            tuple(FILTERS[n] for n in filters),
            tuple(SCORES[n](w) for n, w in scores.items()),
        )


DEFAULT_PIPELINE = Pipeline.from_names(
    list(FILTERS),
    {"GpuBinPack": 0.4, "GpuMemoryFit": 0.3, "CpuBinPack": 0.15, "MemoryBinPack": 0.15},
)
