"""Issue #25, item 1: an SLO on time per output token as well as on the wait for the first.
Decoding slows as batches fill, which more replicas change: with `scale_out_tpot_ms` set, its
p95 over the line scales out in proportion and holds scale-in, also a scale-in whose
remaining replicas would decode over it. Unset (the default), TPOT is not judged."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from crater.autoscaler.adapters.exposition import interval, parse
from crater.autoscaler.domain import Autoscaler, ScalingPolicy
from crater.contracts import LatencySamplesReported, MetricsFormat, ScaleDecided, ScaleDirection

T0 = datetime(2026, 1, 1, tzinfo=UTC)
TPOT_SLO = ScalingPolicy(scale_out_tpot_ms=50.0)


def sample(
    at: float, replica: str, tpot: list[float] | None, pressure: float, replicas: int
) -> LatencySamplesReported:
    return LatencySamplesReported(
        occurred_at=T0 + timedelta(seconds=at),
        service="chat",
        replica_id=replica,
        latencies_ms=[60.0] * 20,
        queue_ms=[0.0] * 20,  # nothing waits: only decoding is slow
        tpot_ms=tpot,
        gpu_memory_pressure=pressure,
        replicas=replicas,
    )


def run(
    policy: ScalingPolicy, replicas: int, tpot_ms: float, pressure: float, seconds: float
) -> tuple[Autoscaler, list[ScaleDecided]]:
    scaler = Autoscaler(policy)
    decided = []
    for t in range(0, int(seconds), 2):
        for i in range(replicas):
            made = scaler.observe(
                sample(t, f"chat-{i}", [tpot_ms] * 20, pressure, replicas)
            ).decision
            if made is not None:
                decided.append(made)
    return scaler, decided


def test_decoding_over_its_slo_scales_out_in_proportion() -> None:
    # 4 replicas at 0.6: the load asks for 4 (2.4 / 0.7); TPOT p95 80 ms against 50: 4 x 1.6.
    _, decided = run(TPOT_SLO, 4, 80.0, 0.6, 4)
    [first] = decided
    assert (first.direction, first.current_replicas, first.desired_replicas) == (
        ScaleDirection.OUT,
        4,
        math.ceil(4 * 80 / 50),
    )
    assert "TPOT p95 80.0 ms > 50 ms: 4 serving x 80.0 / 50 = 7" in first.reason


def test_without_a_tpot_slo_decoding_is_not_judged() -> None:
    _, decided = run(ScalingPolicy(), 4, 80.0, 0.6, 60)
    assert decided == []
    _, within = run(TPOT_SLO, 4, 45.0, 0.6, 60)
    assert within == []


@pytest.mark.parametrize(("tpot_ms", "scales_in"), [(30.0, True), (45.0, False)])
def test_a_scale_in_waits_while_the_replicas_left_would_decode_over_the_slo(
    tpot_ms: float, scales_in: bool
) -> None:
    # 6 replicas nearly idle (0.2): the load asks for 2. One fewer carries their batches at
    # 6/5 of the TPOT: 36 ms fits 50, 54 ms does not.
    _, decided = run(TPOT_SLO, 6, tpot_ms, 0.2, 400)
    ins = [d for d in decided if d.direction is ScaleDirection.IN]
    assert bool(ins) is scales_in
    assert all(d.direction is ScaleDirection.IN for d in decided)
    # The same fleet without the SLO scales in either way.
    _, unjudged = run(ScalingPolicy(), 6, tpot_ms, 0.2, 400)
    assert any(d.direction is ScaleDirection.IN for d in unjudged)


@pytest.mark.parametrize("tpot", [[], [-1.0], [float("nan")], ["slow"]])
def test_a_malformed_tpot_is_refused_naming_the_field(tpot: list[object]) -> None:
    with pytest.raises(ValidationError) as refused:
        LatencySamplesReported.model_validate(
            {"service": "chat", "latencies_ms": [1.0], "tpot_ms": tpot}
        )
    assert refused.value.errors()[0]["loc"][0] == "tpot_ms"


def _tgi_page(tpot_counts: tuple[int, int, int]) -> str:
    low, mid, total = tpot_counts
    return "\n".join(
        [
            "# TYPE tgi_request_queue_duration histogram",
            'tgi_request_queue_duration_bucket{le="0.01"} 3',
            'tgi_request_queue_duration_bucket{le="+Inf"} 3',
            "tgi_request_queue_duration_sum 0.01",
            "tgi_request_queue_duration_count 3",
            "# TYPE tgi_request_mean_time_per_token_duration histogram",
            f'tgi_request_mean_time_per_token_duration_bucket{{le="0.02"}} {low}',
            f'tgi_request_mean_time_per_token_duration_bucket{{le="0.1"}} {mid}',
            f'tgi_request_mean_time_per_token_duration_bucket{{le="+Inf"}} {total}',
            "tgi_request_mean_time_per_token_duration_sum 1.0",
            f"tgi_request_mean_time_per_token_duration_count {total}",
            "# TYPE tgi_queue_size gauge",
            "tgi_queue_size 0",
            "# TYPE tgi_batch_current_size gauge",
            "tgi_batch_current_size 3",
            "",
        ]
    )


def test_tgis_mean_time_per_token_is_read_between_scrapes() -> None:
    before = parse(MetricsFormat.TGI, _tgi_page((2, 3, 3)))
    now = parse(MetricsFormat.TGI, _tgi_page((2, 6, 6)))  # three more, each 20-100 ms
    found = interval(now, before)
    assert found is not None
    assert found.tpot_ms is not None
    assert len(found.tpot_ms) == 3
    assert all(20 < v <= 100 for v in found.tpot_ms)
