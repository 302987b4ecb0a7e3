"""The clairvoyant reference of the frontier benchmark: what it computes the trace needs, and
that it acts ahead of the trace (a replica asked one cold start before a step of load), which
no baseline can."""

from __future__ import annotations

import pytest

from crater.autoscaler.sim import FleetModel, Request, SimulationConfig, simulate
from crater.autoscaler.sim.clairvoyant import ClairvoyantBaseline, replicas_needed

MODEL = FleetModel()


def steady(start: float, end: float, rps: float, tokens_in: int = 200, tokens_out: int = 50):
    step = 1 / rps
    count = int((end - start) * rps)
    return [Request(round(start + k * step, 4), tokens_in, tokens_out) for k in range(count)]


def test_the_need_counts_slots_and_kv_tokens_as_a_fluid() -> None:
    # One request of 1,000 tokens held ~(15 + 50) ms prefill and 100 x 12 ms decode at an
    # idle batch: 2 seconds counted (its start and end second), one slot of 16.
    one = [Request(5.0, 1_000, 100)]
    need = replicas_needed(one, MODEL, utilisation=1.0, load=0.0, smooth_s=1)
    assert list(need[4:9]) == [0, 1, 1, 0, 0]
    # 40 concurrent requests of 400 tokens: 40 slots over 16 is 3 replicas, 16,000 KV tokens
    # over 8,000 is 2: the slots decide.
    many = [Request(10.0, 300, 100)] * 40
    assert replicas_needed(many, MODEL, 1.0, load=0.0, smooth_s=1)[10] == 3
    # Long prompts fill the KV cache first: 10 x 4,000 tokens is 5 replicas of 8,000.
    long = [Request(10.0, 3_900, 100)] * 10
    assert replicas_needed(long, MODEL, 1.0, load=0.0, smooth_s=1)[10] == 5
    # Planning for half the capacity doubles it.
    assert replicas_needed(long, MODEL, 0.5, load=0.0, smooth_s=1)[10] == 10


def test_a_utilisation_of_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="utilisation"):
        replicas_needed([Request(0.0, 10, 10)], MODEL, 0.0)


def test_it_asks_for_replicas_one_cold_start_before_the_load_comes() -> None:
    # 2 requests/s for 10 minutes, then 60/s from minute 10 to minute 15.
    trace = steady(0, 600, 2) + steady(600, 900, 60)
    result = simulate(trace, SimulationConfig(), ClairvoyantBaseline(trace))
    outs = [e for e in result.scale_events if e.direction == "out"]
    lead = MODEL.startup_s + MODEL.place_s
    assert outs, "it never scaled out"
    # The first scale-out comes about one cold start before the step (the sliding maximum
    # looks `smooth_s` further), not after it as a reactive policy's would.
    assert 600 - lead - 15 <= outs[0].at <= 600 - lead + 2
    assert result.disagreements == 0
    assert result.peak_replicas <= SimulationConfig().policy.max_replicas
    # The step is served: nearly every request of it within the SLO.
    assert result.slo_attainment > 0.95


def test_it_releases_what_the_trace_no_longer_needs() -> None:
    trace = steady(0, 300, 60) + steady(300, 1_500, 1)
    result = simulate(trace, SimulationConfig(), ClairvoyantBaseline(trace))
    ins = [e for e in result.scale_events if e.direction == "in"]
    assert ins
    assert ins[0].at < 300 + 30  # no stabilisation window: it knows the load fell
    assert result.timeline[-1].holding <= 2
