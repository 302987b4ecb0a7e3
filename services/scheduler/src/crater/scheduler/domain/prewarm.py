"""Pre-warm: a lending pool takes its capacity back ahead of the demand it expects, so that
a reclaim's grace period is spent before its own tasks arrive instead of after.

What a pool expects is its **daily pattern**: per time-of-day bucket (UTC), the peak of the
GPUs its own tasks wanted (held, plus waiting) in that bucket on past days, older days'
peaks decaying with a half-life in days (a recurring peak is remembered, a one-off fades).
The growth it expects is the pattern's peak over the coming buckets less what it wants now.

Within `lead_seconds` of that growth, borrowers on its nodes are told to yield (with the
grace period) until it has the growth idle or on its way back; within `lend_ahead_seconds`,
it lends nothing that would eat into it (a loan that would soon be taken back costs the
borrower its progress since its last checkpoint). The static `keep_idle` still only stops new
loans. A short-term trend (the rise over the last lead, carried forward) was tried and left
out: on replica arrivals it is mostly noise, and it told borrowers to yield about 50 times as
often for no gain (docs/pools.md). Every input is an event's time and the core's own counts,
so a replay decides the same. The pattern is not stored: a restart learns it again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

DAY_SECONDS = 86_400


@dataclass(frozen=True)
class Prewarm:
    """A lending pool's pre-warm settings (pools file: `lend.prewarm`)."""

    lead_seconds: float  # how far ahead the pool takes back (at least the grace period)
    lend_ahead_seconds: float = 1200.0  # how far ahead a new loan must not be needed back
    bucket_seconds: int = 900  # the daily pattern's resolution
    half_life_days: float = 7.0  # a day's peak counts half after this many days

    @property
    def buckets(self) -> int:
        return math.ceil(DAY_SECONDS / self.bucket_seconds)


@dataclass
class Forecast:
    """One pool's learned daily pattern of the GPUs its own tasks want."""

    settings: Prewarm
    # per bucket of the day: the decayed peak of past days (None: never seen)
    pattern: list[float | None] = field(default_factory=list)
    bucket: int | None = None  # the absolute bucket (days * buckets + index) being observed
    peak: float = 0.0  # the peak so far in `bucket`

    def __post_init__(self) -> None:
        if not self.pattern:
            self.pattern = [None] * self.settings.buckets

    def observe(self, at: float, wanted: float) -> None:
        """What the pool's own tasks want at `at` (seconds since the epoch, non-decreasing)."""
        settings = self.settings
        bucket = int(at // settings.bucket_seconds)
        if self.bucket is not None and bucket != self.bucket:
            self._fold()
            self.peak = 0.0
        self.bucket = bucket
        self.peak = max(self.peak, wanted)

    def _fold(self) -> None:
        """The bucket that ended joins the pattern: its peak, or the older peaks decayed by
        a day, whichever is larger."""
        assert self.bucket is not None
        index = self.bucket % self.settings.buckets
        keep = 0.5 ** (1 / self.settings.half_life_days)
        before = self.pattern[index]
        self.pattern[index] = self.peak if before is None else max(self.peak, before * keep)

    def growth(self, at: float, wanted: float, ahead: float | None = None) -> float:
        """GPUs the pool's own tasks are expected to want beyond `wanted` (now) within
        `ahead` seconds (the lead by default), by the pattern; never negative."""
        settings = self.settings
        first = int(at // settings.bucket_seconds)
        last = int((at + (ahead or settings.lead_seconds)) // settings.bucket_seconds)
        # The coming buckets of past days (a bucket's first visit today: the days before).
        seen = [
            peak
            for b in range(first, last + 1)
            if (peak := self.pattern[b % settings.buckets]) is not None
        ]
        return max(0.0, max(seen, default=wanted) - wanted)
