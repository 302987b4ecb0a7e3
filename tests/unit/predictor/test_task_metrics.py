"""The per-task series (`TaskMetrics`): what each held allocation asked for against what its
task really uses, the two GPU memory shares, and their bound."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from prometheus_client import CollectorRegistry

from crater.predictor.domain.usage import HeldTask, UsageRecord
from crater.predictor.service_layer.usage import MIB, TaskMetrics

NOW = datetime(2026, 12, 2, 12, tzinfo=UTC)


def held(i: int, **readings: object) -> HeldTask:
    record = UsageRecord(
        allocation_id=f"alloc-{i}",
        task_id=f"task-{i}",
        tenant="vision",
        pool="training",
        gpu_model="A100",
        gpus=2,
        gpu_milli=1000,
        gpu_memory_mb=40960,
        cpu_cores=8,
        memory_mb=65536,
        granted_at=NOW - timedelta(minutes=10 + i),
        released_at=None,
        sampled_seconds=readings.pop("sampled", 0.0),  # type: ignore[arg-type]
        busy_seconds=readings.pop("busy", 0.0),  # type: ignore[arg-type]
    )
    fields: dict[str, object] = {
        "running_at": None,
        "gpu_memory_used_mb": None,
        "gpu_memory_card_mb": None,
        "host_memory_used_mb": None,
        "cpu_utilization_percent": None,
    }
    fields.update(readings)
    return HeldTask(record=record, **fields)  # type: ignore[arg-type]


def labels(i: int) -> dict[str, str]:
    return {
        "task_id": f"task-{i}",
        "allocation_id": f"alloc-{i}",
        "tenant": "vision",
        "pool": "training",
    }


def test_requested_against_used_and_both_gpu_memory_shares() -> None:
    registry = CollectorRegistry()
    metrics = TaskMetrics(registry)
    task = held(
        1,
        running_at=NOW - timedelta(seconds=300),
        gpu_memory_used_mb=61440,
        gpu_memory_card_mb=81920,
        host_memory_used_mb=32768,
        cpu_utilization_percent=50.0,
        sampled=100.0,
        busy=80.0,
    )
    metrics.show([task], NOW, limit=10)
    value = registry.get_sample_value
    assert value("crater_task_gpus_requested", labels(1)) == 2
    assert value("crater_task_gpu_utilization_percent", labels(1)) == 80
    assert value("crater_task_gpu_memory_requested_bytes", labels(1)) == 40960 * MIB
    assert value("crater_task_gpu_memory_used_bytes", labels(1)) == 61440 * MIB
    # more than it reserved (1.5 of its request), three quarters of the physical card
    assert value("crater_task_gpu_memory_request_usage_ratio", labels(1)) == 1.5
    assert value("crater_task_gpu_memory_card_usage_ratio", labels(1)) == 0.75
    assert value("crater_task_cpu_cores_requested", labels(1)) == 8
    assert value("crater_task_cpu_cores_used", labels(1)) == 4
    assert value("crater_task_memory_requested_bytes", labels(1)) == 65536 * MIB
    assert value("crater_task_memory_used_bytes", labels(1)) == 32768 * MIB
    assert value("crater_task_run_seconds", labels(1)) == 300


def test_what_was_not_measured_has_no_series() -> None:
    registry = CollectorRegistry()
    TaskMetrics(registry).show([held(1)], NOW, limit=10)
    value = registry.get_sample_value
    assert value("crater_task_gpus_requested", labels(1)) == 2  # what it asked for: always
    for name in (
        "crater_task_gpu_utilization_percent",
        "crater_task_gpu_memory_used_bytes",
        "crater_task_gpu_memory_request_usage_ratio",
        "crater_task_gpu_memory_card_usage_ratio",
        "crater_task_cpu_cores_used",
        "crater_task_memory_used_bytes",
        "crater_task_run_seconds",
    ):
        assert value(name, labels(1)) is None, name


def test_the_longest_held_up_to_the_limit_and_released_ones_go() -> None:
    registry = CollectorRegistry()
    metrics = TaskMetrics(registry)
    metrics.show([held(i) for i in range(5)], NOW, limit=2)
    shown = [
        i for i in range(5) if registry.get_sample_value("crater_task_gpus_requested", labels(i))
    ]
    assert shown == [3, 4]  # granted earliest
    assert registry.get_sample_value("crater_predictor_allocations_not_exported") == 3
    metrics.show([held(0)], NOW, limit=2)  # the others released
    assert registry.get_sample_value("crater_task_gpus_requested", labels(4)) is None
    assert registry.get_sample_value("crater_task_gpus_requested", labels(0)) == 2
    assert registry.get_sample_value("crater_predictor_allocations_not_exported") == 0
