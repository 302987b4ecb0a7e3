"""Budgets per tenant: the price file's budgets read (every refusal names the field and the
reason), each tenant's standing in its period, and what is said when it changes."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from crater.contracts import Event, TenantBudgetExceeded, TenantBudgetRestored
from crater.predictor.domain.usage import (
    Budget,
    PriceFileError,
    Prices,
    parse_prices,
    period_bounds,
    standings,
)
from crater.predictor.service_layer.usage import PriceWatch, TenantMetrics, UsageReporter

NOW = datetime(2026, 12, 15, 9, 30, tzinfo=UTC)

FILE = """
currency: EUR
gpu_hour: {A100: 2.50}
tenants: [physics, vision]
budgets:
  physics: {soft: 5000}
  vision: {soft: 800, hard: 1000, period: daily}
"""


def test_a_budget_file_with_periods() -> None:
    prices = parse_prices(FILE)
    assert prices.budgets["physics"] == Budget(soft=Decimal(5000))  # monthly by default
    assert prices.budgets["physics"].period == "monthly"
    assert prices.budgets["vision"].period == "daily"
    assert prices.budgets["vision"].limits() == [("soft", Decimal(800)), ("hard", Decimal(1000))]


@pytest.mark.parametrize(
    ("text", "field", "reason"),
    [
        (
            "tenants: [physics]\nbudgets: {phyiscs: {soft: 10}}",
            "budgets.phyiscs",
            "unknown tenant 'phyiscs': the file's tenants are physics",
        ),
        ("budgets: {Physics: {soft: 10}}", "budgets.Physics", "is not a tenant name"),
        ("tenants: [Physics]\nbudgets: {}", "tenants", "is not a tenant name"),
        ("budgets: {physics: {}}", "budgets.physics", "no limit: set soft, hard or both"),
        ("budgets: {physics: {soft: 20, hard: 10}}", "budgets.physics", "soft (20) is above"),
        ("budgets: {physics: {hard: -1}}", "budgets.physics.hard", "greater than or equal to 0"),
        ("budgets: {physics: {hard: lots}}", "budgets.physics.hard", "decimal"),
        (
            "budgets: {physics: {soft: 1, period: weekly}}",
            "budgets.physics.period",
            "'monthly' or 'daily'",
        ),
        ("budgets: {physics: {soft: 1, limit: 3}}", "budgets.physics.limit", "Extra inputs"),
        ("currency: EUR\nbudget: {}", "budget", "Extra inputs"),
        ("budgets: [physics", "body", "not valid YAML"),
    ],
)
def test_a_refused_budget_file_names_the_field_and_the_reason(
    text: str, field: str, reason: str
) -> None:
    with pytest.raises(PriceFileError) as refused:
        parse_prices(text, "prices.yaml")
    assert refused.value.field == field
    assert reason in refused.value.reason
    assert str(refused.value).startswith(f"prices.yaml: {field}: ")


def test_periods_are_utc_calendar_months_and_days() -> None:
    assert period_bounds("monthly", NOW) == (
        datetime(2026, 12, 1, tzinfo=UTC),
        datetime(2027, 1, 1, tzinfo=UTC),
    )
    assert period_bounds("daily", NOW) == (
        datetime(2026, 12, 15, tzinfo=UTC),
        datetime(2026, 12, 16, tzinfo=UTC),
    )


def test_each_tenant_stands_against_its_own_period() -> None:
    prices = parse_prices(FILE)
    spent = {"monthly": {"physics": Decimal(6000), "vision": Decimal(900)}, "daily": {}}
    found = standings(prices.budgets, spent, NOW)  # type: ignore[arg-type]
    assert [(s.tenant, s.limit, s.exceeded) for s in found] == [
        ("physics", "soft", True),
        ("vision", "soft", False),  # its day: nothing spent today
        ("vision", "hard", False),
    ]


class Said:
    def __init__(self) -> None:
        self.events: list[Event] = []

    async def __call__(self, event: Event) -> None:
        self.events.append(event)

    def take(self) -> list[tuple[str, str, str]]:
        out = [(type(e).__name__, e.tenant, e.limit) for e in self.events]  # type: ignore[attr-defined]
        self.events.clear()
        return out


def reporter(prices: Prices, said: Said) -> UsageReporter:
    return UsageReporter(None, TenantMetrics(CollectorRegistry()), prices, publish=said)  # type: ignore[arg-type]


def standing(prices: Prices, spent: dict[str, int], now: datetime = NOW) -> Any:
    costs = {t: Decimal(v) for t, v in spent.items()}
    return standings(prices.budgets, {"monthly": costs, "daily": costs}, now)


async def test_a_limit_passed_is_said_once_and_a_hard_one_lifted_when_raised() -> None:
    said = Said()
    prices = parse_prices(FILE)
    usage = reporter(prices, said)
    # At start: every tenant within its hard limit is said to be (it may have been raised).
    await usage._tell(standing(prices, {"physics": 100, "vision": 10}), NOW)
    assert said.take() == [("TenantBudgetRestored", "vision", "hard")]
    await usage._tell(standing(prices, {"physics": 5001, "vision": 1200}), NOW)
    assert said.take() == [
        ("TenantBudgetExceeded", "physics", "soft"),
        ("TenantBudgetExceeded", "vision", "soft"),
        ("TenantBudgetExceeded", "vision", "hard"),
    ]
    await usage._tell(standing(prices, {"physics": 5200, "vision": 1300}), NOW)
    assert said.take() == []  # said already
    # The hard budget raised (the file reloaded): within it again.
    raised = parse_prices(FILE.replace("hard: 1000", "hard: 2000"))
    usage.prices = raised
    await usage._tell(standing(raised, {"physics": 5200, "vision": 1300}), NOW)
    [restored] = said.events
    assert isinstance(restored, TenantBudgetRestored)
    assert restored.why == "its hard budget was raised from 1000 to 2000"
    assert said.take() == [("TenantBudgetRestored", "vision", "hard")]


async def test_the_same_standing_is_the_same_event_everywhere() -> None:
    """Replicas and a restarted predictor publish the same ids: said once on the bus."""
    prices = parse_prices(FILE)
    one, two = Said(), Said()
    for said in (one, two):
        await reporter(prices, said)._tell(standing(prices, {"vision": 1200}), NOW)
    assert [e.event_id for e in one.events] == [e.event_id for e in two.events]
    exceeded = [e for e in one.events if isinstance(e, TenantBudgetExceeded)]
    hard = next(e for e in exceeded if e.limit == "hard")
    assert (hard.period, hard.period_end) == ("daily", datetime(2026, 12, 16, tzinfo=UTC))
    assert (hard.budget, hard.cost, hard.currency) == (Decimal(1000), Decimal(1200), "EUR")
    assert "waits until the period ends at 2026-12-16T00:00:00Z or the budget is raised" in (
        hard.reason
    )


async def test_a_new_period_and_a_removed_budget_lift_a_hard_hold() -> None:
    said = Said()
    prices = parse_prices(FILE)
    usage = reporter(prices, said)
    await usage._tell(standing(prices, {"vision": 1200}), NOW)
    said.take()
    tomorrow = datetime(2026, 12, 16, 0, 1, tzinfo=UTC)
    await usage._tell(standing(prices, {"vision": 0}, tomorrow), tomorrow)
    [restored] = said.events
    assert isinstance(restored, TenantBudgetRestored)
    assert restored.why == "a new budget period began"
    said.take()
    await usage._tell(standing(prices, {"vision": 1500}, tomorrow), tomorrow)
    assert said.take() == [
        ("TenantBudgetExceeded", "vision", "soft"),
        ("TenantBudgetExceeded", "vision", "hard"),
    ]
    without = parse_prices("tenants: [physics, vision]\nbudgets: {physics: {soft: 5000}}")
    usage.prices = without
    await usage._tell(standing(without, {"vision": 1500}, tomorrow), tomorrow)
    [removed] = said.events
    assert isinstance(removed, TenantBudgetRestored)
    assert removed.why == "its hard budget was removed"


async def test_nothing_is_said_without_a_publisher_or_prices() -> None:
    prices = parse_prices(FILE)
    quiet = UsageReporter(None, TenantMetrics(CollectorRegistry()), prices)  # type: ignore[arg-type]
    await quiet._tell(standing(prices, {"vision": 5000}), NOW)
    assert quiet.said == {}


def test_the_price_file_is_read_again_when_it_changes_and_a_bad_change_refused(
    tmp_path: Path,
) -> None:
    path = tmp_path / "prices.yaml"
    path.write_text(FILE)
    registry = CollectorRegistry()
    usage = UsageReporter(
        None,  # type: ignore[arg-type]
        TenantMetrics(registry),
        parse_prices(FILE),
        watch=PriceWatch(path),
    )
    assert usage.reload() is None  # unchanged
    path.write_text(FILE.replace("hard: 1000", "hard: 3000"))
    assert usage.reload() is None
    assert usage.prices is not None
    assert usage.prices.budgets["vision"].hard == Decimal(3000)
    path.write_text(FILE.replace("physics: {soft: 5000}", "phyiscs: {soft: 5000}"))
    refused = usage.reload()
    assert refused is not None
    assert refused.field == "budgets.phyiscs"
    assert usage.prices.budgets["vision"].hard == Decimal(3000)  # the running one kept
    path.unlink()
    gone = usage.reload()
    assert gone is not None
    assert (gone.field, gone.reason) == ("file", "cannot be read: No such file or directory")
    value = registry.get_sample_value
    assert value("crater_predictor_config_reloads_total", {"outcome": "applied"}) == 1
    assert value("crater_predictor_config_reloads_total", {"outcome": "refused"}) == 2


async def test_a_failed_publish_is_said_again_at_the_next_refresh() -> None:
    prices = parse_prices(FILE)
    sent: list[Event] = []
    failing = [True]

    async def publish(event: Event) -> None:
        if failing[0]:
            raise ConnectionError("NATS away")
        sent.append(event)

    usage = UsageReporter(None, TenantMetrics(CollectorRegistry()), prices, publish=publish)  # type: ignore[arg-type]
    with pytest.raises(ConnectionError):
        await usage._tell(standing(prices, {"physics": 6000}), NOW)
    assert usage.said == {}  # nothing counts as said
    failing[0] = False
    await usage._tell(standing(prices, {"physics": 6000}), NOW)
    assert [(type(e).__name__, e.tenant) for e in sent] == [  # type: ignore[attr-defined]
        ("TenantBudgetExceeded", "physics"),
        ("TenantBudgetRestored", "vision"),
    ]


def test_a_budget_event_whose_period_ends_before_it_starts_is_refused() -> None:
    with pytest.raises(ValueError, match="period_end must come after period_start"):
        TenantBudgetExceeded(
            tenant="vision",
            limit="hard",
            period="daily",
            period_start=NOW,
            period_end=NOW,
            budget=Decimal(1),
            cost=Decimal(2),
            currency="EUR",
        )
