"""Lending by phase as the scheduler runs: real nats-server, real database. A training task
enters its CPU phase, an inference replica takes one of its cards (memory-capped), the
scheduler restarts, the task asks its cards back: the replica is told to go within the
reclaim grace, goes, and the task hears its cards are its own again. The audit log replays
it all the same."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from faststream import TestApp

from crater.contracts import (
    AllocationGranted,
    AllocationQuery,
    AllocationReleased,
    GpuPhase,
    GpuUsage,
    LendingState,
    NodeTopologyReported,
    TaskGpusLending,
    TaskPhaseReported,
    TaskPreempted,
    TaskProfiled,
    TaskStatus,
    TaskStatusReported,
)
from crater.runtime.bus import publish
from crater.runtime.db import make_engine, make_session_factory
from crater.runtime.nats_server import NatsServer
from crater.scheduler import audit
from crater.scheduler.app import SchedulerSettings, build, scheduler_config
from tests.support.events import EventTap
from tests.support.profiles import profiled
from tests.support.topologies import node

POOLS = """\
pools:
  inference:
    cohort: shared
    borrow: {limit: {gpus: 0}}
  training:
    cohort: shared
    borrow: {limit: {gpus: 0}}
"""


def submitted(task_id: str, kind: str, pool: str, gpus: int, **body: Any) -> TaskProfiled:
    return profiled(task_id, gpus, task_type=kind, gpu_memory_mb=20000, pool=pool, **body)


async def test_a_replica_borrows_a_training_card_for_its_cpu_phase_and_gives_it_back(
    fresh_nats: NatsServer, tap: EventTap, database_url: str, tmp_path: Path
) -> None:
    pools = tmp_path / "pools.yaml"
    pools.write_text(POOLS)
    settings = SchedulerSettings(
        nats_url=fresh_nats.url,
        database_url=database_url,
        pools_file=pools,
        phase_reclaim_grace_seconds=2.0,
    )
    service, app = build(settings)
    async with TestApp(app):
        for topology in (
            node("trn-01", gpus=2, pool="training"),
            node("inf-01", gpus=1, pool="inference"),
        ):
            await publish(service.broker, NodeTopologyReported(node=topology))
        for _ in range(200):  # both nodes known before any task (another stream)
            if len(service.state.scheduler.cluster) == 2:
                break
            await asyncio.sleep(0.05)
        await publish(service.broker, submitted("train-1", "training", "training", 2))
        [training] = await tap.wait_for(AllocationGranted)
        running = TaskStatusReported(
            task_id="train-1", status=TaskStatus.RUNNING, allocation_id=training.allocation_id
        )
        await publish(service.broker, running)
        await publish(service.broker, submitted("serve-1", "inference", "inference", 1))
        await tap.wait_for(AllocationGranted, count=2)
        await publish(service.broker, submitted("serve-2", "inference", "inference", 1))
        core = service.state.scheduler
        for _ in range(200):  # serve-2 waits (no card of its pool is free); train-1 runs
            if "serve-2" in core.pending and core.allocations["train-1"].running:
                break
            await asyncio.sleep(0.05)
        begin = TaskPhaseReported(
            task_id="train-1",
            allocation_id=training.allocation_id,
            phase=GpuPhase.CPU,
            gpus=[GpuUsage(gpu_id=0, utilization_percent=0, memory_used_mb=40000)],
        )
        await publish(service.broker, begin)
        [lent] = await tap.wait_for(TaskGpusLending)
        assert (lent.state, lent.gpu_ids) == (LendingState.LENT, [0, 1])
        [*_, replica] = await tap.wait_for(AllocationGranted, count=3)
        assert (replica.task_id, replica.node, replica.gpu_ids) == ("serve-2", "trn-01", [0])
        assert "lent by task train-1 during its CPU phase" in replica.explanation
        assert replica.environment["CRATER_LENT_BY"] == "train-1"

    # a new process: the lent card and its replica come back from the database
    service, app = build(settings)
    async with TestApp(app):
        for _ in range(200):
            if "train-1" in service.state.scheduler.phases:
                break
            await asyncio.sleep(0.05)
        trn = service.state.scheduler.cluster.get("trn-01")
        assert trn is not None
        assert trn.gpu_milli_free == [0, 0]  # train-1 still holds both cards
        end = TaskPhaseReported(
            task_id="train-1", allocation_id=training.allocation_id, phase=GpuPhase.GPU
        )
        await publish(service.broker, end)
        [preempted] = await tap.wait_for(TaskPreempted)
        assert (preempted.task_id, preempted.lent_by) == ("serve-2", "train-1")
        assert preempted.grace_period_seconds == 2
        [_, reclaiming] = await tap.wait_for(TaskGpusLending, count=2)
        assert reclaiming.state is LendingState.RECLAIMING
        # what the task's `cpu_phase` asks the gateway, which asks the scheduler
        ask = AllocationQuery(
            allocation_id=training.allocation_id, reservation_token=training.reservation_token
        )
        standing = await service.state.check_allocation(ask)
        assert (standing.verdict, standing.lending) == ("accepted", LendingState.RECLAIMING)
        assert standing.must_be_free_by == reclaiming.must_be_free_by
        stopped = TaskStatusReported(
            task_id="serve-2", status=TaskStatus.CANCELLED, allocation_id=replica.allocation_id
        )
        await publish(service.broker, stopped)
        [released] = await tap.wait_for(AllocationReleased)
        assert released.task_id == "serve-2"
        [*_, back] = await tap.wait_for(TaskGpusLending, count=3)
        assert back.state is LendingState.RETURNED
        assert back.occurred_at <= reclaiming.must_be_free_by  # type: ignore[operator]
        assert not service.state.scheduler.lent_cards
        assert (await service.state.check_allocation(ask)).lending is None

    # the audit log replays both processes' decisions, the phases' among them, byte for byte
    engine = make_engine(database_url)
    try:
        async with make_session_factory(engine)() as session:
            log = await audit.all_entries(session)
    finally:
        await engine.dispose()
    assert sum(e.kind == "TaskPhaseReported" for e in log) == 2
    replayed = audit.replay(log, scheduler_config(settings))
    assert replayed.divergence is None, replayed.divergence and replayed.divergence.render()
    assert replayed.compared == replayed.events
