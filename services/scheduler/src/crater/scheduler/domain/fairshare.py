"""Fair share's memory (docs/pools.md, "Fair share among borrowers"): per borrower (a pool of
a cohort, an elastic tenant above its guarantee), its dominant share of what it borrows,
integrated over the events' times, the older part halved every half-life. Borrowers are then
served least usage first (`standing`). Read from the events' times only, so a replay decides
the same; not stored (a restart starts every borrower at zero)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime


@dataclass
class DecayedUsage:
    history: dict[str, float] = field(default_factory=dict)  # share-seconds, decayed
    at: datetime | None = None  # the time `history` is as of

    def age(
        self, now: datetime, half_life: float, shares: Callable[[], Mapping[str, float]]
    ) -> None:
        """Fold the time since the last event in: each borrower's share held since then
        (`shares()`, read only when time has moved), integrated, the older part decayed."""
        last, self.at = self.at, now
        if last is None or now <= last:
            self.at = max(now, last or now)
            return
        keep = 0.5 ** ((now - last).total_seconds() / half_life)
        for key in sorted(self.history):
            self.history[key] *= keep
        for key, share in sorted(shares().items()):
            gained = share * half_life / math.log(2) * (1 - keep)
            self.history[key] = self.history.get(key, 0.0) + gained

    def standing(self, key: str, share_now: float) -> tuple[float, float]:
        """The order borrowers are served in: least decayed usage, then least held now."""
        return (round(self.history.get(key, 0.0), 9), round(share_now, 9))
