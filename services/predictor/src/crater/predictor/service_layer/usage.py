"""Usage and chargeback, served: the usage query (priced), the `crater_tenant_*` gauges
refreshed from the usage records, the per-task `crater_task_*` gauges (what each allocation
held now asked for against what its task really uses), and the hourly CSV export
(domain/usage.py has the rules)."""

from __future__ import annotations

import asyncio
import csv
import logging
from collections.abc import Awaitable, Callable
from contextlib import suppress
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID, uuid5

from prometheus_client import CollectorRegistry, Counter, Gauge

from crater.contracts import (
    BudgetPeriod,
    Event,
    TenantBudgetExceeded,
    TenantBudgetRestored,
    UsageAnswer,
    UsageQuery,
)
from crater.predictor.adapters.store import LearningStore
from crater.predictor.domain.usage import (
    HOUR,
    HeldTask,
    PriceFileError,
    Prices,
    Standing,
    csv_rows,
    month_start,
    parse_prices,
    period_bounds,
    standings,
    usage,
)

log = logging.getLogger("crater.predictor.usage")
EXPORT_CATCH_UP = 24  # finished hours looked back on for a missing export


class TenantMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["tenant"]
        self.gpus = Gauge(
            "crater_tenant_gpus_allocated",
            "GPUs a tenant holds now (shares of cards count as their share).",
            labels,
            registry=registry,
        )
        self.gpu_hours = Gauge(
            "crater_tenant_gpu_hours",
            "GPU-hours allocated to the tenant this calendar month (UTC), so far.",
            labels,
            registry=registry,
        )
        self.idle_gpu_hours = Gauge(
            "crater_tenant_idle_gpu_hours",
            "Of those, allocated but idle by the tasks' own utilisation samples.",
            labels,
            registry=registry,
        )
        self.unmeasured_gpu_hours = Gauge(
            "crater_tenant_unmeasured_gpu_hours",
            "Of those, held by tasks that sent no utilisation sample.",
            labels,
            registry=registry,
        )
        self.cost = Gauge(
            "crater_tenant_cost",
            "The tenant's cost this calendar month (UTC), so far, in the price file's currency.",
            labels,
            registry=registry,
        )
        self.budget = Gauge(
            "crater_tenant_budget",
            "The tenant's budget per period (price file), by limit (soft, hard).",
            ["tenant", "limit"],
            registry=registry,
        )
        self.budget_exceeded = Gauge(
            "crater_tenant_budget_exceeded",
            "1 while the tenant's cost in its budget period is above the limit (soft, hard).",
            ["tenant", "limit"],
            registry=registry,
        )
        self.budget_cost = Gauge(
            "crater_tenant_budget_cost",
            "The tenant's cost in its budget's current period (this month or today, UTC), so "
            "far: what crater_tenant_budget is compared with.",
            ["tenant", "period"],
            registry=registry,
        )
        self.budget_events = Counter(
            "crater_tenant_budget_events",
            "tenant.budget_exceeded and tenant.budget_restored events published, by kind "
            "(exceeded, restored) and limit.",
            ["kind", "limit"],
            registry=registry,
        )
        self.config_reloads = Counter(
            "crater_predictor_config_reloads",
            "The price file changed on disk and was read again: applied, or refused (invalid; "
            "the running prices and budgets kept, the field and reason logged).",
            ["outcome"],
            registry=registry,
        )


MIB = 1024 * 1024


class TaskMetrics:
    """Per allocation held now: what it asked for against what its task really uses. Set
    afresh at every refresh from the database (every replica alike), so a released
    allocation's series are gone at the next one."""

    LABELS = ("task_id", "allocation_id", "tenant", "pool")

    def __init__(self, registry: CollectorRegistry) -> None:
        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, list(self.LABELS), registry=registry)

        self.gpus = gauge(
            "crater_task_gpus_requested", "GPUs the allocation holds (a shared card: its share)."
        )
        self.gpu_utilization = gauge(
            "crater_task_gpu_utilization_percent",
            "The task's own mean GPU utilisation since its grant (its usage samples); no "
            "series while it sent none.",
        )
        self.gpu_memory_requested = gauge(
            "crater_task_gpu_memory_requested_bytes", "GPU memory reserved on each of its cards."
        )
        self.gpu_memory_used = gauge(
            "crater_task_gpu_memory_used_bytes",
            "GPU memory in use on its fullest card, latest reading: its own usage sample, "
            "else (cards held whole and alone) the node's.",
        )
        self.gpu_memory_request_usage = gauge(
            "crater_task_gpu_memory_request_usage_ratio",
            "GPU memory in use on its fullest card as a share of what the task reserved per "
            "card (above 1: more than it asked for).",
        )
        self.gpu_memory_card_usage = gauge(
            "crater_task_gpu_memory_card_usage_ratio",
            "GPU memory in use on its fullest card as a share of that physical card (per "
            "card and node: crater_gpu_memory_usage_rate).",
        )
        self.cpu_requested = gauge("crater_task_cpu_cores_requested", "CPU cores granted.")
        self.cpu_used = gauge(
            "crater_task_cpu_cores_used",
            "CPU cores busy, by its latest usage sample (cores granted x their use).",
        )
        self.memory_requested = gauge("crater_task_memory_requested_bytes", "Host memory granted.")
        self.memory_used = gauge(
            "crater_task_memory_used_bytes",
            "Host memory resident in its process tree, latest usage sample (its peak).",
        )
        self.run_seconds = gauge(
            "crater_task_run_seconds",
            "Seconds since it started running (its node's or launcher's first running "
            "report); no series before.",
        )
        self.not_exported = Gauge(
            "crater_predictor_allocations_not_exported",
            "Allocations held past CRATER_PREDICTOR_TASK_METRICS_LIMIT: no crater_task_* "
            "series of their own.",
            registry=registry,
        )

    def all(self) -> list[Gauge]:
        return [
            g for g in vars(self).values() if isinstance(g, Gauge) and g is not self.not_exported
        ]

    def show(self, held: list[HeldTask], now: datetime, limit: int) -> None:
        for gauge in self.all():
            gauge.clear()
        ordered = sorted(held, key=lambda h: (h.record.granted_at, h.record.allocation_id))
        self.not_exported.set(max(0, len(ordered) - limit))
        for task in ordered[:limit]:
            r = task.record
            labels = (r.task_id, r.allocation_id, r.tenant, r.pool)
            self.gpus.labels(*labels).set(r.gpus * r.gpu_milli / 1000)
            if r.utilization is not None:
                self.gpu_utilization.labels(*labels).set(r.utilization * 100)
            if r.gpus:
                self.gpu_memory_requested.labels(*labels).set(r.gpu_memory_mb * MIB)
            if task.gpu_memory_used_mb is not None:
                self.gpu_memory_used.labels(*labels).set(task.gpu_memory_used_mb * MIB)
            if (share := task.gpu_memory_request_usage) is not None:
                self.gpu_memory_request_usage.labels(*labels).set(share)
            if (share := task.gpu_memory_card_usage) is not None:
                self.gpu_memory_card_usage.labels(*labels).set(share)
            self.cpu_requested.labels(*labels).set(r.cpu_cores)
            if (cores := task.cpu_cores_used) is not None:
                self.cpu_used.labels(*labels).set(cores)
            self.memory_requested.labels(*labels).set(r.memory_mb * MIB)
            if task.host_memory_used_mb is not None:
                self.memory_used.labels(*labels).set(task.host_memory_used_mb * MIB)
            if (seconds := task.run_seconds(now)) is not None:
                self.run_seconds.labels(*labels).set(seconds)


class PriceWatch:
    """Notices a change of the price file (modification time and size, looked at on each
    refresh) and reads it again, as the scheduler watches its pools and quotas files."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.stamp = _stamp(path)

    def poll(self) -> Prices | PriceFileError | None:
        """The file read again when it changed: new prices, or why they are refused (also
        when it disappeared: the running ones are kept rather than dropped); None when it
        did not change."""
        if self.path is None:
            return None
        stamp = _stamp(self.path)
        if stamp == self.stamp:
            return None
        self.stamp = stamp  # a refused version is said once, not on every look
        try:
            return parse_prices(self.path.read_text(), str(self.path))
        except PriceFileError as refused:
            return refused
        except OSError as error:
            return PriceFileError(str(self.path), "file", f"cannot be read: {error.strerror}")


def _stamp(path: Path | None) -> tuple[int, int] | None:
    if path is None:
        return None
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


_BUDGET_NAMESPACE = UUID("9a3f4c1e-2b7d-4e0a-8c5f-1d6e2a7b9c30")


def budget_event_id(kind: str, tenant: str, limit: str, start: datetime, amount: str) -> UUID:
    """The same for every replica and after a restart, so the event is said once per tenant,
    limit, period and amount (JetStream's duplicate window, then the consumers' inboxes)."""
    return uuid5(_BUDGET_NAMESPACE, f"{kind}:{tenant}:{limit}:{start.isoformat()}:{amount}")


Publish = Callable[[Event], Awaitable[None]]


class UsageReporter:
    """Answers usage queries, refreshes the tenant gauges every `refresh_seconds`, compares
    each tenant's cost with its budget and says when a limit is passed (and, for a hard one,
    when the tenant is within it again), and writes each finished UTC hour's usage by tenant
    to `export_dir` (usage-YYYYMMDDTHH.csv). The price file is read again when it changes."""

    def __init__(
        self,
        store: LearningStore,
        metrics: TenantMetrics,
        prices: Prices | None,
        refresh_seconds: float = 60.0,
        export_dir: Path | None = None,
        tasks: TaskMetrics | None = None,
        task_limit: int = 1000,
        publish: Publish | None = None,
        watch: PriceWatch | None = None,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.tasks = tasks
        self.task_limit = task_limit
        self.prices = prices
        self.refresh_seconds = refresh_seconds
        self.export_dir = export_dir
        self.publish = publish
        self.watch = watch
        # (tenant, limit) -> the standing last said (None: nothing said since start)
        self.said: dict[tuple[str, str], Standing] = {}
        self._task: asyncio.Task[None] | None = None

    async def answer(self, query: UsageQuery) -> UsageAnswer:
        records = await self.store.usage_records(query.since, query.until, query.tenant)
        return usage(records, query.since, query.until, query.by, self.prices, query.hourly)

    def reload(self) -> PriceFileError | None:
        """Take the price file again if it changed: applied from this refresh on, or refused
        naming the field and the reason (the running prices and budgets kept)."""
        found = self.watch.poll() if self.watch is not None else None
        if found is None:
            return None
        if isinstance(found, PriceFileError):
            self.metrics.config_reloads.labels(outcome="refused").inc()
            log.warning("price file refused, the running prices and budgets kept: %s", found)
            return found
        self.prices = found
        self.metrics.config_reloads.labels(outcome="applied").inc()
        log.info("price file reloaded: %d budgets", len(found.budgets))
        return None

    async def refresh(self, now: datetime | None = None) -> UsageAnswer:
        """Set the tenant gauges from this month's usage so far and judge the budgets;
        returns this month's usage."""
        now = now or datetime.now(UTC)
        self.reload()
        month = await self.answer(UsageQuery(since=month_start(now), until=now))
        held = await self.store.usage_records(now, now + timedelta(microseconds=1))
        m = self.metrics
        for gauge in (m.gpus, m.gpu_hours, m.idle_gpu_hours, m.unmeasured_gpu_hours, m.cost):
            gauge.clear()
        for record in held:
            m.gpus.labels(tenant=record.tenant).inc(record.gpus * record.gpu_milli / 1000)
        for line in month.lines:
            m.gpu_hours.labels(tenant=line.key).set(float(line.gpu_hours))
            m.idle_gpu_hours.labels(tenant=line.key).set(float(line.idle_gpu_seconds / 3600))
            m.unmeasured_gpu_hours.labels(tenant=line.key).set(
                float(line.unmeasured_gpu_seconds / 3600)
            )
            if line.cost is not None:
                m.cost.labels(tenant=line.key).set(float(line.cost))
        await self._budgets(month, now)
        if self.tasks is not None:
            self.tasks.show(await self.store.held(), now, self.task_limit)
        return month

    async def _budgets(self, month: UsageAnswer, now: datetime) -> None:
        """Each budgeted tenant's standing: the gauges, and the events on a change."""
        m = self.metrics
        budgets = self.prices.budgets if self.prices else {}
        spent: dict[BudgetPeriod, dict[str, Decimal]] = {
            "monthly": {line.key: line.cost or Decimal(0) for line in month.lines}
        }
        if any(b.period == "daily" for b in budgets.values()):
            day = await self.answer(UsageQuery(since=period_bounds("daily", now)[0], until=now))
            spent["daily"] = {line.key: line.cost or Decimal(0) for line in day.lines}
        found = standings(budgets, spent, now)
        m.budget.clear()
        m.budget_exceeded.clear()
        m.budget_cost.clear()
        for s in found:
            m.budget.labels(tenant=s.tenant, limit=s.limit).set(float(s.amount))
            m.budget_exceeded.labels(tenant=s.tenant, limit=s.limit).set(1 if s.exceeded else 0)
            m.budget_cost.labels(tenant=s.tenant, period=s.period).set(float(s.cost))
        await self._tell(found, now)

    async def _tell(self, found: list[Standing], now: datetime) -> None:
        """Publish what changed since last said: a limit passed (`budget_exceeded`, soft and
        hard); a hard limit held no more (`budget_restored`: raised, a new period, the budget
        removed; and at start, every tenant within its hard limit, since it may have been
        raised while this predictor was away). Said only once published: a failed publish is
        tried again at the next refresh."""
        if self.publish is None or self.prices is None:
            return
        currency = self.prices.currency
        current = {(s.tenant, s.limit): s for s in found}
        for key, last in list(self.said.items()):
            if key in current:
                continue
            if last.exceeded and last.limit == "hard":
                await self._restored(last, currency, now, "its hard budget was removed", "none")
            del self.said[key]
        for key, s in current.items():
            before = self.said.get(key)
            if s.exceeded:
                if before is None or not before.exceeded or before.start != s.start:
                    await self._exceeded(s, currency, now)
            elif s.limit == "hard" and (before is None or before.exceeded):
                if before is None:
                    why = "within its hard budget when the predictor started"
                elif before.start != s.start:
                    why = "a new budget period began"
                else:
                    why = f"its hard budget was raised from {before.amount} to {s.amount}"
                await self._restored(s, currency, now, why, str(s.amount))
            self.said[key] = s

    async def _exceeded(self, s: Standing, currency: str, now: datetime) -> None:
        assert self.publish is not None
        await self.publish(
            TenantBudgetExceeded(
                event_id=budget_event_id("exceeded", s.tenant, s.limit, s.start, str(s.amount)),
                **_standing_fields(s, currency, now),
            )
        )
        self.metrics.budget_events.labels(kind="exceeded", limit=s.limit).inc()
        log.warning(
            "tenant %s passed its %s budget: %s over %s", s.tenant, s.limit, s.cost, s.amount
        )

    async def _restored(
        self, s: Standing, currency: str, now: datetime, why: str, amount: str
    ) -> None:
        assert self.publish is not None
        await self.publish(
            TenantBudgetRestored(
                event_id=budget_event_id("restored", s.tenant, s.limit, s.start, amount),
                **_standing_fields(s, currency, now),
                why=why,
            )
        )
        self.metrics.budget_events.labels(kind="restored", limit=s.limit).inc()

    def export_path(self, hour: datetime) -> Path | None:
        if self.export_dir is None:
            return None
        return self.export_dir / f"usage-{hour:%Y%m%dT%H}.csv"

    async def export(self, hour: datetime) -> Path | None:
        """Write the usage of the UTC hour starting at `hour`, by tenant (AllData loads it);
        an hour already written is left alone."""
        path = self.export_path(hour)
        if path is None or await asyncio.to_thread(path.exists):
            return path
        answer = await self.answer(UsageQuery(since=hour, until=hour + HOUR, hourly=True))
        await asyncio.to_thread(_write_csv, path, csv_rows(answer))
        return path

    async def tick(self, now: datetime | None = None) -> None:
        """Refresh the gauges; export every finished hour of the last `EXPORT_CATCH_UP` not
        written yet (a predictor that was down catches up, oldest first)."""
        now = now or datetime.now(UTC)
        await self.refresh(now)
        current = now.replace(minute=0, second=0, microsecond=0)
        for back in range(EXPORT_CATCH_UP, 0, -1):
            await self.export(current - back * HOUR)

    async def _loop(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception:  # a failed refresh is retried at the next; never the service
                log.exception("usage refresh failed")
            await asyncio.sleep(self.refresh_seconds)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="usage-reporter")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task


def _write_csv(path: Path, rows: list[dict[str, str]]) -> None:
    """Whole or not at all: written aside, then renamed, so AllData never reads half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".csv.part")
    with partial.open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]) if rows else ["by"])
        writer.writeheader()
        writer.writerows(rows)
    partial.replace(path)


def _standing_fields(s: Standing, currency: str, now: datetime) -> dict[str, Any]:
    """What a budget event says of the tenant's standing, exceeded or restored alike."""
    return {
        "occurred_at": now,
        "tenant": s.tenant,
        "limit": s.limit,
        "period": s.period,
        "period_start": s.start,
        "period_end": s.end,
        "budget": s.amount,
        "cost": s.cost,
        "currency": currency,
    }
