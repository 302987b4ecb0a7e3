"""The core skips its expiry scans while nothing can have expired: the decisions must be the
same as with a scan on every event."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from benchmarks.scheduler.throughput import PREDICTION, scaled_fleet, task_request
from crater.contracts import (
    Event,
    NodeCondition,
    NodeHealthReported,
    NodeTopologyReported,
    TaskProfiled,
    TaskStatus,
    TaskStatusReported,
)
from crater.scheduler.domain.core import Scheduler, SchedulerConfig

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def ready(at: datetime, node_id: str) -> NodeHealthReported:
    return NodeHealthReported(
        occurred_at=at, node_id=node_id, condition=NodeCondition.READY, score=100
    )


def workload(seed: int) -> list[Event]:
    """Nodes, then tasks over five simulated minutes: some confirmed running, some never
    (their reservations expire), some finished; a third of the nodes stop sending heartbeats
    half way (they go NotReady), and one comes back."""
    rng = random.Random(seed)
    fleet = scaled_fleet(30, seed)
    pools = sorted({t.pool for t in fleet})
    events: list[Event] = [NodeTopologyReported(occurred_at=T0, node=t) for t in fleet]
    for second in range(300):
        at = T0 + timedelta(seconds=second)
        request = task_request(f"t{second}", rng, pools)
        events.append(TaskProfiled(occurred_at=at, task=request, prediction=PREDICTION))
        if second % 3 == 0:
            events.append(
                TaskStatusReported(
                    occurred_at=at, task_id=request.task_id, status=TaskStatus.RUNNING
                )
            )
        if second % 7 == 0 and second > 20:
            events.append(
                TaskStatusReported(
                    occurred_at=at, task_id=f"t{second - 20}", status=TaskStatus.SUCCEEDED
                )
            )
        for topology in fleet[: 20 if second > 150 else 30]:
            if second % 10 == 0:
                events.append(
                    NodeHealthReported(
                        occurred_at=at,
                        node_id=topology.node_id,
                        condition=NodeCondition.READY,
                        score=100,
                    )
                )
        if second == 250:
            events.append(
                NodeHealthReported(
                    occurred_at=at,
                    node_id=fleet[25].node_id,
                    condition=NodeCondition.READY,
                    score=100,
                )
            )
    return events


def test_skipping_expiry_scans_changes_no_decision() -> None:
    config = SchedulerConfig(reservation_timeout_ms=15_000, heartbeat_timeout_seconds=20)
    skipping, scanning = Scheduler(config=config), Scheduler(config=config)
    kinds: set[str] = set()
    for event in workload(seed=5):
        scanning.expiry_floor = scanning.heartbeat_floor = None  # scan every time
        expected = scanning.handle(event)
        assert skipping.handle(event) == expected
        kinds |= {type(d).__name__ for d in expected}
        assert [n.condition for n in skipping.cluster.nodes] == [
            n.condition for n in scanning.cluster.nodes
        ]
    # The workload exercised what the floors guard: expiries and nodes going NotReady.
    assert {"AllocationGranted", "AllocationReleased"} <= kinds
    assert any(n.condition is NodeCondition.NOT_READY for n in scanning.cluster.nodes)
