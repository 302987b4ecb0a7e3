"""No flapping by construction: no decision undoes the one before within the reversal window
unless the load moved by more than a margin, and panic needs queueing that lasts (several
consecutive panic windows), not one slow request. Reversals are counted in every report."""

from __future__ import annotations

from dataclasses import replace

from crater.autoscaler.domain import Autoscaler, ScalingPolicy
from crater.autoscaler.domain.guards import reversal_held
from crater.autoscaler.domain.state import ServiceState
from crater.autoscaler.domain.window import LatencyWindow
from crater.autoscaler.sim import count_reversals
from crater.autoscaler.sim.fleet import ScaleEvent
from crater.contracts import ScaleDecided, ScaleDirection
from tests.unit.autoscaler.test_policy_features import sample

FAST = [50.0] * 20


def decisions(scaler: Autoscaler, at: list[float], latencies: list[list[float]]) -> list[float]:
    found = []
    for t, values in zip(at, latencies, strict=True):
        if scaler.observe(sample(t, values, 0.5, replicas=4)).decision is not None:
            found.append(t)
    return found


def test_one_slow_request_does_not_panic_sustained_queueing_does() -> None:
    # A report of 5 requests every 2 s; one holds a single 5 s request (the p95 of a 6 s
    # window, nearest rank over 15 samples, is that request).
    times = [float(t) for t in range(0, 60, 2)]
    one_slow = [[5_000.0] + [50.0] * 4 if t == 30 else [50.0] * 5 for t in times]
    policy = ScalingPolicy(strategy="rule", panic_window_seconds=6)
    assert decisions(Autoscaler(policy), times, one_slow) == []
    # A single panic window (what used to ship) panics on it.
    assert decisions(Autoscaler(replace(policy, panic_windows=1)), times, one_slow) == [30.0]
    # Queueing that lasts three windows (18 s) panics.
    queued = [[900.0] * 5 if t >= 30 else [50.0] * 5 for t in times]
    [first, *_] = decisions(Autoscaler(policy), times, queued)
    assert 30 + 12 <= first <= 30 + 18


def test_a_scale_in_waits_out_the_window_after_a_scale_out_unless_the_load_fell() -> None:
    def first_scale_in(drop: float) -> float:
        policy = ScalingPolicy(
            strategy="rule", stabilisation_seconds=0, panic_p95_ms=None, scale_in_load_drop=drop
        )
        scaler = Autoscaler(policy)
        out = scaler.observe(sample(0, [250.0] * 20, 0.9, replicas=4)).decision
        assert out is not None
        assert out.direction is ScaleDirection.OUT  # load 0.9 x 4 = 3.6
        for t in range(5, 300, 5):
            # Calm: mean pressure 0.2 over 5 replicas, load 1.0 (down 72%).
            decision = scaler.observe(sample(t, FAST, 0.2, replicas=5)).decision
            if decision is not None:
                assert decision.direction is ScaleDirection.IN
                return t
        raise AssertionError("no scale-in")

    assert first_scale_in(0.5) == 5  # the load fell by more than half: at once
    assert first_scale_in(0.8) == 125  # not by 80%: after the 120 s window


def _state(direction: ScaleDirection, at: float, load: float) -> ServiceState:
    state = ServiceState(LatencyWindow(60))
    state.last_decision_at, state.last_direction, state.load_at_decision = at, direction, load
    return state


def test_a_scale_out_right_after_a_scale_in_needs_the_load_to_have_risen() -> None:
    policy = ScalingPolicy()  # window 120 s, rise 25%
    after_in = _state(ScaleDirection.IN, 0.0, 7.0)
    assert reversal_held(policy, after_in, 38.0, ScaleDirection.OUT, 7.2) is not None
    assert reversal_held(policy, after_in, 38.0, ScaleDirection.OUT, 8.8) is None
    assert reversal_held(policy, after_in, 121.0, ScaleDirection.OUT, 7.2) is None
    assert reversal_held(policy, after_in, 38.0, ScaleDirection.IN, 5.0) is None  # same way
    after_out = _state(ScaleDirection.OUT, 0.0, 4.0)
    held = reversal_held(policy, after_out, 120.0, ScaleDirection.IN, 2.5)
    assert held is not None
    assert "has not fallen by 50% from 4.00" in held
    assert reversal_held(policy, after_out, 120.0, ScaleDirection.IN, 1.9) is None


def test_a_panic_scale_out_is_not_held() -> None:
    policy = ScalingPolicy(
        strategy="rule", stabilisation_seconds=0, cooldown_seconds=0, panic_window_seconds=2
    )
    scaler = Autoscaler(policy)
    down = scaler.observe(sample(0, FAST, 0.1, replicas=4)).decision
    assert down is not None
    assert down.direction is ScaleDirection.IN
    found: list[ScaleDecided] = []
    for t in range(2, 20, 2):
        decision = scaler.observe(sample(t, [900.0] * 20, 0.1, replicas=3)).decision
        if decision is not None:
            found.append(decision)
    assert [d.panic for d in found] == [True]


def test_reversals_are_changes_of_direction_within_120_s() -> None:
    events = [
        ScaleEvent(0, "out", 10, 11),
        ScaleEvent(8, "in", 11, 10),  # reversal
        ScaleEvent(16, "out", 10, 11),  # reversal
        ScaleEvent(200, "out", 11, 12),
        ScaleEvent(321, "in", 12, 11),  # 121 s later: not one
        ScaleEvent(441, "out", 11, 12),  # 120 s later: one
    ]
    assert count_reversals(events) == 3
