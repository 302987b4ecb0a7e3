"""The per-service GPU memory metric an HPA or KEDA scales on: each inference service's mean
pressure, read at scrape time without changing what the scaling rule reads."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from crater.autoscaler.domain import Autoscaler
from crater.autoscaler.service_layer.handlers import ServiceMemorySeries
from tests.unit.autoscaler.test_policy_features import FAST, RULE, sample, ts

METRIC = "crater_inference_gpu_memory_usage_ratio"


def test_the_mean_of_the_replicas_follows_node_metrics_between_samples() -> None:
    scaler = Autoscaler(RULE)
    registry = CollectorRegistry()
    registry.register(ServiceMemorySeries(scaler))
    scaler.allocation_granted("chat-0", "n1", [0, 1], ts(0))
    scaler.allocation_granted("chat-1", "n2", [0], ts(0))
    scaler.node_metrics("n1", ts(0), {0: 0.5, 1: 0.9})
    scaler.node_metrics("n2", ts(0), {0: 0.3})
    scaler.observe(sample(1, FAST, None, replica_id="chat-0", replicas=2))
    scaler.observe(sample(2, FAST, None, replica_id="chat-1", replicas=2))
    # each replica's fullest card: 0.9 and 0.3
    assert registry.get_sample_value(METRIC, {"service": "chat"}) == 0.6
    assert scaler.memory_pressure("chat") == (0.9, 0.6)
    # A node report without any latency sample since: the metric follows it.
    scaler.node_metrics("n2", ts(3), {0: 0.7})
    assert registry.get_sample_value(METRIC, {"service": "chat"}) == 0.8
    # A released replica stops counting.
    scaler.allocation_released("chat-1")
    assert registry.get_sample_value(METRIC, {"service": "chat"}) == 0.9


def test_reading_it_forgets_nothing_the_rule_reads() -> None:
    scaler = Autoscaler(RULE)
    registry = CollectorRegistry()
    registry.register(ServiceMemorySeries(scaler))
    scaler.observe(sample(1, FAST, 0.4, replica_id="chat-0"))
    assert registry.get_sample_value(METRIC, {"service": "chat"}) == 0.4
    # Past the window the report no longer counts, but it is still there for the rule.
    state = scaler._services["chat"]
    state.window.advance(ts(1) + RULE.window_seconds + 1)
    assert registry.get_sample_value(METRIC, {"service": "chat"}) is None
    assert "chat-0" in state.pressures
    assert registry.get_sample_value(METRIC, {"service": "other"}) is None
