"""Placement as a pipeline of small plugins, after the kube-scheduler framework.

A filter returns, for every node at once, whether the node can host the demand, and names
its reason code; a score rates the nodes that passed. Pipelines are composed by name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from crater.contracts import Taint, TaintEffect, Toleration
from crater.scheduler.domain.cluster import WHOLE, BoolArray, ClusterArrays
from crater.scheduler.domain.demand import Demand
from crater.scheduler.domain.fragmentation import rate_fragmentation
from crater.scheduler.domain.gpu_match import model_matches
from crater.scheduler.domain.mig import MigProfile
from crater.scheduler.domain.placement import expected_locality

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
    """Every node passes: one shared read-only array (a filter that asks nothing is free)."""
    return c.everywhere


def _ready(c: ClusterArrays, d: Demand, free: bool) -> BoolArray:
    return c.ready.copy() if free else _all(c)


def _pool(c: ClusterArrays, d: Demand, free: bool) -> BoolArray:
    return np.asarray(c.pool == d.pool)


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


def _models_text(d: Demand) -> str:
    models = d.gpu_models
    return models[0] if len(models) == 1 else f"one of {', '.join(models)}"


FILTERS: dict[str, Filter] = {
    f.name: f
    for f in (
        Filter("NodeReady", "NodeNotReady", _ready, lambda d: "node not ready"),
        Filter("Pool", "OtherPool", _pool, lambda d: f"not in pool {d.pool}"),
        Filter(
            "NodeLabels",
            "NodeSelectorMismatch",
            _node_labels,
            lambda d: "labels do not match " + ",".join(f"{k}={v}" for k, v in d.node_selector),
        ),
        Filter(
            "TaintToleration",
            "UntoleratedTaint",
            _taints,
            lambda d: "a taint the task does not tolerate",
        ),
        Filter("GpuCount", "InsufficientGpus", _gpu_count, lambda d: f"fewer than {d.gpus} GPUs"),
        Filter(
            "GpuModel", "GpuModelMismatch", _gpu_model, lambda d: f"GPU model not {_models_text(d)}"
        ),
        Filter(
            "MigProfile",
            "NoMigSlice",
            _mig,
            lambda d: f"no card with a free MIG {d.mig_profile} slice",
        ),
        Filter(
            "GpuMemory",
            "InsufficientGpuMemory",
            _gpu_memory,
            lambda d: (
                f"GPU memory per card < {d.gpu_memory_mb} MiB"
                + (f" (MIG {d.mig_profile})" if d.mig_profile else "")
            ),
        ),
        Filter(
            "CpuCores", "InsufficientCpu", _cpu, lambda d: f"fewer than {d.cpu_cores} CPU cores"
        ),
        Filter("Memory", "InsufficientMemory", _memory, lambda d: f"memory < {d.memory_mb} MiB"),
        Filter(
            "MemoryBandwidth",
            "InsufficientMemoryBandwidth",
            _memory_bandwidth,
            lambda d: (
                f"memory bandwidth < {d.memory_bandwidth_gbps:g} GB/s over a NUMA node's cores "
                "(one thread's where no such figure) or not measured"
            ),
        ),
        Filter("DiskCapacity", "InsufficientDisk", _disk, lambda d: f"SSD < {d.disk_gb} GB"),
        Filter(
            "SsdIops",
            "InsufficientSsdIops",
            _ssd_iops,
            lambda d: (
                f"SSD random reads < {d.ssd_iops_min} IOPS at depth (at QD1 where no such "
                "figure) or not measured"
            ),
        ),
        Filter(
            "SsdLatency",
            "SsdLatencyTooHigh",
            _ssd_latency,
            lambda d: f"SSD read latency > {d.ssd_latency_us_max} us or not measured",
        ),
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


SCORES: dict[str, Callable[[float], Score]] = {
    "GpuBinPack": lambda w: Score("GpuBinPack", w, _gpu_binpack),
    "GpuMemoryFit": lambda w: Score("GpuMemoryFit", w, _gpu_memory_fit),
    "CpuBinPack": lambda w: Score("CpuBinPack", w, _cpu_binpack),
    "MemoryBinPack": lambda w: Score("MemoryBinPack", w, _memory_binpack),
    "FieldWeighted": lambda w: Score("FieldWeighted", w, _field_weighted),
    "TopologyLocality": lambda w: Score("TopologyLocality", w, _topology_locality),
    # least growth of GPU fragmentation against the workload seen (fragmentation.py)
    "Fragmentation": lambda w: Score("Fragmentation", w, rate_fragmentation),
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
            model_matches(c, idx, shape.gpu_model)
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


# Crater's placement, the default of every pool: least fragmentation growth against the
# workload seen decides; bin packing and card fit only break its ties (weighed any higher
# they override real fragmentation differences: 1.6 points lost on openb at 1%).
TIE_BREAK = 1e-4
DEFAULT_PIPELINE = Pipeline.from_names(
    list(FILTERS),
    {"Fragmentation": 1.0}
    | {
        name: weight * TIE_BREAK
        for name, weight in (
            ("GpuBinPack", 0.4),
            ("GpuMemoryFit", 0.3),
            ("CpuBinPack", 0.15),
            ("MemoryBinPack", 0.15),
        )
    },
)


def policy_pipeline(
    policy: str,
    *,
    seed: int = 0,
    workload: tuple[TaskShape, ...] = (),
    cpu_milli_per_unit: int = 1000,
) -> Pipeline:
    """A named placement policy: every filter, and the policy's score plugins.

    `crater` is `DEFAULT_PIPELINE`, what production runs (least fragmentation growth);
    `bestfit`, `fgd` and `random` are the baselines of the FGD paper (FGD measures
    fragmentation against `workload`; random draws from `seed`; BestFit weighs CPU in
    milli-CPU, one of the core's CPUs being `cpu_milli_per_unit`)."""
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
