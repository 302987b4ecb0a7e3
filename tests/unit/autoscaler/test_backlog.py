"""Issue #25, item 1: the admission backlog. Replicas that report the requests waiting for
them (`requests_waiting`, vLLM's num_requests_waiting) have their arrivals counted, not
inferred: the admissions plus the backlog's growth, seen as a burst forms, before any
request that waited in it is admitted and reports its wait."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from crater.autoscaler.adapters.exposition import Interval
from crater.autoscaler.adapters.scrape import Replica, ReplicaScraper
from crater.autoscaler.domain import Autoscaler, ScalingPolicy
from crater.autoscaler.domain.demand import Demand
from crater.contracts import LatencySamplesReported, MetricsFormat, ScaleDirection

T0 = datetime(2026, 1, 1, tzinfo=UTC)
# Sized at 0.8 for round numbers: 4 replicas at 0.75 are a load of 3.0, 3.75 replicas' worth.
POLICY = ScalingPolicy(target_pressure=0.8)
REPLICAS = [f"code-{i}" for i in range(1, 5)]


def sample(at: float, replica: str, waiting: int | None) -> LatencySamplesReported:
    """20 requests admitted in the last 2 s, none of them queued (a burst's first seconds:
    those that queue have not been admitted yet)."""
    return LatencySamplesReported(
        occurred_at=T0 + timedelta(seconds=at),
        service="code",
        replica_id=replica,
        latencies_ms=[90.0] * 20,
        queue_ms=[0.0] * 20,
        requests_waiting=waiting,
        gpu_memory_pressure=0.75,
        replicas=len(REPLICAS),
    )


def feed(scaler: Autoscaler, waiting_per_second: float | None) -> list[ScaleDirection]:
    directions = []
    for t in range(0, 40, 2):
        for replica in REPLICAS:
            waiting = None if waiting_per_second is None else round(waiting_per_second * t)
            decided = scaler.observe(sample(t, replica, waiting)).decision
            if decided is not None:
                directions.append(decided.direction)
                assert decided.direction is ScaleDirection.OUT
                assert "backlog growing" in decided.reason
    return directions


def test_a_backlog_forming_scales_out_before_any_wait_is_reported() -> None:
    # 40 admitted/s over the fleet, the backlog growing 5/s at each of 4 replicas: arrivals
    # are 60/s, x1.5 the admissions: 3.75 x 1.5 = 5.6 replicas.
    scaler = Autoscaler(POLICY)
    assert feed(scaler, 5.0)[:1] == [ScaleDirection.OUT]
    assert scaler.replicas("code") == 6
    # Not reported, the same fleet sees nothing yet: no request has waited.
    unreported = Autoscaler(POLICY)
    assert feed(unreported, None) == []
    assert unreported.replicas("code") == 4
    # A backlog that holds steady is served at the rate it comes: no scale-out.
    steady = Autoscaler(POLICY)
    for t in range(0, 40, 2):
        for replica in REPLICAS:
            assert steady.observe(sample(t, replica, 3)).decision is None


def test_the_fleets_backlog_is_each_replicas_latest_and_a_released_one_leaves_it() -> None:
    scaler = Autoscaler(POLICY)
    scaler.observe(sample(0, "code-1", 10))
    scaler.observe(sample(1, "code-2", 7))
    scaler.observe(sample(2, "code-1", 4))  # replaces code-1's 10
    state = scaler._services["code"]
    assert state.backlog(since=-1) == 11
    assert [n for _, n in state.backlogs] == [10, 17, 11]
    scaler.allocation_released("code-2")
    assert state.backlog(since=-1) == 4
    # Only reports after `since` count; none at all is no backlog known, not zero.
    assert state.backlog(since=T0.timestamp() + 2) is None


def test_arrivals_from_the_backlog_take_the_place_of_the_waits_inference() -> None:
    inferred = Demand(3.0, 0.0, 0.8, 60.0, wait_growth=0.5)
    assert inferred.arrival_factor == pytest.approx(2.0)
    counted = Demand(3.0, 0.0, 0.8, 60.0, wait_growth=0.5, backlog_growth=10, admissions_per_s=20)
    assert counted.arrival_factor == pytest.approx(1.5)
    assert "backlog growing +10.00/s at 20.0 admitted/s" in counted.explain()
    # A backlog shrinking: fewer arrive than are admitted.
    shrinking = Demand(3.0, 0.0, 0.8, 60.0, backlog_growth=-5, admissions_per_s=20)
    assert shrinking.arrival_factor == pytest.approx(0.75)
    # Bounded as the wait's inference is: at most 10x the admissions, at least 1/1.9.
    assert Demand(3.0, 0, 0.8, 60.0, backlog_growth=1e6, admissions_per_s=1).arrival_factor == (
        pytest.approx(10.0)
    )
    assert Demand(3.0, 0, 0.8, 60.0, backlog_growth=-1e6, admissions_per_s=1).arrival_factor == (
        pytest.approx(1 / 1.9)
    )
    # Nothing admitted: no rate to hold the growth against; the wait's inference stands.
    assert Demand(3.0, 0, 0.8, 60.0, backlog_growth=5, admissions_per_s=0).arrival_factor == 1.0


@pytest.mark.parametrize("waiting", [-1, 1_000_001, 2.5, "many"])
def test_a_backlog_out_of_bounds_or_not_a_count_is_refused_naming_the_field(
    waiting: object,
) -> None:
    with pytest.raises(ValidationError) as refused:
        LatencySamplesReported.model_validate(
            {"service": "code", "latencies_ms": [1.0], "requests_waiting": waiting}
        )
    assert refused.value.errors()[0]["loc"] == ("requests_waiting",)


@pytest.mark.parametrize(
    ("gauge", "sent"),
    [(5.0, 5), (0.0, 0), (None, None), (-1.0, None), (2e6, None), (float("nan"), None)],
)
def test_a_scraped_waiting_gauge_is_sent_as_the_backlog_when_it_is_a_count(
    gauge: float | None, sent: int | None
) -> None:
    # vllm:num_requests_waiting, tgi_queue_size, nv_inference_pending_request_count; a gauge
    # gone wrong is left out rather than failing the latencies it came with.
    found = Interval(
        latencies_ms=[40.0],
        requests=1,
        queue_ms=None,
        p95_ms=40.0,
        queue_p95_ms=None,
        queue_mean_ms=None,
        waiting=gauge,
        running=None,
        kv_cache=None,
    )
    replica = Replica("llama-0", "chat", MetricsFormat.VLLM, "http://127.0.0.1:1/metrics")
    made = ReplicaScraper.sample(replica, found, 0.0)
    assert made is not None
    assert made.requests_waiting == sent
