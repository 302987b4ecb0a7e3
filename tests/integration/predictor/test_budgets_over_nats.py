"""Budgets per tenant through real services on a real nats-server: the predictor prices what
was granted, and a soft limit passed reaches AllData as a webhook (the callback, the
reference receiver over HTTP)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from faststream import TestApp

from crater.callback.app import build as build_callback
from crater.contracts import (
    TenantBudgetExceeded,
    WebhookDelivered,
    utc_now,
)
from crater.predictor.app import PredictorSettings
from crater.predictor.app import build as build_predictor
from crater.predictor.domain.usage import month_start
from crater.runtime.bus import publish
from crater.runtime.nats_server import NatsServer
from tests.integration.callback.conftest import serve_receiver
from tests.integration.callback.test_callback_over_nats import settings as callback_settings
from tests.integration.predictor.test_usage import grant
from tests.support.events import EventTap
from tests.support.scrape import scrape, served, value

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
