"""Each pool's totals and fragmentation, and each waiting task's wait, as the scheduler
exports them (`domain/capacity.py`, `service_layer/cluster_metrics.py`)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from prometheus_client import CollectorRegistry

from crater.contracts import AllocationGranted, NodeCondition, NodeHealthReported
from crater.scheduler.domain.capacity import pool_totals
from crater.scheduler.service_layer.cluster_metrics import GB, MIB, ClusterSeries
from tests.support.topologies import node
from tests.unit.scheduler.test_core import at, cluster, profiled


def test_capacity_is_allocated_plus_free_plus_unavailable_per_pool() -> None:
    scheduler, _ = cluster(
        node("a100-01", gpus=8, pool="training"),
        node("a100-02", gpus=8, pool="training"),
        node("t4-01", gpus=1, gpu_memory_mb=15360, pool="inference", cores=8),
    )
    [granted] = scheduler.handle(profiled("t1", gpus=2, cores=8, mem=16000, pool="training"))
    assert isinstance(granted, AllocationGranted)
    scheduler.handle(
        NodeHealthReported(
            occurred_at=at(2), node_id="a100-02", condition=NodeCondition.NOT_READY, score=0
        )
    )
    totals = pool_totals(scheduler.cluster)
    training = totals["training"]
    assert training.gpus.states() == {
        "capacity": 16,
        "allocated": 2,
        "free": 6,
        "unavailable": 8,  # a100-02 is NotReady
    }
    assert training.gpu_memory_mb.capacity == 16 * 81920
    assert training.gpu_memory_mb.allocated == 2 * 81920  # the cards taken, whole
    assert training.cpu_cores.states() == {
        "capacity": 64,
        "allocated": 8,
        "free": 24,
        "unavailable": 32,
    }
    assert training.memory_mb.allocated == granted.memory_mb
    assert training.disk_gb == 2 * 3800
    assert training.nodes[NodeCondition.NOT_READY] == 1
    assert totals["inference"].gpus.states()["free"] == 1


def test_fragmentation_is_the_free_share_the_workload_seen_cannot_use() -> None:
    scheduler, _ = cluster(node("a100-01", gpus=2, pool="training"))
    # Before any GPU request: measured against one whole card; nothing is cut yet.
    assert pool_totals(scheduler.cluster)["training"].fragmentation_ratio == 0.0
    # Half of card 0 taken: its other half is free but no whole-card task can use it.
    [half] = scheduler.handle(profiled("half", gpus=1, milli=500, cores=2, pool="training"))
    assert isinstance(half, AllocationGranted)
    totals = pool_totals(scheduler.cluster)["training"]
    assert totals.gpus.free == 1.5
    # the workload seen so far: one half-card task, which still fits the half left: 0
    assert totals.gpus_fragmented == 0.0
    # Then a run of two-card requests, the workload's shape from now on: a node with 1.5
    # cards free cannot run one, so all of its free share is fragmented.
    for _ in range(100):
        scheduler.cluster.workload.observe_shape(2, 1000, None, 4, 16000)
    totals = pool_totals(scheduler.cluster)["training"]
    assert totals.gpus_fragmented == pytest.approx(1.5, rel=0.2)
    assert 0.8 <= totals.fragmentation_ratio <= 1.0


def test_the_series_carry_units_and_each_waiting_task_its_wait() -> None:
    scheduler, _ = cluster(node("a100-01", gpus=1, pool="training"))
    scheduler.handle(profiled("first", when=10, gpus=1, pool="training", tenant="vision"))
    scheduler.handle(profiled("second", when=20, gpus=1, pool="training", tenant="nlp"))
    scheduler.handle(profiled("third", when=30, gpus=1, pool="training", tenant="nlp"))
    registry = CollectorRegistry()
    registry.register(ClusterSeries(lambda: scheduler, task_limit=1, clock=lambda: at(50)))
    value = registry.get_sample_value
    training = {"pool": "training"}
    assert value("crater_pool_gpus", {**training, "state": "allocated"}) == 1
    assert value("crater_pool_gpus", {**training, "state": "fragmented"}) == 0
    assert value("crater_pool_gpu_memory_bytes", {**training, "state": "capacity"}) == 81920 * MIB
    assert value("crater_pool_memory_bytes", {**training, "state": "capacity"}) == 512_000 * MIB
    assert value("crater_pool_disk_bytes", {**training, "state": "capacity"}) == 3800 * GB
    assert value("crater_pool_gpu_fragmentation_ratio", training) == 0
    assert value("crater_pool_nodes", {**training, "condition": "Ready"}) == 1
    # "first" holds the card; of the two waiting, only the longest waiting is exported.
    wait = "crater_task_wait_seconds"
    assert value(wait, {"task_id": "second", "tenant": "nlp", "pool": "training"}) == 30
    assert value(wait, {"task_id": "third", "tenant": "nlp", "pool": "training"}) is None
    assert value("crater_scheduler_waiting_tasks_not_exported") == 1


def test_a_placed_task_leaves_the_wait_series() -> None:
    scheduler, _ = cluster(node("a100-01", gpus=1, pool="training"))
    scheduler.handle(profiled("first", when=1, gpus=1, pool="training"))
    scheduler.handle(profiled("second", when=2, gpus=1, pool="training"))
    registry = CollectorRegistry()
    series = ClusterSeries(lambda: scheduler, clock=lambda: at(5) + timedelta(seconds=0.5))
    registry.register(series)
    labels = {"task_id": "second", "tenant": "default", "pool": "training"}
    assert registry.get_sample_value("crater_task_wait_seconds", labels) == 3.5
    scheduler.pending.clear()  # placed, rejected or cancelled: no longer waiting
    assert registry.get_sample_value("crater_task_wait_seconds", labels) is None
