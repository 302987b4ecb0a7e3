"""Nested queues over a real nats-server and database (SQLite and PostgreSQL): a department
at its limit holds its teams' work, saying so in `task.pending`; the quotas file raised is
applied without a restart; a restarted scheduler counts the department's stored grants."""

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
)
from crater.runtime.bus import publish
from crater.runtime.nats_server import NatsServer
from crater.scheduler.app import build
from tests.integration.scheduler.test_scheduler_over_nats import profiled
from tests.support.events import EventTap
from tests.support.scheduler import node_known, with_quotas
from tests.support.topologies import node

QUOTAS = """
queues:
  acme:
    queues:
      research: {{limit: {{gpus: {gpus}}}, tenants: [vision, nlp]}}
"""


def of_team(task_id: str, gpus: int, tenant: str) -> TaskProfiled:
    event = profiled(task_id, gpus=gpus)
    return event.model_copy(update={"task": event.task.model_copy(update={"tenant": tenant})})


async def test_a_departments_limit_holds_reloads_and_survives_a_restart(
    fresh_nats: NatsServer, tap: EventTap, database_url: str, tmp_path: Path
) -> None:
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text(QUOTAS.format(gpus=4))
    settings = with_quotas(fresh_nats.url, database_url, quotas)
    service, app = build(settings)
    async with TestApp(app):
        await node_known(service, node("a100-01", gpus=8))
        await publish(service.broker, of_team("nlp-1", 3, "nlp"))
        await tap.wait_for(AllocationGranted)
        await publish(service.broker, of_team("v-1", 2, "vision"))
        [waits] = await tap.wait_for(TaskPending)
        assert waits.reasons[0].code == "QueueLimitReached"
        assert "queue research (in acme) of tenant vision at its limit" in waits.summary
        quotas.write_text(QUOTAS.format(gpus=6))  # applied from the next event on
        await asyncio.sleep(0.05)
        beat = NodeHealthReported(node_id="a100-01", condition=NodeCondition.READY, score=100)
        await publish(service.broker, beat)
        [_, second] = await tap.wait_for(AllocationGranted, count=2)
        assert second.task_id == "v-1"

    service, app = build(settings)
    async with TestApp(app):  # restarted: research's teams hold 5 of its 6
        await publish(service.broker, of_team("nlp-2", 2, "nlp"))
        [_, waits] = await tap.wait_for(TaskPending, count=2)
        assert waits.task_id == "nlp-2"
        assert "its tenants hold 5 of 6 gpus" in waits.summary
