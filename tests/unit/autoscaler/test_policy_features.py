"""Rate limits, panic mode, the warm pool, pressure from the GPUs a replica holds, and
drain-before-release."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from uuid import NAMESPACE_URL, uuid5

from crater.autoscaler.domain import Assessment, Autoscaler, ScalingPolicy
from crater.contracts import (
    LatencySamplesReported,
    ReplicaDrained,
    ReplicaReleaseRequested,
    ReplicasRequested,
    ScaleDecided,
    ScaleDirection,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
# These tests pin down the field's rule; test_demand.py covers the default strategy.
RULE = ScalingPolicy(strategy="rule")
FAST = [50.0] * 20


def sample(
    at: float,
    latencies: list[float],
    pressure: float | None = 0.9,
    *,
    replicas: int | None = None,
    replica_id: str | None = None,
    task_id: str | None = None,
    service: str = "chat",
) -> LatencySamplesReported:
    return LatencySamplesReported(
        # Ids fixed by the inputs, so that runs can be compared event for event.
        event_id=uuid5(NAMESPACE_URL, f"{service}/{replica_id}/{at}"),
        occurred_at=T0 + timedelta(seconds=at),
        service=service,
        latencies_ms=latencies,
        gpu_memory_pressure=pressure,
        replicas=replicas,
        replica_id=replica_id,
        task_id=task_id,
    )


def ts(at: float) -> float:
    return (T0 + timedelta(seconds=at)).timestamp()


def requested(assessment: Assessment) -> list[ReplicasRequested]:
    return [r for r in assessment.requests if isinstance(r, ReplicasRequested)]


def test_scale_out_is_rate_limited_per_period() -> None:
    policy = ScalingPolicy(
        strategy="rule",
        cooldown_seconds=5,
        panic_p95_ms=None,
        scale_out_period_seconds=60,
        scale_out_period_replicas=2,
        scale_out_period_factor=1.5,
    )
    scaler = Autoscaler(policy)
    first = scaler.observe(sample(0, [2_000.0] * 20, replicas=4)).decision
    assert first is not None
    assert (first.desired_replicas, first.proportional_replicas) == (6, 40)
    assert first.limited_by == "+2 or x1.5 per 60 s"
    assert "(+2 or x1.5 per 60 s)" in first.reason
    # The new replicas serve but the period has not passed: no more growth.
    for t in range(10, 60, 10):
        assert scaler.observe(sample(t, [2_000.0] * 20, replicas=6)).decision is None
    later = scaler.observe(sample(61, [2_000.0] * 20, replicas=6)).decision
    assert later is not None
    assert later.desired_replicas == 9  # x1.5 of 6 beats +2


def test_scale_in_step_is_capped_and_goes_towards_the_proportional_count() -> None:
    calm = [50.0] * 20
    wide = Autoscaler(ScalingPolicy(strategy="rule", stabilisation_seconds=0, max_scale_in_step=3))
    decision = wide.observe(sample(0, calm, 0.05, replicas=10)).decision
    assert decision is not None
    assert decision.direction is ScaleDirection.IN
    assert (decision.desired_replicas, decision.proportional_replicas) == (7, 3)
    assert decision.limited_by == "-3 per stabilisation window"
    one = Autoscaler(ScalingPolicy(strategy="rule", stabilisation_seconds=0)).observe(
        sample(0, calm, 0.05, replicas=10)
    )
    assert one.decision is not None
    assert one.decision.desired_replicas == 9


def test_panic_scales_out_ahead_of_the_cooldown_once_per_target() -> None:
    # One panic window (three in a row by default: test_no_flapping.py).
    scaler = Autoscaler(ScalingPolicy(strategy="rule", cooldown_seconds=15, panic_windows=1))
    normal = scaler.observe(sample(0, [250.0] * 20, replicas=4)).decision
    assert normal is not None
    assert not normal.panic
    # Two seconds later a burst: p95 900 ms over the panic window, inside the cooldown.
    burst = scaler.observe(sample(2, [900.0] * 20, replicas=4))
    assert burst.panic
    assert burst.decision is not None
    assert burst.decision.panic
    assert burst.decision.desired_replicas == 8  # x2 per decision
    assert burst.decision.reason.startswith("panic: p95 900.0 ms > 400 ms")
    # The same target again is not asked for twice while its replicas start.
    assert scaler.observe(sample(3, [900.0] * 20, replicas=4)).decision is None


def test_panic_needs_no_pressure_but_enough_samples() -> None:
    rule = replace(RULE, panic_windows=1)
    assert Autoscaler(rule).observe(sample(0, [900.0] * 5, None)).decision is None
    decision = Autoscaler(rule).observe(sample(0, [900.0] * 20, None, replicas=2)).decision
    assert decision is not None
    assert decision.panic
    assert decision.gpu_memory_pressure is None


def test_no_scale_in_while_panicking_nor_until_the_hold_passes() -> None:
    policy = ScalingPolicy(
        strategy="rule", stabilisation_seconds=30, panic_hold_seconds=60, panic_windows=1
    )
    scaler = Autoscaler(policy)
    assert scaler.observe(sample(0, [900.0] * 20, replicas=4)).decision is not None
    found: list[tuple[float, ScaleDecided]] = []
    for t in range(1, 200):
        assessment = scaler.observe(sample(t, FAST, 0.1, replicas=8))
        if assessment.decision is not None:
            found.append((t, assessment.decision))
        if t < 60:
            assert assessment.panic
    # Panic held until 60 s after the burst; then 30 s of calm before the first scale-in.
    assert found[0][0] == 90
    assert found[0][1].direction is ScaleDirection.IN


def test_panic_mode_can_be_turned_off() -> None:
    scaler = Autoscaler(ScalingPolicy(strategy="rule", panic_p95_ms=None))
    assert scaler.observe(sample(0, [900.0] * 20, 0.5, replicas=4)).decision is None


def test_the_warm_pool_is_filled_then_promoted_first_and_refilled() -> None:
    scaler = Autoscaler(ScalingPolicy(strategy="rule", warm_pool_size=2, panic_p95_ms=None))
    first = scaler.observe(sample(0, FAST, 0.5, replicas=2, replica_id="chat-0"))
    [fill] = requested(first)
    assert fill.standby
    assert len(fill.task_ids) == 2
    assert all(t.startswith("chat-standby-") for t in fill.task_ids)
    # Nothing is asked twice while the standbys are being placed.
    assert requested(scaler.observe(sample(1, FAST, 0.5, replica_id="chat-0"))) == []
    for i, task in enumerate(fill.task_ids):
        scaler.allocation_granted(task, "n1", [i], ts(2 + i))
    assert scaler.warm_pool("chat") == fill.task_ids

    out = scaler.observe(sample(10, [500.0] * 20, replicas=2, replica_id="chat-0"))
    assert out.decision is not None
    assert (out.decision.current_replicas, out.decision.desired_replicas) == (2, 4)
    assert out.decision.from_warm_pool == 2
    assert out.decision.promoted_replicas == fill.task_ids
    [refill] = requested(out)  # no cold replica needed; the pool refills
    assert refill.standby
    assert len(refill.task_ids) == 2
    assert scaler.warm_pool("chat") == []

    # Pool still empty (refill not placed) at the next scale-out: the rest come cold.
    again = scaler.observe(sample(30, [500.0] * 20, replicas=4, replica_id="chat-0"))
    assert again.decision is not None
    assert again.decision.from_warm_pool == 0
    [cold] = requested(again)
    assert not cold.standby
    assert cold.decision_id == again.decision.event_id
    assert len(cold.task_ids) == 8 - 4 - 2  # two promoted standbys still on their way


def test_a_repeated_target_asks_for_no_replica_twice() -> None:
    scaler = Autoscaler(ScalingPolicy(strategy="rule", cooldown_seconds=15, panic_p95_ms=None))
    first = scaler.observe(sample(0, [250.0] * 20, replicas=4))
    [cold] = requested(first)
    assert len(cold.task_ids) == 1
    repeat = scaler.observe(sample(15, [250.0] * 20, replicas=4))
    assert repeat.decision is not None
    assert repeat.decision.desired_replicas == 5
    assert requested(repeat) == []
    # Once the new replica serves, growth asks for more.
    scaler.observe(sample(20, FAST, 0.5, replica_id=cold.task_ids[0]))
    grown = scaler.observe(sample(31, [250.0] * 20, replicas=5))
    assert [len(r.task_ids) for r in requested(grown)] == [2]


def test_pressure_comes_from_the_gpus_the_replica_holds() -> None:
    scaler = Autoscaler(RULE)
    scaler.allocation_granted("chat-0", "n1", [0, 1], ts(0))
    scaler.node_metrics("n1", ts(0), {0: 0.5, 1: 0.95, 2: 0.1})
    assessment = scaler.observe(sample(1, [250.0] * 20, 0.2, replica_id="chat-0", replicas=2))
    assert assessment.pressure == 0.95
    assert assessment.decision is not None
    assert assessment.decision.pressure_source == "node-metrics"
    # Metrics older than the window no longer count: the replica's own report is used.
    other = Autoscaler(RULE)
    other.allocation_granted("chat-0", "n1", [0], ts(0))
    other.node_metrics("n1", ts(0), {0: 0.95})
    late = other.observe(sample(100, FAST, 0.2, replica_id="chat-0"))
    assert late.pressure == 0.2
    # A released replica no longer counts at all.
    scaler.allocation_released("chat-0")
    assert scaler.observe(sample(2, FAST, None, replica_id="chat-1")).pressure is None


def test_a_paged_engines_kv_cache_comes_before_its_cards_memory() -> None:
    # vLLM takes 90% of its card at start: the card says 0.92 whatever the load; the KV cache
    # its engine reports (a scraped replica) is what moves with the requests it holds.
    scaler = Autoscaler(RULE)
    scaler.allocation_granted("chat-0", "n1", [0], ts(0))
    scaler.node_metrics("n1", ts(0), {0: 0.92})
    kv = sample(1, [250.0] * 20, None, replica_id="chat-0", replicas=1)
    assessment = scaler.observe(kv.model_copy(update={"kv_cache_usage": 0.35}))
    assert (assessment.pressure, assessment.decision) == (0.35, None)
    # Reported no more for a window (nor the card): nothing; then the card's memory again.
    late = scaler.observe(sample(100, FAST, None, replica_id="chat-0"))
    assert late.pressure is None
    scaler.node_metrics("n1", ts(100), {0: 0.92})
    assert scaler.memory_pressure("chat") == (0.92, 0.92)
    # A released replica forgets its KV cache with the rest.
    again = scaler.observe(
        sample(101, FAST, None, replica_id="chat-0").model_copy(update={"kv_cache_usage": 0.5})
    )
    assert again.pressure == 0.5
    scaler.allocation_released("chat-0")
    assert scaler.observe(sample(102, FAST, None, replica_id="chat-1")).pressure is None


def test_mixed_sources_take_the_highest() -> None:
    scaler = Autoscaler(RULE)
    scaler.allocation_granted("a", "n1", [0], ts(0))
    scaler.node_metrics("n1", ts(0), {0: 0.4})
    scaler.observe(sample(1, FAST, 0.1, replica_id="a"))
    assessment = scaler.observe(sample(2, [300.0] * 20, 0.85, replica_id="b", replicas=2))
    assert assessment.pressure == 0.85
    assert assessment.decision is not None
    assert assessment.decision.pressure_source == "mixed"


def test_scale_in_drains_the_newest_replica_then_releases_it() -> None:
    scaler = Autoscaler(
        ScalingPolicy(
            strategy="rule", min_replicas=2, stabilisation_seconds=0, drain_timeout_seconds=30
        )
    )
    for i, name in enumerate(["a", "b"]):
        scaler.observe(sample(i * 0.1, FAST, 0.1, replica_id=name, task_id=f"task-{name}"))
    # The third replica heard of makes a fleet of three, one over the minimum, all calm.
    assessment = scaler.observe(sample(0.2, FAST, 0.1, replica_id="c", task_id="task-c"))
    assert assessment.decision is not None
    assert assessment.decision.direction is ScaleDirection.IN
    assert assessment.decision.drain_replicas == ["c"]
    assert scaler.draining("chat") == ["c"]
    # Still in flight: not yet.
    assert scaler.replica_drained(ReplicaDrained(service="chat", replica_id="c", in_flight=2)) == []
    [release] = scaler.replica_drained(ReplicaDrained(service="chat", replica_id="c"))
    assert isinstance(release, ReplicaReleaseRequested)
    assert (release.replica_id, release.task_id, release.drained) == ("c", "task-c", True)
    assert release.decision_id == assessment.decision.event_id
    assert scaler.replica_drained(ReplicaDrained(service="chat", replica_id="c")) == []
    assert scaler.draining("chat") == []


def test_a_drain_that_never_finishes_is_released_at_its_timeout() -> None:
    scaler = Autoscaler(
        ScalingPolicy(strategy="rule", stabilisation_seconds=0, drain_timeout_seconds=30)
    )
    scaler.observe(sample(0, FAST, 0.1, replica_id="a"))
    # A second replica heard of: a fleet of two, calm, one over the minimum.
    decision = scaler.observe(sample(0.5, FAST, 0.1, replica_id="b")).decision
    assert decision is not None
    assert decision.drain_replicas == ["b"]
    assert scaler.tick(ts(30)) == []
    [release] = scaler.tick(ts(31))
    assert isinstance(release, ReplicaReleaseRequested)
    assert not release.drained
    assert release.occurred_at == T0 + timedelta(seconds=31)  # the time given, no clock
    assert "timed out" in release.reason
    assert scaler.tick(ts(60)) == []


def test_noisy_input_does_not_flap() -> None:
    """An hour of noisy samples from three replicas at a steady, moderate load (single
    samples well past both lines, p95 hovering below the scale-out line): no decision in
    either direction, and no panic."""
    rng = random.Random(1)
    scaler = Autoscaler(ScalingPolicy(strategy="rule", warm_pool_size=1))
    found: list[ScaleDecided] = []
    for t in range(3_600):
        latencies = [rng.lognormvariate(4.7, 0.3) for _ in range(20)]  # median ~110 ms
        pressure = min(1.0, max(0.0, rng.gauss(0.5, 0.08)))
        assessment = scaler.observe(
            sample(t, latencies, pressure, replicas=3, replica_id=f"r{t % 3}")
        )
        assert not assessment.panic
        if assessment.decision is not None:
            found.append(assessment.decision)
    assert found == []


def test_noise_between_hot_and_calm_never_reverses_within_the_window() -> None:
    """Load that swings between hot and calm every few minutes, with noise on top: a
    decision is never reversed within the stabilisation window."""
    rng = random.Random(2)
    policy = ScalingPolicy(strategy="rule")
    scaler = Autoscaler(policy)
    found: list[tuple[float, ScaleDecided]] = []
    for t in range(7_200):
        hot = (t // 240) % 2 == 0
        median = 5.5 if hot else 3.9  # ~245 ms or ~50 ms
        latencies = [rng.lognormvariate(median, 0.25) for _ in range(20)]
        pressure = min(1.0, max(0.0, rng.gauss(0.85 if hot else 0.2, 0.05)))
        decision = scaler.observe(sample(t, latencies, pressure, replicas=4)).decision
        if decision is not None:
            found.append((t, decision))
    assert any(d.direction is ScaleDirection.OUT for _, d in found)
    for (t1, d1), (t2, d2) in itertools.pairwise(found):
        if d1.direction is not d2.direction:
            assert t2 - t1 >= policy.stabilisation_seconds


def test_same_inputs_give_the_same_events() -> None:
    def run() -> list[object]:
        scaler = Autoscaler(
            ScalingPolicy(strategy="rule", warm_pool_size=1, stabilisation_seconds=20)
        )
        events: list[object] = []
        for t in range(300):
            slow = 60 <= t < 90
            latencies = [900.0 if slow else 40.0] * 20
            a = scaler.observe(sample(t, latencies, 0.9 if slow else 0.1, replica_id=f"r{t % 3}"))
            events += a.events
            events += scaler.tick(ts(t))
        return events

    first = run()
    assert first == run()
    kinds = {type(e).__name__ for e in first}
    assert {"ScaleDecided", "ReplicasRequested", "ReplicaReleaseRequested"} <= kinds
