"""The default strategy: the fleet sized by Little's law on GPU memory pressure plus the queue,
scale-in to the most the stabilisation window asked for; and its building blocks."""

from __future__ import annotations

import itertools
import random
from collections import deque
from datetime import UTC, datetime, timedelta
from uuid import NAMESPACE_URL, uuid5

import pytest

from crater.autoscaler.domain import Autoscaler, ScalingPolicy
from crater.autoscaler.domain.demand import Demand, SlidingMax, TimeSeries
from crater.contracts import LatencySamplesReported, ReplicasRequested, ScaleDecided, ScaleDirection

T0 = datetime(2026, 1, 1, tzinfo=UTC)
FAST = [50.0] * 20


def sample(
    at: float,
    pressure: float | None,
    replicas: int,
    latencies: list[float] | None = None,
    replica_id: str = "r0",
) -> LatencySamplesReported:
    return LatencySamplesReported(
        event_id=uuid5(NAMESPACE_URL, f"demand/{replica_id}/{at}"),
        occurred_at=T0 + timedelta(seconds=at),
        service="chat",
        replica_id=replica_id,
        latencies_ms=latencies or FAST,
        gpu_memory_pressure=pressure,
        replicas=replicas,
    )


def feed(scaler: Autoscaler, samples: list[LatencySamplesReported]) -> list[ScaleDecided]:
    found = []
    for s in samples:
        decision = scaler.observe(s).decision
        if decision is not None:
            found.append(decision)
    return found


# -- the parts ---------------------------------------------------------------------------


def test_time_series_sums_match_a_plain_walk_over_the_horizon() -> None:
    rng = random.Random(7)
    series, plain = TimeSeries(30.0), deque[tuple[float, float, float]]()
    at = 0.0
    for _ in range(5_000):  # enough to compact the running totals several times
        at += rng.choice([0.0, 0.5, 2.0, 45.0])
        value, weight = rng.random(), rng.choice([1.0, 3.0])
        series.add(at, value, weight)
        plain.append((at, value, weight))
        while plain[0][0] <= at - 30.0:
            plain.popleft()
        since = at - rng.choice([6.0, 30.0, 100.0])
        kept = [(v, w) for t, v, w in plain if t > since]
        total, weights = series.sums(since)
        assert total == pytest.approx(sum(v for v, _ in kept))
        assert weights == pytest.approx(sum(w for _, w in kept))
    assert len(series) == len(plain)


def test_sliding_max_is_the_largest_within_the_window() -> None:
    window = SlidingMax(10.0)
    for at, value, largest in [(0, 3, 3), (1, 5, 5), (2, 4, 5), (11, 2, 4), (12.5, 1, 2)]:
        window.add(at, value)
        assert window.largest() == largest


def test_demand_is_load_over_target_times_the_queue() -> None:
    idle = Demand(load=6.0, queue_wait_s=0.0, target_pressure=0.8, drain_seconds=30)
    assert idle.replicas == pytest.approx(7.5)
    assert idle.desired(1, 24) == 8
    queued = Demand(load=6.0, queue_wait_s=15.0, target_pressure=0.8, drain_seconds=30)
    assert queued.replicas == pytest.approx(7.5 * 1.5)
    assert queued.desired(1, 10) == 10  # max_replicas clamps
    assert "queue wait 15.00 s / drain 30 s" in queued.explain()
    exact = Demand(load=1.6, queue_wait_s=0.0, target_pressure=0.8, drain_seconds=30)
    assert exact.desired(1, 24) == 2  # 2.0000000001 from float noise is still 2


@pytest.mark.parametrize(
    "bad",
    [{"strategy": "guess"}, {"target_pressure": 0}, {"drain_seconds": 0}],
)
def test_bad_demand_settings_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        ScalingPolicy(**bad)  # type: ignore[arg-type]


# -- decisions ---------------------------------------------------------------------------


def test_scale_out_ahead_of_the_latency_line_and_say_why() -> None:
    # 4 replicas at mean pressure 0.9: a load of 3.6 needs 4.5 -> 5 replicas at 0.8, while
    # p95 is still 50 ms: the demand scales out before users feel it.
    scaler = Autoscaler(ScalingPolicy(target_pressure=0.8, panic_p95_ms=None))
    decision = scaler.observe(sample(0, 0.9, replicas=4)).decision
    assert decision is not None
    assert decision.direction is ScaleDirection.OUT
    assert (decision.current_replicas, decision.desired_replicas) == (4, 5)
    assert decision.proportional_replicas == 5
    assert decision.gpu_memory_pressure == 0.9
    assert "load 3.60" in decision.reason
    assert "target 0.8" in decision.reason
    assert "4 (4 serving + 0 starting) -> 5 replicas" in decision.reason


def test_a_fleet_at_its_target_stays() -> None:
    scaler = Autoscaler(ScalingPolicy(target_pressure=0.8, panic_p95_ms=None))
    assert feed(scaler, [sample(t, 0.78, replicas=4) for t in range(0, 600, 2)]) == []


def test_replicas_still_starting_are_counted_so_nothing_is_asked_twice() -> None:
    scaler = Autoscaler(ScalingPolicy(target_pressure=0.8, panic_p95_ms=None, cooldown_seconds=0))
    first = scaler.observe(sample(0, 0.95, replicas=4))
    asked = [r for r in first.requests if isinstance(r, ReplicasRequested)]
    assert first.decision is not None
    assert first.decision.desired_replicas == 5
    assert sum(len(r.task_ids) for r in asked) == 1
    # The same load while that replica starts: 4 serving + 1 starting already make 5.
    again = feed(scaler, [sample(t, 0.95, replicas=4) for t in range(2, 60, 2)])
    assert again == []


def test_the_queue_adds_replicas_beyond_what_the_pressure_shows() -> None:
    # Saturated replicas show pressure 0.8 whatever waits behind them; 15 s of mean wait
    # with a 30 s drain asks for 1.5 times the pressure's count.
    policy = ScalingPolicy(target_pressure=0.8, panic_p95_ms=None, drain_seconds=30)
    calm = Autoscaler(policy).observe(sample(0, 0.8, replicas=4)).decision
    assert calm is None
    queued = Autoscaler(policy).observe(sample(0, 0.8, replicas=4, latencies=[15_100.0] * 20))
    assert queued.decision is not None
    assert queued.decision.desired_replicas == 6
    assert "queue wait 15.00 s" in queued.decision.reason


def test_a_growing_wait_reads_as_arrivals_beyond_the_admissions() -> None:
    # In a FIFO queue the wait grows at 1 - admitted/arrived: waits growing 0.5 s per second
    # mean twice the arrivals the saturated replicas admit.
    assert Demand(4.0, 0.0, 0.8, 30, wait_growth=0.5).replicas == pytest.approx(10.0)
    assert Demand(4.0, 0.0, 0.8, 30, wait_growth=5.0).arrival_factor == pytest.approx(10.0)
    assert Demand(4.0, 0.0, 0.8, 30, wait_growth=-5.0).arrival_factor == pytest.approx(1 / 1.9)
    policy = ScalingPolicy(
        target_pressure=0.8, panic_p95_ms=None, cooldown_seconds=0, demand_window_seconds=10
    )
    # About the same mean wait over the window: flat in one, growing 0.5 s/s in the other.
    flat = feed(
        Autoscaler(policy),
        [sample(t, 0.8, replicas=4, latencies=[2_600.0] * 20) for t in range(0, 12, 2)],
    )
    rising = feed(
        Autoscaler(policy),
        [sample(t, 0.8, replicas=4, latencies=[100.0 + 500.0 * t] * 20) for t in range(0, 12, 2)],
    )
    assert "arrivals/admissions" in rising[-1].reason
    assert max(d.desired_replicas for d in flat) < max(d.desired_replicas for d in rising)


def test_scale_out_keeps_the_rate_limits() -> None:
    policy = ScalingPolicy(target_pressure=0.8, panic_p95_ms=None, max_scale_out_factor=1.5)
    decision = Autoscaler(policy).observe(sample(0, 1.0, replicas=4, latencies=[60_000.0] * 20))
    assert decision.decision is not None
    assert decision.decision.desired_replicas == 6
    assert decision.decision.limited_by == "x1.5 per decision"


def test_scale_in_waits_for_a_whole_stabilisation_window_then_goes_to_its_highest() -> None:
    policy = ScalingPolicy(
        target_pressure=0.8,
        panic_p95_ms=None,
        stabilisation_seconds=300,
        max_scale_in_step=16,
        scale_in_margin=0.0,
    )
    scaler = Autoscaler(policy)
    # Load 3.0 (4 replicas at 0.8), except one busier minute early on (load 5: 7 replicas).
    found: list[ScaleDecided] = []
    replicas = 10
    for t in range(0, 900, 2):
        load = 5.0 if 60 <= t < 120 else 3.0
        decision = scaler.observe(sample(t, load / replicas, replicas=replicas)).decision
        if decision is not None:
            found.append(decision)
            replicas = decision.desired_replicas
    assert all(d.direction is ScaleDirection.IN for d in found)
    first, *rest = found
    assert first.occurred_at == T0 + timedelta(seconds=300)  # the window is whole
    assert (first.current_replicas, first.desired_replicas) == (10, 7)
    assert (
        "the most the arrivals asked for over the stabilisation window (300 s), with 0% to spare,"
        " is 7" in first.reason
    )
    # The busy minute (averaged over the 30 s demand window) leaves the window 300 s after
    # it ended, step by step; then the count is the load's.
    assert rest
    assert all(d.occurred_at > T0 + timedelta(seconds=390) for d in rest)
    assert rest[-1].occurred_at <= T0 + timedelta(seconds=452)
    assert [d.desired_replicas for d in found] == sorted(
        (d.desired_replicas for d in found), reverse=True
    )
    assert rest[-1].desired_replicas == 4


def test_scale_in_sizes_for_the_arrivals_not_the_backlog() -> None:
    # The queue adds replicas to serve a backlog within drain_seconds, but once served the
    # backlog is gone: the stabilisation window keeps the count the arrivals asked for.
    queued = Demand(load=3.0, queue_wait_s=15.0, target_pressure=0.8, drain_seconds=30)
    assert queued.desired(1, 24) == 6
    assert queued.desired_for_arrivals(1, 24) == 4
    rising = Demand(
        load=3.0, queue_wait_s=15.0, target_pressure=0.8, drain_seconds=30, wait_growth=0.5
    )
    assert rising.arrival_replicas == pytest.approx(7.5)  # arrivals beyond admissions count
    policy = ScalingPolicy(
        target_pressure=0.8,
        panic_p95_ms=None,
        stabilisation_seconds=300,
        max_scale_in_step=16,
        drain_seconds=30,
        scale_in_margin=0.0,
    )
    scaler = Autoscaler(policy)
    found: list[ScaleDecided] = []
    replicas = 10
    for t in range(0, 400, 2):  # a load of 3.0 (4 replicas at 0.8), a backlog for 90 s
        slow = [15_100.0] * 20 if t < 90 else None
        decision = scaler.observe(sample(t, 3.0 / replicas, replicas, latencies=slow)).decision
        if decision is not None:
            found.append(decision)
            replicas = decision.desired_replicas
    assert found
    first = found[0]
    assert first.direction is ScaleDirection.IN
    assert first.occurred_at == T0 + timedelta(seconds=300)
    # Sized on the backlog (load x 1.5) the window would have held 6 until t = 390.
    assert (first.current_replicas, first.desired_replicas) == (10, 4)


def test_scale_in_steps_are_capped_and_a_cooldown_apart() -> None:
    policy = ScalingPolicy(
        target_pressure=0.8,
        panic_p95_ms=None,
        stabilisation_seconds=60,
        cooldown_seconds=15,
        max_scale_in_step=2,
    )
    scaler = Autoscaler(policy)
    found: list[ScaleDecided] = []
    replicas = 10
    for t in range(0, 200, 2):  # a load of 2.0: 3 replicas at 0.8
        decision = scaler.observe(sample(t, 2.0 / replicas, replicas=replicas)).decision
        if decision is not None:
            found.append(decision)
            replicas = decision.desired_replicas
    steps = [(d.current_replicas, d.desired_replicas) for d in found]
    assert steps == [(10, 8), (8, 6), (6, 4), (4, 3)]
    assert [d.limited_by for d in found] == ["-2 per scale-in"] * 3 + [None]
    times = [d.occurred_at for d in found]
    assert times[0] == T0 + timedelta(seconds=60)
    assert all((b - a).total_seconds() >= 15 for a, b in itertools.pairwise(times))


def test_noisy_pressure_does_not_flap() -> None:
    # Pressure jumping around 0.7 on 6 replicas (demand 4.7..5.8): no decision may reverse
    # the one before within the stabilisation window.
    rng = random.Random(11)
    policy = ScalingPolicy(
        target_pressure=0.8, panic_p95_ms=None, stabilisation_seconds=300, max_scale_in_step=16
    )
    scaler = Autoscaler(policy)
    found: list[ScaleDecided] = []
    replicas = 6
    for t in range(0, 3_600, 2):
        pressure = min(1.0, max(0.0, rng.gauss(0.7, 0.08)))
        decision = scaler.observe(sample(t, pressure, replicas=replicas)).decision
        if decision is not None:
            found.append(decision)
            replicas = decision.desired_replicas
    for before, after in itertools.pairwise(found):
        if before.direction is not after.direction:
            gap = (after.occurred_at - before.occurred_at).total_seconds()
            assert gap >= 300, (before.reason, after.reason)
    assert len(found) <= 6


def test_panic_decides_on_the_short_window_ahead_of_the_cooldown() -> None:
    # One panic window (the default asks for three in a row: tests/unit/autoscaler/
    # test_no_flapping.py): what is tested here is the short window, ahead of the cooldown.
    policy = ScalingPolicy(
        target_pressure=0.8, cooldown_seconds=60, panic_window_seconds=6, panic_windows=1
    )
    scaler = Autoscaler(policy)
    assert scaler.observe(sample(0, 0.95, replicas=4)).decision is not None  # 4 -> 5
    burst = scaler.observe(sample(4, 1.0, replicas=4, latencies=[3_000.0] * 20))
    assert burst.decision is not None
    assert burst.decision.panic
    assert burst.decision.current_replicas == 5  # the one starting is counted
    assert burst.decision.desired_replicas > 5
    assert burst.decision.reason.startswith("panic: p95 3000.0 ms > 400 ms")
    assert burst.panic


def test_without_pressure_the_rule_decides() -> None:
    # No pressure known: the demand cannot be measured, the rule's panic still acts.
    scaler = Autoscaler(ScalingPolicy(target_pressure=0.8, panic_windows=1))
    assert scaler.observe(sample(0, None, replicas=2)).decision is None
    decision = scaler.observe(sample(2, None, replicas=2, latencies=[900.0] * 20)).decision
    assert decision is not None
    assert decision.panic
    assert "panic: p95 900.0 ms > 400 ms" in decision.reason


def test_the_fields_rule_is_still_there() -> None:
    # At pressure 0.9 and p95 50 ms the rule waits for latency; the demand does not.
    rule = Autoscaler(ScalingPolicy(strategy="rule", panic_p95_ms=None))
    assert rule.observe(sample(0, 0.9, replicas=4)).decision is None
    slow = rule.observe(sample(20, 0.9, replicas=4, latencies=[250.0] * 20)).decision
    assert slow is not None
    assert "p95 250.0 ms > 200 ms" in slow.reason


def test_scale_in_keeps_a_margin_over_what_the_arrivals_asked_for() -> None:
    """A load of 3.0 asks for 3.75 replicas at 0.8: 4 without a margin; with 20% to spare
    (4.5) the window holds 5, so a fleet of 6 sheds one replica, not two."""
    assert Demand(3.0, 0.0, 0.8, 60).desired_for_arrivals(1, 24) == 4
    assert Demand(3.0, 0.0, 0.8, 60).desired_for_arrivals(1, 24, margin=0.2) == 5
    found: dict[float, list[ScaleDecided]] = {}
    for margin in (0.0, 0.2):
        policy = ScalingPolicy(
            target_pressure=0.8,
            panic_p95_ms=None,
            stabilisation_seconds=60,
            max_scale_in_step=16,
            scale_in_margin=margin,
        )
        scaler, replicas, decided = Autoscaler(policy), 6, []
        for t in range(0, 300, 2):
            decision = scaler.observe(sample(t, 3.0 / replicas, replicas=replicas)).decision
            if decision is not None:
                decided.append(decision)
                replicas = decision.desired_replicas
        found[margin] = decided
    assert [d.desired_replicas for d in found[0.0]] == [4]
    assert [d.desired_replicas for d in found[0.2]] == [5]
    assert "with 20% to spare, is 5" in found[0.2][0].reason
