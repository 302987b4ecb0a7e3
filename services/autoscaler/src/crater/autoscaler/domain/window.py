"""A time-based sliding window of latency samples with an exact percentile.

Time is whatever the caller says it is (seconds, e.g. an event's occurred_at as a POSIX
timestamp); the window never reads a clock, so replaying the same samples gives the same
answers.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from collections import deque
from collections.abc import Iterable


def nearest_rank(sorted_values: list[float], quantile: float) -> float:
    """The nearest-rank percentile: the smallest sample with at least `quantile` of all
    samples at or below it. Always one of the samples, never an interpolation."""
    if not sorted_values:
        raise ValueError("no samples")
    rank = max(1, math.ceil(quantile * len(sorted_values)))
    return sorted_values[rank - 1]


class LatencyWindow:
    """Samples from the last `window_seconds`, kept as the batches they arrived in.

    Memory is bounded: beyond `max_samples`, the oldest whole batches are dropped first (a
    batch is at most 10,000 samples by contract, so the bound is max_samples + one batch).
    The whole window is also kept as one sorted list (insertion and eviction by bisection),
    so its percentile costs nothing; a percentile over part of the window (`since`) merges
    that part's batches, each kept sorted.
    """

    # Batches larger than this are merged into (or taken out of) the sorted list by a
    # re-sort rather than value by value.
    _BULK = 64

    def __init__(self, window_seconds: float, max_samples: int = 50_000) -> None:
        if window_seconds <= 0:
            raise ValueError("window_seconds must be positive")
        if max_samples < 1:
            raise ValueError("max_samples must be at least 1")
        self.window_seconds = window_seconds
        self.max_samples = max_samples
        self._times: deque[float] = deque()
        self._batches: deque[list[float]] = deque()
        self._count = 0
        self._latest = -math.inf
        self._sorted: list[float] = []

    def __len__(self) -> int:
        return self._count

    @property
    def latest(self) -> float:
        """The newest time seen: the window's 'now'."""
        return self._latest

    def advance(self, now: float) -> None:
        """Move the window's 'now' forward (never back) and forget what fell out of it."""
        if now > self._latest:
            self._latest = now
        cutoff = self._latest - self.window_seconds
        while self._times and self._times[0] <= cutoff:
            self._evict_oldest()

    def _evict_oldest(self) -> None:
        self._times.popleft()
        batch = self._batches.popleft()
        self._count -= len(batch)
        if len(batch) > self._BULK:
            self._sorted = sorted(v for b in self._batches for v in b)
            return
        for value in batch:
            del self._sorted[bisect_left(self._sorted, value)]

    def add(self, at: float, latencies: Iterable[float]) -> int:
        """Add a batch observed at `at`; returns how many samples were kept (0 when the batch
        is already older than the window, as a late redelivery can be)."""
        self.advance(at)
        batch = sorted(latencies)
        if not batch or at <= self._latest - self.window_seconds:
            return 0
        if not self._times or at >= self._times[-1]:
            self._times.append(at)
            self._batches.append(batch)
        else:
            # Out of order (replicas' clocks, concurrent delivery): keep the deque time-sorted
            # so eviction from the left stays exact.
            index = bisect_right(self._times, at)
            self._times.insert(index, at)
            self._batches.insert(index, batch)
        self._count += len(batch)
        if len(batch) > self._BULK:
            self._sorted.extend(batch)
            self._sorted.sort()  # two sorted runs: merged in linear time
        else:
            for value in batch:
                insort(self._sorted, value)
        while self._count > self.max_samples and len(self._batches) > 1:
            self._evict_oldest()
        return len(batch)

    def samples(self, since: float | None = None, until: float | None = None) -> list[float]:
        """Every sample in the window observed after `since` (all when None) and at or
        before `until` (the latest when None), sorted."""
        whole = until is None or (bool(self._times) and until >= self._times[-1])
        if whole and (since is None or not self._times or since < self._times[0]):
            return list(self._sorted)
        values: list[float] = []
        for at, batch in zip(reversed(self._times), reversed(self._batches), strict=True):
            if since is not None and at <= since:
                break
            if until is None or at <= until:
                values.extend(batch)
        values.sort()
        return values

    def percentile(
        self, quantile: float, since: float | None = None, until: float | None = None
    ) -> tuple[float, int] | None:
        """(nearest-rank percentile, sample count) over the window (after `since`, up to
        `until`, when given), or None when empty."""
        if until is not None:
            values = self.samples(since, until)
            return (nearest_rank(values, quantile), len(values)) if values else None
        if since is None or not self._times or since < self._times[0]:
            if not self._sorted:
                return None
            return nearest_rank(self._sorted, quantile), len(self._sorted)
        values = self.samples(since)
        if not values:
            return None
        return nearest_rank(values, quantile), len(values)
