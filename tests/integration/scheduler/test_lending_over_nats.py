"""Pools that lend and reclaim as the scheduler runs: real nats-server, real database, a
restart between the loan and the reclaim (the loan is known again from the node's pool)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from faststream import TestApp

from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    NodeTopologyReported,
    TaskPending,
    TaskPreempted,
    TaskProfiled,
    TaskStatus,
    TaskStatusReported,
)
from crater.runtime.bus import publish
from crater.runtime.nats_server import NatsServer
from crater.scheduler.app import SchedulerSettings, build
from tests.support.events import EventTap
from tests.support.profiles import profiled
from tests.support.topologies import node

RELOADS = "crater_scheduler_config_reloads_total"
POOLS = """\
pools:
  inference:
    cohort: shared
    borrow: {limit: {gpus: 0}}
  training:
    cohort: shared
    borrow: {limit: {gpus: 4}}
"""


def submitted(task_id: str, pool: str, gpus: int, **body: Any) -> TaskProfiled:
    return profiled(task_id, gpus, pool=pool, **body)


async def test_training_borrows_idle_inference_cards_and_inference_reclaims_them(
    fresh_nats: NatsServer, tap: EventTap, database_url: str, tmp_path: Path
) -> None:
    pools = tmp_path / "pools.yaml"
    pools.write_text(POOLS)
    settings = SchedulerSettings(
        nats_url=fresh_nats.url, database_url=database_url, pools_file=pools
    )
    service, app = build(settings)
    async with TestApp(app):
        for topology in (
            node("inf-01", gpus=4, pool="inference"),
            node("trn-01", gpus=2, pool="training"),
        ):
            await publish(service.broker, NodeTopologyReported(node=topology))
        for _ in range(200):  # both pools' nodes known before any task (another stream)
            if len(service.state.scheduler.cluster) == 2:
                break
            await asyncio.sleep(0.05)
        await publish(service.broker, submitted("train-1", "training", 2, priority="high"))
        await publish(service.broker, submitted("train-2", "training", 2, priority="high"))
        first, loan = await tap.wait_for(AllocationGranted, count=2)
        assert (first.task_id, first.node, first.borrowed_from) == ("train-1", "trn-01", None)
        assert (loan.task_id, loan.node, loan.borrowed_from) == ("train-2", "inf-01", "inference")
        assert "borrowed 2 GPUs from pool inference" in loan.explanation

    # a new process: the loan comes back from the database, reclaimable
    service, app = build(settings)
    async with TestApp(app):
        await publish(service.broker, submitted("serve-1", "inference", 4, priority="low"))
        [preempted] = await tap.wait_for(TaskPreempted)
        assert (preempted.task_id, preempted.preempted_by, preempted.reclaimed_by_pool) == (
            "train-2",
            "serve-1",
            "inference",
        )
        stopped = TaskStatusReported(
            task_id="train-2", status=TaskStatus.CANCELLED, allocation_id=loan.allocation_id
        )
        await publish(service.broker, stopped)
        [*_, serve] = await tap.wait_for(AllocationGranted, count=3)
        assert (serve.task_id, serve.node, serve.borrowed_from) == ("serve-1", "inf-01", None)
        released = await tap.wait_for(AllocationReleased)
        assert [r.task_id for r in released] == ["train-2"]


async def test_the_pools_file_is_reloaded_without_a_restart(
    fresh_nats: NatsServer, tap: EventTap, database_url: str, tmp_path: Path
) -> None:
    """No cohort at the start: training waits. The file gets a cohort (an invalid version
    first, refused, the running one kept); the next event applies it and training borrows."""
    pools = tmp_path / "pools.yaml"
    pools.write_text("pools: {inference: {}, training: {}}\n")
    settings = SchedulerSettings(
        nats_url=fresh_nats.url,
        database_url=database_url,
        pools_file=pools,
        config_reload_seconds=0.01,
    )
    service, app = build(settings)
    async with TestApp(app):
        for topology in (
            node("inf-01", gpus=4, pool="inference"),
            node("trn-01", gpus=2, pool="training"),
        ):
            await publish(service.broker, NodeTopologyReported(node=topology))
        for _ in range(200):
            if len(service.state.scheduler.cluster) == 2:
                break
            await asyncio.sleep(0.05)
        await publish(service.broker, submitted("train-1", "training", 2))
        await publish(service.broker, submitted("train-2", "training", 2))
        [first] = await tap.wait_for(AllocationGranted)
        assert first.task_id == "train-1"
        for _ in range(200):
            if "train-2" in service.state.scheduler.pending:
                break
            await asyncio.sleep(0.05)
        pools.write_text("pools:\n  training: {borrow: {limit: {gpus: 4}}}\n")  # no cohort
        await asyncio.sleep(0.05)
        await publish(
            service.broker, NodeTopologyReported(node=node("inf-02", gpus=4, pool="inference"))
        )
        for _ in range(200):
            if len(service.state.scheduler.cluster) == 3:
                break
            await asyncio.sleep(0.05)
        assert "train-2" in service.state.scheduler.pending  # refused: nothing lends
        assert not service.state.scheduler.config.cohort_of("training")
        refused = {"outcome": "refused"}
        assert service.registry.get_sample_value(RELOADS, refused) == 1.0
        pools.write_text(POOLS)
        await asyncio.sleep(0.05)
        await publish(
            service.broker, NodeTopologyReported(node=node("trn-02", gpus=0, pool="training"))
        )
        [_, loan] = await tap.wait_for(AllocationGranted, count=2)
        assert (loan.task_id, loan.borrowed_from) == ("train-2", "inference")
        applied = {"outcome": "applied"}
        assert service.registry.get_sample_value(RELOADS, applied) == 1.0


PREEMPTING = """\
pools:
  inference:
    cohort: shared
    borrow: {limit: {gpus: 1}, preempt: lower-priority}
  training:
    cohort: shared
    lend: {reclaim: lower-priority}
"""


async def test_a_replica_its_pool_cannot_hold_preempts_training_to_borrow_across_a_restart(
    fresh_nats: NatsServer, tap: EventTap, database_url: str, tmp_path: Path
) -> None:
    """Inference full of its own replicas: a new replica has a low-priority training task
    yield and, after a restart while the victim checkpoints, borrows its card; training's
    next task does not take it back."""
    pools = tmp_path / "pools.yaml"
    pools.write_text(PREEMPTING)
    settings = SchedulerSettings(
        nats_url=fresh_nats.url, database_url=database_url, pools_file=pools
    )
    service, app = build(settings)
    async with TestApp(app):
        for topology in (
            node("inf-01", gpus=2, pool="inference"),
            node("trn-01", gpus=2, pool="training"),
        ):
            await publish(service.broker, NodeTopologyReported(node=topology))
        for _ in range(200):
            if len(service.state.scheduler.cluster) == 2:
                break
            await asyncio.sleep(0.05)
        replica = {"priority": "high", "preemptible": False}
        await publish(service.broker, submitted("serve-0", "inference", 2, **replica))
        await publish(
            service.broker,
            submitted("train-1", "training", 2, priority="low", preemptible=True),
        )
        _, train = await tap.wait_for(AllocationGranted, count=2)
        assert (train.task_id, train.node) == ("train-1", "trn-01")
        await publish(service.broker, submitted("serve-1", "inference", 1, **replica))
        [preempted] = await tap.wait_for(TaskPreempted)
        assert (preempted.task_id, preempted.preempted_by, preempted.reclaimed_by_pool) == (
            "train-1",
            "serve-1",
            None,
        )

    # a new process: the replica still waits for the room its victim leaves on trn-01
    service, app = build(settings)
    async with TestApp(app):
        stopped = TaskStatusReported(
            task_id="train-1", status=TaskStatus.CANCELLED, allocation_id=train.allocation_id
        )
        await publish(service.broker, stopped)
        [*_, serve] = await tap.wait_for(AllocationGranted, count=3)
        assert (serve.task_id, serve.node, serve.borrowed_from) == ("serve-1", "trn-01", "training")
        assert "borrowed 1 GPU from pool training" in serve.explanation
        # Training's next task takes the other card; none takes the replica's back.
        await publish(
            service.broker,
            submitted("train-2", "training", 2, priority="medium", preemptible=True),
        )
        await tap.wait_for(TaskPending, lambda p: p.task_id == "train-2")
        await asyncio.sleep(0.5)  # a preemption would be published with it, just after
        assert "train-2" in service.state.scheduler.pending
        assert len(await tap.wait_for(TaskPreempted)) == 1  # only train-1's, long ago
