"""What the autoscaler shows of each fleet (`crater.v1.query.fleets`, the console's page)."""

from __future__ import annotations

from crater.autoscaler.app import fleets_answer
from crater.autoscaler.domain import Autoscaler
from crater.contracts import FleetsQuery, ScaleDirection
from tests.unit.autoscaler.test_policy import FAST, RULE, SLOW, T0, sample


def test_each_fleet_shows_its_figures_and_latest_decisions_first() -> None:
    scaler = Autoscaler(RULE)
    scaler.observe(sample(0, SLOW, 0.9, replicas=2, replica_id="r-0"))
    scaler.observe(sample(1, FAST, 0.1, service="quiet", replicas=1))
    scaler.observe(sample(40, SLOW, 0.95, replica_id="r-0"))
    [chat, quiet] = scaler.fleets()
    assert chat.service == "chat"
    assert chat.p95_latency_ms == 250.0
    assert chat.gpu_memory_pressure == 0.95
    assert chat.pressure_source == "samples"
    assert chat.last_sample_at is not None
    assert (chat.last_sample_at - T0).total_seconds() == 40
    assert [d.direction for d in chat.decisions] == [ScaleDirection.OUT] * 2
    assert chat.decisions[0].occurred_at > chat.decisions[1].occurred_at  # latest first
    assert chat.replicas == chat.decisions[0].desired_replicas
    assert (quiet.replicas, quiet.decisions) == (1, [])
    assert [f.service for f in scaler.fleets("quiet")] == ["quiet"]
    assert len(scaler.fleets(decisions=1)[0].decisions) == 1


def test_the_answer_carries_the_policy_lines() -> None:
    scaler = Autoscaler(RULE)
    scaler.observe(sample(0, SLOW, 0.9, replicas=2))
    answer = fleets_answer(scaler, FleetsQuery())
    assert (answer.strategy, answer.scale_out_p95_ms, answer.scale_out_pressure) == (
        "rule",
        200.0,
        0.8,
    )
    assert (answer.scale_in_p95_ms, answer.scale_in_pressure) == (100.0, 0.3)
    assert [f.service for f in answer.fleets] == ["chat"]
