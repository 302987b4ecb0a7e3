"""Reconciling against reality across services: the scheduler and the probe's simulated fleet
as they run, over a real nats-server and a real database (SQLite and PostgreSQL). The fleet's
heartbeats list what its nodes run; the scheduler blocks the cards of a task it never placed
that a node runs (a stray grant, as a deposed leader could leave), and releases, with the
drift event and the task's end, an allocation the node stopped running when its agent
restarted and forgot it, the case that leaves other schedulers holding cards until they
restart."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import nats
from faststream import TestApp

from crater.contracts import (
    AllocationDriftFound,
    AllocationGranted,
    AllocationReleased,
    Confidence,
    DriftAction,
    DriftKind,
    NodeHealthReported,
    NodesAnswer,
    NodesQuery,
    NodeTopologyReported,
    QuerySubjects,
    ResourcePrediction,
    TaskEnded,
    TaskProfiled,
    TaskRequest,
    TaskStatus,
    TaskStatusReported,
    utc_now,
)
from crater.probe.app import ProbeSettings
from crater.probe.app import build as build_probe
from crater.runtime.bus import publish
from crater.runtime.nats_server import NatsServer
from crater.scheduler.app import SchedulerSettings, build
from tests.support.events import EventTap

# Past the consumers' 30 s ack wait on a starved machine, as the probe's own tests allow.
WITHIN = 45.0
PREDICTION = ResourcePrediction(
    gpu_memory_per_gpu_mb=20000,
    host_memory_mb=8000,
    confidence=Confidence.MEDIUM,
    method="test",
    dataloader_num_workers=2,
    dataloader_prefetch_factor=2,
)


def fleet_file(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text("seed: 5\nnodes:\n  - {profile: dgx-a100-8, count: 1, pool: training}\n")
    return path


def probe_settings(nats: NatsServer, fleet: Path) -> ProbeSettings:
    # Heartbeats every 0.3 s; simulated tasks run for ten minutes: they end only if released.
    return ProbeSettings(
        nats_url=nats.url,
        mode="fleet",
        fleet_file=fleet,
        metrics_interval_seconds=0.3,
        health_interval_seconds=0.3,
        task_seconds_min=600,
        task_seconds_max=600,
        task_start_seconds=0.05,
    )


def profiled(task_id: str, gpus: int) -> TaskProfiled:
    request = TaskRequest.model_validate(
        {
            "task_id": task_id,
            "task_type": "training",
            "model_config": {"name": "m"},
            "resource_requirements": {
                "gpu": {"count": gpus, "memory_mb": 40000},
                "cpu": {"cores": 4},
                "memory": {"capacity_mb": 8000},
            },
            "pool": "training",
        }
    )
    return TaskProfiled(task=request, prediction=PREDICTION)


def stray_grant() -> AllocationGranted:
    """A grant this scheduler never made (another, deposed leader's, say) for cards 6 and 7."""
    return AllocationGranted(
        allocation_id="stray-1",
        task_id="stray",
        node="a100-01",
        pool="training",
        tenant="default",
        gpu_ids=[6, 7],
        gpu_memory_mb=40000,
        cpu_cores=[60, 61],
        numa_node=1,
        memory_mb=8000,
        checkpoint_path=None,
        reservation_token="not-ours",
        reservation_expires_at=utc_now() + timedelta(seconds=60),
        score=0.5,
        explanation="stray",
        environment={"CRATER_GPU_IDS": "6,7"},
    )


async def gpus_free(nats_url: str, node: str) -> int:
    connection = await nats.connect(nats_url)
    try:
        reply = await connection.request(
            QuerySubjects.NODES, NodesQuery().model_dump_json().encode(), timeout=5
        )
    finally:
        await connection.close()
    [row] = [n for n in NodesAnswer.model_validate_json(reply.data).nodes if n.node_id == node]
    return row.gpus_free


async def test_stray_and_forgotten_allocations_are_found_fixed_and_said(
    fresh_nats: NatsServer, tap: EventTap, database_url: str, tmp_path: Path
) -> None:
    settings = SchedulerSettings(
        nats_url=fresh_nats.url,
        database_url=database_url,
        reconcile_interval_seconds=1,
        reconcile_grace_seconds=3,
    )
    fleet = fleet_file(tmp_path)
    scheduler, app = build(settings)
    async with TestApp(app):
        probe, probe_app = build_probe(probe_settings(fresh_nats, fleet))
        async with TestApp(probe_app):
            await tap.wait_for(NodeTopologyReported, timeout=WITHIN)
            await publish(scheduler.broker, profiled("kept", gpus=4))
            [grant] = await tap.wait_for(AllocationGranted, timeout=WITHIN)
            assert grant.node == "a100-01"
            await tap.wait_for(
                TaskStatusReported,
                lambda r: r.task_id == "kept" and r.status is TaskStatus.RUNNING,
                timeout=WITHIN,
            )
            await publish(probe.broker, stray_grant())
            [held] = await tap.wait_for(
                AllocationDriftFound, lambda d: d.action is DriftAction.HELD, timeout=WITHIN
            )
            assert (held.kind, held.node, held.allocation_id, held.gpu_ids) == (
                DriftKind.UNKNOWN_ALLOCATION,
                "a100-01",
                "stray-1",
                [6, 7],
            )
            assert "does not hold there" in held.reason
            # its inventory was in the heartbeats all along, the running task's with it
            heartbeats = tap.of(NodeHealthReported, lambda h: bool(h.running))
            assert any(
                {r.allocation_id for r in h.running or []} == {grant.allocation_id, "stray-1"}
                for h in heartbeats
            )
            # 8 cards: 4 held by "kept", 2 blocked for the stray
            assert await gpus_free(fresh_nats.url, "a100-01") == 2
            # the task that runs as placed was never called drift
            assert not tap.of(AllocationDriftFound, lambda d: d.task_id == "kept")

        # The agent restarts and forgets what it ran (its simulated runs die with it).
        probe, probe_app = build_probe(probe_settings(fresh_nats, fleet))
        async with TestApp(probe_app):
            [orphaned] = await tap.wait_for(
                AllocationDriftFound,
                lambda d: d.kind is DriftKind.ORPHANED_ALLOCATION,
                timeout=WITHIN,
            )
            assert (orphaned.action, orphaned.allocation_id, orphaned.task_id) == (
                DriftAction.RELEASED,
                grant.allocation_id,
                "kept",
            )
            assert "has not reported it running" in orphaned.reason
            [released] = await tap.wait_for(
                AllocationReleased, lambda r: r.task_id == "kept", timeout=WITHIN
            )
            assert released.reason == "failed"
            [ended] = await tap.wait_for(TaskEnded, lambda e: e.task_id == "kept", timeout=WITHIN)
            assert ended.status is TaskStatus.FAILED
            assert "orphaned allocation" in ended.reason
            [freed] = await tap.wait_for(
                AllocationDriftFound, lambda d: d.action is DriftAction.FREED, timeout=WITHIN
            )
            assert (freed.allocation_id, freed.gpu_ids) == ("stray-1", [6, 7])
            assert await gpus_free(fresh_nats.url, "a100-01") == 8
        drift = scheduler.registry.get_sample_value
        assert (
            drift(
                "crater_scheduler_drift_total",
                {"kind": "orphaned-allocation", "action": "released"},
            )
            == 1
        )
        assert (
            drift("crater_scheduler_drift_total", {"kind": "unknown-allocation", "action": "held"})
            == 1
        )
        assert not tap.of(AllocationDriftFound, lambda d: d.kind is DriftKind.LEDGER_MISMATCH)
    # what was decided is stored: the task ended failed, its allocation released
    scheduler, app = build(settings)
    async with TestApp(app):
        assert "kept" not in scheduler.state.scheduler.allocations
