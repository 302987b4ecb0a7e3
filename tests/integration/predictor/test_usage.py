"""Usage and chargeback through a real predictor: a demo hour of grants, releases and usage
samples (some redelivered) becomes usage records, and the bill per tenant adds up exactly to
the cluster's allocated GPU-seconds; by pool and by model too; hourly lines add up to the
period; idle GPU time follows the tasks' own samples; prices, gauges and the hourly export."""

from __future__ import annotations

import csv
import os
import random
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import nats
from faststream import TestApp
from prometheus_client import CollectorRegistry
from sqlalchemy import func, select

from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    GpuUsage,
    QuerySubjects,
    ReleaseReason,
    TaskUsageReported,
    UsageAnswer,
    UsageQuery,
)
from crater.predictor.adapters.orm import usage_records
from crater.predictor.app import PredictorSettings, build
from crater.predictor.domain.usage import Budget, Prices
from crater.predictor.service_layer.usage import TenantMetrics, UsageReporter
from crater.runtime.bus import publish
from crater.runtime.nats_server import NatsServer
from tests.integration.predictor.test_predictor_over_nats import scalar, until

HOUR0 = datetime(2026, 11, 30, 10, tzinfo=UTC)
HOUR1 = HOUR0 + timedelta(hours=1)
TENANTS = ("physics", "vision", "nlp")
MODELS = {"pool-a": "NVIDIA A100-SXM4-80GB", "pool-h": "NVIDIA H100 80GB HBM3"}


def grant(i: int, tenant: str, pool: str, gpus: int, milli: int, at: datetime) -> AllocationGranted:
    return AllocationGranted(
        occurred_at=at,
        allocation_id=f"alloc-{i}",
        task_id=f"task-{i}",
        node=f"{pool}-node-{i % 3}",
        pool=pool,
        tenant=tenant,
        gpu_ids=list(range(gpus)),
        gpu_memory_mb=40960,
        gpu_model=MODELS[pool] if gpus else None,
        gpu_milli=milli,
        cpu_cores=list(range(4)),
        numa_node=0,
        memory_mb=16384,
        checkpoint_path=None,
        reservation_token="token",
        reservation_expires_at=at + timedelta(seconds=30),
        score=1.0,
        explanation="demo",
        environment={},
    )


def release(event: AllocationGranted, at: datetime) -> AllocationReleased:
    return AllocationReleased(
        occurred_at=at,
        allocation_id=event.allocation_id,
        task_id=event.task_id,
        node=event.node,
        gpu_ids=event.gpu_ids,
        cpu_cores=event.cpu_cores,
        reason=ReleaseReason.SUCCEEDED,
    )


def demo_hour(seed: int = 22) -> list[tuple[AllocationGranted, AllocationReleased | None]]:
    """40 allocations around HOUR0: some granted before it, some still held after it, some
    on shares of a card, some without GPUs; times to the millisecond."""
    rng = random.Random(seed)
    out = []
    for i in range(40):
        start = HOUR0 + timedelta(milliseconds=rng.randint(-1_800_000, 3_500_000))
        gpus = rng.choice((0, 1, 1, 2, 4, 8))
        milli = rng.choice((1000, 1000, 500, 250)) if gpus == 1 else 1000
        event = grant(i, rng.choice(TENANTS), rng.choice(tuple(MODELS)), gpus, milli, start)
        held = timedelta(milliseconds=rng.randint(1, 5_400_000))
        out.append((event, None if i % 7 == 0 else release(event, start + held)))
    return out


def expected_gpu_seconds(
    allocations: list[tuple[AllocationGranted, AllocationReleased | None]],
    since: datetime,
    until: datetime,
) -> Fraction:
    total = Fraction(0)
    for g, r in allocations:
        start = max(since, g.occurred_at)
        end = min(until, r.occurred_at if r else until)
        if end > start:
            seconds = Fraction((end - start) // timedelta(microseconds=1), 1_000_000)
            total += seconds * len(g.gpu_ids) * Fraction(g.gpu_milli, 1000)
    return total


async def ask(nats_url: str, query: UsageQuery) -> UsageAnswer:
    connection = await nats.connect(nats_url)
    try:
        reply = await connection.request(
            QuerySubjects.USAGE, query.model_dump_json().encode(), timeout=5
        )
    finally:
        await connection.close()
    return UsageAnswer.model_validate_json(reply.data)


async def test_a_demo_hour_bills_each_tenant_and_the_bills_add_up_exactly(
    fresh_nats: NatsServer, database_url: str, tmp_path: Path
) -> None:
    settings = PredictorSettings(nats_url=fresh_nats.url, database_url=database_url)
    service, app = build(settings)
    demo = demo_hour()
    async with TestApp(app):
        store = service.state
        for g, _ in demo:
            await publish(service.broker, g)
        await publish(service.broker, demo[1][0])  # a redelivery counts once

        async def all_granted() -> bool:
            n = await scalar(store, select(func.count()).select_from(usage_records))
            return bool(n == len(demo))

        await until(all_granted)
        # task-1's own samples: 25% busy on average (two samples, one redelivered)
        first = demo[1][0]
        for util in (10.0, 40.0):
            sample = TaskUsageReported(
                occurred_at=first.occurred_at + timedelta(seconds=util),
                task_id=first.task_id,
                allocation_id=first.allocation_id,
                interval_seconds=30,
                gpus=[
                    GpuUsage(gpu_id=i, utilization_percent=util, memory_used_mb=1)
                    for i in first.gpu_ids
                ]
                or [GpuUsage(gpu_id=0, utilization_percent=util, memory_used_mb=1)],
            )
            await publish(service.broker, sample)
            await publish(service.broker, sample)

        async def sampled() -> bool:
            mine = usage_records.c.allocation_id == first.allocation_id
            seconds = await scalar(store, select(usage_records.c.sampled_seconds).where(mine))
            return bool(seconds == 60)

        await until(sampled)
        releases = [r for _, r in demo if r is not None]
        for r in releases:
            await publish(service.broker, r)

        async def all_released() -> bool:
            closed = usage_records.c.released_at.is_not(None)
            n = await scalar(store, select(func.count()).where(closed))
            return bool(n == len(releases))

        await until(all_released)

        cluster = expected_gpu_seconds(demo, HOUR0, HOUR1)
        bill = await ask(fresh_nats.url, UsageQuery(since=HOUR0, until=HOUR1))
        assert {line.key for line in bill.lines} <= set(TENANTS)
        per_tenant = sum((line.gpu_seconds for line in bill.lines), Decimal(0))
        assert per_tenant == bill.total.gpu_seconds
        assert Fraction(per_tenant) == cluster  # exactly, to the millisecond
        assert cluster > 0
        for by in ("pool", "model", "task"):
            other = await ask(fresh_nats.url, UsageQuery(since=HOUR0, until=HOUR1, by=by))
            assert sum((line.gpu_seconds for line in other.lines), Decimal(0)) == per_tenant
        hourly = await ask(
            fresh_nats.url,
            UsageQuery(since=HOUR0 - timedelta(minutes=30), until=HOUR1, hourly=True),
        )
        two = expected_gpu_seconds(demo, HOUR0 - timedelta(minutes=30), HOUR1)
        assert Fraction(sum((line.gpu_seconds for line in hourly.lines), Decimal(0))) == two
        assert {line.hour for line in hourly.lines} == {HOUR0 - timedelta(hours=1), HOUR0}

        # one tenant's own: the same line as in the whole bill
        physics = await ask(fresh_nats.url, UsageQuery(since=HOUR0, until=HOUR1, tenant="physics"))
        assert [line.key for line in physics.lines] == ["physics"]
        assert physics.lines[0] == next(x for x in bill.lines if x.key == "physics")

        # idle: task-1's allocation was 25% busy, so 75% of its GPU-seconds were idle
        task1 = await ask(
            fresh_nats.url,
            UsageQuery(
                since=HOUR0 - timedelta(hours=1), until=HOUR1 + timedelta(hours=2), by="task"
            ),
        )
        line1 = next(x for x in task1.lines if x.key == first.task_id)
        assert line1.idle_gpu_seconds == (line1.gpu_seconds * Decimal("0.75")).quantize(
            Decimal("0.000001")
        )
        assert line1.unmeasured_gpu_seconds == 0
        others = [x for x in task1.lines if x.key != first.task_id]
        assert all(x.unmeasured_gpu_seconds == x.gpu_seconds for x in others)

        # priced, the gauges, the budgets and the hourly export
        prices = Prices(
            currency="EUR",
            gpu_hour={"A100": Decimal("2.50"), "H100": Decimal("4.00")},
            cpu_core_hour=Decimal("0.02"),
            memory_gib_hour=Decimal("0.005"),
            budgets={"physics": Budget(soft=Decimal("0.01")), "nlp": Budget(hard=Decimal(10**6))},
        )
        registry = CollectorRegistry()
        reporter = UsageReporter(store, TenantMetrics(registry), prices, export_dir=tmp_path)
        priced = await reporter.answer(UsageQuery(since=HOUR0, until=HOUR1))
        assert priced.currency == "EUR"
        assert priced.total.cost == sum(
            (line.cost or Decimal(0) for line in priced.lines), Decimal(0)
        )
        assert priced.total.cost is not None
        assert priced.total.cost > 0
        month = await reporter.refresh(now=HOUR1)
        for line in month.lines:
            gauge = registry.get_sample_value("crater_tenant_gpu_hours", {"tenant": line.key})
            assert gauge == float(line.gpu_hours)
        exceeded = registry.get_sample_value(
            "crater_tenant_budget_exceeded", {"tenant": "physics", "limit": "soft"}
        )
        assert exceeded == 1.0
        assert (
            registry.get_sample_value(
                "crater_tenant_budget_exceeded", {"tenant": "nlp", "limit": "hard"}
            )
            == 0.0
        )
        held_now = sum(
            len(g.gpu_ids) * g.gpu_milli / 1000
            for g, r in demo
            if g.occurred_at <= HOUR1 and (r is None or r.occurred_at > HOUR1)
        )
        gauges = sum(
            registry.get_sample_value("crater_tenant_gpus_allocated", {"tenant": t}) or 0
            for t in TENANTS
        )
        assert gauges == held_now

        await reporter.tick(now=HOUR1 + timedelta(minutes=5))
        written = sorted(n for n in os.listdir(tmp_path) if n.startswith("usage-"))
        assert len(written) == 24  # the last day's finished hours, each once
        assert written[-1] == "usage-20261130T10.csv"
        path = tmp_path / "usage-20261130T10.csv"
        rows = list(csv.DictReader(path.open()))
        assert {r["key"] for r in rows} == {line.key for line in priced.lines}
        assert sum(Decimal(r["gpu_seconds"]) for r in rows) == priced.total.gpu_seconds
        assert sum(Decimal(r["cost"]) for r in rows) == priced.total.cost
