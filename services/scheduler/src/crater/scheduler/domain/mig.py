"""MIG (Multi-Instance GPU): a card cut into isolated slices, each a profile `<g>g.<m>gb`.

A card has a fixed number of compute slices (7 on A100/H100, 4 on A30) and of memory
slices (8 and 4). A profile takes `g` compute slices and as many memory slices as its memory
needs, counted in the card's smallest slice (the memory of its 1g profile): 1g.10gb takes
1 of 8 on an A100 80GB, 3g.40gb takes 4. Slices are carved on demand: a free card becomes a
MIG card when its first slice is granted and a whole card again when its last one returns;
while carved it serves only MIG requests. Only counts are kept (not the slot positions that
nvidia-smi picks), which admits the same sets of profiles on A100/H100 but for a few corner
placements.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

_PROFILE = re.compile(r"^([1-9])g\.([1-9][0-9]*)gb$")
# Quota and sharing accounting count a slice as its share of the card's compute, over the
# seven compute slices of the MIG cards in use (A100, H100).
ACCOUNTED_COMPUTE_SLICES = 7


@dataclass(frozen=True)
class MigProfile:
    name: str
    compute: int
    memory_gb: int

    @classmethod
    def parse(cls, name: str) -> MigProfile:
        match = _PROFILE.match(name)
        if match is None:
            raise ValueError(f"{name!r} is not a MIG profile like 1g.10gb")
        return cls(name, int(match[1]), int(match[2]))

    @property
    def milli(self) -> int:
        """The thousandths of a card this slice is accounted as."""
        return max(1, 1000 * self.compute // ACCOUNTED_COMPUTE_SLICES)


@dataclass(frozen=True)
class MigGeometry:
    """How one card model cuts: its profiles and its compute and memory slices."""

    profiles: frozenset[str]
    compute_slices: int
    memory_slices: int
    memory_unit_gb: int

    def cost(self, profile: MigProfile) -> tuple[int, int]:
        """(compute slices, memory slices) a slice of `profile` takes on this card."""
        return profile.compute, math.ceil(profile.memory_gb / self.memory_unit_gb)

    def fits(self, profile: MigProfile, used: tuple[int, int]) -> bool:
        if profile.name not in self.profiles:
            return False
        compute, memory = self.cost(profile)
        return used[0] + compute <= self.compute_slices and used[1] + memory <= self.memory_slices

    def room(self, used: tuple[int, int]) -> int:
        """Compute slices still free: the best-fit key (the fullest card that fits wins)."""
        return self.compute_slices - used[0]


@cache
def geometry(profiles: tuple[str, ...]) -> MigGeometry | None:
    """The geometry a card's profile list implies; None when it lists none."""
    parsed = [MigProfile.parse(p) for p in profiles if _PROFILE.match(p)]
    if not parsed:
        return None
    smallest = [p.memory_gb for p in parsed if p.compute == 1] or [min(p.memory_gb for p in parsed)]
    unit = min(smallest)
    return MigGeometry(
        profiles=frozenset(p.name for p in parsed),
        compute_slices=max(p.compute for p in parsed),
        memory_slices=max(p.memory_gb for p in parsed) // unit,
        memory_unit_gb=unit,
    )


def card_geometry(profiles: Sequence[str]) -> MigGeometry | None:
    return geometry(tuple(sorted(profiles)))
