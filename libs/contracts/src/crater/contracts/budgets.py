"""Tenant budgets: a tenant's cost in its budget period passed a limit, or is within it again.

The predictor prices usage (the price file) and compares each tenant's cost in its budget
period (a calendar month or day, UTC) with the budget's limits: `soft` warns (a metric, an
alert, and the `budget_exceeded` webhook), `hard` also holds the tenant's work that is not
placed yet in the scheduler's queue until the period ends or the budget is raised
(`budget_restored`). Amounts are in the price file's currency, exact decimals.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Literal

from pydantic import AwareDatetime, Field, model_validator

from crater.contracts.base import Event
from crater.contracts.tasks import Name

BudgetLimit = Literal["soft", "hard"]
BudgetPeriod = Literal["monthly", "daily"]
# Bounds on an amount: well inside what a database and a JSON parser hold exactly.
MAX_AMOUNT = Decimal(10) ** 15


class TenantBudgetEvent(Event):
    tenant: Name
    limit: BudgetLimit = Field(description="soft: warn; hard: hold the tenant's new work.")
    period: BudgetPeriod = Field(description="The budget's period: a UTC calendar month or day.")
    period_start: AwareDatetime
    period_end: AwareDatetime = Field(description="When the period rolls over.")
    budget: Decimal = Field(ge=0, le=MAX_AMOUNT, description="The limit, in `currency`.")
    cost: Decimal = Field(ge=0, le=MAX_AMOUNT, description="Spent in the period so far.")
    currency: str = Field(max_length=16)

    @model_validator(mode="after")
    def _period_in_order(self) -> TenantBudgetEvent:
        if self.period_end <= self.period_start:
            raise ValueError("period_end must come after period_start")
        return self

    def describe(self) -> str:
        """`1250.5 EUR this month, over its hard budget of 1000 EUR`."""
        span = "this month" if self.period == "monthly" else "today"
        return (
            f"{self.cost.normalize():f} {self.currency} {span} (UTC), against its "
            f"{self.limit} budget of {self.budget.normalize():f} {self.currency}"
        )


class TenantBudgetExceeded(TenantBudgetEvent):
    """A tenant's cost in its budget period passed one of its limits: said once per tenant,
    limit, period and budget amount (the event id derives from them)."""

    @property
    def reason(self) -> str:
        said = f"tenant {self.tenant!r} spent {self.describe()}"
        if self.limit == "soft":
            return f"{said}: a warning, its work goes on"
        return (
            f"{said}: its work not yet placed waits until the period ends at "
            f"{self.period_end:%Y-%m-%dT%H:%M:%SZ} or the budget is raised"
        )


class TenantBudgetRestored(TenantBudgetEvent):
    """A tenant over a hard limit is within it again (the budget was raised, or a new period
    began): the scheduler stops holding its work. Also said, for every tenant within its
    hard limit, when a predictor starts (it may have been raised meanwhile)."""

    why: str = Field(max_length=512, description="Why it is within the budget now.")
