"""The field's autoscaling rule, per inference service, driven only by the samples it is fed.

Scale out when p95 latency > 200 ms AND GPU memory pressure > 0.8; scale in when p95 < 100 ms
AND pressure < 0.3. Scale-in waits until the calm has held for the stabilisation window
(300 s); scale-out waits out a cooldown (15 s) after the last scale-out. Every decision is
judged on samples that arrived after the previous decision, so the effect of one decision is
measured before the next is taken, and a burst does not produce a decision per sample.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from uuid import UUID

from crater.autoscaler.domain.window import LatencyWindow
from crater.contracts import LatencySamplesReported, ScaleDecided, ScaleDirection, derived_event_id

QUANTILE = 0.95
ANONYMOUS_REPLICA = ""


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

    def __post_init__(self) -> None:
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
        if self.max_scale_out_factor < 1:
            raise ValueError("max_scale_out_factor must be at least 1")


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


@dataclass
class _ServiceState:
    window: LatencyWindow
    # replica id -> (when, pressure): the latest report of each replica.
    pressures: dict[str, tuple[float, float]] = field(default_factory=dict)
    replicas: int | None = None
    replicas_at: float = -math.inf
    last_decision_at: float | None = None
    last_scale_out_at: float | None = None
    calm_since: float | None = None


class Autoscaler:
    """Per-service windows and the rule; `observe` is the only way state changes."""

    def __init__(self, policy: ScalingPolicy | None = None, remember_events: int = 10_000) -> None:
        self.policy = policy or ScalingPolicy()
        self._services: dict[str, _ServiceState] = {}
        self._seen: OrderedDict[UUID, Assessment] = OrderedDict()
        self._remember_events = remember_events

    def replicas(self, service: str) -> int:
        """The replica count believed now: the latest of a decision and a reported count."""
        state = self._services.get(service)
        if state is None or state.replicas is None:
            return self.policy.min_replicas
        return state.replicas

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
            state = _ServiceState(LatencyWindow(policy.window_seconds, policy.max_samples))
            self._services[sample.service] = state

        at = sample.occurred_at.timestamp()
        state.window.add(at, sample.latencies_ms)
        # The newest time seen is 'now': a late sample must not move time backwards.
        now = state.window.latest
        cutoff = now - policy.window_seconds
        self._record_pressure(state, sample, at, cutoff)
        if sample.replicas is not None and at >= state.replicas_at:
            state.replicas, state.replicas_at = sample.replicas, at

        pressure = _pressure(state, cutoff)
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
        if evidence is None or pressure is None:
            state.calm_since = None  # unknown pressure is not calm
            return assessment
        p95, count = evidence

        hot = p95 > policy.scale_out_p95_ms and pressure > policy.scale_out_pressure
        calm = p95 < policy.scale_in_p95_ms and pressure < policy.scale_in_pressure
        if not calm:
            state.calm_since = None
        elif state.calm_since is None:
            state.calm_since = now

        decision: ScaleDecided | None = None
        if hot:
            decision = self._scale_out(state, sample, now, current, p95, pressure, count)
        elif calm:
            decision = self._scale_in(state, sample, now, current, p95, pressure, count)
        if decision is None:
            return assessment

        state.last_decision_at = now
        state.calm_since = None
        state.replicas, state.replicas_at = decision.desired_replicas, now
        if decision.direction is ScaleDirection.OUT:
            state.last_scale_out_at = now
        return replace(assessment, replicas=decision.desired_replicas, decision=decision)

    def _record_pressure(
        self, state: _ServiceState, sample: LatencySamplesReported, at: float, cutoff: float
    ) -> None:
        if sample.gpu_memory_pressure is None or at <= cutoff:
            return
        replica = sample.replica_id or ANONYMOUS_REPLICA
        previous = state.pressures.get(replica)
        if previous is None or at >= previous[0]:
            state.pressures[replica] = (at, sample.gpu_memory_pressure)

    def _scale_out(
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
        if count < policy.min_samples or current >= policy.max_replicas:
            return None
        last = state.last_scale_out_at
        if last is not None and now - last < policy.cooldown_seconds:
            return None
        # Grow in proportion to how far p95 is over the line, between +1 and the factor cap.
        proportional = math.ceil(current * p95 / policy.scale_out_p95_ms)
        ceiling = max(current + 1, math.floor(current * policy.max_scale_out_factor))
        desired = min(policy.max_replicas, ceiling, max(current + 1, proportional))
        reason = (
            f"p95 {p95:.1f} ms > {policy.scale_out_p95_ms:g} ms and GPU memory pressure "
            f"{pressure:.2f} > {policy.scale_out_pressure:g} over {count} samples: "
            f"{current} -> {desired} replicas"
        )
        if desired == policy.max_replicas:
            reason += f" (max {policy.max_replicas})"
        return self._decision(
            sample, ScaleDirection.OUT, current, desired, p95, pressure, count, reason
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
        # One replica at a time: the next scale-in needs a fresh stabilisation window, so
        # the smaller fleet proves itself before shrinking again.
        desired = current - 1
        reason = (
            f"p95 {p95:.1f} ms < {policy.scale_in_p95_ms:g} ms and GPU memory pressure "
            f"{pressure:.2f} < {policy.scale_in_pressure:g} for {calm_for:.0f} s "
            f"(stabilisation {policy.stabilisation_seconds:g} s) over {count} samples: "
            f"{current} -> {desired} replicas"
        )
        return self._decision(
            sample, ScaleDirection.IN, current, desired, p95, pressure, count, reason
        )

    @staticmethod
    def _decision(
        sample: LatencySamplesReported,
        direction: ScaleDirection,
        current: int,
        desired: int,
        p95: float,
        pressure: float,
        count: int,
        reason: str,
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
        )


def _pressure(state: _ServiceState, cutoff: float) -> float | None:
    """The highest latest pressure among replicas that reported within the window: one
    replica near its memory limit is enough to count, and a replica gone quiet stops
    counting once its report leaves the window."""
    for replica in [r for r, (at, _) in state.pressures.items() if at <= cutoff]:
        del state.pressures[replica]
    if not state.pressures:
        return None
    return max(pressure for _, pressure in state.pressures.values())
