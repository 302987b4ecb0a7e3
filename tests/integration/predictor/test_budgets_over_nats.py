"""Budgets per tenant through real services on a real nats-server: the predictor prices what
the scheduler granted, a soft limit passed reaches AllData as a webhook (the callback, the
reference receiver over HTTP), a hard one holds the tenant's new work in the scheduler's
queue with a reason naming the budget, across a scheduler restart, until the budget is
raised in the price file (read again by the predictor)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

from faststream import TestApp

from crater.callback.app import build as build_callback
from crater.contracts import (
    AllocationGranted,
    TaskPending,
    TenantBudgetExceeded,
    TenantBudgetRestored,
    WebhookDelivered,
    utc_now,
)
from crater.predictor.app import PredictorSettings
from crater.predictor.app import build as build_predictor
from crater.predictor.domain.usage import month_start
from crater.runtime.bus import publish
from crater.runtime.nats_server import NatsServer
from crater.scheduler.app import SchedulerSettings
from crater.scheduler.app import build as build_scheduler
from tests.integration.callback.conftest import serve_receiver
from tests.integration.callback.test_callback_over_nats import settings as callback_settings
from tests.integration.predictor.test_usage import grant
from tests.integration.scheduler.test_scheduler_over_nats import profiled
from tests.support.events import EventTap
from tests.support.scrape import scrape, served, value
from tests.support.topologies import node

# 3,600,000 a GPU-hour: a card held one second costs 1000.
PRICES = """
currency: EUR
gpu_hour: {A100: 3600000}
tenants: [physics, vision]
budgets:
  vision: {soft: 1, hard: HARD}
"""


def price_file(tmp_path: Path, hard: str) -> Path:
    path = tmp_path / "prices.yaml"
    path.write_text(PRICES.replace("HARD", hard))
    return path


async def test_a_soft_limit_passed_warns_by_metric_and_by_webhook(
    fresh_nats: NatsServer, tap: EventTap, tmp_path: Path
) -> None:
    async with serve_receiver() as receiver:
        await _soft_limit(fresh_nats, tap, tmp_path, receiver)


async def _soft_limit(nats: NatsServer, tap: EventTap, tmp_path: Path, receiver) -> None:  # type: ignore[no-untyped-def]
    fresh_nats = nats
    predictor, predictor_app = build_predictor(
        PredictorSettings(
            nats_url=fresh_nats.url,
            database_url=f"sqlite+aiosqlite:///{tmp_path}/predictor.db",
            price_file=price_file(tmp_path, "1000000000"),
            usage_refresh_seconds=1,
        )
    )
    _, callback_app = build_callback(
        callback_settings(fresh_nats, f"sqlite+aiosqlite:///{tmp_path}/callback.db", receiver.url)
    )
    now = utc_now()
    held_since = max(now - timedelta(minutes=5), month_start(now))
    async with served(predictor_app) as http, TestApp(callback_app):
        await publish(predictor.broker, grant(1, "vision", "pool-a", 1, 1000, held_since))
        [warned] = await tap.wait_for(TenantBudgetExceeded, timeout=30)
        assert (warned.tenant, warned.limit, warned.period) == ("vision", "soft", "monthly")
        assert warned.cost > warned.budget == 1
        [delivered] = await tap.wait_for(
            WebhookDelivered, lambda d: d.task_id.startswith("@tenant/"), timeout=30
        )
        samples = await scrape(http)
    assert value(samples, "crater_tenant_budget_exceeded", tenant="vision", limit="soft") == 1
    assert value(samples, "crater_tenant_budget_exceeded", tenant="vision", limit="hard") == 0
    assert value(samples, "crater_tenant_budget", tenant="vision", limit="soft") == 1
    spent = value(samples, "crater_tenant_budget_cost", tenant="vision", period="monthly")
    assert spent is not None
    assert spent > 1
    assert (delivered.task_id, delivered.task_status) == ("@tenant/vision", "budget_exceeded")
    [got] = [d for d in receiver.state.deliveries if "event" in d.body]  # besides task-1's
    assert got.webhook_id == str(warned.event_id)
    assert got.body["event"] == "tenant.budget_exceeded"
    assert (got.body["tenant"], got.body["limit"], got.body["held"]) == ("vision", "soft", False)
    assert got.body["reason"].endswith("a warning, its work goes on")
    assert got.headers["crater-event"] == "tenant.budget_exceeded"
    # Said once: the refreshes since did not say it again.
    assert len(tap.of(TenantBudgetExceeded)) == 1


async def test_a_hard_limit_holds_new_work_until_the_budget_is_raised(
    fresh_nats: NatsServer, tap: EventTap, tmp_path: Path, database_url: str
) -> None:
    prices = price_file(tmp_path, "500")
    _, predictor_app = build_predictor(
        PredictorSettings(
            nats_url=fresh_nats.url,
            database_url=f"sqlite+aiosqlite:///{tmp_path}/predictor.db",
            price_file=prices,
            usage_refresh_seconds=1,
        )
    )
    scheduling = SchedulerSettings(nats_url=fresh_nats.url, database_url=database_url)

    def task(task_id: str, tenant: str):  # type: ignore[no-untyped-def]
        event = profiled(task_id, gpus=1)
        return event.model_copy(update={"task": event.task.model_copy(update={"tenant": tenant})})

    async with TestApp(predictor_app):
        scheduler, scheduler_app = build_scheduler(scheduling)
        async with TestApp(scheduler_app):
            await publish(scheduler.broker, _topology())
            await publish(scheduler.broker, task("vision-1", "vision"))
            [first] = await tap.wait_for(AllocationGranted, timeout=30)
            assert first.tenant == "vision"
            # Priced by the predictor: past 500 within a second, the hard limit holds it.
            hard = await tap.wait_for(TenantBudgetExceeded, lambda e: e.limit == "hard", timeout=30)
            await _until(lambda: "vision" in scheduler.state.scheduler.quotas.holds)
            await publish(scheduler.broker, task("vision-2", "vision"))
            [waits] = await tap.wait_for(TaskPending, lambda e: e.task_id == "vision-2", timeout=30)
            assert [r.filter for r in waits.reasons] == ["TenantBudget"]
            assert "against its hard budget of 500 EUR" in waits.summary
            assert "waits until the period ends at" in waits.summary
            assert "or the budget is raised" in waits.summary
            # Other tenants' work goes on.
            await publish(scheduler.broker, task("physics-1", "physics"))
            await tap.wait_for(AllocationGranted, lambda e: e.task_id == "physics-1", timeout=30)
            held = scheduler.registry.get_sample_value(
                "crater_tenant_budget_held", {"tenant": "vision"}
            )
            assert held == 1

        # A restarted scheduler holds it still (from its database).
        scheduler, scheduler_app = build_scheduler(scheduling)
        async with TestApp(scheduler_app):
            await _until(lambda: "vision" in scheduler.state.scheduler.quotas.holds)
            assert scheduler.state.scheduler.quotas.holds["vision"].event_id == hard[0].event_id
            await publish(scheduler.broker, task("vision-3", "vision"))
            [still] = await tap.wait_for(TaskPending, lambda e: e.task_id == "vision-3", timeout=30)
            assert [r.filter for r in still.reasons] == ["TenantBudget"]

            # The budget raised in the price file: read again, within it, the work goes.
            price_file(tmp_path, "1000000000000")
            [restored] = await tap.wait_for(
                TenantBudgetRestored, lambda e: e.why.startswith("its hard budget was"), timeout=30
            )
            assert restored.why == "its hard budget was raised from 500 to 1000000000000"
            placed = await tap.wait_for(
                AllocationGranted, lambda e: e.task_id in {"vision-2", "vision-3"}, count=2
            )
            assert {g.task_id for g in placed} == {"vision-2", "vision-3"}
            assert scheduler.state.scheduler.quotas.holds == {}


def _topology():  # type: ignore[no-untyped-def]
    from crater.contracts import NodeTopologyReported

    return NodeTopologyReported(node=node("a100-01", gpus=8, pool="default"))


async def _until(condition, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)
