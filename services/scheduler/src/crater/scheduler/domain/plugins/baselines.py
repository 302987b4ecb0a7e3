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
from crater.scheduler.domain.gpu_match import model_matches
from crater.scheduler.domain.plugins.framework import FloatArray, Score, ScorePlugin

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


def fgd_score(weight: float, workload: Sequence[TaskShape | Mapping[str, Any]]) -> Score:
    """Fragmentation gradient descent: the node whose expected fragmentation, measured
    against the target workload, grows least (or shrinks most) when the task lands on it.
    Shapes may come as mappings of TaskShape's fields (a pools file, an audit record)."""
    given = tuple(s if isinstance(s, TaskShape) else TaskShape(**s) for s in workload)
    total = sum(s.popularity for s in given) or 1.0
    shapes = tuple(
        TaskShape(s.gpus, s.gpu_milli, s.cpu_cores, s.popularity / total, s.gpu_model)
        for s in given
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
