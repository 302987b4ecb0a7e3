"""Cordons across a scheduler restart (real SQLite and PostgreSQL): an operator's cordon,
and a fault an operator lifted that the probe still reports, are read back from the nodes'
rows; a card cordoned for a fault stays held out with what its task held."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from crater.contracts import (
    AllocationGranted,
    GpuCordonRequested,
    GpuFault,
    NodeCondition,
    NodeHealthReported,
    NodeTopologyReported,
)
from tests.integration.scheduler.test_failed_nodes_restored import leader
from tests.support.profiles import small_training
from tests.support.topologies import node

pytestmark = pytest.mark.integration


async def test_cordons_and_lifted_faults_outlive_a_restart(sessions: Any) -> None:
    now = datetime.now(UTC)
    first = await leader(sessions, 1)
    await first.handle(NodeTopologyReported(occurred_at=now, node=node("n1", gpus=4)), "topology")
    task = small_training("t", at=now)
    [grant] = [d for d in await first.handle(task, "tasks") if isinstance(d, AllocationGranted)]
    remap = GpuFault(gpu=3, kind="row-remap-failure", action="operator", since=now)
    faults = [GpuFault(gpu=2, kind="xid", xid=48, action="reset-card", since=now), remap]

    def beat(after: float) -> NodeHealthReported:
        return NodeHealthReported(
            occurred_at=now + timedelta(seconds=after),
            node_id="n1",
            condition=NodeCondition.DEGRADED,
            score=85,
            gpu_faults=faults,
        )

    await first.handle(beat(1), "node-health")
    lift = GpuCordonRequested(
        occurred_at=now + timedelta(seconds=2), node_id="n1", gpu=3, cordon=False
    )
    await first.handle(lift, "node-cordon")
    manual = GpuCordonRequested(
        occurred_at=now + timedelta(seconds=3), node_id="n1", gpu=1, cordon=True, reason="fan"
    )
    await first.handle(manual, "node-cordon")
    n1 = first.scheduler.cluster.get("n1")
    assert n1 is not None
    assert sorted(n1.cordons) == [1, 2]
    before = list(n1.gpu_milli_free)

    second = await leader(sessions, 2)  # a restart: the core rebuilt from the tables
    again = second.scheduler.cluster.get("n1")
    assert again is not None
    assert sorted(again.cordons) == [1, 2]
    assert again.cordons[1].reason.startswith("GPU 1 of n1 is cordoned: fan")
    assert again.gpu_milli_free == before
    assert grant.gpu_ids[0] not in (1, 2) or again.gpu_milli_free[grant.gpu_ids[0]] == 0
    # The lifted fault, still reported, stays lifted; the healthy-until cordon follows reports.
    await second.handle(beat(4), "node-health")
    assert sorted(again.cordons) == [1, 2]
    faults.clear()
    await second.handle(beat(5), "node-health")
    assert sorted(again.cordons) == [1]  # an operator's own cordon waits for the operator
