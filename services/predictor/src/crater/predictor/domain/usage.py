"""Usage and chargeback: what each allocation held, for how long, what that costs.

Every allocation is one usage record from its grant to its release (one still held counts up
to the end of the period asked about), kept in the predictor's database. A period's usage is
each record's overlap with it, in whole milliseconds, times what it held: GPU-seconds count
the share of each card held (`gpu_milli`), so a period's GPU-seconds are integers of
milli-GPU-milliseconds underneath, added up exactly: a bill per tenant adds up to the
cluster's allocated GPU-seconds to the last digit.

Idle but allocated: a task that sends usage samples (crater_client) says how busy its GPUs
were; its allocated GPU-seconds times (1 - its mean measured utilisation) are idle. An
allocation whose task sent none is counted as unmeasured, not as busy nor idle.

Prices (a YAML or JSON file, CRATER_PREDICTOR_PRICE_FILE): per GPU model per hour (the
longest key contained in the grant's model, case-insensitive, else `default_gpu_hour`), per
GiB-hour of GPU memory reserved, per core-hour, per GiB-hour of host memory; and each
tenant's budget per month or day (soft: warn; hard: hold its new work), naming only the
tenants the file lists under `tenants` when it lists them.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from crater.contracts import BudgetLimit, BudgetPeriod
from crater.contracts.budgets import MAX_AMOUNT
from crater.contracts.queries import UsageAnswer, UsageGrouping, UsageLine

MILLI = 1000
MS_PER_HOUR = 3_600_000
MIB_PER_GIB = 1024
SIX_PLACES = Decimal("0.000001")
HOUR = timedelta(hours=1)
# A tenant's name as a task carries it (TaskRequest.tenant).
TENANT_NAME = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?")
NAMING = "lower-case letters, digits and '-', at most 63, starting and ending alphanumeric"


class Budget(BaseModel):
    """A tenant's spend per period (a UTC calendar month or day), in the price file's
    currency: above `soft` it is warned of, above `hard` its work not yet placed waits."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    soft: Decimal | None = Field(default=None, ge=0, le=MAX_AMOUNT, description="Warn above it.")
    hard: Decimal | None = Field(
        default=None, ge=0, le=MAX_AMOUNT, description="Hold new work above it."
    )
    period: BudgetPeriod = Field(default="monthly", description="monthly or daily (UTC).")

    @model_validator(mode="after")
    def _limits(self) -> Budget:
        if self.soft is None and self.hard is None:
            raise ValueError("no limit: set soft, hard or both")
        if self.soft is not None and self.hard is not None and self.soft > self.hard:
            raise ValueError(
                f"soft ({self.soft}) is above hard ({self.hard}): the warning would come after "
                "the hold"
            )
        return self

    def limits(self) -> list[tuple[BudgetLimit, Decimal]]:
        """(limit, amount) of the limits set, soft first."""
        found: list[tuple[BudgetLimit, Decimal]] = []
        if self.soft is not None:
            found.append(("soft", self.soft))
        if self.hard is not None:
            found.append(("hard", self.hard))
        return found


class Prices(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    currency: str = Field(default="EUR", min_length=1, max_length=16)
    gpu_hour: dict[str, Decimal] = Field(default_factory=dict)
    default_gpu_hour: Decimal = Field(default=Decimal(0), ge=0)
    gpu_memory_gib_hour: Decimal = Field(default=Decimal(0), ge=0)
    cpu_core_hour: Decimal = Field(default=Decimal(0), ge=0)
    memory_gib_hour: Decimal = Field(default=Decimal(0), ge=0)
    tenants: tuple[str, ...] | None = Field(
        default=None,
        description="Every tenant a budget may name; a budget naming another is refused "
        "(a typo budgets nobody). Unset: budgets are checked only for a valid tenant name.",
    )
    budgets: dict[str, Budget] = Field(default_factory=dict)

    def per_gpu_hour(self, model: str | None) -> Decimal:
        if model:
            found = [k for k in self.gpu_hour if k.lower() in model.lower()]
            if found:
                return self.gpu_hour[max(found, key=len)]
        return self.default_gpu_hour


class PriceFileError(ValueError):
    """A price file that cannot be used: the field (`budgets.physics.hard`) and the reason."""

    def __init__(self, origin: str, field: str, reason: str) -> None:
        super().__init__(f"{origin}: {field}: {reason}")
        self.origin, self.field, self.reason = origin, field, reason


def parse_prices(text: str, origin: str = "price file") -> Prices:
    """The price file's YAML (or JSON) as `Prices`, or `PriceFileError` naming the first
    field at fault and why: not YAML, a wrong type or bound, a budget of an unknown tenant."""
    try:
        raw: Any = yaml.safe_load(text) or {}
    except yaml.YAMLError as fault:
        raise PriceFileError(origin, "body", f"not valid YAML: {fault}") from fault
    try:
        prices = Prices.model_validate(raw)
    except ValidationError as invalid:
        first = invalid.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        raise PriceFileError(origin, where, first["msg"]) from invalid
    for name in prices.tenants or ():
        if not is_tenant_name(name):
            raise PriceFileError(origin, "tenants", f"{name!r} is not a tenant name ({NAMING})")
    known = set(prices.tenants) if prices.tenants is not None else None
    for tenant in prices.budgets:
        if not is_tenant_name(tenant):
            raise PriceFileError(
                origin, f"budgets.{tenant}", f"{tenant!r} is not a tenant name ({NAMING})"
            )
        if known is not None and tenant not in known:
            listed = ", ".join(sorted(known)) or "none"
            raise PriceFileError(
                origin,
                f"budgets.{tenant}",
                f"unknown tenant {tenant!r}: the file's tenants are {listed}; add it to "
                "tenants (or correct the name)",
            )
    return prices


def is_tenant_name(name: str) -> bool:
    return len(name) <= 63 and TENANT_NAME.fullmatch(name) is not None


def load_prices(path: Path | None) -> Prices | None:
    if path is None:
        return None
    return parse_prices(path.read_text(), str(path))


def period_bounds(period: BudgetPeriod, moment: datetime) -> tuple[datetime, datetime]:
    """The UTC calendar month (or day) `moment` is in: [start, end)."""
    if period == "daily":
        start = moment.replace(hour=0, minute=0, second=0, microsecond=0)
        return start, start + timedelta(days=1)
    start = month_start(moment)
    end = (start + timedelta(days=32)).replace(day=1)
    return start, end


@dataclass(frozen=True)
class UsageRecord:
    allocation_id: str
    task_id: str
    tenant: str
    pool: str
    gpu_model: str | None
    gpus: int
    gpu_milli: int
    gpu_memory_mb: int
    cpu_cores: int
    memory_mb: int
    granted_at: datetime
    released_at: datetime | None
    sampled_seconds: float = 0.0
    busy_seconds: float = 0.0  # sum of interval x mean GPU utilisation (0..1)

    def held_ms(self, since: datetime, until: datetime) -> int:
        """Milliseconds of [since, until) this allocation held, every time taken to its
        whole millisecond first: an hour's, a day's and a month's figures add up exactly."""
        start = _whole_ms(max(since, self.granted_at))
        end = _whole_ms(min(until, self.released_at or until))
        if end <= start:
            return 0
        return (end - start) // timedelta(milliseconds=1)

    @property
    def utilization(self) -> float | None:
        if self.sampled_seconds <= 0:
            return None
        return min(1.0, max(0.0, self.busy_seconds / self.sampled_seconds))

    def key(self, by: UsageGrouping) -> str:
        if by == "tenant":
            return self.tenant
        if by == "pool":
            return self.pool
        if by == "model":
            return self.gpu_model or "-"
        return self.task_id


@dataclass(frozen=True)
class HeldTask:
    """An allocation held now, with the latest readings of what its task really uses: the
    per-task metrics compare them with what it asked for."""

    record: UsageRecord
    running_at: datetime | None
    gpu_memory_used_mb: int | None  # on its fullest card, the latest reading
    gpu_memory_card_mb: int | None  # that card's size
    host_memory_used_mb: int | None
    cpu_utilization_percent: float | None  # of the cores granted

    def run_seconds(self, now: datetime) -> float | None:
        """Since its node (or launcher) said it runs; None before."""
        if self.running_at is None:
            return None
        return max(0.0, (now - self.running_at).total_seconds())

    @property
    def gpu_memory_request_usage(self) -> float | None:
        """GPU memory in use on its fullest card over what it reserved per card."""
        reserved = self.record.gpu_memory_mb
        if self.gpu_memory_used_mb is None or not reserved:
            return None
        return self.gpu_memory_used_mb / reserved

    @property
    def gpu_memory_card_usage(self) -> float | None:
        """GPU memory in use on its fullest card over that card's size."""
        if self.gpu_memory_used_mb is None or not self.gpu_memory_card_mb:
            return None
        return self.gpu_memory_used_mb / self.gpu_memory_card_mb

    @property
    def cpu_cores_used(self) -> float | None:
        if self.cpu_utilization_percent is None:
            return None
        return self.record.cpu_cores * self.cpu_utilization_percent / 100


@dataclass
class _Sums:
    """Exact integer sums: milli-GPU-ms, MiB-ms, core-ms; idle as a Decimal of GPU-ms."""

    allocations: int = 0
    gpu_milli_ms: int = 0
    unmeasured_milli_ms: int = 0
    idle_gpu_ms: Decimal = Decimal(0)
    gpu_memory_mib_ms: int = 0
    core_ms: int = 0
    memory_mib_ms: int = 0
    cost: Decimal = Decimal(0)

    def add(self, record: UsageRecord, ms: int, prices: Prices | None) -> None:
        self.allocations += 1
        milli_ms = record.gpus * record.gpu_milli * ms
        self.gpu_milli_ms += milli_ms
        utilization = record.utilization
        if utilization is None:
            self.unmeasured_milli_ms += milli_ms
        else:
            self.idle_gpu_ms += Decimal(milli_ms) / MILLI * (1 - Decimal(str(utilization)))
        gpu_memory = record.gpus * record.gpu_memory_mb * ms
        self.gpu_memory_mib_ms += gpu_memory
        self.core_ms += record.cpu_cores * ms
        self.memory_mib_ms += record.memory_mb * ms
        if prices is not None:
            cost = (
                Decimal(milli_ms) / MILLI * prices.per_gpu_hour(record.gpu_model)
                + Decimal(gpu_memory) / MIB_PER_GIB * prices.gpu_memory_gib_hour
                + Decimal(record.cpu_cores * ms) * prices.cpu_core_hour
                + Decimal(record.memory_mb * ms) / MIB_PER_GIB * prices.memory_gib_hour
            ) / MS_PER_HOUR
            self.cost += cost

    def line(self, key: str, hour: datetime | None, priced: bool) -> UsageLine:
        gpu_seconds = Decimal(self.gpu_milli_ms) / (MILLI * MILLI)
        return UsageLine(
            key=key,
            hour=hour,
            allocations=self.allocations,
            gpu_seconds=gpu_seconds,
            gpu_hours=(gpu_seconds / 3600).quantize(SIX_PLACES, ROUND_HALF_EVEN),
            idle_gpu_seconds=(self.idle_gpu_ms / MILLI).quantize(SIX_PLACES, ROUND_HALF_EVEN),
            unmeasured_gpu_seconds=Decimal(self.unmeasured_milli_ms) / (MILLI * MILLI),
            gpu_memory_gib_seconds=_gib_seconds(self.gpu_memory_mib_ms),
            cpu_core_seconds=Decimal(self.core_ms) / MILLI,
            memory_gib_seconds=_gib_seconds(self.memory_mib_ms),
            cost=self.cost.quantize(SIX_PLACES, ROUND_HALF_EVEN) if priced else None,
        )


def _gib_seconds(mib_ms: int) -> Decimal:
    return (Decimal(mib_ms) / (MIB_PER_GIB * MILLI)).quantize(SIX_PLACES, ROUND_HALF_EVEN)


def _whole_ms(moment: datetime) -> datetime:
    return moment.replace(microsecond=moment.microsecond - moment.microsecond % 1000)


def _hour(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


def hours(since: datetime, until: datetime) -> Iterator[tuple[datetime, datetime]]:
    """The UTC hours [since, until) spans, each cut to it."""
    start = _hour(since)
    while start < until:
        yield max(start, since), min(start + HOUR, until)
        start += HOUR


def usage(
    records: Iterable[UsageRecord],
    since: datetime,
    until: datetime,
    by: UsageGrouping = "tenant",
    prices: Prices | None = None,
    hourly: bool = False,
) -> UsageAnswer:
    """Each group's usage of [since, until) (per UTC hour when `hourly`), sorted by key
    (then hour); the total adds up every line's exact quantities and rounded costs."""
    groups: dict[tuple[str, datetime | None], _Sums] = defaultdict(_Sums)
    for record in records:
        # only the hours the record overlaps: a year's hourly bill stays linear in records
        start = max(since, record.granted_at)
        end = min(until, record.released_at or until)
        if end <= start:
            continue
        windows = hours(start, end) if hourly else iter([(since, until)])
        for window_start, window_end in windows:
            ms = record.held_ms(window_start, window_end)
            if ms > 0:
                hour = _hour(window_start) if hourly else None
                groups[(record.key(by), hour)].add(record, ms, prices)
    priced = prices is not None
    lines = [
        groups[k].line(k[0], k[1], priced)
        for k in sorted(groups, key=lambda k: (k[0], k[1] or since))
    ]
    return UsageAnswer(
        since=since,
        until=until,
        by=by,
        currency=prices.currency if prices else None,
        lines=lines,
        total=_total(lines, priced),
    )


def _total(lines: list[UsageLine], priced: bool) -> UsageLine:
    def add(field: str) -> Decimal:
        return sum((getattr(line, field) for line in lines), Decimal(0))

    gpu_seconds = add("gpu_seconds")
    return UsageLine(
        key="total",
        allocations=sum(line.allocations for line in lines),
        gpu_seconds=gpu_seconds,
        gpu_hours=(gpu_seconds / 3600).quantize(SIX_PLACES, ROUND_HALF_EVEN),
        idle_gpu_seconds=add("idle_gpu_seconds"),
        unmeasured_gpu_seconds=add("unmeasured_gpu_seconds"),
        gpu_memory_gib_seconds=add("gpu_memory_gib_seconds"),
        cpu_core_seconds=add("cpu_core_seconds"),
        memory_gib_seconds=add("memory_gib_seconds"),
        cost=add("cost") if priced else None,
    )


def month_start(moment: datetime) -> datetime:
    return moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


CSV_FIELDS = (
    "key",
    "hour",
    "allocations",
    "gpu_seconds",
    "gpu_hours",
    "idle_gpu_seconds",
    "unmeasured_gpu_seconds",
    "gpu_memory_gib_seconds",
    "cpu_core_seconds",
    "memory_gib_seconds",
    "cost",
)


def csv_rows(answer: UsageAnswer) -> list[dict[str, str]]:
    """The answer's lines as CSV rows (CSV_FIELDS, plus `by` and `currency`), for AllData."""
    rows = []
    for line in answer.lines:
        data = line.model_dump(mode="json")
        row = {f: "" if data[f] is None else str(data[f]) for f in CSV_FIELDS}
        rows.append({"by": answer.by, **row, "currency": answer.currency or ""})
    return rows


@dataclass(frozen=True)
class Standing:
    """Where a tenant stands against one limit of its budget, this period."""

    tenant: str
    limit: BudgetLimit
    period: BudgetPeriod
    start: datetime
    end: datetime
    amount: Decimal
    cost: Decimal

    @property
    def exceeded(self) -> bool:
        return self.cost > self.amount


def standings(
    budgets: dict[str, Budget], spent: dict[BudgetPeriod, dict[str, Decimal]], now: datetime
) -> list[Standing]:
    """Every budgeted tenant's standing against each of its limits, by tenant then limit;
    `spent` holds each tenant's cost in the current month and day."""
    out = []
    for tenant in sorted(budgets):
        budget = budgets[tenant]
        start, end = period_bounds(budget.period, now)
        cost = spent.get(budget.period, {}).get(tenant, Decimal(0))
        for limit, amount in budget.limits():
            out.append(Standing(tenant, limit, budget.period, start, end, amount, cost))
    return out
