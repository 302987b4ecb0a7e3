"""Placement as a pipeline of small plugins, after the kube-scheduler framework.

A filter returns, for every node at once, whether the node can host the demand, and names
its reason code; a score rates the nodes that passed. Pipelines are composed by name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

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
    """`type` names one model, or alternatives separated by `|` ("V100|A100"): any of them."""
    if not d.gpus or not d.gpu_model:
        return _all(c)
    return model_matches(c.gpu_model, d.gpu_model)


def model_matches(models: npt.NDArray[np.str_], wanted: str) -> BoolArray:
    """Which normalised node models match `wanted` (substring; `A|B` means A or B)."""
    keys = [model_key(w) for w in wanted.split("|") if w.strip()]
    if not keys:
        return np.ones(len(models), np.bool_)
    hit = np.zeros(len(models), np.bool_)
    for key in keys:
        hit |= np.char.find(models, key) >= 0
    return hit


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


# -- baseline policies for the trace simulator (and anyone who wants them) -------------------
#
# BestFit and FGD after Weng et al., "Beware of Fragmentation" (USENIX ATC'23). Both look at
# each card's free thousandths, read from the nodes behind the candidate rows.

BESTFIT_CPU_SCALE = 128_000  # milli-CPU, as in the paper's BestFit
BESTFIT_GPU_SCALE = 8_000  # milli-GPU: an 8-card node


def _cards(c: ClusterArrays, idx: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Free thousandths of every card of the candidate nodes, one row each, padded with 0."""
    free = [c.nodes[i].gpu_milli_free for i in idx]
    width = max((len(f) for f in free), default=0)
    out = np.zeros((len(idx), max(width, 1)), np.int64)
    for row, cards in enumerate(free):
        out[row, : len(cards)] = cards
    return out


def bestfit_score(weight: float, cpu_milli_per_unit: int = 1000) -> Score:
    """The paper's BestFit: the node left with the least CPU and GPU after the task wins.
    `cpu_milli_per_unit`: what one of the core's CPUs stands for (a core: 1000)."""

    def rate(c: ClusterArrays, d: Demand, idx: npt.NDArray[np.int64]) -> FloatArray:
        asked_gpu = d.gpus * (d.gpu_milli or WHOLE)
        gpu_left = _cards(c, idx).sum(axis=1) - asked_gpu
        cpu_left = (c.cpu_free[idx] - d.cpu_cores) * cpu_milli_per_unit
        waste = 0.5 * cpu_left / BESTFIT_CPU_SCALE + 0.5 * gpu_left / BESTFIT_GPU_SCALE
        return np.asarray(1.0 - waste, np.float64)

    return Score("BestFit", weight, rate)


def random_score(weight: float, seed: int = 0) -> Score:
    """Uniform random scores from a seeded generator: the same calls, the same draws."""
    rng = np.random.default_rng(seed)

    def rate(c: ClusterArrays, d: Demand, idx: npt.NDArray[np.int64]) -> FloatArray:
        return rng.random(len(idx))

    return Score("Random", weight, rate)


@dataclass(frozen=True)
class TaskShape:
    """One request shape of a target workload, and how often it occurs."""

    gpus: int
    gpu_milli: int  # per card; 0 with no GPU
    cpu_cores: int
    popularity: float
    gpu_model: str | None = None


def _fragment(
    cards: npt.NDArray[np.int64],
    cpu_free: npt.NDArray[np.int64],
    model_ok: BoolArray,
    shape: TaskShape,
) -> FloatArray:
    """F_n(m): the free GPU thousandths of each node that a task of `shape` cannot use. All
    of them when the task cannot run there at all (too few cards, CPU, model); otherwise the
    cards with less free than it asks per card. A task without GPUs uses none of them."""
    total: FloatArray = cards.sum(axis=1).astype(np.float64)
    if not shape.gpus:
        return total
    fits_card = cards >= shape.gpu_milli
    runs = (fits_card.sum(axis=1) >= shape.gpus) & (cpu_free >= shape.cpu_cores) & model_ok
    stranded = np.where(fits_card, 0, cards).sum(axis=1).astype(np.float64)
    return np.asarray(np.where(runs, stranded, total), np.float64)


def _expected_fragment(
    c: ClusterArrays,
    idx: npt.NDArray[np.int64],
    cards: npt.NDArray[np.int64],
    cpu_free: npt.NDArray[np.int64],
    shapes: tuple[TaskShape, ...],
) -> FloatArray:
    """F_n(M) = sum over the workload's shapes m of popularity(m) * F_n(m)."""
    out = np.zeros(len(idx))
    for shape in shapes:
        ok = (
            model_matches(c.gpu_model[idx], shape.gpu_model)
            if shape.gpu_model
            else np.ones(len(idx), np.bool_)
        )
        out += shape.popularity * _fragment(cards, cpu_free, ok, shape)
    return out


def _place_on_cards(cards: npt.NDArray[np.int64], d: Demand) -> npt.NDArray[np.int64]:
    """The cards after the task lands the way `placement.select` puts it: a share on the
    fullest card that still holds it (lowest index on ties), whole cards from the lowest
    index; which whole free cards go does not change the fragmentation."""
    after = cards.copy()
    if not d.gpus:
        return after
    rows = np.arange(len(cards))
    if d.gpu_milli and d.gpu_milli < WHOLE:
        room = np.where(cards >= d.gpu_milli, cards, np.iinfo(np.int64).max)
        chosen = room.argmin(axis=1)
        after[rows, chosen] -= d.gpu_milli
        return after
    whole = cards == WHOLE
    taken = whole & (np.cumsum(whole, axis=1) <= d.gpus)
    after[taken] = 0
    return after


def fgd_score(weight: float, workload: tuple[TaskShape, ...]) -> Score:
    """Fragmentation gradient descent: the node whose expected fragmentation, measured
    against the target workload, grows least (or shrinks most) when the task lands on it."""
    total = sum(s.popularity for s in workload) or 1.0
    shapes = tuple(
        TaskShape(s.gpus, s.gpu_milli, s.cpu_cores, s.popularity / total, s.gpu_model)
        for s in workload
    )

    def rate(c: ClusterArrays, d: Demand, idx: npt.NDArray[np.int64]) -> FloatArray:
        cards = _cards(c, idx)
        span = float(max(cards.shape[1], 1) * WHOLE)
        before = _expected_fragment(c, idx, cards, c.cpu_free[idx], shapes)
        after = _expected_fragment(
            c, idx, _place_on_cards(cards, d), c.cpu_free[idx] - d.cpu_cores, shapes
        )
        # growth in [-span, span] -> score in [0, 1], less growth scoring higher
        return np.asarray(0.5 - (after - before) / (2 * span), np.float64)

    return Score("FGD", weight, rate)


def typical_shapes(
    requests: list[tuple[int, int, int, str | None]], coverage: float = 0.95
) -> tuple[TaskShape, ...]:
    """The target workload of FGD from a list of (gpus, gpu_milli, cpu_cores, model)
    requests: the most common (gpus, gpu_milli, model) shapes that together cover
    `coverage` of the requests, each with its share and the mean CPU cores it asks.
    (Keying shapes by CPU too, as the paper's simulator does, scattered this trace's
    workload over 27 shapes and placed a point worse.)"""
    counts: dict[tuple[int, int, str | None], list[int]] = {}
    for gpus, milli, cores, model in requests:
        counts.setdefault((gpus, milli if gpus else 0, model or None), []).append(cores)
    ranked = sorted(counts.items(), key=lambda kv: (-len(kv[1]), kv[0][:2], kv[0][2] or ""))
    shapes: list[TaskShape] = []
    covered = 0
    for (gpus, milli, model), asked in ranked:
        if covered >= coverage * len(requests):
            break
        covered += len(asked)
        mean_cores = round(sum(asked) / len(asked))
        shapes.append(TaskShape(gpus, milli, mean_cores, len(asked) / len(requests), model))
    return tuple(shapes)


# Plugins that need configuration (the kube-scheduler's plugin args): name -> factory taking
# the weight and the plugin's arguments.
CONFIGURED_SCORES: dict[str, Callable[..., Score]] = {
    "Random": random_score,
    "BestFit": bestfit_score,
    "FGD": fgd_score,
}


@dataclass(frozen=True)
class Pipeline:
    filters: tuple[Filter, ...]
    scores: tuple[Score, ...]

    @classmethod
    def from_names(
        cls,
        filters: list[str],
        scores: dict[str, float],
        args: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> Pipeline:
        """Filters and weighted scores by name; `args` configures the plugins that take
        arguments (`CONFIGURED_SCORES`), e.g. {"FGD": {"workload": shapes}}."""
        args = args or {}
        known = {*FILTERS, *SCORES, *CONFIGURED_SCORES}
        unknown = [n for n in [*filters, *scores] if n not in known]
        if unknown:
            raise ValueError(f"unknown plugins: {', '.join(unknown)}")
        return cls(
            tuple(FILTERS[n] for n in filters),
            tuple(
                CONFIGURED_SCORES[n](w, **args.get(n, {}))
                if n in CONFIGURED_SCORES
                # a plain plugin takes only its weight
                else SCORES[n](w)
                for n, w in scores.items()
            ),
        )


DEFAULT_PIPELINE = Pipeline.from_names(
    list(FILTERS),
    {"GpuBinPack": 0.4, "GpuMemoryFit": 0.3, "CpuBinPack": 0.15, "MemoryBinPack": 0.15},
)


def policy_pipeline(
    policy: str,
    *,
    seed: int = 0,
    workload: tuple[TaskShape, ...] = (),
    cpu_milli_per_unit: int = 1000,
) -> Pipeline:
    """A named placement policy: every filter, and the policy's score plugins.

    `crater` is the default pipeline; `bestfit`, `fgd` and `random` are the baselines of the
    FGD paper (FGD measures fragmentation against `workload`; random draws from `seed`;
    BestFit weighs CPU in milli-CPU, one of the core's CPUs being `cpu_milli_per_unit`)."""
    if policy == "crater":
        return DEFAULT_PIPELINE
    scores = {"random": "Random", "bestfit": "BestFit", "fgd": "FGD"}
    if policy not in scores:
        raise ValueError(f"unknown policy {policy!r}; one of crater, {', '.join(scores)}")
    name = scores[policy]
    args: dict[str, dict[str, Any]] = {
        "Random": {"seed": seed},
        "FGD": {"workload": workload},
        "BestFit": {"cpu_milli_per_unit": cpu_milli_per_unit},
    }
    return Pipeline.from_names(list(FILTERS), {name: 1.0}, {name: args.get(name, {})})


POLICIES = ("crater", "bestfit", "fgd", "random")
