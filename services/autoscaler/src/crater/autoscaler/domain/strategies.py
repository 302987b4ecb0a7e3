"""The two strategies, each one `decide`: given an evaluation, a scale decision or None.

- `DemandStrategy` ('demand', the default): the count the load needs by Little's law
  (domain/demand.py): the summed GPU memory pressure of the serving replicas over
  `target_pressure`, times `1 + mean queue wait / drain_seconds` for the requests queued,
  averaged over `demand_window_seconds` (the panic window in a panic). Scale out as soon as
  that is more than the replicas serving plus those still starting (so a scale-out is not
  asked twice while replicas load, and it comes before p95 crosses the SLO); scale in, no
  sooner than `cooldown_seconds` after the last decision and never while p95 is over the
  scale-out line or a panic holds, to the highest count the arrivals asked for over the
  stabilisation window (HPA's scale-down rule; the queue's share is left out, since a backlog
  once served is gone), at most `max_scale_in_step` at a time. Without any pressure reading it
  falls back to the rule.
- `RuleStrategy` ('rule'): the field's rule. Scale out when p95 latency > 200 ms AND GPU
  memory pressure > 0.8; scale in when p95 < 100 ms AND pressure < 0.3. Scale-in waits until
  the calm has held for the stabilisation window (300 s); scale-out waits out a cooldown
  (15 s) after the last scale-out. Proportional count (HPA): a scale-out asks for
  ceil(current * p95 / target); a scale-in goes towards the count that keeps both metrics
  under the scale-out line (times `scale_in_headroom`, when set, which also lets an oversized
  fleet shrink when pressure never drops under the scale-in line).

Both judge scale-out on the highest pressure among the replicas and scale-in on the mean:
after a scale-in the load spreads over the replicas that stay. Both go through the shared
guards (domain/guards.py).
"""

from __future__ import annotations

import math
from typing import Protocol

from crater.autoscaler.domain import guards
from crater.autoscaler.domain.decision import Evaluation, decision
from crater.autoscaler.domain.demand import Demand, TimeSeries
from crater.autoscaler.domain.scaling_policy import ScalingPolicy
from crater.autoscaler.domain.state import ServiceState
from crater.contracts import LatencySamplesReported, ScaleDecided, ScaleDirection


class ScalingStrategy(Protocol):
    def decide(self, evaluation: Evaluation) -> ScaleDecided | None: ...


class RuleStrategy:
    """The field's rule: out on p95 and the highest pressure over their lines (or panic),
    in once p95 and the mean pressure stayed under theirs for the stabilisation window."""

    def __init__(self, policy: ScalingPolicy) -> None:
        self.policy = policy

    def decide(self, evaluation: Evaluation) -> ScaleDecided | None:
        policy = self.policy
        state, sample, now = evaluation.state, evaluation.sample, evaluation.now
        evidence, panic_p95 = evaluation.evidence, evaluation.panic_p95
        # The rule sizes from the replicas serving (those starting are subtracted from what
        # a scale-out asks for): the fleet known by name less those not heard of yet.
        current = evaluation.current
        if state.fleet_size() is not None:
            current = max(0, current - state.unheard())
        pressure, mean_pressure = evaluation.pressure, evaluation.mean_pressure
        panicking = panic_p95 is not None
        decided: ScaleDecided | None = None
        if evidence is None or (pressure is None and not panicking):
            state.calm_since = None  # unknown pressure is not calm
        else:
            p95, count = evidence
            hot = pressure is not None and (
                p95 > policy.scale_out_p95_ms and pressure > policy.scale_out_pressure
            )
            calm = (
                pressure is not None
                and not evaluation.held
                and mean_pressure is not None
                and guards.tpot_over(policy, evaluation.tpot) is None  # a TPOT SLO holds it
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
                decided = self._scale_out(
                    state, sample, now, current, max(p95, panic_p95), pressure, count, panic=True
                )
            if decided is None and hot:
                decided = self._scale_out(state, sample, now, current, p95, pressure, count)
            elif decided is None and calm and mean_pressure is not None:
                decided = self._scale_in(state, sample, now, current, p95, mean_pressure, count)

        return decided

    def _scale_out(
        self,
        state: ServiceState,
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
        measure = state.judged_measure  # what p95 is of, for the reasons
        if count < policy.min_samples or current >= policy.max_replicas:
            return None
        if not panic and guards.cooling_down(policy, state.last_scale_out_at, now):
            return None
        # Grow in proportion to how far p95 is over the line, between +1 and the caps.
        proportional = max(current + 1, math.ceil(current * p95 / policy.scale_out_p95_ms))
        desired, limited_by = guards.limit_scale_out(policy, state, now, current, proportional)
        if desired <= current:
            return None
        if panic and desired <= state.panic_peak:
            return None  # this panic already asked for as many: wait for them to serve
        shown = "unknown" if pressure is None else f"{pressure:.2f}"
        if panic:
            reason = (
                f"panic: {measure} {p95:.1f} ms > {policy.panic_p95_ms:g} ms over the last "
                f"{policy.panic_window_seconds:g} s (GPU memory pressure {shown}), "
                f"ahead of the cooldown, over {count} samples: {current} -> {desired} replicas"
            )
        else:
            reason = (
                f"{measure} {p95:.1f} ms > {policy.scale_out_p95_ms:g} ms and GPU memory pressure "
                f"{shown} > {policy.scale_out_pressure:g} over {count} samples: "
                f"{current} -> {desired} replicas"
            )
        if limited_by is not None:
            reason += f" ({limited_by})"
        return decision(
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

    def _scale_in(
        self,
        state: ServiceState,
        sample: LatencySamplesReported,
        now: float,
        current: int,
        p95: float,
        pressure: float,
        count: int,
    ) -> ScaleDecided | None:
        policy = self.policy
        measure = state.judged_measure  # what p95 is of, for the reasons
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
                f"{measure} {p95:.1f} ms < {policy.scale_in_p95_ms:g} ms and mean GPU memory "
                f"pressure {pressure:.2f} < {policy.scale_in_pressure:g}"
            )
        else:
            why = (
                f"{measure} {p95:.1f} ms and mean GPU memory pressure {pressure:.2f} fit "
                f"{proportional} replicas at {policy.scale_in_headroom:g} of the scale-out line"
            )
        reason = (
            f"{why} for {calm_for:.0f} s (stabilisation {policy.stabilisation_seconds:g} s) "
            f"over {count} samples: {current} -> {desired} replicas"
        )
        return decision(
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
        headroom = 1.0 if policy.scale_in_headroom is None else policy.scale_in_headroom
        return max(policy.min_replicas, math.ceil(current * load / headroom))

    def _oversized(self, current: int, p95: float, pressure: float) -> bool:
        """With a headroom set: the fleet would stay within that share of both scale-out
        lines with fewer replicas (HPA's proportional rule, on the way down)."""
        if self.policy.scale_in_headroom is None:
            return False
        return self._shrink_to(current, p95, pressure) < current


class DemandStrategy:
    """Out when the demand (domain/demand.py) needs more replicas than serve or start;
    in to the highest count the demand asked for over the stabilisation window. Without a
    pressure reading, the rule decides."""

    def __init__(self, policy: ScalingPolicy) -> None:
        self.policy = policy
        self.fallback = RuleStrategy(policy)

    def decide(self, evaluation: Evaluation) -> ScaleDecided | None:
        mean_pressure = evaluation.mean_pressure
        if mean_pressure is None:  # the rule, also when no pressure is known
            return self.fallback.decide(evaluation)
        policy = self.policy
        state, sample, now = evaluation.state, evaluation.sample, evaluation.now
        measure = state.judged_measure  # what p95 is of, for the reasons
        evidence, panic_p95, held = evaluation.evidence, evaluation.panic_p95, evaluation.held
        serving = self._serving(state)
        starting = len(state.starting)
        # The fleet as known by name (idle replicas included), else the counts reported.
        provisioned = state.fleet_size() or serving + starting
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
            backlog_growth=state.backlog_growth(since, now, policy.panic_window_seconds / 2),
            admissions_per_s=_rate(started, state.waits.first_after(since), now),
        )
        wanted = demand.desired(policy.min_replicas, policy.max_replicas)
        if state.recommending_since is None:
            state.recommending_since = now
        state.recommendations.add(
            now,
            demand.desired_for_arrivals(
                policy.min_replicas, policy.max_replicas, policy.scale_in_margin
            ),
        )
        p95, count = evidence
        counts = f"{provisioned - starting} serving + {starting} starting"
        # The TPOT SLO: decode slows as batches fill, so the replicas serving times how far
        # over the line its p95 is carry it (the HPA's proportional count).
        tpot_p95 = guards.tpot_over(policy, evaluation.tpot)
        by_tpot = None
        if tpot_p95 is not None and serving > 0:
            assert policy.scale_out_tpot_ms is not None
            by_tpot = min(
                policy.max_replicas, math.ceil(serving * tpot_p95 / policy.scale_out_tpot_ms)
            )
            wanted = max(wanted, by_tpot)
        if wanted > provisioned:
            if not panic and guards.cooling_down(policy, state.last_scale_out_at, now):
                return None
            desired, limited_by = guards.limit_scale_out(policy, state, now, provisioned, wanted)
            if desired <= provisioned:
                return None
            head = (
                f"panic: {measure} {panic_p95:.1f} ms > {policy.panic_p95_ms:g} ms over the last "
                f"{policy.panic_window_seconds:g} s; "
                if panic_p95 is not None
                else ""
            )
            if by_tpot is not None:
                head += (
                    f"TPOT p95 {tpot_p95:.1f} ms > {policy.scale_out_tpot_ms:g} ms: {serving} "
                    f"serving x {tpot_p95:.1f} / {policy.scale_out_tpot_ms:g} = {by_tpot}; "
                )
            reason = (
                f"{head}{demand.explain()} over the last "
                f"{now - since:g} s: {provisioned} ({counts}) -> {desired} replicas"
            )
            direction = ScaleDirection.OUT
        else:
            if held or p95 >= policy.scale_out_p95_ms:
                return None  # no scale-in in or just after a panic, nor while slow
            if tpot_p95 is not None:
                return None  # nor while decoding is over its SLO
            calm_for = now - state.recommending_since
            if calm_for < policy.stabilisation_seconds:
                return None  # not yet a whole window of recommendations
            if guards.cooling_down(policy, state.last_decision_at, now):
                return None
            # The window holds the arrivals' counts; never below what the demand (queue
            # included) asks for now, or the next sample would scale straight back out.
            highest = max(state.recommendations.largest() or wanted, wanted)
            if highest >= provisioned or serving == 0:
                return None
            desired = max(highest, provisioned - policy.max_scale_in_step, policy.min_replicas)
            limited_by = None if desired == highest else f"-{policy.max_scale_in_step} per scale-in"
            if guards.tpot_over_after(
                policy, evaluation.tpot, serving, serving - (provisioned - desired)
            ):
                return None  # the batches of the replicas left would decode over the SLO
            reason = (
                f"{demand.explain()}; the most the arrivals asked for over the stabilisation "
                f"window ({policy.stabilisation_seconds:g} s), with "
                f"{policy.scale_in_margin:.0%} to spare, is {highest}: "
                f"{provisioned} ({counts}) -> {desired} replicas"
            )
            direction = ScaleDirection.IN
        if limited_by is not None:
            reason += f" ({limited_by})"
        return decision(
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

    def _serving(self, state: ServiceState) -> int:
        """Replicas taking traffic: as reported, else those heard of and not draining."""
        if state.reported_serving is not None:
            return state.reported_serving
        heard = sum(1 for name in state.seen if name not in state.draining)
        return heard or (state.replicas or self.policy.min_replicas)


STRATEGY_CLASSES: dict[str, type[RuleStrategy] | type[DemandStrategy]] = {
    "demand": DemandStrategy,
    "rule": RuleStrategy,
}


def strategy_for(policy: ScalingPolicy) -> ScalingStrategy:
    """The strategy the policy names."""
    return STRATEGY_CLASSES[policy.strategy](policy)


def _rate(count: float, first: float | None, now: float) -> float | None:
    """`count` events per second since `first` (the first report in the window; a window
    not yet full is not diluted); None without a report or a span."""
    if first is None or now <= first:
        return None
    return count / (now - first)


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
