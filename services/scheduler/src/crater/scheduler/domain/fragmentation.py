"""Crater's placement score: least growth of GPU fragmentation, measured against the workload
the core has actually seen.

FGD (Weng et al., USENIX ATC'23) measures a node's fragmentation against a target workload
given up front. Production has no future trace, so this score learns the workload online:
every request it is asked to place counts once, into a table of request shapes (GPU count,
per-card share, GPU model) whose weights decay with a half-life counted in requests, each
with the decayed mean CPU and memory its requests ask for.

A node's fragmentation for one shape is the GPU thousandths a task of that shape could not
use there: all of them when the task cannot run there at all (too few fitting cards, the
wrong model, or too little CPU or memory left: the node's CPU or memory strands its GPUs),
otherwise the free thousandths on cards too small for its share. The node's expected
fragmentation weighs the shapes by popularity; the score rates how little it grows when
the task lands there (the cards it takes as `placement.select` takes them).
"""

from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from crater.scheduler.domain.cluster import WHOLE, BoolArray, ClusterArrays
from crater.scheduler.domain.demand import Demand

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# Requests after which a shape's weight halves: the mix of the last few thousand requests.
HALF_LIFE_REQUESTS = 5000.0
# The shapes that together make this share of the (decayed) requests are measured against;
# the rare rest would cost time and shift little.
COVERAGE = 0.95
MAX_SHAPES = 32


@dataclass(frozen=True)
class LearnedShape:
    """One request shape and its share of the requests seen, with the mean CPU and memory
    its requests asked for."""

    gpus: int
    gpu_milli: int  # per card; 0 without GPUs
    gpu_model: str | None
    popularity: float
    cpu_cores: float
    memory_mb: float


@dataclass
class _Tally:
    weight: float = 0.0
    cpu: float = 0.0  # decayed sums: mean = sum / weight
    memory: float = 0.0


@dataclass
class WorkloadModel:
    """Request shapes seen so far, each request counted once, older ones weighing less."""

    half_life: float = HALF_LIFE_REQUESTS
    tallies: dict[tuple[int, int, str | None], _Tally] = field(default_factory=dict)
    seen: int = 0
    _shapes: tuple[LearnedShape, ...] | None = None
    # the requests already counted, by identity: a pending task retried is the same request
    _counted: weakref.WeakValueDictionary[int, Demand] = field(
        default_factory=weakref.WeakValueDictionary
    )

    def observe(self, demand: Demand) -> None:
        if self._counted.get(id(demand)) is demand:
            return
        self._counted[id(demand)] = demand
        keep = 0.5 ** (1.0 / self.half_life)
        for tally in self.tallies.values():
            tally.weight *= keep
            tally.cpu *= keep
            tally.memory *= keep
        key = (demand.gpus, demand.gpu_milli if demand.gpus else 0, demand.gpu_model or None)
        tally = self.tallies.setdefault(key, _Tally())
        tally.weight += 1.0
        tally.cpu += demand.cpu_cores
        tally.memory += demand.memory_mb
        self.seen += 1
        self._shapes = None
        if len(self.tallies) > 4 * MAX_SHAPES:  # forget shapes nobody asks for any more
            floor = sorted(t.weight for t in self.tallies.values())[-2 * MAX_SHAPES]
            self.tallies = {k: t for k, t in self.tallies.items() if t.weight >= floor}

    def shapes(self) -> tuple[LearnedShape, ...]:
        """The most requested shapes covering `COVERAGE` of the decayed weight, most popular
        first (ties in a fixed order), popularity as a share of all requests."""
        if self._shapes is None:
            total = sum(t.weight for t in self.tallies.values())
            ranked = sorted(
                self.tallies.items(), key=lambda kv: (-kv[1].weight, kv[0][:2], kv[0][2] or "")
            )
            shapes: list[LearnedShape] = []
            covered = 0.0
            for (gpus, milli, model), tally in ranked:
                if covered >= COVERAGE * total or len(shapes) == MAX_SHAPES:
                    break
                covered += tally.weight
                shapes.append(
                    LearnedShape(
                        gpus,
                        milli,
                        model,
                        tally.weight / total,
                        tally.cpu / tally.weight,
                        tally.memory / tally.weight,
                    )
                )
            self._shapes = tuple(shapes)
        return self._shapes

    def host_per_gpu_milli(self) -> tuple[float, float]:
        """CPU cores and memory MiB the GPU requests seen ask per GPU thousandth: what a
        node's free GPUs need beside them to be usable."""
        gpu = cpu = memory = 0.0
        for (gpus, milli, _), tally in self.tallies.items():
            if gpus:
                gpu += tally.weight * gpus * milli
                cpu += tally.cpu
                memory += tally.memory
        if not gpu:
            return 0.0, 0.0
        return cpu / gpu, memory / gpu


# One model per cluster: every `Scheduler` owns its cluster, so schedulers sharing a pipeline
# (the default one) never share what they learned.
_MODELS: weakref.WeakKeyDictionary[ClusterArrays, WorkloadModel] = weakref.WeakKeyDictionary()


def workload_model(cluster: ClusterArrays) -> WorkloadModel:
    model = _MODELS.get(cluster)
    if model is None:
        model = _MODELS[cluster] = WorkloadModel()
    return model


def card_matrix(c: ClusterArrays, idx: IntArray) -> IntArray:
    """Free thousandths of every card of nodes `idx`, one row each, padded with 0."""
    counts = c.gpus_total[idx]
    width = max(int(counts.max(initial=0)), 1)
    flat = np.fromiter(
        itertools.chain.from_iterable(c.nodes[i].gpu_milli_free for i in idx.tolist()),
        np.int64,
        int(counts.sum()),
    )
    out = np.zeros((len(idx), width), np.int64)
    out[np.arange(width) < counts[:, None]] = flat
    return out


def cards_after(cards: IntArray, d: Demand) -> IntArray:
    """The cards once the task lands as `placement.select` puts it: a share on the fullest
    card that still holds it, whole cards anywhere free (which ones changes nothing here)."""
    after = cards.copy()
    if not d.gpus:
        return after
    rows = np.arange(len(cards))
    if d.gpu_milli < WHOLE:
        room = np.where(cards >= d.gpu_milli, cards, np.iinfo(np.int64).max)
        after[rows, room.argmin(axis=1)] -= d.gpu_milli
        return after
    whole = cards >= WHOLE  # more than 1000 on a card time-sliced by over-commit
    after[whole & (np.cumsum(whole, axis=1) <= d.gpus)] -= WHOLE
    return after


def expected_fragmentation(
    cards: IntArray,
    cpu_free: IntArray,
    memory_free: IntArray,
    model_ok: BoolArray,
    shapes: tuple[LearnedShape, ...],
) -> FloatArray:
    """Per node (row of `cards`): sum over GPU shapes of popularity x the free thousandths a
    task of that shape could not use there. `model_ok[s, n]`: shape s may run on node n.
    Shapes without GPUs are left out: every GPU is theirs to strand wherever a task lands,
    the same amount on every node."""
    gpu_shapes = [s for s in shapes if s.gpus]
    if not gpu_shapes:
        return np.zeros(len(cards))
    milli = np.asarray([s.gpu_milli for s in gpu_shapes], np.int64)[:, None, None]
    fits_card = cards[None, :, :] >= milli  # (shape, node, card)
    stranded = np.where(fits_card, 0, cards[None, :, :]).sum(axis=2)
    total = cards.sum(axis=1)[None, :]
    runs = (
        (fits_card.sum(axis=2) >= np.asarray([s.gpus for s in gpu_shapes])[:, None])
        & (cpu_free[None, :] >= np.asarray([s.cpu_cores for s in gpu_shapes])[:, None])
        & (memory_free[None, :] >= np.asarray([s.memory_mb for s in gpu_shapes])[:, None])
        & model_ok
    )
    fragment = np.where(runs, stranded, total).astype(np.float64)
    popularity = np.asarray([s.popularity for s in gpu_shapes])
    return np.asarray(popularity @ fragment, np.float64)


def host_stranded(
    cards: IntArray,
    cpu_free: IntArray,
    memory_free: IntArray,
    cpu_per_milli: float,
    memory_per_milli: float,
) -> FloatArray:
    """Free GPU thousandths the node's free CPU or memory cannot feed, at the CPU and memory
    per GPU thousandth the workload asks: GPUs stranded by the host."""
    feedable = np.full(len(cards), np.inf)
    if cpu_per_milli > 0:
        feedable = np.minimum(feedable, np.maximum(cpu_free, 0) / cpu_per_milli)
    if memory_per_milli > 0:
        feedable = np.minimum(feedable, np.maximum(memory_free, 0) / memory_per_milli)
    return np.asarray(np.maximum(cards.sum(axis=1) - feedable, 0.0), np.float64)


def _models_ok(c: ClusterArrays, idx: IntArray, shapes: tuple[LearnedShape, ...]) -> BoolArray:
    from crater.scheduler.domain.plugins import model_matches  # plugins registers this score

    gpu_shapes = [s for s in shapes if s.gpus]
    ok = np.ones((len(gpu_shapes), len(idx)), np.bool_)
    models = c.gpu_model[idx]
    for row, shape in enumerate(gpu_shapes):
        if shape.gpu_model:
            ok[row] = model_matches(models, shape.gpu_model)
    return ok


def fragmentation_growth(c: ClusterArrays, d: Demand, idx: IntArray) -> FloatArray:
    """How much each candidate node's expected fragmentation grows (in GPU thousandths; less
    than 0: shrinks) when `d` lands there, against the workload learned so far (`d`
    included). Nodes without GPUs: 0."""
    growth = np.zeros(len(idx))
    if d.mig_profile is not None:  # a MIG slice takes no share of the cards counted here
        return growth
    model = workload_model(c)
    model.observe(d)
    gpu_rows = np.flatnonzero(c.gpus_total[idx] > 0)
    shapes = model.shapes()
    if not len(gpu_rows) or not any(s.gpus for s in shapes):
        return growth
    nodes = idx[gpu_rows]
    cards = card_matrix(c, nodes)
    ok = _models_ok(c, nodes, shapes)
    cpu, memory = c.cpu_free[nodes], c.memory_free_mb[nodes]
    # before and after in one pass: rows [0, n) before, [n, 2n) after
    all_cards = np.concatenate([cards, cards_after(cards, d)])
    all_cpu = np.concatenate([cpu, cpu - d.cpu_cores])
    all_memory = np.concatenate([memory, memory - d.memory_mb])
    both = expected_fragmentation(
        all_cards, all_cpu, all_memory, np.concatenate([ok, ok], axis=1), shapes
    )
    # GPUs the host cannot feed count like those too small for any task: a stranded card
    # is a stranded card, whichever resource strands it
    both += host_stranded(all_cards, all_cpu, all_memory, *model.host_per_gpu_milli())
    growth[gpu_rows] = both[len(nodes) :] - both[: len(nodes)]
    return growth


def rate_fragmentation(c: ClusterArrays, d: Demand, idx: IntArray) -> FloatArray:
    """Score in [0, 1]: 0.5 where fragmentation does not change, higher where it shrinks,
    lower where it grows. A node's fragmentation (cards and host together) is at most twice
    its free cards: the largest node's cards, twice over, span the range."""
    growth = fragmentation_growth(c, d, idx)
    span = float(max(int(c.gpus_total.max(initial=0)), 1) * WHOLE)
    return np.asarray(0.5 - growth / (4 * span), np.float64)
