"""Queue guarantees over a real nats-server and database (SQLite and PostgreSQL): a
department borrows its sibling's idle guarantee, the quotas file is reloaded with the
sibling's guarantee raised, and a team of the sibling takes it back (the borrowed task
preempted with the grace period, `reclaimed_by_queue`); a file refused on reload (a child's
guarantee above its parent's) changes nothing, and so does one sent over the config API
(422, each field and why)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from faststream import TestApp

from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    NodeCondition,
    NodeHealthReported,
    TaskPreempted,
    TaskProfiled,
    TaskStatus,
    TaskStatusReported,
)
from crater.gateway.apikeys import Scope
from crater.runtime.bus import publish
from crater.runtime.nats_server import NatsServer
from crater.scheduler.app import SchedulerSettings, build
from tests.integration.scheduler.test_config_api_over_nats import gateway, store_key
from tests.support.events import EventTap
from tests.support.profiles import profiled
from tests.support.scheduler import node_known, with_quotas
from tests.support.topologies import node

QUOTAS = """
queues:
  acme:
    guarantee: {{gpus: 8}}
    queues:
      research: {{guarantee: {{gpus: {research}}}, tenants: [nlp]}}
      ads: {{guarantee: {{gpus: {ads}}}, tenants: [ranking]}}
"""
RELOADS = "crater_scheduler_config_reloads_total"


def of_team(task_id: str, gpus: int, tenant: str, priority: str = "medium") -> TaskProfiled:
    return profiled(task_id, gpus, tenant=tenant, priority=priority)


async def reloaded(service: Any, outcome: str) -> None:
    """A heartbeat makes the scheduler look at its files; wait until it has `outcome`."""
    beat = NodeHealthReported(node_id="a100-01", condition=NodeCondition.READY, score=100)
    for _ in range(200):
        await asyncio.sleep(0.05)
        await publish(service.broker, beat)
        if service.registry.get_sample_value(RELOADS, {"outcome": outcome}) == 1.0:
            return
    raise AssertionError(f"the quotas file was not {outcome}")


async def test_a_reload_raising_a_queues_guarantee_takes_its_borrowed_capacity_back(
    fresh_nats: NatsServer, tap: EventTap, database_url: str, tmp_path: Path
) -> None:
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text(QUOTAS.format(research=2, ads=6))
    settings = with_quotas(fresh_nats.url, database_url, quotas)
    service, app = build(settings)
    async with TestApp(app):
        await node_known(service, node("a100-01", gpus=8))
        await publish(service.broker, of_team("r-1", 6, "ranking"))
        await tap.wait_for(AllocationGranted)
        await publish(service.broker, of_team("r-2", 2, "ranking", priority="high"))
        [_, loan] = await tap.wait_for(AllocationGranted, count=2)
        assert "borrowed 2 GPUs from queue research (in acme) (reclaimable)" in loan.explanation

        # refused: research's and ads's guarantees would sum above acme's
        quotas.write_text(QUOTAS.format(research=4, ads=6))
        await reloaded(service, "refused")
        research = service.state.scheduler.quotas.queues["research"].share
        assert research is not None
        assert research.guarantee.gpus == 2

        # applied: research may hold 4 now; nlp's task takes ranking's borrowed 2 back
        quotas.write_text(QUOTAS.format(research=4, ads=4))
        await reloaded(service, "applied")
        await publish(service.broker, of_team("nlp-1", 2, "nlp", priority="low"))
        [preempted] = await tap.wait_for(TaskPreempted)
        assert (
            preempted.task_id,
            preempted.preempted_by,
            preempted.reclaimed_by_tenant,
            preempted.reclaimed_by_queue,
        ) == ("r-2", "nlp-1", "nlp", "research")
        assert preempted.grace_period_seconds == settings.grace_period_seconds
        stopped = TaskStatusReported(
            task_id="r-2", status=TaskStatus.CANCELLED, allocation_id=loan.allocation_id
        )
        await publish(service.broker, stopped)
        granted = await tap.wait_for(AllocationGranted, count=3)
        assert granted[-1].task_id == "nlp-1"
        released = await tap.wait_for(AllocationReleased)
        assert [r.task_id for r in released] == ["r-2"]


async def test_the_config_api_refuses_a_bad_queue_tree_naming_each_field(
    fresh_nats: NatsServer, database_url: str
) -> None:
    settings = SchedulerSettings(nats_url=fresh_nats.url, database_url=database_url)
    service, app = build(settings)
    admin = await store_key(fresh_nats.url, "ops", Scope.ADMIN)
    async with TestApp(app), gateway(fresh_nats.url) as http:
        for _ in range(200):  # leading: it answers the admin subject
            if service.state.epoch is not None:
                break
            await asyncio.sleep(0.05)
        bad = QUOTAS.format(research=6, ads=6).replace(
            "guarantee: {gpus: 8}", "guarantee: {gpus: 8}\n    borrowing_limit: {gpus: 2}"
        )
        refused = await http.put(
            "/api/v1/admin/quotas", content=bad, headers={"Authorization": f"Bearer {admin}"}
        )
        assert refused.status_code == 422, refused.text
        fields = {e["field"]: e["reason"] for e in refused.json()["detail"]}
        assert (
            "a root queue has no parent to borrow within" in fields["queues.acme.borrowing_limit"]
        )
        assert "(queue ads 6 + queue research 6 = 12)" in fields["queues.acme.guarantee.gpus"]
        assert not service.state.scheduler.quotas.queues  # the running configuration kept
