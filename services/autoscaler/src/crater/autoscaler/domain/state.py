"""What the autoscaler remembers of each service between events."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from uuid import UUID

from crater.autoscaler.domain.demand import SlidingMax, TimeSeries
from crater.autoscaler.domain.window import LatencyWindow
from crater.contracts import ScaleDecided, ScaleDirection

# Decisions kept per service for people to read (`crater.v1.query.fleets`).
RECENT_DECISIONS = 100


@dataclass(frozen=True)
class Replica:
    first_seen: float
    last_seen: float
    task_id: str | None


@dataclass(frozen=True)
class Drain:
    replica_id: str
    task_id: str | None
    deadline: float
    decision_id: UUID


@dataclass
class ServiceState:
    window: LatencyWindow  # time to first token, as the replicas report it
    # Queueing delay (arrival to first scheduled), from replicas that report it: what more
    # replicas shorten. None until one does.
    queueing: LatencyWindow | None = None
    # Time to first token less each prompt's allowance (ttft_ms_per_1k_prompt_tokens), from
    # replicas that report prompt lengths and not their queueing. None until one does.
    beyond_prompt: LatencyWindow | None = None
    # Time per output token, from replicas that report it: the second SLO when one is set.
    tpot: LatencyWindow | None = None
    # replica id -> (when, pressure): the latest self-reported pressure of each replica.
    pressures: dict[str, tuple[float, float]] = field(default_factory=dict)
    # replica id -> (when, KV cache in use): the latest its engine reported (a scraped vLLM).
    kv_cache: dict[str, tuple[float, float]] = field(default_factory=dict)
    # replica id -> (when, requests waiting): the latest admission backlog each reported.
    waiting: dict[str, tuple[float, int]] = field(default_factory=dict)
    # (when, the fleet's backlog) at each sample that reported one, for how fast it grows.
    backlogs: deque[tuple[float, int]] = field(default_factory=deque)
    # replica id -> when it was first and last heard of, and its task.
    seen: dict[str, Replica] = field(default_factory=dict)
    replicas: int | None = None
    replicas_at: float = -math.inf
    last_decision_at: float | None = None
    last_scale_out_at: float | None = None
    # The latest decision's direction, and the load (summed GPU memory pressure) then.
    last_direction: ScaleDirection | None = None
    load_at_decision: float | None = None
    calm_since: float | None = None
    # (when, replicas before) of each scale-out within the rate-limit period.
    growth: deque[tuple[float, int]] = field(default_factory=deque)
    panic_until: float = -math.inf
    panic_peak: int = 0
    # Warm pool: standbys placed (task id -> when placed), and those asked for, not yet placed.
    standby: dict[str, float] = field(default_factory=dict)
    standby_pending: dict[str, float] = field(default_factory=dict)
    # Cold replicas asked for that have not reported yet (task id -> when asked).
    starting: dict[str, float] = field(default_factory=dict)
    draining: dict[str, Drain] = field(default_factory=dict)
    # Demand strategy: summed pressure at each evaluation, and the queue wait of each batch.
    loads: TimeSeries = field(default_factory=lambda: TimeSeries(3600.0))
    waits: TimeSeries = field(default_factory=lambda: TimeSeries(3600.0))
    # The counts the demand asked for over the stabilisation window: scale-in goes to the
    # highest, once they cover a whole window.
    recommendations: SlidingMax = field(default_factory=lambda: SlidingMax(300.0))
    recommending_since: float | None = None
    # The replicas serving, as the latest sample reported it (None: never reported).
    reported_serving: int | None = None
    reported_at: float = -math.inf
    # The fleet's template: the latest of its tasks seen placed. Kept after that replica
    # ends (the scheduler keeps every task's request), so a fleet whose replicas all came and
    # went still names a request to copy.
    template: str | None = None
    # What the latest sample batch left (read by people, not by the decisions): the window's
    # p95 and size, the pressures and their source, when it came; and the latest decisions.
    p95_ms: float | None = None
    samples: int = 0
    pressure: float | None = None
    mean_pressure: float | None = None
    pressure_source: str | None = None
    panic: bool = False
    heard_at: float | None = None
    decisions: deque[ScaleDecided] = field(default_factory=lambda: deque(maxlen=RECENT_DECISIONS))

    def judged(self) -> LatencyWindow:
        """The latencies the decisions judge: the queueing delays while the window holds
        some (prefill is no reason to scale), else time to first token less each prompt's
        allowance when that SLO is set and prompts reported, else time to first token."""
        if self.queueing is not None and len(self.queueing):
            return self.queueing
        if self.beyond_prompt is not None and len(self.beyond_prompt):
            return self.beyond_prompt
        return self.window

    @property
    def judged_measure(self) -> str:
        """What `judged` holds, as the reasons name it."""
        judged = self.judged()
        if judged is self.queueing:
            return "queueing p95"
        if judged is self.beyond_prompt:
            return "p95 beyond the prompt's allowance"
        return "p95"

    def backlog(self, since: float) -> int | None:
        """The requests waiting for admission across the fleet: the latest count of each
        replica that reported one after `since`; None when none did (replicas that do not
        export it)."""
        counts = [n for at, n in self.waiting.values() if at > since]
        return sum(counts) if counts else None

    def backlog_growth(self, since: float, now: float, least_span: float) -> float | None:
        """How fast the fleet's backlog grew over (since, now], requests per second: its
        latest value against the first one recorded after `since`, over at least
        `least_span` seconds; None without two such points."""
        first = next(((at, n) for at, n in self.backlogs if at > since), None)
        if first is None:
            return None
        last_at, last = self.backlogs[-1]
        span = last_at - first[0]
        if span < least_span:
            return None
        return (last - first[1]) / span

    def members(self) -> list[tuple[float, str, str | None]]:
        """The fleet as known by name, (since, replica id, task id) each: the replicas heard
        of (a silent one is idle, not gone: it stays until its allocation is released) and
        those asked for and not heard of yet; not those draining, nor standbys."""
        known = [
            (info.first_seen, name, info.task_id)
            for name, info in self.seen.items()
            if name not in self.draining and info.task_id not in self.standby
        ]
        known += [
            (asked, task, task)
            for task, asked in self.starting.items()
            if task not in self.draining and task not in self.seen
        ]
        return known

    def fleet_size(self) -> int | None:
        """The replicas of the fleet (serving or starting), from what is known of it: its
        members by name; or, when a count reported since the latest decision says more
        serve (some serve unnamed), that count and those starting. None: no replica known
        by name, only counts."""
        if not self.seen:
            return None
        known = self.members()
        reported = self.reported_serving
        if reported is None or (
            self.last_decision_at is not None and self.reported_at <= self.last_decision_at
        ):
            return len(known)
        return max(len(known), reported + self.unheard())

    def unheard(self) -> int:
        """Replicas asked for and not heard of yet (loading, or idle since they started)."""
        return sum(1 for task in self.starting if task not in self.seen)
