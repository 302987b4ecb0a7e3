"""Issue #25, item 1: scale on what scaling changes. A replica that reports each request's
queueing delay (`queue_ms`, vLLM's and TGI's queue-time histograms) is judged on it, not on
its time to first token, whose prefill of a long prompt no replica count shortens."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from crater.autoscaler.domain import Autoscaler, ScalingPolicy
from crater.contracts import LatencySamplesReported, ScaleDirection

T0 = datetime(2026, 1, 1, tzinfo=UTC)
RULE = ScalingPolicy(strategy="rule")
# Long prompts: 20 requests of 250 ms to first token, all of it prefill.
PREFILL_BOUND = [250.0] * 20
NOT_QUEUED = [0.0] * 20


def sample(
    at: float, latencies: list[float], queue: list[float] | None, pressure: float = 0.9
) -> LatencySamplesReported:
    return LatencySamplesReported(
        occurred_at=T0 + timedelta(seconds=at),
        service="code",
        replica_id="code-1",
        latencies_ms=latencies,
        queue_ms=queue,
        gpu_memory_pressure=pressure,
        replicas=4,
    )


def test_slow_prefill_without_queueing_is_no_reason_to_scale_out() -> None:
    assert Autoscaler(RULE).observe(sample(0, PREFILL_BOUND, NOT_QUEUED)).decision is None
    # The same latencies without the queue: the rule reads the prefill as load.
    decided = Autoscaler(RULE).observe(sample(0, PREFILL_BOUND, None)).decision
    assert decided is not None
    assert decided.direction is ScaleDirection.OUT


def test_queueing_over_the_line_scales_out_and_says_it_judged_queueing() -> None:
    queued = [260.0] * 20  # TTFT 510 ms, of which 260 ms waiting
    decided = Autoscaler(RULE).observe(sample(0, [t + 250 for t in queued], queued)).decision
    assert decided is not None
    assert decided.direction is ScaleDirection.OUT
    assert decided.p95_latency_ms == 260.0
    assert "queueing p95 260.0 ms > 200 ms" in decided.reason


def test_no_panic_on_prefill_only_on_sustained_queueing() -> None:
    # demand (the default), panic over 400 ms in 3 windows; sized at 0.8 for round numbers
    policy = ScalingPolicy(target_pressure=0.8)
    long_prompts = [900.0] * 20
    scaler = Autoscaler(policy)
    seen = [scaler.observe(sample(t, long_prompts, NOT_QUEUED, 0.75)) for t in range(0, 30, 2)]
    assert not any(a.panic for a in seen)
    # Queued as long, for three panic windows in a row: a panic.
    scaler = Autoscaler(policy)
    seen = [scaler.observe(sample(t, long_prompts, [800.0] * 20, 0.75)) for t in range(0, 30, 2)]
    assert [a.panic for a in seen].index(True) == 6  # at 12 s: three 6 s windows over 400 ms


def test_the_demand_counts_the_time_queued_not_the_prefill() -> None:
    """The demand's queue factor (1 + queue wait / drain 60 s): prefill adds nothing to it
    when queueing is reported, and on time to first token alone it did."""
    policy = ScalingPolicy(target_pressure=0.8)
    prefill_only, queued, unreported = Autoscaler(policy), Autoscaler(policy), Autoscaler(policy)
    for t in range(0, 40, 2):
        prefill_only.observe(sample(t, [5_000.0] * 20, NOT_QUEUED, 0.75))
        queued.observe(sample(t, [5_000.0] * 20, [4_900.0] * 20, 0.75))
        unreported.observe(sample(t, [5_000.0] * 20, None, 0.75))
    assert prefill_only.replicas("code") == 4  # load 3.0 / target 0.8: 3.75
    assert queued.replicas("code") == 5  # x (1 + 4.9 / 60)
    assert unreported.replicas("code") == 5  # the prefill read as waiting


def test_a_fleet_that_stops_reporting_its_queue_is_judged_on_ttft_again() -> None:
    scaler = Autoscaler(RULE)
    assert scaler.observe(sample(0, PREFILL_BOUND, NOT_QUEUED)).decision is None
    # Past the window (60 s) with TTFT alone: the queueing samples are gone, TTFT judges.
    decided = scaler.observe(sample(400, PREFILL_BOUND, None)).decision
    assert decided is not None
    assert "p95 250.0 ms > 200 ms" in decided.reason
    assert "queueing" not in decided.reason


@pytest.mark.parametrize(
    ("queue", "why"),
    [([], "at least 1 item"), ([-1.0], "greater than or equal to 0"), ([float("nan")], "finite")],
)
def test_a_malformed_queue_report_is_refused_naming_the_field(queue: list[float], why: str) -> None:
    with pytest.raises(ValidationError) as refused:
        sample(0, [10.0], queue)
    assert "queue_ms" in str(refused.value)
    assert why in str(refused.value)
