"""A pipeline: filters and weighted scores composed by name from the registry; Crater's
default, and the named policies of the simulator."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from crater.scheduler.domain.cluster import ClusterArrays
from crater.scheduler.domain.demand import Demand
from crater.scheduler.domain.plugins.baselines import TaskShape
from crater.scheduler.domain.plugins.framework import Filter, Score
from crater.scheduler.domain.plugins.registry import CONFIGURED_SCORES, FILTERS, SCORES


@dataclass(frozen=True)
class Pipeline:
    filters: tuple[Filter, ...]
    scores: tuple[Score, ...]

    def card_for(self, c: ClusterArrays, d: Demand, row: int) -> int | None:
        """The card a share takes on node `row` where the heaviest score that chooses cards
        says (as the paper's simulator lets its score choose the GPU); None: the placement's
        own choice."""
        choosers = [s for s in self.scores if s.card is not None]
        if not choosers:
            return None
        heaviest = max(choosers, key=lambda s: s.weight)
        assert heaviest.card is not None
        return heaviest.card(c, d, row)

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
# they override real fragmentation differences: 1.6 points lost on openb at 1%). Where
# nodes declare a place in the fabric, filling busy domains first weighs a tenth as much:
# it moves a task only between nodes whose fragmentation differs little (0 everywhere, and
# nothing changes, where none declares a place).
TIE_BREAK = 1e-4
# Live readings (a card another process holds, hot, on a degraded link) outweigh
# fragmentation differences below a quarter; they take part only where a node has some.
LIVE_READINGS_WEIGHT = 0.25
FABRIC_PACK_WEIGHT = 0.1
DEFAULT_PIPELINE = Pipeline.from_names(
    list(FILTERS),
    {"Fragmentation": 1.0, "LiveReadings": LIVE_READINGS_WEIGHT, "FabricPack": FABRIC_PACK_WEIGHT}
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
