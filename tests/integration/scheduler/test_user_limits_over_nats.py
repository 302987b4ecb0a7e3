"""Per-user limits over a real nats-server and database (SQLite and PostgreSQL): a user at
its running-GPU limit waits, saying so in `task.pending`; one task more than its queued limit
is refused naming the field; the quotas file raised is applied without a restart; and a
restarted scheduler counts the user's stored grants."""

from __future__ import annotations

import asyncio
from pathlib import Path

from faststream import TestApp

from crater.contracts import (
    AllocationGranted,
    NodeCondition,
    NodeHealthReported,
    TaskPending,
    TaskProfiled,
    TaskRejected,
)
from crater.runtime.bus import publish
from crater.runtime.nats_server import NatsServer
from crater.scheduler.app import build
from tests.integration.scheduler.test_scheduler_over_nats import profiled
from tests.support.events import EventTap
from tests.support.scheduler import node_known, with_quotas
from tests.support.topologies import node

QUOTAS = "tenants:\n  acme:\n    per_user: {{running_gpus: {gpus}, queued_tasks: 1}}\n"


def by(task_id: str, gpus: int, user: str = "bob") -> TaskProfiled:
    event = profiled(task_id, gpus=gpus)
    return event.model_copy(
        update={"task": event.task.model_copy(update={"tenant": "acme", "user": user})}
    )


async def test_a_users_limits_hold_refuse_reload_and_survive_a_restart(
    fresh_nats: NatsServer, tap: EventTap, database_url: str, tmp_path: Path
) -> None:
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text(QUOTAS.format(gpus=2))
    settings = with_quotas(fresh_nats.url, database_url, quotas)
    service, app = build(settings)
    async with TestApp(app):
        await node_known(service, node("a100-01", gpus=8))
        await publish(service.broker, by("b1", 2))
        await tap.wait_for(AllocationGranted)
        await publish(service.broker, by("b2", 1))
        [waits] = await tap.wait_for(TaskPending)
        assert waits.reasons[0].code == "UserGpuLimit"
        assert "user bob of tenant acme holds 2 of its 2 running GPUs" in waits.summary
        await publish(service.broker, by("b3", 1))
        [refused] = await tap.wait_for(TaskRejected)
        assert [e.field for e in refused.errors] == ["user"]
        assert "has 1 tasks waiting, as many as it may" in refused.errors[0].reason
        quotas.write_text(QUOTAS.format(gpus=4))  # applied from the next event on
        await asyncio.sleep(0.05)
        beat = NodeHealthReported(node_id="a100-01", condition=NodeCondition.READY, score=100)
        await publish(service.broker, beat)
        [_, second] = await tap.wait_for(AllocationGranted, count=2)
        assert second.task_id == "b2"

    service, app = build(settings)
    async with TestApp(app):  # restarted: bob's 3 GPUs held count against his 4
        await publish(service.broker, by("b4", 2))
        [_, waits] = await tap.wait_for(TaskPending, count=2)
        assert waits.task_id == "b4"
        assert "holds 3 of its 4 running GPUs" in waits.summary
        await publish(service.broker, by("a1", 2, user="alice"))
        [*_, alice] = await tap.wait_for(AllocationGranted, count=3)
        assert alice.task_id == "a1"
