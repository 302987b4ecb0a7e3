"""The trace simulator: deterministic under a seed, and its accounting (replica-minutes, SLO)
checked against cases small enough to work out by hand."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest

from crater.autoscaler.domain import ScalingPolicy
from crater.autoscaler.sim import (
    FleetModel,
    Request,
    SimulationConfig,
    TraceShape,
    generate_trace,
    read_trace,
    simulate,
    with_tokens,
    write_trace,
)

SHORT = TraceShape(hours=0.25, trough_rps=2.0, peak_rps=12.0, bursts_per_hour=4.0)


def test_the_generator_is_deterministic_under_a_seed() -> None:
    first = generate_trace(SHORT, seed=1)
    assert first == generate_trace(SHORT, seed=1)
    assert first != generate_trace(SHORT, seed=2)
    assert all(a.at <= b.at for a, b in itertools.pairwise(first))
    assert all(r.input_tokens >= 8 and r.output_tokens >= 1 for r in first)


def test_the_generated_day_swings_between_trough_and_peak() -> None:
    shape = TraceShape(hours=2.0, trough_rps=2.0, peak_rps=20.0, bursts_per_hour=0)
    trace = generate_trace(shape, seed=3)
    per_10_min = [0] * 12
    for r in trace:
        per_10_min[int(r.at // 600)] += 1
    trough, peak = per_10_min[0] / 600, max(per_10_min) / 600
    assert trough < 4
    assert 15 < peak < 21
    assert per_10_min.index(max(per_10_min)) in (5, 6)  # mid-day


def test_a_trace_survives_a_round_trip_through_csv(tmp_path: Path) -> None:
    trace = generate_trace(SHORT, seed=4)[:500]
    path = tmp_path / "trace.csv"
    write_trace(trace, path)
    assert path.read_text().splitlines()[0] == "timestamp_s,input_tokens,output_tokens"
    assert read_trace(path) == trace


def test_a_bad_row_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("timestamp_s,input_tokens,output_tokens\n0.5,10,10\n1.0,ten,3\n")
    with pytest.raises(ValueError, match=r"bad.csv:3"):
        read_trace(path)


@pytest.mark.parametrize("policy", ["crater", "hpa"])
def test_the_simulation_is_deterministic(policy: str) -> None:
    trace = generate_trace(SHORT, seed=1)
    config = SimulationConfig(policy=ScalingPolicy(warm_pool_size=1), seed=1)
    first = simulate(trace, config, policy)
    second = simulate(trace, config, policy)
    assert first == second
    assert first.requests == len(trace)


def test_a_fixed_fleet_holds_its_replicas_for_the_whole_trace() -> None:
    # min = max = 3 and no warm pool: nothing scales, so 3 replicas for the trace's length.
    trace = [Request(float(t), 100, 10) for t in range(0, 601, 2)]
    config = SimulationConfig(
        policy=ScalingPolicy(min_replicas=3, max_replicas=3), initial_replicas=3
    )
    result = simulate(trace, config, "crater")
    assert result.scale_events == []
    assert result.duration_s == 600
    assert result.replica_minutes == pytest.approx(3 * 600 / 60)
    assert result.serving_replica_minutes == pytest.approx(3 * 600 / 60, rel=0.02)


def test_slo_attainment_counts_time_to_first_token() -> None:
    model = FleetModel(prefill_base_ms=15.0, prefill_ms_per_token=0.05)
    # Far apart, so each meets an idle replica: TTFT is the prefill alone.
    trace = [
        Request(0.0, 100, 1),  # 20 ms
        Request(10.0, 3_000, 1),  # 165 ms
        Request(20.0, 4_000, 1),  # 215 ms: over 200
        Request(30.0, 200, 1),  # 25 ms
    ]
    config = SimulationConfig(
        fleet=model, policy=ScalingPolicy(min_replicas=1, max_replicas=1), initial_replicas=1
    )
    result = simulate(trace, config, "hpa")
    assert result.slo_attainment == 0.75
    assert result.p50_ms == pytest.approx(25.0)
    assert result.p99_ms == pytest.approx(215.0)
    assert result.dropped == 0


def test_queueing_shows_in_the_latency() -> None:
    # One slot: the second request waits for the first to finish (prefill + 10 tokens).
    model = FleetModel(slots=1, prefill_base_ms=10.0, prefill_ms_per_token=0.0, tpot_ms=10.0)
    trace = [Request(0.0, 10, 10), Request(0.0, 10, 10)]
    config = SimulationConfig(
        fleet=model, policy=ScalingPolicy(min_replicas=1, max_replicas=1), initial_replicas=1
    )
    result = simulate(trace, config, "crater")
    # First: 10 ms. Second: waits 10 + 100 ms, then its own 10 ms prefill.
    assert sorted([result.p50_ms, result.p99_ms]) == pytest.approx([10.0, 120.0])


def test_a_burst_makes_crater_scale_out_and_the_calm_scale_back_in() -> None:
    burst = TraceShape(hours=0.75, trough_rps=1.0, peak_rps=1.0, bursts_per_hour=0)
    trace = generate_trace(burst, seed=5)
    # Ten minutes of 25 requests/s in the middle of a quiet trace.
    extra = generate_trace(
        TraceShape(hours=1 / 6, trough_rps=25, peak_rps=25, bursts_per_hour=0), 6
    )
    trace = sorted(
        trace + [Request(r.at + 600, r.input_tokens, r.output_tokens) for r in extra],
        key=lambda r: r.at,
    )
    config = SimulationConfig(policy=ScalingPolicy(warm_pool_size=1, max_scale_in_step=2))
    result = simulate(trace, config, "crater")
    assert result.scale_outs >= 1
    assert result.scale_ins >= 1
    assert result.promoted >= 1
    peak = max(b.serving for b in result.timeline)
    assert peak > 2
    assert result.timeline[-1].serving < peak
    assert math.isfinite(result.p95_ms)


def _burst_then_calm() -> list[Request]:
    """Five minutes of 40 requests/s inside half an hour of 1 request/s: the fleet grows to
    its cap, then most replicas fall silent (idle replicas send no samples)."""
    quiet = generate_trace(
        TraceShape(hours=0.5, trough_rps=1.0, peak_rps=1.0, bursts_per_hour=0), 5
    )
    burst = generate_trace(
        TraceShape(hours=1 / 12, trough_rps=40, peak_rps=40, bursts_per_hour=0), 6
    )
    moved = [Request(r.at + 300, r.input_tokens, r.output_tokens) for r in burst]
    return sorted(quiet + moved, key=lambda r: r.at)


def test_what_a_decision_asks_is_what_the_fleet_does_and_the_cap_holds() -> None:
    # Silent replicas used to be forgotten after the 60 s window: scale-ins drained fewer
    # than decided (16 -> 7 drained 2), and the stale count let the fleet reach 18 of 16.
    policy = ScalingPolicy(max_scale_in_step=16, stabilisation_seconds=120)
    result = simulate(_burst_then_calm(), SimulationConfig(policy=policy), "crater")
    assert result.scale_outs >= 3
    assert result.scale_ins >= 3
    for event in result.scale_events:
        assert event.agrees, event
        assert event.fleet_before == event.current
        assert event.fleet_after == event.desired
        if event.direction == "in":
            assert event.drained == event.current - event.desired
        else:
            assert event.added == event.desired - event.current
    assert result.disagreements == 0
    assert result.peak_replicas == policy.max_replicas  # reached, never passed
    assert result.summary()["decisions_not_carried_out"] == 0


def test_the_hpa_records_what_it_did_too() -> None:
    result = simulate(_burst_then_calm(), SimulationConfig(), "hpa")
    assert result.scale_events
    assert result.disagreements == 0
    assert result.peak_replicas <= result.max_replicas


def test_the_initial_fleet_is_a_setting() -> None:
    trace = [Request(float(t), 100, 10) for t in range(0, 121, 2)]
    fixed = ScalingPolicy(min_replicas=1, max_replicas=5)
    for initial in (1, 5):
        config = SimulationConfig(policy=fixed, initial_replicas=initial)
        result = simulate(trace, config, "hpa")
        assert result.timeline[0].holding == initial
        assert result.initial_replicas == initial
    with pytest.raises(ValueError, match="initial_replicas 6"):
        SimulationConfig(policy=fixed, initial_replicas=6)


@pytest.mark.parametrize(
    ("profile", "prompt_mean", "output_median"),
    [("conversation", 1_400, 129), ("coding", 2_070, 13)],
)
def test_the_token_profiles_are_heavy_tailed_as_published(
    profile: str, prompt_mean: float, output_median: float
) -> None:
    shape = with_tokens(TraceShape(hours=1.0, bursts_per_hour=0), profile)
    trace = generate_trace(shape, seed=5)
    prompts = sorted(r.input_tokens for r in trace)
    outputs = sorted(r.output_tokens for r in trace)
    mean = sum(prompts) / len(prompts)
    assert mean == pytest.approx(prompt_mean, rel=0.05)
    assert outputs[len(outputs) // 2] == pytest.approx(output_median, rel=0.1)
    # Heavy-tailed: the mean well above the median, a long upper tail.
    assert mean > 1.25 * prompts[len(prompts) // 2]
    assert prompts[int(len(prompts) * 0.99)] > 4 * prompts[len(prompts) // 2]


def test_an_unknown_token_profile_is_refused() -> None:
    with pytest.raises(ValueError, match="token profile 'poetry' unknown"):
        with_tokens(SHORT, "poetry")


@pytest.mark.parametrize(
    ("reported", "counted"), [(True, "backlog growing"), (False, "wait growing")]
)
def test_the_replicas_report_the_routers_queue_as_their_backlog(
    reported: bool, counted: str
) -> None:
    # Two slots of 1 s requests, 4 arriving a second: the queue grows by 2 a second. Shared
    # out among the replicas as their requests_waiting, it is what the demand counts arrivals
    # by; without it, the wait's growth is inferred.
    model = FleetModel(slots=2, prefill_base_ms=10.0, prefill_ms_per_token=0.0, tpot_ms=10.0)
    trace = [Request(i / 4, 10, 100) for i in range(4 * 120)]
    config = SimulationConfig(
        fleet=model,
        policy=ScalingPolicy(min_replicas=1, max_replicas=4),
        initial_replicas=1,
        report_backlog=reported,
    )
    result = simulate(trace, config, "crater")
    first = result.scale_events[0]
    assert first.direction == "out"
    assert f"({counted} " in first.reason, first.reason
    assert ("at 2.0 admitted/s" in first.reason) is reported  # 2 slots of 1 s requests


def test_the_replicas_report_time_per_output_token_and_a_tpot_slo_acts_on_it() -> None:
    # Four slots, 50-token outputs, 2 requests/s of 1 s each: two in flight, each token 10 ms
    # x (1 + 1.0 x 2/4) = 15 ms; nothing waits. A 12 ms TPOT SLO scales out, 20 ms does not.
    model = FleetModel(
        slots=4, prefill_base_ms=10.0, prefill_ms_per_token=0.0, tpot_ms=10.0, batch_slowdown=1.0
    )
    trace = [Request(i / 2, 10, 50) for i in range(2 * 300)]
    results = {}
    for slo in (12.0, 20.0):
        config = SimulationConfig(
            fleet=model,
            policy=ScalingPolicy(min_replicas=1, max_replicas=4, scale_out_tpot_ms=slo),
            initial_replicas=1,
        )
        results[slo] = simulate(trace, config, "crater")
    tight, loose = results[12.0], results[20.0]
    assert loose.tpot_p95_ms is not None
    assert loose.tpot_p95_ms > 12.0
    assert loose.scale_outs == 0
    assert loose.tpot_within(20.0) == 1.0
    assert tight.scale_outs >= 1
    assert "TPOT p95" in tight.scale_events[0].reason
    assert tight.tpot_within(12.0) > loose.tpot_within(12.0)
