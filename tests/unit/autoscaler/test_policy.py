from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crater.autoscaler.domain import Autoscaler, ScalingPolicy
from crater.contracts import LatencySamplesReported, ScaleDecided, ScaleDirection

T0 = datetime(2026, 1, 1, tzinfo=UTC)
# These tests pin down the field's rule; test_demand.py covers the default strategy.
RULE = ScalingPolicy(strategy="rule")
SLOW = [250.0] * 20  # p95 250 ms
FAST = [50.0] * 20  # p95 50 ms


def sample(
    at: float,
    latencies: list[float],
    pressure: float | None = 0.9,
    *,
    service: str = "chat",
    replicas: int | None = None,
    replica_id: str | None = None,
) -> LatencySamplesReported:
    return LatencySamplesReported(
        occurred_at=T0 + timedelta(seconds=at),
        service=service,
        latencies_ms=latencies,
        gpu_memory_pressure=pressure,
        replicas=replicas,
        replica_id=replica_id,
    )


def decisions(scaler: Autoscaler, samples: list[LatencySamplesReported]) -> list[ScaleDecided]:
    found = []
    for s in samples:
        decision = scaler.observe(s).decision
        if decision is not None:
            found.append(decision)
    return found


def test_scale_out_when_p95_and_pressure_are_both_over_and_say_why() -> None:
    scaler = Autoscaler(RULE)
    assessment = scaler.observe(sample(0, SLOW, 0.9, replicas=4))
    decision = assessment.decision
    assert decision is not None
    assert decision.direction is ScaleDirection.OUT
    assert (decision.current_replicas, decision.desired_replicas) == (4, 5)
    assert decision.p95_latency_ms == 250.0
    assert decision.gpu_memory_pressure == 0.9
    assert decision.samples == 20
    assert decision.occurred_at == T0  # the sample's time: no clock read
    assert "p95 250.0 ms > 200 ms" in decision.reason
    assert "pressure 0.90 > 0.8" in decision.reason
    assert assessment.replicas == 5
    assert scaler.replicas("chat") == 5


@pytest.mark.parametrize(
    ("latencies", "pressure"),
    [
        ([200.0] * 20, 0.9),  # p95 exactly at the line: not over
        (SLOW, 0.8),  # pressure exactly at the line
        (SLOW, 0.5),  # slow but memory is fine: more replicas would not help
        ([100.0] * 20, 0.95),  # memory tight but fast enough
        (SLOW, None),  # pressure unknown
    ],
)
def test_no_scale_out_unless_both_conditions_hold(
    latencies: list[float], pressure: float | None
) -> None:
    scaler = Autoscaler(RULE)
    assert scaler.observe(sample(0, latencies, pressure, replicas=4)).decision is None


def test_scale_out_needs_enough_samples() -> None:
    scaler = Autoscaler(ScalingPolicy(strategy="rule", min_samples=10))
    assert scaler.observe(sample(0, [900.0] * 9)).decision is None
    assert scaler.observe(sample(1, [900.0])).decision is not None


def test_scale_out_grows_with_the_overshoot_up_to_double() -> None:
    scaler = Autoscaler(RULE)
    decision = scaler.observe(sample(0, [300.0] * 20, replicas=4)).decision
    assert decision is not None
    assert decision.desired_replicas == 6  # ceil(4 * 300 / 200)
    decision = Autoscaler(RULE).observe(sample(0, [5_000.0] * 20, replicas=4)).decision
    assert decision is not None
    assert decision.desired_replicas == 8  # capped at 2x


def test_max_replicas_clamps_and_stops_scale_out() -> None:
    scaler = Autoscaler(ScalingPolicy(strategy="rule", max_replicas=16))
    decision = scaler.observe(sample(0, [5_000.0] * 20, replicas=12)).decision
    assert decision is not None
    assert decision.desired_replicas == 16
    assert "(max 16)" in decision.reason
    assert scaler.observe(sample(100, [5_000.0] * 20, replicas=16)).decision is None


def test_one_burst_gives_one_decision_per_cooldown() -> None:
    scaler = Autoscaler(ScalingPolicy(strategy="rule", cooldown_seconds=15))
    burst = [sample(t * 0.5, SLOW, replicas=4) for t in range(60)]  # 30 s of overload
    found = decisions(scaler, burst)
    assert [d.occurred_at - T0 for d in found] == [timedelta(0), timedelta(seconds=15)]
    # Replicas not yet serving (the reports still say 4): the target is repeated, not
    # compounded.
    assert [d.desired_replicas for d in found] == [5, 5]


def test_after_a_decision_only_new_samples_count() -> None:
    scaler = Autoscaler(ScalingPolicy(strategy="rule", cooldown_seconds=15))
    assert scaler.observe(sample(0, [1_000.0] * 100, replicas=1)).decision is not None
    # 20 s later the window still holds the old slow samples, but the new ones are fast.
    assert scaler.observe(sample(20, [150.0] * 20, replicas=2)).decision is None


def test_scale_in_only_after_calm_held_for_the_stabilisation_window() -> None:
    scaler = Autoscaler(ScalingPolicy(strategy="rule", stabilisation_seconds=300))
    calm = [sample(t, FAST, 0.2, replicas=4) for t in range(0, 300, 10)]
    assert decisions(scaler, calm) == []  # 290 s of calm: not yet
    [decision] = decisions(scaler, [sample(300, FAST, 0.2, replicas=4)])
    assert decision.direction is ScaleDirection.IN
    assert (decision.current_replicas, decision.desired_replicas) == (4, 3)
    assert "for 300 s" in decision.reason
    # The next scale-in needs a fresh window of calm at the new size.
    assert decisions(scaler, [sample(t, FAST, 0.2) for t in range(310, 600, 10)]) == []
    [decision] = decisions(scaler, [sample(610, FAST, 0.2)])
    assert (decision.current_replicas, decision.desired_replicas) == (3, 2)


@pytest.mark.parametrize(
    ("latencies", "pressure"),
    [
        (FAST, 0.3),  # pressure exactly at the line
        ([100.0] * 20, 0.1),  # p95 exactly at the line
        ([150.0] * 20, 0.1),  # between the thresholds: hold
        (FAST, 0.5),
        (FAST, None),
    ],
)
def test_no_scale_in_unless_both_conditions_hold(
    latencies: list[float], pressure: float | None
) -> None:
    scaler = Autoscaler(ScalingPolicy(strategy="rule", stabilisation_seconds=60))
    steps = [sample(t, latencies, pressure, replicas=4) for t in range(0, 400, 10)]
    assert decisions(scaler, steps) == []


def test_one_busy_moment_restarts_the_stabilisation_window() -> None:
    scaler = Autoscaler(
        ScalingPolicy(strategy="rule", stabilisation_seconds=300, window_seconds=60)
    )
    steps = [sample(t, FAST, 0.2, replicas=4) for t in range(0, 250, 10)]
    steps.append(sample(250, FAST, 0.5, replicas=4))  # pressure rises once
    steps += [sample(t, FAST, 0.2, replicas=4) for t in range(260, 560, 10)]
    assert decisions(scaler, steps) == []
    [decision] = decisions(scaler, [sample(560, FAST, 0.2, replicas=4)])
    assert decision.direction is ScaleDirection.IN


def test_min_replicas_stops_scale_in() -> None:
    scaler = Autoscaler(ScalingPolicy(strategy="rule", min_replicas=2, stabilisation_seconds=0))
    assert scaler.observe(sample(0, FAST, 0.1, replicas=2)).decision is None
    decision = scaler.observe(sample(1, FAST, 0.1, replicas=3)).decision
    assert decision is not None
    assert decision.desired_replicas == 2


def test_noise_around_the_thresholds_does_not_flap() -> None:
    scaler = Autoscaler(
        ScalingPolicy(strategy="rule", cooldown_seconds=15, stabilisation_seconds=300)
    )
    steps = []
    for t in range(0, 1_200):
        # p95 hops across 100 ms and pressure across 0.3 every second; 20 min of it.
        high = t % 2 == 0
        latencies = [105.0 if high else 95.0] * 20
        steps.append(sample(t, latencies, 0.32 if high else 0.28, replicas=4))
    assert decisions(scaler, steps) == []
    # Around the scale-out line: at most one decision per cooldown, never a scale-in.
    steps = []
    for t in range(1_200, 1_260):
        high = t % 2 == 0
        latencies = [210.0 if high else 190.0] * 20
        steps.append(sample(t, latencies, 0.85 if high else 0.75, replicas=4))
    found = decisions(scaler, steps)
    assert all(d.direction is ScaleDirection.OUT for d in found)
    assert len(found) <= 60 // 15 + 1


def test_a_redelivered_sample_is_not_counted_twice_and_repeats_its_decision() -> None:
    scaler = Autoscaler(RULE)
    event = sample(0, SLOW, replicas=4)
    first = scaler.observe(event)
    again = scaler.observe(event)
    assert again.duplicate
    assert again.decision == first.decision
    assert scaler.observe(sample(1, FAST)).samples == 40  # the first batch counted once


def test_reported_replicas_override_and_decisions_update_the_count() -> None:
    scaler = Autoscaler(RULE)
    assert scaler.replicas("chat") == 1  # unknown: min_replicas
    scaler.observe(sample(0, FAST, 0.5, replicas=7))
    assert scaler.replicas("chat") == 7
    scaler.observe(sample(1, SLOW, 0.9))  # p95 250 over 40 samples: ceil(7 * 250 / 200)
    assert scaler.replicas("chat") == 9
    scaler.observe(sample(0.5, FAST, 0.5, replicas=3))  # a late report older than the decision
    assert scaler.replicas("chat") == 9
    assert scaler.replicas("other") == 1


def test_pressure_is_the_highest_fresh_report_among_replicas() -> None:
    scaler = Autoscaler(ScalingPolicy(strategy="rule", window_seconds=60))
    scaler.observe(sample(0, FAST, 0.9, replica_id="a"))
    assert scaler.observe(sample(1, FAST, 0.2, replica_id="b")).pressure == 0.9
    assert scaler.observe(sample(2, FAST, 0.4, replica_id="a")).pressure == 0.4
    scaler.observe(sample(3, FAST, 0.7, replica_id="c"))
    assert scaler.observe(sample(70, FAST, None, replica_id="b")).pressure is None


def test_services_are_independent() -> None:
    scaler = Autoscaler(RULE)
    assert scaler.observe(sample(0, FAST, 0.9, service="a")).decision is None
    assert scaler.observe(sample(1, SLOW, 0.9, service="b")).decision is not None
    assert scaler.observe(sample(2, FAST, 0.9, service="a")).p95_ms == 50.0


def test_same_samples_give_the_same_decisions() -> None:
    steps = [sample(t, SLOW if t < 60 else FAST, 0.9 if t < 60 else 0.1) for t in range(900)]
    first = decisions(Autoscaler(RULE), steps)
    assert first == decisions(Autoscaler(RULE), steps)
    assert {d.direction for d in first} == {ScaleDirection.OUT, ScaleDirection.IN}


@pytest.mark.parametrize(
    "bad",
    [
        {"scale_in_p95_ms": 300.0},
        {"scale_in_pressure": 0.9},
        {"min_replicas": 5, "max_replicas": 4},
        {"window_seconds": 0},
        {"max_scale_out_factor": 0.5},
    ],
)
def test_inconsistent_policies_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=r"need|must"):
        ScalingPolicy(strategy="rule", **bad)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Step:
    dt: float
    latency: float
    pressure: float | None
    replicas: int | None


steps_strategy = st.lists(
    st.builds(
        Step,
        dt=st.floats(0, 30),
        latency=st.sampled_from([20.0, 90.0, 110.0, 190.0, 210.0, 600.0]),
        pressure=st.one_of(st.none(), st.sampled_from([0.1, 0.29, 0.31, 0.79, 0.81, 0.99])),
        replicas=st.one_of(st.none(), st.integers(0, 20)),
    ),
    max_size=120,
)


@settings(max_examples=150, deadline=None)
@given(steps=steps_strategy)
def test_decisions_respect_cooldown_stabilisation_and_limits(steps: list[Step]) -> None:
    policy = ScalingPolicy(
        strategy="rule", cooldown_seconds=15, stabilisation_seconds=300, min_samples=1
    )
    scaler = Autoscaler(policy)
    at = 0.0
    last_out: float | None = None
    last_decision = 0.0
    for step in steps:
        at += step.dt
        decision = scaler.observe(
            sample(at, [step.latency] * 5, step.pressure, replicas=step.replicas)
        ).decision
        if decision is None:
            continue
        assert policy.min_replicas <= decision.desired_replicas <= policy.max_replicas
        if decision.direction is ScaleDirection.OUT:
            assert decision.desired_replicas > decision.current_replicas
            # Only panic goes ahead of the cooldown.
            assert decision.panic or last_out is None or at - last_out >= policy.cooldown_seconds
            last_out = at
        else:
            assert decision.desired_replicas == decision.current_replicas - 1
            assert at - last_decision >= policy.stabilisation_seconds
            assert last_out is None or at - last_out >= policy.panic_hold_seconds
        last_decision = at
