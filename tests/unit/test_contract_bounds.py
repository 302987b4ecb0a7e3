"""Bounds the fuzzer showed were missing: a message a consumer would fail on at every
delivery (a database integer overflowing, an outbox id repeated) is refused when it is read,
naming the field, so it is rejected once instead of crashing the consumer."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from crater.contracts import (
    AllocationGranted,
    LatencySamplesReported,
    NodeTopology,
    ReplicasRequested,
    TaskPending,
    TaskSequence,
    TaskUsageReported,
)
from crater.contracts.autoscaling import MAX_LATENCY_MS
from tests.support.lifecycle import granted
from tests.support.topologies import node


def test_a_replica_request_repeating_a_task_id_is_refused() -> None:
    with pytest.raises(ValidationError) as refused:
        ReplicasRequested(service="chat", task_ids=["r-1", "r-2", "r-1"], reason="scale out")
    [error] = refused.value.errors()
    assert error["loc"] == ("task_ids",)
    assert "repeats r-1" in error["msg"]


def test_a_replica_request_with_an_empty_task_id_is_refused() -> None:
    with pytest.raises(ValidationError) as refused:
        ReplicasRequested(service="0", task_ids=[""], reason="")
    assert refused.value.errors()[0]["loc"] == ("task_ids", 0)


@pytest.mark.parametrize(("field", "value"), [("attempt", 10_001), ("nodes_total", 2**53 + 1)])
def test_numbers_a_database_cannot_hold_are_refused(field: str, value: int) -> None:
    with pytest.raises(ValidationError) as refused:
        TaskPending.model_validate(
            {"task_id": "t1", "nodes_total": 3, "reasons": [], "summary": "", field: value}
        )
    assert refused.value.errors()[0]["loc"] == (field,)


def test_a_sequence_number_beyond_what_json_parsers_read_exactly_is_refused() -> None:
    with pytest.raises(ValidationError):
        TaskSequence(number=2**53 + 1)
    assert TaskSequence(number=2**53).number == 2**53


def test_a_node_report_with_an_integer_beyond_what_json_parsers_read_exactly_is_refused() -> None:
    """The fuzzer's node.topology and node.health failures: sizes past 64 bits overflowed
    the scheduler's arrays and SQLite on every delivery."""
    topology = node("a100-01", gpus=2).model_dump(mode="json")
    topology["numa_nodes"][0]["memory_mb"] = 2**64
    with pytest.raises(ValidationError) as refused:
        NodeTopology.model_validate(topology)
    assert refused.value.errors()[0]["loc"] == ("numa_nodes", 0, "memory_mb")
    topology["numa_nodes"][0]["memory_mb"] = 2**53
    NodeTopology.model_validate(topology)  # the largest exact integer is still a size


@pytest.mark.parametrize("latency", [-1.0, 1.7976931348623155e308, float("nan"), float("inf")])
def test_a_latency_outside_a_day_is_refused_naming_the_sample(latency: float) -> None:
    """The fuzzer's inference.latency crash: huge and negative samples summed to inf - inf,
    and the autoscaler failed converting NaN to a replica count on every delivery."""
    with pytest.raises(ValidationError) as refused:
        LatencySamplesReported(service="chat", latencies_ms=[12.0, latency])
    assert refused.value.errors()[0]["loc"] == ("latencies_ms", 1)


def test_the_widest_accepted_latency_batch_keeps_the_autoscaler_finite() -> None:
    from crater.autoscaler.domain.autoscaler import Autoscaler

    sample = LatencySamplesReported(service="chat", latencies_ms=[MAX_LATENCY_MS] * 10_000)
    Autoscaler().observe(sample)  # would raise converting NaN before the bound


@pytest.mark.parametrize(
    ("field", "value", "where"),
    [
        ("memory_mb", 2**64, ("memory_mb",)),
        ("gpu_memory_mb", 2**63, ("gpu_memory_mb",)),
        ("cpu_cores", [0, 2**64], ("cpu_cores", 1)),
        ("gpu_ids", [2**70], ("gpu_ids", 0)),
        ("gang_size", 2**64, ("gang_size",)),
    ],
)
def test_a_grant_with_an_integer_no_database_holds_is_refused(
    field: str, value: object, where: tuple[object, ...]
) -> None:
    """The fuzzer's allocation.granted crash: the predictor's SQLite refused a 64-bit
    overflow on every delivery."""
    body = granted().model_dump(mode="json")
    body[field] = value
    with pytest.raises(ValidationError) as refused:
        AllocationGranted.model_validate(body)
    assert refused.value.errors()[0]["loc"] == where


def test_a_usage_sample_with_an_integer_no_database_holds_is_refused() -> None:
    """The fuzzer's usage.task crash: the predictor's SQLite refused it on every delivery."""
    with pytest.raises(ValidationError) as refused:
        TaskUsageReported(task_id="t1", interval_seconds=10, host_memory_used_mb=2**64)
    assert refused.value.errors()[0]["loc"] == ("host_memory_used_mb",)


def test_a_field_s_own_bounds_are_what_its_json_schema_says() -> None:
    """An exact integer's own `ge` shows in the published schema (it showed -2**53, and the
    fuzzer took a negative gang_index for valid)."""
    schema = AllocationGranted.model_json_schema()["properties"]
    assert schema["gang_index"]["minimum"] == 0
    assert schema["gang_size"]["minimum"] == 1
    assert schema["memory_mb"]["minimum"] == 0
