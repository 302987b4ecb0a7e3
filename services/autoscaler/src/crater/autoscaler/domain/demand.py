"""The demand strategy's count: how many replicas the load needs, by Little's law.

A replica's GPU memory pressure grows with the sequences it holds (their KV cache), and by
Little's law the sequences held are the arrival rate times the time each is held. So the
fleet's summed pressure (mean pressure x replicas serving) measures the arrival rate in
"replicas' worth" of memory, and `load / target_pressure` replicas carry it at the target.

Summed pressure saturates when requests queue (a full replica shows the same pressure with
one request waiting as with a thousand), so the queue is counted apart: by Little's law the
requests waiting are the throughput times their mean wait, and serving them within
`drain_seconds` as well as the arrivals takes `1 + mean_wait / drain_seconds` times the
capacity. Both are averaged over an interval (the stable window, or the short panic window),
so one noisy report does not move the count.

The arrival rate is what the load measures (the admissions) times arrivals/admissions: from
the replicas' admission backlog when they report it (arrivals = admissions + the backlog's
growth), else inferred from how fast the queue wait grows.

Scale-out sizes for both; scale-in for the arrivals alone (`arrival_replicas`): the replicas
added to serve a burst's backlog are not needed once it is served, so the stabilisation
window keeps the count the arrivals asked for, not the backlog's.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass

# Demand within this of a whole replica rounds down: float noise must not add a replica.
_ROUNDING = 1e-6
# A wait growing (or shrinking) faster than this is read as this: arrivals at most 10x the
# admissions, and at least half.
MAX_WAIT_GROWTH = 0.9


class TimeSeries:
    """(time, value, weight) points of the last `horizon` seconds, with sums after any time.

    Points arrive in time order (the autoscaler's 'now' never moves back). Running totals make
    a sum over any suffix one bisection, whatever the rate of points.
    """

    def __init__(self, horizon: float) -> None:
        if horizon <= 0:
            raise ValueError("horizon must be positive")
        self.horizon = horizon
        self._times: list[float] = []
        # Running totals up to and including each point.
        self._values: list[float] = []
        self._weights: list[float] = []
        self._head = 0  # points before this have fallen out of the horizon
        # The running totals just before the first point kept in the lists.
        self._base = (0.0, 0.0)

    def __len__(self) -> int:
        return len(self._times) - self._head

    def add(self, at: float, value: float, weight: float = 1.0) -> None:
        if self._times and at < self._times[-1]:
            at = self._times[-1]  # never back in time
        self._times.append(at)
        self._values.append((self._values[-1] if self._values else self._base[0]) + value)
        self._weights.append((self._weights[-1] if self._weights else self._base[1]) + weight)
        self._head = bisect_right(self._times, at - self.horizon, lo=self._head)
        if self._head > 1024 and self._head * 2 > len(self._times):
            self._compact()

    def _compact(self) -> None:
        head = self._head
        self._base = (self._values[head - 1], self._weights[head - 1])
        self._times = self._times[head:]
        self._values = self._values[head:]
        self._weights = self._weights[head:]
        self._head = 0

    def sums(self, since: float) -> tuple[float, float]:
        """(sum of values, sum of weights) of the points after `since` (and in the horizon)."""
        if len(self) == 0:
            return 0.0, 0.0
        first = max(self._head, bisect_right(self._times, since, lo=self._head))
        if first >= len(self._times):
            return 0.0, 0.0
        if first == 0:
            value, weight = self._base
        else:
            value, weight = self._values[first - 1], self._weights[first - 1]
        return self._values[-1] - value, self._weights[-1] - weight

    def first_after(self, since: float) -> float | None:
        """The time of the first point after `since` (and in the horizon); None if none."""
        first = max(self._head, bisect_right(self._times, since, lo=self._head))
        return self._times[first] if first < len(self._times) else None

    def mean(self, since: float) -> float | None:
        """The weighted mean of the values after `since` (value sum / weight sum)."""
        total, weights = self.sums(since)
        return total / weights if weights > 0 else None


class SlidingMax:
    """The largest of the values given over the last `window` seconds (a monotonic queue:
    each value is kept only while no later one is at least as large)."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._kept: deque[tuple[float, int]] = deque()

    def add(self, at: float, value: int) -> None:
        while self._kept and self._kept[-1][1] <= value:
            self._kept.pop()
        self._kept.append((at, value))
        while len(self._kept) > 1 and self._kept[0][0] <= at - self.window:
            self._kept.popleft()  # the newest stays: a window of 0 s is the latest value

    def largest(self) -> int | None:
        return self._kept[0][1] if self._kept else None


def _whole(replicas: float, min_replicas: int, max_replicas: int) -> int:
    wanted = math.ceil(replicas - _ROUNDING)
    return min(max_replicas, max(min_replicas, wanted))


@dataclass(frozen=True)
class Demand:
    """The numbers behind a demand count, kept so a decision can show them."""

    load: float  # summed GPU memory pressure of the serving replicas, averaged
    queue_wait_s: float  # mean wait beyond the fast line of the requests started
    target_pressure: float
    drain_seconds: float
    # How fast that wait grows (s/s). In a FIFO queue the wait grows at 1 - admitted/arrived,
    # so arrivals are the admissions (which the load measures) / (1 - growth).
    wait_growth: float = 0.0
    # When the replicas report their admission backlog (vLLM's num_requests_waiting): how
    # fast it grows (requests/s) and the admissions per second. Arrivals are then counted,
    # not inferred: the admissions plus the backlog's growth.
    backlog_growth: float | None = None
    admissions_per_s: float | None = None

    @property
    def arrival_factor(self) -> float:
        if self.backlog_growth is not None and self.admissions_per_s:
            ratio = 1 + self.backlog_growth / self.admissions_per_s
            return min(1 / (1 - MAX_WAIT_GROWTH), max(1 / (1 + MAX_WAIT_GROWTH), ratio))
        growth = min(MAX_WAIT_GROWTH, max(-MAX_WAIT_GROWTH, self.wait_growth))
        return 1 / (1 - growth)

    @property
    def queue_factor(self) -> float:
        return 1 + self.queue_wait_s / self.drain_seconds

    @property
    def replicas(self) -> float:
        """Replicas needed, fractional: the arrivals at the target pressure, plus the queue."""
        return self.arrival_replicas * self.queue_factor

    @property
    def arrival_replicas(self) -> float:
        """Replicas the arrivals alone need, fractional: the queue left out. Scale-in sizes
        for this, so a backlog a burst left behind (served within `drain_seconds` by the
        replicas already there) does not keep surge replicas for a whole window."""
        return self.load * self.arrival_factor / self.target_pressure

    def desired(self, min_replicas: int, max_replicas: int) -> int:
        return _whole(self.replicas, min_replicas, max_replicas)

    def desired_for_arrivals(
        self, min_replicas: int, max_replicas: int, margin: float = 0.0
    ) -> int:
        """The replicas the arrivals ask for, with `margin` of them to spare."""
        return _whole(self.arrival_replicas * (1 + margin), min_replicas, max_replicas)

    def explain(self) -> str:
        text = (
            f"load {self.load:.2f} (mean GPU memory pressure x replicas serving) / target "
            f"{self.target_pressure:g}"
        )
        if self.arrival_factor != 1:
            growing = (
                f"backlog growing {self.backlog_growth:+.2f}/s at "
                f"{self.admissions_per_s:.1f} admitted/s"
                if self.backlog_growth is not None and self.admissions_per_s
                else f"wait growing {self.wait_growth:+.2f} s/s"
            )
            text += f" x arrivals/admissions {self.arrival_factor:.2f} ({growing})"
        if self.queue_wait_s > 0:
            text += (
                f" x (1 + queue wait {self.queue_wait_s:.2f} s / drain {self.drain_seconds:g} s)"
            )
        return f"{text} = {self.replicas:.2f} replicas"
