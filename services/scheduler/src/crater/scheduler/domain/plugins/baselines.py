"""The baseline policies of the trace simulator (and anyone who wants them), scores that
take arguments: random, and BestFit and FGD after Weng et al., "Beware of Fragmentation"
(USENIX ATC'23). Both look at each card's free thousandths, read from the nodes behind the
candidate rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from crater.scheduler.domain.cluster import WHOLE, BoolArray, ClusterArrays
from crater.scheduler.domain.demand import Demand
from crater.scheduler.domain.fragmentation import card_matrix, expected_fragmentation
from crater.scheduler.domain.gpu_match import model_matches
from crater.scheduler.domain.plugins.framework import FloatArray, Score, ScorePlugin
from crater.scheduler.domain.workload import LearnedShape

BESTFIT_CPU_SCALE = 128_000  # milli-CPU, as in the paper's BestFit
BESTFIT_GPU_SCALE = 8_000  # milli-GPU: an 8-card node


def bestfit_score(weight: float, cpu_milli_per_unit: int = 1000) -> Score:
    """The paper's BestFit: the node left with the least CPU and GPU after the task wins.
    `cpu_milli_per_unit`: what one of the core's CPUs stands for (a core: 1000)."""

    def rate(c: ClusterArrays, d: Demand, idx: npt.NDArray[np.int64]) -> FloatArray:
        asked_gpu = d.gpus * (d.gpu_milli or WHOLE)
        gpu_left = card_matrix(c, idx).sum(axis=1) - asked_gpu
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
    return _paper_fragment(cards, cpu_free, model_ok[None, :], (shape,), np.ones(1))


def _paper_fragment(
    cards: npt.NDArray[np.int64],
    cpu_free: npt.NDArray[np.int64],
    model_ok: BoolArray | None,
    shapes: tuple[TaskShape, ...],
    popularity: FloatArray,
) -> FloatArray:
    """F_n(M) = sum over the workload's shapes m of popularity(m) * F_n(m), one value per row
    of `cards` (`model_ok[m, n]`: shape m may run on row n; None: all may). A shape without
    GPUs counts every free thousandth (the paper's XL/XR kinds); the paper's measure weighs
    no memory."""
    measure = _PaperMeasure.of(shapes, popularity)
    ok = None if model_ok is None else model_ok[measure.gpu_rows]
    return measure.fragment(cards, cpu_free, ok)


@dataclass(frozen=True)
class _PaperMeasure:
    """A workload's shapes as `_paper_fragment` weighs them, made once: its GPU shapes as the
    fragmentation score's learned shapes, the rows of those that name a model, by model, and
    the popularity of those without GPUs."""

    measured: tuple[LearnedShape, ...]
    gpu_rows: list[int]
    by_model: tuple[tuple[str, list[int]], ...]
    cpu_only: float

    @classmethod
    def of(cls, shapes: tuple[TaskShape, ...], popularity: FloatArray) -> _PaperMeasure:
        gpu_rows = [k for k, s in enumerate(shapes) if s.gpus]
        measured = tuple(
            LearnedShape(s.gpus, s.gpu_milli, s.gpu_model, float(popularity[k]), s.cpu_cores, 0.0)
            for k, s in ((k, shapes[k]) for k in gpu_rows)
        )
        by_model: dict[str, list[int]] = {}
        for row, shape in enumerate(measured):
            if shape.gpu_model:
                by_model.setdefault(shape.gpu_model, []).append(row)
        cpu_only = float(sum(popularity[k] for k, s in enumerate(shapes) if not s.gpus))
        return cls(measured, gpu_rows, tuple(by_model.items()), cpu_only)

    def models_ok(self, c: ClusterArrays, idx: npt.NDArray[np.int64]) -> BoolArray | None:
        """[GPU shape, row]: whether the shape may run on node `idx[row]` (None: all may)."""
        if not self.by_model:
            return None
        ok = np.ones((len(self.measured), len(idx)), np.bool_)
        for model, rows in self.by_model:
            ok[rows] = model_matches(c, idx, model)
        return ok

    def fragment(
        self,
        cards: npt.NDArray[np.int64],
        cpu_free: npt.NDArray[np.int64],
        model_ok: BoolArray | None,
        profiles: npt.NDArray[np.int64] | None = None,
    ) -> FloatArray:
        """`_paper_fragment` (`model_ok` over the GPU shapes only; `profiles`: each row's
        capacity profile, what `model_ok` depends on)."""
        no_memory = np.zeros(len(cards), np.int64)
        out = expected_fragmentation(cards, cpu_free, no_memory, model_ok, self.measured, profiles)
        return np.asarray(out + self.cpu_only * cards.sum(axis=1), np.float64)


def _place_on_cards(cards: npt.NDArray[np.int64], d: Demand) -> npt.NDArray[np.int64]:
    """The cards after a task of whole cards lands: free cards from the lowest index (which
    whole free cards go does not change the fragmentation). A share is placed card by card
    in `_FgdWorkload.share_points`."""
    after = cards.copy()
    if not d.gpus:
        return after
    whole = cards == WHOLE
    taken = whole & (np.cumsum(whole, axis=1) <= d.gpus)
    after[taken] = 0
    return after


def _fgd_points(gain: FloatArray) -> FloatArray:
    """The paper's node score from the fragmentation a placement removes (thousandths): the
    kube-scheduler's integer score, sigmoid(gain / 1000) x 100 cut to an integer, so that
    near-equal gains tie (ties go to the smallest node name); read here in [0, 1]."""
    return np.asarray(np.floor(100.0 / (1.0 + np.exp(-gain / 1000.0))) / 100.0, np.float64)


def _is_share(d: Demand) -> bool:
    return d.gpus == 1 and 0 < d.gpu_milli < WHOLE and d.mig_profile is None


@dataclass(frozen=True)
class _FgdWorkload:
    """FGD's target workload, normalized, and the measure against it."""

    shapes: tuple[TaskShape, ...]
    popularity: FloatArray
    measure: _PaperMeasure

    def fragment(
        self,
        c: ClusterArrays,
        idx: npt.NDArray[np.int64],
        cards: npt.NDArray[np.int64],
        cpu_free: npt.NDArray[np.int64],
    ) -> FloatArray:
        ok = self.measure.models_ok(c, idx)
        return self.measure.fragment(cards, cpu_free, ok, c.capacity_profiles()[0][idx])

    def share_points(
        self, c: ClusterArrays, d: Demand, idx: npt.NDArray[np.int64]
    ) -> tuple[FloatArray, npt.NDArray[np.int64]]:
        """For a share: per node, the best score over the cards that hold it, and that card
        (the lowest index among equals, as the paper's simulator takes it; -1: none)."""
        cards = card_matrix(c, idx)
        cpu = c.cpu_free[idx]
        before = self.fragment(c, idx, cards, cpu)
        rows, cols = np.nonzero(cards >= d.gpu_milli)  # row-major: each node's cards in order
        after_cards = cards[rows]
        after_cards[np.arange(len(rows)), cols] -= d.gpu_milli
        after = self.fragment(c, idx[rows], after_cards, cpu[rows] - d.cpu_cores)
        points = _fgd_points(before[rows] - after)
        best = np.full(len(idx), -1.0)
        card = np.full(len(idx), -1, np.int64)
        for row, col, value in zip(rows.tolist(), cols.tolist(), points.tolist(), strict=True):
            if value > best[row]:
                best[row], card[row] = value, col
        return best, card


def fgd_score(weight: float, workload: Sequence[TaskShape | Mapping[str, Any]]) -> Score:
    """Fragmentation gradient descent as the paper's simulator scores it: the node whose
    expected fragmentation, measured against the target workload (its typical requests,
    CPU included, memory not), shrinks most when the task lands there, as an integer score
    out of 100 (`_fgd_points`). A share is tried on each card that holds it and the node
    takes its best card's score; `card` names that card, for the grant. Shapes may come as
    mappings of TaskShape's fields (a pools file, an audit record)."""
    given = tuple(s if isinstance(s, TaskShape) else TaskShape(**s) for s in workload)
    total = sum(s.popularity for s in given) or 1.0
    popularity = np.asarray([s.popularity / total for s in given], np.float64)
    model = _FgdWorkload(given, popularity, _PaperMeasure.of(given, popularity))

    def rate(c: ClusterArrays, d: Demand, idx: npt.NDArray[np.int64]) -> FloatArray:
        if _is_share(d):
            return model.share_points(c, d, idx)[0].clip(0.0, 1.0)
        cards = card_matrix(c, idx)
        cpu = c.cpu_free[idx]
        before = model.fragment(c, idx, cards, cpu)
        after = model.fragment(c, idx, _place_on_cards(cards, d), cpu - d.cpu_cores)
        return _fgd_points(before - after)

    def card(c: ClusterArrays, d: Demand, row: int) -> int | None:
        if not _is_share(d):
            return None
        chosen = int(model.share_points(c, d, np.asarray([row], np.int64))[1][0])
        return None if chosen < 0 else chosen

    return Score("FGD", weight, rate, card=card)


def typical_shapes(
    requests: list[tuple[int, int, int, str | None]], coverage: float = 0.95
) -> tuple[TaskShape, ...]:
    """FGD's target workload from a list of (gpus, gpu_milli, cpu_cores, model) requests, as
    the paper's simulator takes it (with its defaults: requests without GPUs included, 95%):
    the distinct requests, CPU included, most frequent first (equal counts: the larger
    request first), taken until they cover `coverage` of the requests, each with its share
    among those taken."""
    counts: dict[tuple[int, int, int, str], int] = {}
    for gpus, milli, cores, model in requests:
        key = (cores, milli if gpus else 0, gpus, model or "")
        counts[key] = counts.get(key, 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: (kv[1], *kv[0]), reverse=True)
    taken: list[tuple[tuple[int, int, int, str], int]] = []
    covered = 0
    for key, count in ranked:
        if covered >= coverage * len(requests):
            break
        taken.append((key, count))
        covered += count
    return tuple(
        TaskShape(gpus, milli, cores, count / covered, model or None)
        for (cores, milli, gpus, model), count in taken
    )


# Plugins that need configuration (the kube-scheduler's plugin args): name -> factory taking
# the weight and the plugin's arguments.
ALL: tuple[ScorePlugin, ...] = (
    ScorePlugin("Random", "uniform random scores from a seeded generator", random_score, ("seed",)),
    ScorePlugin(
        "BestFit",
        "the node left with the least CPU and GPU after the task (the paper's BestFit)",
        bestfit_score,
        ("cpu_milli_per_unit",),
    ),
    ScorePlugin(
        "FGD",
        "least growth of expected fragmentation against a target workload given up front "
        "(fragmentation gradient descent)",
        fgd_score,
        ("workload",),
    ),
)
