"""A task retried after a failed attempt keeps away from the node it failed on across a
scheduler restart: the nodes are read back from the attempts' rows (real SQLite and
PostgreSQL)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from faststream.nats import NatsBroker
from prometheus_client import CollectorRegistry

from crater.contracts import (
    AllocationGranted,
    NodeTopologyReported,
    RestartPolicy,
    TaskProfiled,
    TaskStatus,
    TaskStatusReported,
)
from crater.runtime.outbox import OutboxRelay
from crater.scheduler.adapters.orm import outbox
from crater.scheduler.domain.core import SchedulerConfig
from crater.scheduler.service_layer.handlers import SchedulerMetrics, SchedulerService
from tests.support.profiles import small_training
from tests.support.topologies import node

pytestmark = pytest.mark.integration


async def leader(sessions: Any, epoch: int) -> SchedulerService:
    # The relay is never started: the decisions are read from what `handle` returns.
    relay = OutboxRelay(sessions, outbox, NatsBroker("nats://127.0.0.1:1"))
    service = SchedulerService(
        sessions, relay, SchedulerConfig(), SchedulerMetrics(CollectorRegistry())
    )
    await service.take_over(epoch, f"replica-{epoch}")
    return service


async def test_a_retry_keeps_away_from_the_node_it_failed_on_after_a_restart(
    sessions: Any,
) -> None:
    now = datetime.now(UTC)
    first = await leader(sessions, 1)
    for name in ("n1", "n2"):
        topology = NodeTopologyReported(occurred_at=now, node=node(name, gpus=1))
        await first.handle(topology, "node-topology")
    blocker = small_training("blocker", at=now)
    profiled = small_training("retried", at=now)
    policy = RestartPolicy(when=["failure"], backoff_seconds=0, max_attempts=3)
    request = profiled.task.model_copy(update={"restart_policy": policy})
    task = TaskProfiled(occurred_at=now, task=request, prediction=profiled.prediction)
    [grant] = [d for d in await first.handle(task, "tasks") if isinstance(d, AllocationGranted)]
    [held] = [d for d in await first.handle(blocker, "tasks") if isinstance(d, AllocationGranted)]
    assert held.node != grant.node
    failed = TaskStatusReported(
        occurred_at=now + timedelta(seconds=1),
        task_id="retried",
        status=TaskStatus.FAILED,
        allocation_id=grant.allocation_id,
    )
    decisions = await first.handle(failed, "task-status")
    assert not [d for d in decisions if isinstance(d, AllocationGranted)]
    assert first.scheduler.pending["retried"].failed_on == (grant.node,)

    second = await leader(sessions, 2)  # a restart: the core rebuilt from the tables
    assert second.scheduler.pending["retried"].failed_on == (grant.node,)
    ended = TaskStatusReported(
        occurred_at=now + timedelta(seconds=2),
        task_id="blocker",
        status=TaskStatus.SUCCEEDED,
        allocation_id=held.allocation_id,
    )
    decisions = await second.handle(ended, "task-status")
    [retry] = [d for d in decisions if isinstance(d, AllocationGranted)]
    assert (retry.task_id, retry.node, retry.attempt) == ("retried", held.node, 2)
