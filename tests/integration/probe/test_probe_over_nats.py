"""The probe as it runs: a real nats-server, real JetStream publishing and consumers."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any
from uuid import uuid4

from faststream import TestApp

from crater.contracts import (
    AllocationGranted,
    MessageRejected,
    NodeCondition,
    NodeHealthReported,
    NodeMetricsReported,
    NodeTopologyReported,
    TaskStatus,
    TaskStatusReported,
    derived_event_id,
    utc_now,
)
from crater.probe.app import ProbeSettings, build
from crater.probe.sim.fleet import load_fleet
from crater.runtime.bus import publish
from crater.runtime.nats_server import NatsServer
from tests.support.events import EventTap, publish_raw

# Past the consumers' 30 s ack wait: on a starved machine a pull can time out client-side
# with its message already sent, which then only comes back as a redelivery.
CONSUMED_WITHIN = 45.0


def fast(nats: NatsServer, **overrides: Any) -> ProbeSettings:
    """Settings with metrics and health every 0.2 s, so a test sees rounds quickly."""
    return ProbeSettings(
        nats_url=nats.url,
        metrics_interval_seconds=0.2,
        health_interval_seconds=0.2,
        **overrides,
    )


def grant(allocation: str, node: str, gpu_ids: list[int]) -> AllocationGranted:
    return AllocationGranted(
        allocation_id=allocation,
        task_id=f"task-{allocation}",
        node=node,
        pool="training",
        tenant="default",
        gpu_ids=gpu_ids,
        gpu_memory_mb=60000,
        cpu_cores=list(range(16)),
        numa_node=0,
        memory_mb=131072,
        checkpoint_path="/data/nvme1/ckpt",
        reservation_token="token-1",
        reservation_expires_at=utc_now() + timedelta(seconds=30),
        score=0.9,
        explanation="test",
        environment={"CRATER_GPU_IDS": ",".join(map(str, gpu_ids))},
    )


def small_fleet(tmp_path: Path) -> Path:
    path = tmp_path / "small.yaml"
    path.write_text(
        "seed: 5\nnodes:\n"
        "  - {profile: dgx-a100-8, count: 1, pool: training}\n"
        "  - {profile: t4-1, count: 2, pool: inference}\n"
    )
    return path


async def test_fleet_mode_reports_topology_metrics_and_health_for_every_node(
    fresh_nats: NatsServer, tap: EventTap
) -> None:
    settings = fast(fresh_nats, mode="fleet", seed=42)
    service, app = build(settings)
    expected = {n.node_id: n for n in load_fleet(None, seed=42)}
    async with TestApp(app):
        topologies = await tap.wait_for(NodeTopologyReported, count=38)
        assert {t.node.node_id for t in topologies} == set(expected)
        for report in topologies:
            assert report.node == expected[report.node.node_id]
        # Two rounds of metrics and of health for every node.
        await tap.wait_for(NodeMetricsReported, count=76)
        health = await tap.wait_for(NodeHealthReported, count=76)
        assert {h.node_id for h in health} == set(expected)
        assert {h.condition for h in health} == {NodeCondition.READY}
    assert len(tap.of(NodeTopologyReported)) == 38  # one each: republished every 300 s only
    subjects = {m.subject for m in tap.raw}
    assert "crater.v1.node.topology.a100-01" in subjects
    assert "crater.v1.node.health.cpu-08" in subjects
    published = service.registry.get_sample_value(
        "crater_probe_events_published_total", {"kind": "topology"}
    )
    assert published == 38
    assert service.registry.get_sample_value("crater_probe_nodes") == 38


async def test_runner_turns_a_grant_into_running_then_succeeded_once(
    fresh_nats: NatsServer, tap: EventTap, tmp_path: Path
) -> None:
    settings = fast(
        fresh_nats,
        mode="fleet",
        fleet_file=small_fleet(tmp_path),
        task_seconds_min=0.6,
        task_seconds_max=0.6,
        task_start_seconds=0.05,
    )
    service, app = build(settings)
    async with TestApp(app):
        await tap.wait_for(NodeTopologyReported, count=3)
        granted = grant("alloc-1", "a100-01", [0, 1])
        await publish(service.broker, granted)
        await publish(service.broker, grant("alloc-9", "ghost-01", [0]))  # not this fleet's
        [running] = await tap.wait_for(
            TaskStatusReported, lambda e: e.status is TaskStatus.RUNNING, timeout=CONSUMED_WITHIN
        )
        assert running.task_id == "task-alloc-1"
        assert running.allocation_id == "alloc-1"
        assert running.event_id == derived_event_id(granted.event_id, "running")
        # While it runs, the cards it holds are busy and the others idle.
        [busy] = await tap.wait_for(
            NodeMetricsReported,
            lambda m: m.node_id == "a100-01" and m.gpus[0].utilization_percent > 50,
        )
        assert busy.gpus[1].memory_used_mb > 50000
        assert busy.gpus[2].utilization_percent < 5
        # The same grant again under a new message id (so past JetStream's de-duplication, as
        # a redelivery after the duplicate window would be): the runner knows the allocation.
        await publish(service.broker, granted.model_copy(update={"event_id": uuid4()}))
        [done] = await tap.wait_for(TaskStatusReported, lambda e: e.status is TaskStatus.SUCCEEDED)
        assert done.event_id == derived_event_id(granted.event_id, "succeeded")
    statuses = [(e.task_id, e.status.value) for e in tap.of(TaskStatusReported)]
    assert statuses == [("task-alloc-1", "running"), ("task-alloc-1", "succeeded")]
    assert service.registry.get_sample_value("crater_probe_grants_total", {"outcome": "not-ours"})


async def test_malformed_grants_are_rejected_and_consuming_goes_on(
    fresh_nats: NatsServer, tap: EventTap, tmp_path: Path
) -> None:
    settings = fast(
        fresh_nats,
        mode="fleet",
        fleet_file=small_fleet(tmp_path),
        task_seconds_min=0.1,
        task_seconds_max=0.1,
        task_start_seconds=0.01,
    )
    service, app = build(settings)
    async with TestApp(app):
        subject = "crater.v1.allocation.granted"
        await publish_raw(fresh_nats.url, subject, b"{not json")
        bad = json.loads(grant("alloc-bad", "t4-01", [0]).model_dump_json())
        bad["gpu_ids"] = "zero"
        await publish_raw(fresh_nats.url, subject, json.dumps(bad).encode())
        await publish(service.broker, grant("alloc-2", "t4-02", [0]))

        rejected = await tap.wait_for(MessageRejected, count=2, timeout=CONSUMED_WITHIN)
        assert {r.consumer for r in rejected} == {"probe"}
        assert rejected[0].errors[0].field == "body"
        assert rejected[1].errors[0].field.startswith("gpu_ids")
        statuses = await tap.wait_for(TaskStatusReported, count=2, timeout=CONSUMED_WITHIN)
        assert [(s.task_id, s.status.value) for s in statuses] == [
            ("task-alloc-2", "running"),
            ("task-alloc-2", "succeeded"),
        ]


async def test_local_mode_reports_this_machine(fresh_nats: NatsServer, tap: EventTap) -> None:
    settings = fast(fresh_nats, mode="local", pool="edge")
    _, app = build(settings)
    async with TestApp(app):
        [topology] = await tap.wait_for(NodeTopologyReported)
        node = topology.node
        assert node.pool == "edge"
        assert not node.simulated
        assert node.cpu.threads >= 1
        [metrics] = await tap.wait_for(NodeMetricsReported)
        assert metrics.node_id == node.node_id
        assert metrics.memory_total_mb > 0
        [health] = await tap.wait_for(NodeHealthReported)
        assert health.node_id == node.node_id
        assert {c.name for c in health.checks} >= {"memory-pressure", "disk-present"}
