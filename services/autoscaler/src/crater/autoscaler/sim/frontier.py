"""The frontier of a baseline family swept over its target: SLO attainment against
replica-minutes, the points no other point beats on both (Pareto), and the replica-minutes a
frontier needs at a given attainment (read off the straight line between the two frontier
points around it)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Point:
    replica_minutes: float
    attainment: float
    label: str = ""


@dataclass(frozen=True)
class AtAttainment:
    """The replica-minutes a frontier needs at an attainment, and how that was read:
    'interpolated' between two frontier points, 'exact' on one, 'at most' (the attainment is
    below the frontier's cheapest point, which reaches more for this many), or 'unreachable'
    (above its best point; `replica_minutes` is None)."""

    replica_minutes: float | None
    how: str


def pareto(points: Iterable[Point]) -> list[Point]:
    """The points not dominated by another (fewer or equal replica-minutes and higher or
    equal attainment, one of them strictly), cheapest first: along it attainment rises
    strictly with replica-minutes."""
    ordered = sorted(points, key=lambda p: (p.replica_minutes, -p.attainment))
    front: list[Point] = []
    for point in ordered:
        if not front or point.attainment > front[-1].attainment:
            front.append(point)
    return front


def minutes_at(front: list[Point], attainment: float) -> AtAttainment:
    """The replica-minutes on `front` (from `pareto`) at `attainment`."""
    if not front:
        return AtAttainment(None, "unreachable")
    if attainment > front[-1].attainment:
        return AtAttainment(None, "unreachable")
    if attainment < front[0].attainment:
        return AtAttainment(front[0].replica_minutes, "at most")
    for low, high in itertools.pairwise(front):
        if low.attainment <= attainment <= high.attainment:
            if attainment == low.attainment:
                return AtAttainment(low.replica_minutes, "exact")
            share = (attainment - low.attainment) / (high.attainment - low.attainment)
            minutes = low.replica_minutes + share * (high.replica_minutes - low.replica_minutes)
            return AtAttainment(minutes, "interpolated")
    return AtAttainment(front[-1].replica_minutes, "exact")  # equal to the best point


def saving(mine: float, theirs: float) -> float:
    """How much fewer replica-minutes `mine` is than `theirs`, as a share of theirs
    (negative: more)."""
    return (theirs - mine) / theirs
