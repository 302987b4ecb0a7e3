"""Choosing whom to preempt: on the node where the fewest lower-priority preemptible tasks
must yield, the least progressed of them."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

from crater.scheduler.domain.cluster import Node
from crater.scheduler.domain.demand import Demand
from crater.scheduler.domain.placement import select


@dataclass(frozen=True)
class Candidate:
    """A running allocation that may be asked to yield."""

    allocation_id: str
    node: str
    gpu_ids: tuple[int, ...]
    gpu_milli: int
    cpu_cores: tuple[int, ...]
    memory_mb: int
    priority_rank: int  # larger is lower priority
    granted_seq: int  # later grant, less progress lost
    mig_profile: str | None = None  # a MIG slice of gpu_ids[0]


@dataclass(frozen=True)
class Plan:
    node: str
    victims: tuple[Candidate, ...]


def plan(nodes: Sequence[Node], demand: Demand, candidates: Sequence[Candidate]) -> Plan | None:
    """The cheapest set of victims that lets `demand` fit on one of `nodes`, or None.

    Cost: fewest victims, then the least progressed (latest granted), then node name."""
    best: tuple[tuple[int, int, str], Plan] | None = None
    for node in nodes:
        mine = sorted(
            (c for c in candidates if c.node == node.name),
            key=lambda c: (-c.priority_rank, -c.granted_seq),
        )
        if not mine:
            continue
        freed = copy.deepcopy(node)
        victims: list[Candidate] = []
        for victim in mine:
            victims.append(victim)
            freed.give_back(
                victim.gpu_ids,
                victim.gpu_milli,
                victim.cpu_cores,
                victim.memory_mb,
                None,
                victim.mig_profile,
            )
            if select(freed, demand) is not None:
                cost = (len(victims), -min(v.granted_seq for v in victims), node.name)
                if best is None or cost < best[0]:
                    best = (cost, Plan(node.name, tuple(victims)))
                break
    return None if best is None else best[1]
