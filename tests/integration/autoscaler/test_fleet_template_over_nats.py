"""The demo's second scale-out, over a real nats-server with the real scheduler and database:
the replica the first scale-out copied has ended by the second, which still names a request
to copy and is placed, with no rejection and no None in any message."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from faststream import TestApp

from crater.autoscaler.app import AutoscalerSettings
from crater.autoscaler.app import build as build_autoscaler
from crater.autoscaler.domain import Autoscaler
from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    LatencySamplesReported,
    NodeTopologyReported,
    ReplicasRequested,
    TaskRejected,
    TaskStatus,
    TaskStatusReported,
)
from crater.runtime.bus import publish
from crater.runtime.nats_server import NatsServer
from crater.scheduler.app import SchedulerSettings
from crater.scheduler.app import build as build_scheduler
from tests.integration.autoscaler.test_scaling_flows_over_nats import until
from tests.integration.scheduler.test_duplicate_tasks_over_nats import replica
from tests.support.events import EventTap
from tests.support.topologies import node


def burst(at: datetime, replicas: int) -> LatencySamplesReported:
    # The demo's service: one simulated replica reports for the whole fleet, under the first
    # replica's task, whether or not that task still runs.
    return LatencySamplesReported(
        occurred_at=at,
        service="chat",
        replica_id="chat-0",
        task_id="chat-0",
        latencies_ms=[320.0] * 50,
        gpu_memory_pressure=0.9,
        replicas=replicas,
    )


async def test_the_second_scale_out_copies_the_fleet_after_its_template_ended(
    fresh_nats: NatsServer, tap: EventTap, database_url: str
) -> None:
    scheduler, scheduler_app = build_scheduler(
        SchedulerSettings(nats_url=fresh_nats.url, database_url=database_url)
    )
    autoscaler, autoscaler_app = build_autoscaler(
        AutoscalerSettings(
            nats_url=fresh_nats.url,
            strategy="rule",
            cooldown_seconds=0,
            panic_p95_ms=0,
            # The new replicas report no latencies here: soon no longer counted as starting.
            replica_start_timeout_seconds=1,
        )
    )
    async with TestApp(scheduler_app), TestApp(autoscaler_app):
        for name in ("rtx-01", "rtx-02", "rtx-03", "rtx-04"):
            await publish(scheduler.broker, NodeTopologyReported(node=node(name, gpus=2)))
        await publish(scheduler.broker, replica("chat-0", "chat"))
        [first] = await tap.wait_for(AllocationGranted)
        now = datetime.now(UTC)

        await publish(autoscaler.broker, burst(now, replicas=1))
        [ask] = await tap.wait_for(ReplicasRequested)
        assert ask.template_task_id == "chat-0"
        await tap.wait_for(AllocationGranted, count=2)

        ended = TaskStatusReported(
            task_id="chat-0", status=TaskStatus.SUCCEEDED, allocation_id=first.allocation_id
        )
        await publish(scheduler.broker, ended)
        await tap.wait_for(AllocationReleased, lambda r: r.task_id == "chat-0")
        scaler: Autoscaler = autoscaler.state
        await until(lambda: "chat-0" not in scaler._allocations)  # the autoscaler saw it too

        await publish(autoscaler.broker, burst(now + timedelta(seconds=5), replicas=2))
        [_, again] = await tap.wait_for(ReplicasRequested, count=2)
        assert again.template_task_id is not None
        assert again.template_task_id in ask.task_ids  # the live replica, not the ended one
        granted = await tap.wait_for(AllocationGranted, count=2 + len(again.task_ids))
        assert {g.task_id for g in granted} >= set(again.task_ids)
        assert tap.of(TaskRejected) == []
        assert not [m.subject for m in tap.raw if b"None" in m.data]  # no Python None leaks
