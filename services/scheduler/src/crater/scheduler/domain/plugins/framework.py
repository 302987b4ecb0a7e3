"""The plugin framework, after the kube-scheduler's: a filter returns, for every node at
once, whether the node can host the demand, names its reason code and declares the request
field it judges; a score rates the nodes that passed. Pipelines of them are composed by name
(`pipeline.py`) from the registry (`registry.py`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from crater.scheduler.domain.cluster import BoolArray, ClusterArrays
from crater.scheduler.domain.demand import Demand

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Filter:
    name: str
    code: str
    # the request field it judges (dotted, as a rejection names it); None: none (the node's
    # own state, such as readiness)
    field: str | None
    # what it checks, in a line (the generated docs list it)
    checks: str
    # (cluster, demand, use free amounts?) -> which nodes pass
    passes: Callable[[ClusterArrays, Demand, bool], BoolArray]
    explain: Callable[[Demand], str]


@dataclass(frozen=True)
class Score:
    name: str
    weight: float
    # (cluster, demand, candidate indexes) -> score in [0, 1] per candidate
    rate: Callable[[ClusterArrays, Demand, IntArray], FloatArray]
    # the plugin's arguments it was made with (`ScorePlugin`): the audit log records them,
    # so that a replay makes the same score again
    args: tuple[tuple[str, Any], ...] = field(default=(), compare=False)
    # (cluster, demand, node row) -> the card a share should take there, where the score
    # has its own view of that (FGD scores a share card by card); None: the placement's own
    card: Callable[[ClusterArrays, Demand, int], int | None] | None = field(
        default=None, compare=False
    )
    # (cluster, candidate indexes) -> whether the score takes part at all; None: always. A
    # score that reads what nodes may not report (live readings, a place in the fabric) is
    # left out where none do: those decisions, and their score details, read byte for byte
    # as before it existed (and it costs nothing there).
    applies: Callable[[ClusterArrays, IntArray], bool] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class ScorePlugin:
    """A score as registered: its name, what it rates (the generated docs list it), and how
    to make it at a weight, with the plugin's arguments where it takes some (the
    kube-scheduler's plugin args): `plugin(weight, **args)`."""

    name: str
    rates: str
    make: Callable[..., Score]
    args: tuple[str, ...] = ()

    def __call__(self, weight: float, **args: Any) -> Score:
        score = self.make(weight, **args)
        return replace(score, args=tuple(args.items())) if args else score


def plain_score(
    name: str, rates: str, rate: Callable[[ClusterArrays, Demand, IntArray], FloatArray]
) -> ScorePlugin:
    """A score that takes only its weight."""
    return ScorePlugin(name, rates, lambda weight: Score(name, weight, rate))
