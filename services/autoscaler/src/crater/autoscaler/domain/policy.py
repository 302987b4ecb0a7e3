"""Autoscaling per inference service, driven only by the events it is fed.

Two strategies (`ScalingPolicy.strategy`):

- 'demand' (the default): the count the load needs by Little's law (domain/demand.py): the
  summed GPU memory pressure of the serving replicas over `target_pressure`, times
  `1 + mean queue wait / drain_seconds` for the requests queued, averaged over
  `demand_window_seconds` (the panic window in a panic). Scale out as soon as that is more
  than the replicas serving plus those still starting (so a scale-out is not asked twice
  while replicas load, and it comes before p95 crosses the SLO); scale in, no sooner than
  `cooldown_seconds` after the last decision and never while p95 is over the scale-out line or
  a panic holds, to the highest count the arrivals asked for over the stabilisation window
  (HPA's scale-down rule; the queue's share is left out, since a backlog once served is
  gone), at most `max_scale_in_step` at a time. Without any pressure reading it falls back
  to the rule.
- 'rule': the field's rule, below.

The field's rule: scale out when p95 latency > 200 ms AND GPU memory pressure > 0.8; scale in
when p95 < 100 ms AND pressure < 0.3. Scale-in waits until the calm has held for the
stabilisation window (300 s); scale-out waits out a cooldown (15 s) after the last scale-out.
Every decision is judged on samples that arrived after the previous decision, so the effect of
one decision is measured before the next is taken, and a burst does not produce a decision per
sample.

On top of the rule (rate limits, panic, warm pool, pressure sources and drains serve both):

- Proportional count (HPA): a scale-out asks for ceil(current * p95 / target); a scale-in
  goes towards the count that keeps both metrics under the scale-out line.
- Rate limits: a scale-out at most multiplies the fleet by `max_scale_out_factor`, and over
  any `scale_out_period_seconds` the fleet grows by at most max(+N, xk) of its size at the
  period's start; a scale-in removes at most `max_scale_in_step` replicas per stabilisation
  window.
- Panic (after Knative): when p95 over the short `panic_window_seconds` passes
  `panic_p95_ms`, scale out at once, ahead of the cooldown and whatever the pressure (a burst
  queues requests before it fills memory), and take no scale-in until the panic has been
  over for `panic_hold_seconds`.
- Warm pool: `warm_pool_size` standby replicas are kept placed; a scale-out promotes them
  first (the decision names them) and asks for the rest cold, then refills the pool.
- Scale-out judges the highest pressure among the replicas, scale-in the mean: after a
  scale-in the load spreads over the replicas that stay.
- Pressure from the GPUs each replica holds: `allocation_granted` says which GPUs a replica's
  task holds, `node_metrics` their memory; a replica's own reported pressure is the fallback.
- Drain before release: a scale-in names the replica to drain; its allocation is released
  (`ReplicaReleaseRequested`) when it reports drained, or when `drain_timeout_seconds` pass.

Time is always the events' own `occurred_at` (or the `now` handed to `tick`): no clock.
"""

from __future__ import annotations

import math
import re
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from uuid import UUID

from crater.autoscaler.domain.demand import Demand, SlidingMax, TimeSeries
from crater.autoscaler.domain.window import LatencyWindow
from crater.contracts import (
    Event,
    LatencySamplesReported,
    ReplicaDrained,
    ReplicaReleaseRequested,
    ReplicasRequested,
    ScaleDecided,
    ScaleDirection,
    derived_event_id,
)

QUANTILE = 0.95
STRATEGIES = ("demand", "rule")
ANONYMOUS_REPLICA = ""
_NOT_TASK_ID = re.compile(r"[^A-Za-z0-9._:-]+")


@dataclass(frozen=True)
class ScalingPolicy:
    scale_out_p95_ms: float = 200.0
    scale_out_pressure: float = 0.8
    scale_in_p95_ms: float = 100.0
    scale_in_pressure: float = 0.3
    window_seconds: float = 60.0
    stabilisation_seconds: float = 300.0
    cooldown_seconds: float = 15.0
    min_replicas: int = 1
    max_replicas: int = 16
    # One slow request is not a trend: scale-out needs this many samples as evidence.
    # Scale-in needs no minimum, since few requests is itself a sign of low load.
    min_samples: int = 10
    max_samples: int = 50_000
    # A scale-out adds at least one replica and at most multiplies the fleet by this.
    max_scale_out_factor: float = 2.0
    # Over any period, the fleet grows by at most max(+N, xk) of its size at the period's
    # start (HPA's scale-up policies, 'select max').
    scale_out_period_seconds: float = 60.0
    scale_out_period_replicas: int = 8
    scale_out_period_factor: float = 4.0
    # A scale-in removes at most this many replicas (rule: once per stabilisation window;
    # demand: a cooldown apart).
    max_scale_in_step: int = 1
    # None: scale in only on the field's rule (p95 < 100 ms and pressure < 0.3). A share
    # (e.g. 0.7): also when fewer replicas would keep p95 and the mean pressure within this
    # share of the scale-out lines, so a fleet grown for a burst does not stay oversized
    # through a busy day where pressure never drops under 0.3.
    scale_in_headroom: float | None = None
    # Panic mode; None turns it off.
    panic_p95_ms: float | None = 400.0
    panic_window_seconds: float = 6.0
    panic_hold_seconds: float = 60.0
    # Standby replicas kept placed and loaded, promoted first on a scale-out.
    warm_pool_size: int = 0
    # A draining replica is released after this long even if it never reports drained.
    drain_timeout_seconds: float = 60.0
    # A requested replica that never reports is no longer counted as on its way after this.
    replica_start_timeout_seconds: float = 600.0
    # 'demand' (the default): size the fleet by Little's law to hold the mean GPU memory
    # pressure at `target_pressure`, plus the queue (see domain/demand.py); scale-in to the
    # highest count the stabilisation window asked for. 'rule': the field's rule alone.
    strategy: str = "demand"
    target_pressure: float = 0.8
    # The demand strategy serves the queue as well as the arrivals within this long.
    drain_seconds: float = 60.0
    # The demand strategy averages pressure and queue wait over this (the stable window).
    demand_window_seconds: float = 30.0

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}")
        if not 0 < self.target_pressure <= 1:
            raise ValueError("target_pressure must be in (0, 1]")
        if self.drain_seconds <= 0 or self.demand_window_seconds <= 0:
            raise ValueError("drain_seconds and demand_window_seconds must be positive")
        if not 0 < self.scale_in_p95_ms <= self.scale_out_p95_ms:
            raise ValueError("need 0 < scale_in_p95_ms <= scale_out_p95_ms")
        if not 0 <= self.scale_in_pressure <= self.scale_out_pressure <= 1:
            raise ValueError("need 0 <= scale_in_pressure <= scale_out_pressure <= 1")
        if not 0 <= self.min_replicas <= self.max_replicas:
            raise ValueError("need 0 <= min_replicas <= max_replicas")
        if self.window_seconds <= 0 or self.stabilisation_seconds < 0 or self.cooldown_seconds < 0:
            raise ValueError("windows must be positive and cooldowns not negative")
        if self.min_samples < 1 or self.max_samples < 1:
            raise ValueError("min_samples and max_samples must be at least 1")
        if self.max_scale_out_factor < 1 or self.scale_out_period_factor < 1:
            raise ValueError("max_scale_out_factor and scale_out_period_factor must be at least 1")
        if self.scale_out_period_seconds < 0 or self.scale_out_period_replicas < 1:
            raise ValueError(
                "scale_out_period_seconds must not be negative and "
                "scale_out_period_replicas must be at least 1"
            )
        if self.max_scale_in_step < 1:
            raise ValueError("max_scale_in_step must be at least 1")
        if self.scale_in_headroom is not None and not 0 < self.scale_in_headroom <= 1:
            raise ValueError("scale_in_headroom must be in (0, 1]")
        if self.panic_p95_ms is not None and self.panic_p95_ms < self.scale_out_p95_ms:
            raise ValueError("need panic_p95_ms >= scale_out_p95_ms")
        if not 0 < self.panic_window_seconds <= self.window_seconds:
            raise ValueError("need 0 < panic_window_seconds <= window_seconds")
        if self.panic_hold_seconds < 0 or self.drain_timeout_seconds < 0:
            raise ValueError("panic_hold_seconds and drain_timeout_seconds must not be negative")
        if self.replica_start_timeout_seconds <= 0:
            raise ValueError("replica_start_timeout_seconds must be positive")
        if self.warm_pool_size < 0:
            raise ValueError("warm_pool_size must not be negative")


@dataclass(frozen=True)
class Assessment:
    """What one sample batch left behind: the service's numbers now, and any decision."""

    service: str
    p95_ms: float | None
    samples: int
    pressure: float | None
    replicas: int
    decision: ScaleDecided | None = None
    # The same event was seen before (a redelivery): nothing was counted again, and the
    # decision, if any, is the one taken the first time (same event id, so JetStream drops a
    # second copy).
    duplicate: bool = False
    # What else to publish, after the decision: replicas to place, allocations to release.
    requests: tuple[Event, ...] = ()
    panic: bool = False

    @property
    def events(self) -> tuple[Event, ...]:
        """Everything to publish, in order."""
        return ((self.decision,) if self.decision else ()) + self.requests


@dataclass(frozen=True)
class _Replica:
    first_seen: float
    last_seen: float
    task_id: str | None


@dataclass(frozen=True)
class _Drain:
    replica_id: str
    task_id: str | None
    deadline: float
    decision_id: UUID


@dataclass
class _ServiceState:
    window: LatencyWindow
    # replica id -> (when, pressure): the latest self-reported pressure of each replica.
    pressures: dict[str, tuple[float, float]] = field(default_factory=dict)
    # replica id -> when it was first and last heard of, and its task.
    seen: dict[str, _Replica] = field(default_factory=dict)
    replicas: int | None = None
    replicas_at: float = -math.inf
    last_decision_at: float | None = None
    last_scale_out_at: float | None = None
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
    draining: dict[str, _Drain] = field(default_factory=dict)
    # Demand strategy: summed pressure at each evaluation, and the queue wait of each batch.
    loads: TimeSeries = field(default_factory=lambda: TimeSeries(3600.0))
    waits: TimeSeries = field(default_factory=lambda: TimeSeries(3600.0))
    # The counts the demand asked for over the stabilisation window: scale-in goes to the
    # highest, once they cover a whole window.
    recommendations: SlidingMax = field(default_factory=lambda: SlidingMax(300.0))
    recommending_since: float | None = None
    # The replicas serving, as the latest sample reported it (None: never reported).
    reported_serving: int | None = None
    # The fleet's template: the latest of its tasks seen placed. Kept after that replica
    # ends (the scheduler keeps every task's request), so a fleet whose replicas all came and
    # went still names a request to copy.
    template: str | None = None


class Autoscaler:
    """Per-service windows and the rule. State changes only through `observe`,
    `allocation_granted`, `allocation_released`, `node_metrics`, `replica_drained` and
    `tick`, each given the time it happened."""

    def __init__(self, policy: ScalingPolicy | None = None, remember_events: int = 10_000) -> None:
        self.policy = policy or ScalingPolicy()
        self._services: dict[str, _ServiceState] = {}
        self._seen: OrderedDict[UUID, Assessment] = OrderedDict()
        self._remember_events = remember_events
        # task id -> (node, GPU indexes) of every live allocation.
        self._allocations: dict[str, tuple[str, tuple[int, ...]]] = {}
        # node -> (when, GPU index -> memory pressure) from the latest node metrics.
        self._gpu_pressure: dict[str, tuple[float, dict[int, float]]] = {}
        self._service_of_task: dict[str, str] = {}

    def replicas(self, service: str) -> int:
        """The replica count believed now: the latest of a decision and a reported count."""
        state = self._services.get(service)
        if state is None or state.replicas is None:
            return self.policy.min_replicas
        return state.replicas

    def warm_pool(self, service: str) -> list[str]:
        """The standbys placed for a service, oldest first."""
        state = self._services.get(service)
        return [] if state is None else sorted(state.standby, key=lambda t: (state.standby[t], t))

    def gpu_pressure_of(self, task_id: str) -> float | None:
        """The highest memory pressure among the GPUs a task holds, by the latest metrics."""
        return self._gpus_pressure(task_id, -math.inf)

    def draining(self, service: str) -> list[str]:
        state = self._services.get(service)
        return [] if state is None else sorted(state.draining)

    # -- inputs other than samples -------------------------------------------------------

    def allocation_granted(
        self, task_id: str, node: str, gpu_ids: Sequence[int], at: float
    ) -> None:
        """A task was placed: remember its GPUs; a requested standby joins the warm pool."""
        self._allocations[task_id] = (node, tuple(gpu_ids))
        service = self._service_of_task.get(task_id)
        state = self._services.get(service) if service else None
        if state is None:
            return
        state.template = task_id
        if state.standby_pending.pop(task_id, None) is not None:
            state.standby[task_id] = at

    def allocation_released(self, task_id: str) -> None:
        self._allocations.pop(task_id, None)
        service = self._service_of_task.pop(task_id, None)
        state = self._services.get(service) if service else None
        if state is None:
            return
        state.standby.pop(task_id, None)
        state.standby_pending.pop(task_id, None)
        state.starting.pop(task_id, None)
        for replica, info in list(state.seen.items()):
            if info.task_id == task_id or replica == task_id:
                del state.seen[replica]
                state.pressures.pop(replica, None)
                state.draining.pop(replica, None)

    def node_metrics(self, node: str, at: float, gpu_pressure: dict[int, float]) -> None:
        """The memory pressure (used/total) of each GPU of a node, as the probe measured it."""
        previous = self._gpu_pressure.get(node)
        if previous is None or at >= previous[0]:
            self._gpu_pressure[node] = (at, dict(gpu_pressure))

    def replica_drained(self, event: ReplicaDrained) -> list[Event]:
        """A draining replica finished its requests: ask for its allocation's release."""
        state = self._services.get(event.service)
        if state is None or event.in_flight > 0:
            return []
        drain = state.draining.pop(event.replica_id, None)
        if drain is None:
            return []
        return [self._release(event.service, drain, drained=True, at=event.occurred_at)]

    def tick(self, now: float) -> list[Event]:
        """Time passed (a timer in the service, the clock of a simulation): release the
        replicas whose drain timed out."""
        released: list[Event] = []
        for name in sorted(self._services):
            released += self._expire_drains(name, self._services[name], now)
        return released

    # -- samples --------------------------------------------------------------------------

    def observe(self, sample: LatencySamplesReported) -> Assessment:
        earlier = self._seen.get(sample.event_id)
        if earlier is not None:
            return replace(earlier, duplicate=True)
        assessment = self._observe(sample)
        self._seen[sample.event_id] = assessment
        if len(self._seen) > self._remember_events:
            self._seen.popitem(last=False)
        return assessment

    def _observe(self, sample: LatencySamplesReported) -> Assessment:
        policy = self.policy
        state = self._services.get(sample.service)
        if state is None:
            horizon = max(policy.demand_window_seconds, policy.panic_window_seconds)
            state = _ServiceState(
                LatencyWindow(policy.window_seconds, policy.max_samples),
                loads=TimeSeries(horizon),
                waits=TimeSeries(horizon),
                recommendations=SlidingMax(policy.stabilisation_seconds),
            )
            self._services[sample.service] = state

        at = sample.occurred_at.timestamp()
        state.window.add(at, sample.latencies_ms)
        # The newest time seen is 'now': a late sample must not move time backwards.
        now = state.window.latest
        cutoff = now - policy.window_seconds
        self._record_replica(state, sample, at, cutoff)
        if sample.replicas is not None and at >= state.replicas_at:
            state.replicas, state.replicas_at = sample.replicas, at
            state.reported_serving = sample.replicas
        # Queueing shows as time to first token beyond the fast (scale-in) line.
        fast = policy.scale_in_p95_ms
        waited = sum(v - fast for v in sample.latencies_ms if v > fast) / 1000
        state.waits.add(now, waited, len(sample.latencies_ms))
        requests: list[Event] = self._expire_drains(sample.service, state, now)
        self._forget_slow_starters(state, now)

        pressure, mean_pressure, source = self._pressure(state, cutoff)
        current = self.replicas(sample.service)
        whole = state.window.percentile(QUANTILE)
        p95_ms, samples = whole if whole else (None, 0)
        assessment = Assessment(sample.service, p95_ms, samples, pressure, current)

        # Judge on what happened since the last decision, within the window.
        since = state.last_decision_at
        if since is None or since <= cutoff:
            evidence = whole
        else:
            evidence = state.window.percentile(QUANTILE, since=since)
        panic_p95 = self._panic_p95(state, now)
        panicking = panic_p95 is not None
        if panicking:
            state.panic_until = now + policy.panic_hold_seconds
        elif now >= state.panic_until:
            state.panic_peak = 0
        held = now < state.panic_until  # no scale-in while panicking or just after

        decision: ScaleDecided | None = None
        if policy.strategy == "demand" and mean_pressure is not None:
            decision = self._decide_by_demand(
                state, sample, now, evidence, panic_p95, held, mean_pressure
            )
        else:  # the rule, also when no pressure is known (its panic needs none)
            decision = self._decide_by_rule(
                state, sample, now, current, evidence, panic_p95, held, pressure, mean_pressure
            )

        if decision is not None:
            decision = decision.model_copy(update={"pressure_source": source})
            decision, carried = self._carry_out(state, sample, decision, now)
            requests += carried
            state.last_decision_at = now
            state.calm_since = None
            state.replicas, state.replicas_at = decision.desired_replicas, now
            if decision.direction is ScaleDirection.OUT:
                state.last_scale_out_at = now
                state.growth.append((now, current))
                if decision.panic:
                    state.panic_peak = max(state.panic_peak, decision.desired_replicas)
            assessment = replace(assessment, replicas=decision.desired_replicas)
        requests += self._fill_warm_pool(state, sample, now)
        return replace(
            assessment, decision=decision, requests=tuple(requests), panic=panicking or held
        )

    # -- the parts ------------------------------------------------------------------------

    def _decide_by_rule(
        self,
        state: _ServiceState,
        sample: LatencySamplesReported,
        now: float,
        current: int,
        evidence: tuple[float, int] | None,
        panic_p95: float | None,
        held: bool,
        pressure: float | None,
        mean_pressure: float | None,
    ) -> ScaleDecided | None:
        """The field's rule: out on p95 and the highest pressure over their lines (or panic),
        in once p95 and the mean pressure stayed under theirs for the stabilisation window."""
        policy = self.policy
        panicking = panic_p95 is not None
        decision: ScaleDecided | None = None
        if evidence is None or (pressure is None and not panicking):
            state.calm_since = None  # unknown pressure is not calm
        else:
            p95, count = evidence
            hot = pressure is not None and (
                p95 > policy.scale_out_p95_ms and pressure > policy.scale_out_pressure
            )
            calm = (
                pressure is not None
                and not held
                and mean_pressure is not None
                and (
                    (p95 < policy.scale_in_p95_ms and mean_pressure < policy.scale_in_pressure)
                    or self._oversized(current, p95, mean_pressure)
                )
            )
            if not calm:
                state.calm_since = None
            elif state.calm_since is None:
                state.calm_since = now
            if panic_p95 is not None:
                decision = self._scale_out(
                    state, sample, now, current, max(p95, panic_p95), pressure, count, panic=True
                )
            if decision is None and hot:
                decision = self._scale_out(state, sample, now, current, p95, pressure, count)
            elif decision is None and calm and mean_pressure is not None:
                decision = self._scale_in(state, sample, now, current, p95, mean_pressure, count)

        return decision

    def _decide_by_demand(
        self,
        state: _ServiceState,
        sample: LatencySamplesReported,
        now: float,
        evidence: tuple[float, int] | None,
        panic_p95: float | None,
        held: bool,
        mean_pressure: float,
    ) -> ScaleDecided | None:
        """Out when the demand (domain/demand.py) needs more replicas than serve or start;
        in to the highest count the demand asked for over the stabilisation window."""
        policy = self.policy
        serving = self._serving(state)
        starting = len(state.starting)
        provisioned = serving + starting
        if serving > 0:
            state.loads.add(now, mean_pressure * serving)
        panic = panic_p95 is not None
        # In a panic the short window decides, so the count follows the burst at once.
        since = now - (policy.panic_window_seconds if panic else policy.demand_window_seconds)
        load = state.loads.mean(since)
        if load is None or evidence is None:
            return None
        waited, started = state.waits.sums(since)
        demand = Demand(
            load,
            waited / started if started else 0.0,
            policy.target_pressure,
            policy.drain_seconds,
            wait_growth=_wait_growth(state.waits, since, now),
        )
        wanted = demand.desired(policy.min_replicas, policy.max_replicas)
        if state.recommending_since is None:
            state.recommending_since = now
        state.recommendations.add(
            now, demand.desired_for_arrivals(policy.min_replicas, policy.max_replicas)
        )
        p95, count = evidence
        counts = f"{serving} serving + {starting} starting"
        if wanted > provisioned:
            last = state.last_scale_out_at
            if not panic and last is not None and now - last < policy.cooldown_seconds:
                return None
            desired, limited_by = self._limit_scale_out(state, now, provisioned, wanted)
            if desired <= provisioned:
                return None
            head = (
                f"panic: p95 {panic_p95:.1f} ms > {policy.panic_p95_ms:g} ms over the last "
                f"{policy.panic_window_seconds:g} s; "
                if panic_p95 is not None
                else ""
            )
            reason = (
                f"{head}{demand.explain()} over the last "
                f"{now - since:g} s: {provisioned} ({counts}) -> {desired} replicas"
            )
            direction = ScaleDirection.OUT
        else:
            if held or p95 >= policy.scale_out_p95_ms:
                return None  # no scale-in in or just after a panic, nor while slow
            calm_for = now - state.recommending_since
            if calm_for < policy.stabilisation_seconds:
                return None  # not yet a whole window of recommendations
            last = state.last_decision_at
            if last is not None and now - last < policy.cooldown_seconds:
                return None
            # The window holds the arrivals' counts; never below what the demand (queue
            # included) asks for now, or the next sample would scale straight back out.
            highest = max(state.recommendations.largest() or wanted, wanted)
            if highest >= provisioned or serving == 0:
                return None
            desired = max(highest, provisioned - policy.max_scale_in_step, policy.min_replicas)
            limited_by = None if desired == highest else f"-{policy.max_scale_in_step} per scale-in"
            reason = (
                f"{demand.explain()}; the most the arrivals asked for over the stabilisation "
                f"window ({policy.stabilisation_seconds:g} s) is {highest}: "
                f"{provisioned} ({counts}) -> {desired} replicas"
            )
            direction = ScaleDirection.IN
        if limited_by is not None:
            reason += f" ({limited_by})"
        return self._decision(
            sample,
            direction,
            provisioned,
            desired,
            p95,
            mean_pressure,
            count,
            reason,
            panic=panic and direction is ScaleDirection.OUT,
            proportional=wanted,
            limited_by=limited_by,
        )

    def _serving(self, state: _ServiceState) -> int:
        """Replicas taking traffic: as reported, else those heard of and not draining."""
        if state.reported_serving is not None:
            return state.reported_serving
        heard = sum(1 for name in state.seen if name not in state.draining)
        return heard or (state.replicas or self.policy.min_replicas)

    def _limit_scale_out(
        self, state: _ServiceState, now: float, current: int, wanted: int
    ) -> tuple[int, str | None]:
        """`wanted` capped by max_replicas and the per-decision and per-period rate limits;
        and the limit that capped it, if one did."""
        policy = self.policy
        limits = [
            (policy.max_replicas, f"max {policy.max_replicas}"),
            (
                max(current + 1, math.floor(current * policy.max_scale_out_factor)),
                f"x{policy.max_scale_out_factor:g} per decision",
            ),
            (self._period_ceiling(state, now, current), self._period_label()),
        ]
        desired, limited_by = wanted, None
        for ceiling, label in limits:
            if ceiling < desired:
                desired, limited_by = ceiling, label
        return desired, limited_by

    def _record_replica(
        self, state: _ServiceState, sample: LatencySamplesReported, at: float, cutoff: float
    ) -> None:
        replica = sample.replica_id or ANONYMOUS_REPLICA
        if sample.replica_id:
            task = sample.task_id or sample.replica_id
            known = state.seen.get(replica)
            first = known.first_seen if known else at
            last = max(at, known.last_seen) if known else at
            state.seen[replica] = _Replica(min(first, at), last, task)
            self._service_of_task.setdefault(task, sample.service)
            state.starting.pop(task, None)
            state.standby.pop(task, None)  # a standby that serves has been promoted
        for name in [r for r, info in state.seen.items() if info.last_seen <= cutoff]:
            if name not in state.draining:
                del state.seen[name]
        if sample.gpu_memory_pressure is None or at <= cutoff:
            return
        previous = state.pressures.get(replica)
        if previous is None or at >= previous[0]:
            state.pressures[replica] = (at, sample.gpu_memory_pressure)

    def _pressure(
        self, state: _ServiceState, cutoff: float
    ) -> tuple[float | None, float | None, str | None]:
        """(highest, mean, source) of the pressure of the service's replicas heard of within
        the window. Scale-out looks at the highest (one replica near its memory limit is
        enough); scale-in at the mean (the load spreads over the replicas that stay), so one
        replica's long request does not hold a whole fleet at its size. A replica's GPUs (from
        its allocation and the node's metrics) come first; its own report is the fallback."""
        for replica in [r for r, (at, _) in state.pressures.items() if at <= cutoff]:
            del state.pressures[replica]
        values: list[float] = []
        sources: set[str] = set()
        measured: set[str] = set()
        for replica, info in state.seen.items():
            gpus = self._gpus_pressure(info.task_id, cutoff)
            if gpus is not None:
                values.append(gpus)
                sources.add("node-metrics")
                measured.add(replica)
        for replica, (_, reported) in state.pressures.items():
            if replica not in measured:
                values.append(reported)
                sources.add("samples")
        if not values:
            return None, None, None
        source = sources.pop() if len(sources) == 1 else "mixed"
        return max(values), sum(values) / len(values), source

    def _gpus_pressure(self, task_id: str | None, cutoff: float) -> float | None:
        allocation = self._allocations.get(task_id) if task_id else None
        if allocation is None or not allocation[1]:
            return None
        node, gpu_ids = allocation
        metrics = self._gpu_pressure.get(node)
        if metrics is None or metrics[0] <= cutoff:
            return None
        found = [metrics[1][g] for g in gpu_ids if g in metrics[1]]
        return max(found) if found else None

    def _panic_p95(self, state: _ServiceState, now: float) -> float | None:
        """p95 over the short panic window (new samples only) when it is over the panic
        threshold on enough samples; else None."""
        policy = self.policy
        if policy.panic_p95_ms is None:
            return None
        since = now - policy.panic_window_seconds
        if state.last_decision_at is not None:
            since = max(since, state.last_decision_at)
        short = state.window.percentile(QUANTILE, since=since)
        if short is None or short[1] < policy.min_samples or short[0] <= policy.panic_p95_ms:
            return None
        return short[0]

    def _scale_out(
        self,
        state: _ServiceState,
        sample: LatencySamplesReported,
        now: float,
        current: int,
        p95: float,
        pressure: float | None,
        count: int,
        *,
        panic: bool = False,
    ) -> ScaleDecided | None:
        policy = self.policy
        if count < policy.min_samples or current >= policy.max_replicas:
            return None
        last = state.last_scale_out_at
        if not panic and last is not None and now - last < policy.cooldown_seconds:
            return None
        # Grow in proportion to how far p95 is over the line, between +1 and the caps.
        proportional = max(current + 1, math.ceil(current * p95 / policy.scale_out_p95_ms))
        desired, limited_by = self._limit_scale_out(state, now, current, proportional)
        if desired <= current:
            return None
        if panic and desired <= state.panic_peak:
            return None  # this panic already asked for as many: wait for them to serve
        shown = "unknown" if pressure is None else f"{pressure:.2f}"
        if panic:
            reason = (
                f"panic: p95 {p95:.1f} ms > {policy.panic_p95_ms:g} ms over the last "
                f"{policy.panic_window_seconds:g} s (GPU memory pressure {shown}), "
                f"ahead of the cooldown, over {count} samples: {current} -> {desired} replicas"
            )
        else:
            reason = (
                f"p95 {p95:.1f} ms > {policy.scale_out_p95_ms:g} ms and GPU memory pressure "
                f"{shown} > {policy.scale_out_pressure:g} over {count} samples: "
                f"{current} -> {desired} replicas"
            )
        if limited_by is not None:
            reason += f" ({limited_by})"
        return self._decision(
            sample,
            ScaleDirection.OUT,
            current,
            desired,
            p95,
            pressure,
            count,
            reason,
            panic=panic,
            proportional=proportional,
            limited_by=limited_by,
        )

    def _period_label(self) -> str:
        policy = self.policy
        return (
            f"+{policy.scale_out_period_replicas} or x{policy.scale_out_period_factor:g} "
            f"per {policy.scale_out_period_seconds:g} s"
        )

    def _period_ceiling(self, state: _ServiceState, now: float, current: int) -> int:
        policy = self.policy
        while state.growth and state.growth[0][0] <= now - policy.scale_out_period_seconds:
            state.growth.popleft()
        base = min([current, *(before for _, before in state.growth)])
        return max(
            base + policy.scale_out_period_replicas,
            math.floor(base * policy.scale_out_period_factor),
        )

    def _scale_in(
        self,
        state: _ServiceState,
        sample: LatencySamplesReported,
        now: float,
        current: int,
        p95: float,
        pressure: float,
        count: int,
    ) -> ScaleDecided | None:
        policy = self.policy
        if state.calm_since is None or current <= policy.min_replicas:
            return None
        calm_for = now - state.calm_since
        if calm_for < policy.stabilisation_seconds:
            return None
        # Proportionally, the fleet could shrink to what keeps both metrics under the
        # scale-out line (times the headroom, when set); the step is capped, and the next
        # scale-in needs a fresh stabilisation window, so the smaller fleet proves itself
        # before shrinking again.
        proportional = self._shrink_to(current, p95, pressure)
        desired = max(policy.min_replicas, current - policy.max_scale_in_step, proportional)
        desired = min(desired, current - 1)
        limited_by = None
        if desired > proportional:
            limited_by = f"-{policy.max_scale_in_step} per stabilisation window"
        if p95 < policy.scale_in_p95_ms and pressure < policy.scale_in_pressure:
            why = (
                f"p95 {p95:.1f} ms < {policy.scale_in_p95_ms:g} ms and mean GPU memory "
                f"pressure {pressure:.2f} < {policy.scale_in_pressure:g}"
            )
        else:
            why = (
                f"p95 {p95:.1f} ms and mean GPU memory pressure {pressure:.2f} fit "
                f"{proportional} replicas at {policy.scale_in_headroom:g} of the scale-out line"
            )
        reason = (
            f"{why} for {calm_for:.0f} s (stabilisation {policy.stabilisation_seconds:g} s) "
            f"over {count} samples: {current} -> {desired} replicas"
        )
        return self._decision(
            sample,
            ScaleDirection.IN,
            current,
            desired,
            p95,
            pressure,
            count,
            reason,
            proportional=proportional,
            limited_by=limited_by,
        )

    def _shrink_to(self, current: int, p95: float, pressure: float) -> int:
        policy = self.policy
        load = max(p95 / policy.scale_out_p95_ms, pressure / policy.scale_out_pressure)
        return max(policy.min_replicas, math.ceil(current * load / (policy.scale_in_headroom or 1)))

    def _oversized(self, current: int, p95: float, pressure: float) -> bool:
        """With a headroom set: the fleet would stay within that share of both scale-out
        lines with fewer replicas (HPA's proportional rule, on the way down)."""
        if self.policy.scale_in_headroom is None:
            return False
        return self._shrink_to(current, p95, pressure) < current

    def _carry_out(
        self,
        state: _ServiceState,
        sample: LatencySamplesReported,
        decision: ScaleDecided,
        now: float,
    ) -> tuple[ScaleDecided, list[Event]]:
        """Name the standbys to promote and ask for the rest cold (scale-out), or name the
        replicas to drain (scale-in). Returns the completed decision and what to publish
        beside it."""
        requests: list[Event] = []
        if decision.direction is ScaleDirection.OUT:
            wanted = decision.desired_replicas - decision.current_replicas
            if self.policy.strategy == "rule":
                # The rule counts the replicas serving: a target repeated while its replicas
                # still start asks for nothing twice. (The demand count includes them.)
                wanted -= len(state.starting)
            promoted = self.warm_pool(sample.service)[: max(0, wanted)]
            for task in promoted:
                del state.standby[task]
                state.starting[task] = now
            cold = max(0, wanted - len(promoted))
            if cold:
                ids = _task_ids(sample.service, decision.event_id, "replica", cold)
                template = self._template(state)
                for task in ids:
                    state.starting[task] = now
                    self._service_of_task[task] = sample.service
                requests.append(
                    ReplicasRequested(
                        event_id=derived_event_id(decision.event_id, "replicas-requested"),
                        occurred_at=decision.occurred_at,
                        service=sample.service,
                        task_ids=ids,
                        template_task_id=template,
                        standby=False,
                        decision_id=decision.event_id,
                        reason=f"scale-out {decision.current_replicas} -> "
                        f"{decision.desired_replicas}: {len(promoted)} from the warm pool, "
                        f"{cold} cold{_copying(template, sample.service)}",
                    )
                )
            if promoted:
                decision = decision.model_copy(
                    update={"from_warm_pool": len(promoted), "promoted_replicas": promoted}
                )
            return decision, requests
        candidates = [
            (info.first_seen, name)
            for name, info in state.seen.items()
            if name not in state.draining and info.task_id not in state.standby
        ]
        removing = decision.current_replicas - decision.desired_replicas
        chosen = [name for _, name in sorted(candidates, reverse=True)[:removing]]
        for name in chosen:
            state.draining[name] = _Drain(
                name,
                state.seen[name].task_id,
                now + self.policy.drain_timeout_seconds,
                decision.event_id,
            )
        return decision.model_copy(update={"drain_replicas": chosen}), requests

    def _fill_warm_pool(
        self, state: _ServiceState, sample: LatencySamplesReported, now: float
    ) -> list[Event]:
        missing = self.policy.warm_pool_size - len(state.standby) - len(state.standby_pending)
        if missing <= 0:
            return []
        event_id = derived_event_id(sample.event_id, "warm-pool")
        ids = _task_ids(sample.service, event_id, "standby", missing)
        template = self._template(state)
        for task in ids:
            state.standby_pending[task] = now
            self._service_of_task[task] = sample.service
        return [
            ReplicasRequested(
                event_id=event_id,
                occurred_at=sample.occurred_at,
                service=sample.service,
                task_ids=ids,
                template_task_id=template,
                standby=True,
                reason=f"warm pool {len(state.standby)}/{self.policy.warm_pool_size} placed"
                f"{_copying(template, sample.service)}",
            )
        ]

    def _template(self, state: _ServiceState) -> str | None:
        """The task whose request new replicas copy: a live placed replica, else the fleet's
        remembered template (placed once; ended perhaps, its request is still stored), else
        a task a replica reports running (say, after a restart, before any grant was seen).
        None only for a fleet never seen placed nor reporting a task: the scheduler then
        copies the service's latest task, or refuses naming the service."""
        reported = sorted(info.task_id for info in state.seen.values() if info.task_id)
        placed = [task for task in reported if task in self._allocations]
        if placed:
            state.template = placed[0]
            return placed[0]
        return state.template or (reported[0] if reported else None)

    def _forget_slow_starters(self, state: _ServiceState, now: float) -> None:
        timeout = self.policy.replica_start_timeout_seconds
        for pending in (state.starting, state.standby_pending):
            for task in [t for t, asked in pending.items() if now - asked >= timeout]:
                del pending[task]

    def _expire_drains(self, service: str, state: _ServiceState, now: float) -> list[Event]:
        overdue = sorted(r for r, d in state.draining.items() if d.deadline <= now)
        at = datetime.fromtimestamp(now, UTC)
        return [
            self._release(service, state.draining.pop(r), drained=False, at=at) for r in overdue
        ]

    def _release(
        self, service: str, drain: _Drain, *, drained: bool, at: datetime
    ) -> ReplicaReleaseRequested:
        state = self._services[service]
        state.seen.pop(drain.replica_id, None)
        state.pressures.pop(drain.replica_id, None)
        how = "drained" if drained else f"drain timed out ({self.policy.drain_timeout_seconds:g} s)"
        return ReplicaReleaseRequested(
            event_id=derived_event_id(drain.decision_id, f"release:{drain.replica_id}"),
            occurred_at=at,
            service=service,
            replica_id=drain.replica_id,
            task_id=drain.task_id,
            drained=drained,
            decision_id=drain.decision_id,
            reason=f"scale-in: {drain.replica_id} {how}",
        )

    @staticmethod
    def _decision(
        sample: LatencySamplesReported,
        direction: ScaleDirection,
        current: int,
        desired: int,
        p95: float,
        pressure: float | None,
        count: int,
        reason: str,
        *,
        panic: bool = False,
        proportional: int | None = None,
        limited_by: str | None = None,
    ) -> ScaleDecided:
        return ScaleDecided(
            # Derived from the sample, so a redelivered sample re-publishes the same id.
            event_id=derived_event_id(sample.event_id, "scale-decided"),
            occurred_at=sample.occurred_at,
            service=sample.service,
            direction=direction,
            current_replicas=current,
            desired_replicas=desired,
            p95_latency_ms=p95,
            gpu_memory_pressure=pressure,
            samples=count,
            reason=reason,
            panic=panic,
            proportional_replicas=proportional,
            limited_by=limited_by,
        )


def _wait_growth(waits: TimeSeries, since: float, now: float) -> float:
    """How fast the mean queue wait grew over (since, now]: its later half against its
    earlier half, in seconds of wait per second."""
    middle = (since + now) / 2
    whole, whole_count = waits.sums(since)
    late, late_count = waits.sums(middle)
    early_count = whole_count - late_count
    if late_count <= 0 or early_count <= 0:
        return 0.0
    return (late / late_count - (whole - late) / early_count) / (now - middle)


def _copying(template: str | None, service: str) -> str:
    """What the replicas copy, in words (never a bare None)."""
    if template is None:
        return f"; no replica of {service} known here: the scheduler copies its latest task"
    return f"; copying {template}"


def _task_ids(service: str, source: UUID, kind: str, count: int) -> list[str]:
    """Task ids for new replicas, derived from the event that asked for them."""
    stem = _NOT_TASK_ID.sub("-", service).strip("-._:")[:80] or "service"
    return [
        f"{stem}-{kind}-{derived_event_id(source, f'{kind}:{i}').hex[:12]}" for i in range(count)
    ]


def gpu_pressures(gpus: Iterable[tuple[int, int, int]]) -> dict[int, float]:
    """(index, used MiB, total MiB) -> index -> used/total, for `Autoscaler.node_metrics`."""
    return {index: (used / total if total else 0.0) for index, used, total in gpus}
