"""A tenant's budget passed as a webhook: one body for every format, queued under the tenant
(never under a task), and endpoints may ask for it by its event type."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from crater.callback.domain.endpoints import Endpoint
from crater.callback.domain.payload import TENANT_KEY, WebhookFormat, budget_body, render
from crater.contracts import TenantBudgetExceeded
from crater.contracts.tasks import TaskRequest

EVENT = TenantBudgetExceeded(
    occurred_at=datetime(2026, 12, 15, 9, 30, tzinfo=UTC),
    tenant="vision",
    limit="hard",
    period="monthly",
    period_start=datetime(2026, 12, 1, tzinfo=UTC),
    period_end=datetime(2027, 1, 1, tzinfo=UTC),
    budget=Decimal(1000),
    cost=Decimal("1250.50"),
    currency="EUR",
)


@pytest.mark.parametrize("format", list(WebhookFormat))
def test_one_body_in_every_format_with_headers_naming_it(format: WebhookFormat) -> None:
    payload = budget_body(EVENT).encode().decode()
    rendered = render(payload, format)
    body = json.loads(rendered.body)
    assert body["event"] == "tenant.budget_exceeded"
    assert (body["tenant"], body["limit"], body["held"]) == ("vision", "hard", True)
    assert (body["budget"], body["cost"], body["currency"]) == ("1000", "1250.50", "EUR")
    assert body["event_id"] == str(EVENT.event_id)
    assert "its work not yet placed waits until the period ends" in body["reason"]
    assert rendered.headers == {
        "crater-format": format.value,
        "crater-event": "tenant.budget_exceeded",
        "crater-occurred-at": "2026-12-15T09:30:00Z",
    }
    assert render(payload, format) == rendered  # every attempt the same bytes


def test_a_soft_limit_says_the_work_goes_on() -> None:
    soft = budget_body(EVENT.model_copy(update={"limit": "soft"}))
    assert soft.held is False
    assert soft.reason.endswith("a warning, its work goes on")


def test_the_tenant_key_is_no_task_id() -> None:
    with pytest.raises(ValueError, match="task_id"):
        TaskRequest.model_validate(
            {
                "task_id": f"{TENANT_KEY}vision",
                "task_type": "training",
                "model_config": {"name": "m"},
            }
        )


def test_endpoints_ask_for_it_by_its_event_type() -> None:
    assert Endpoint(url="http://a", events=("TenantBudgetExceeded",)).wants(
        "TenantBudgetExceeded", ""
    )
    assert not Endpoint(url="http://a", events=("failed",)).wants("TenantBudgetExceeded", "")
    assert Endpoint(url="http://a").wants("TenantBudgetExceeded", "")
