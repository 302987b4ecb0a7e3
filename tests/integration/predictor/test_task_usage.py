"""A task's own usage samples through a real predictor: learning prefers them, and the GPU
utilisation SLA is checked, said once per attempt, and survives a restart."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from faststream import TestApp
from sqlalchemy import select

from crater.contracts import (
    GpuUsage,
    ReleaseReason,
    TaskProfiled,
    TaskUnderutilized,
    TaskUsageReported,
)
from crater.predictor.adapters.orm import allocations, predictions, usage_windows
from crater.predictor.adapters.store import LearningStore, prediction_record
from crater.predictor.app import PredictorSettings, build
from crater.runtime.bus import publish
from crater.runtime.nats_server import NatsServer
from tests.integration.predictor.test_predictor_over_nats import (
    counted,
    granted,
    metrics,
    released,
    running,
    scalar,
    submitted,
    until,
)
from tests.support.events import EventTap

T0 = datetime.now(UTC)


def usage(
    task_id: str, second: float, util: float, used_mb: int = 1000, attempt: int = 1
) -> TaskUsageReported:
    return TaskUsageReported(
        occurred_at=T0 + timedelta(seconds=second),
        task_id=task_id,
        allocation_id="alloc-1",
        attempt=attempt,
        interval_seconds=10,
        gpus=[GpuUsage(gpu_id=0, utilization_percent=util, memory_used_mb=used_mb)],
    )


def settings(nats: NatsServer, database_url: str) -> PredictorSettings:
    return PredictorSettings(
        nats_url=nats.url,
        database_url=database_url,
        correction_min_observations=1,
        sla_window_seconds=20,
        sla_warmup_seconds=10,
    )


async def test_a_task_below_its_sla_is_said_once_and_it_survives_a_restart(
    fresh_nats: NatsServer, tap: EventTap, database_url: str
) -> None:
    service, app = build(settings(fresh_nats, database_url))
    async with TestApp(app):
        await publish(service.broker, submitted("slow", sla={"min_gpu_utilization_percent": 60}))
        await publish(service.broker, submitted("fine", sla={"min_gpu_utilization_percent": 60}))
        await tap.wait_for(TaskProfiled, count=2)
        first = [usage("slow", s, 20.0) for s in (10, 20, 30)]  # warm-up, then 20 s at 20%
        for sample in first:
            await publish(service.broker, sample)
        for s in (10, 20, 30, 40, 50):
            await publish(service.broker, usage("fine", s, 90.0))
        [breach] = await tap.wait_for(TaskUnderutilized)
        assert (breach.task_id, breach.attempt, breach.allocation_id) == ("slow", 1, "alloc-1")
        assert breach.measured_gpu_utilization_percent == 20.0
        assert breach.min_gpu_utilization_percent == 60.0
        assert (breach.window_seconds, breach.samples) == (20.0, 2)

        async def gauged() -> bool:
            labels = {"task_id": "fine"}
            return counted(service, "crater_predictor_task_gpu_utilization_percent", labels) > 0

        async def breaches_counted() -> bool:  # counted after the commit, the breach before it
            return counted(service, "crater_predictor_tasks_underutilized_total") == 1

        def taken() -> float:
            return counted(service, "crater_predictor_usage_samples_total", {"gpus": "yes"})

        async def all_taken() -> bool:  # the gauge moves at the first "fine" sample, not the last
            return taken() >= len(first) + 5

        await until(gauged)
        await until(breaches_counted)
        await until(all_taken)
        assert taken() == len(first) + 5  # every sample of both tasks, once
        store: LearningStore = service.state
        # a redelivered sample (same event id) counts nothing twice
        assert await store.usage(first[-1], publish_nothing) is None
    service, app = build(settings(fresh_nats, database_url))
    async with TestApp(app):
        # the window survived: another low window in the same attempt is not said again
        for s in (40, 50, 60):
            await publish(service.broker, usage("slow", s, 10.0))
        store = service.state
        await until(lambda: seen(store, "slow"))
        # a new attempt is measured afresh, and may be said again
        for s in (100, 110, 120):
            await publish(service.broker, usage("slow", s, 5.0, attempt=2))
        await tap.wait_for(TaskUnderutilized, lambda e: e.attempt == 2)
        assert len(tap.of(TaskUnderutilized, lambda e: e.task_id == "slow")) == 2
        assert not tap.of(TaskUnderutilized, lambda e: e.task_id == "fine")


async def publish_nothing(_: TaskUnderutilized) -> None:
    raise AssertionError("nothing is to be published for a redelivered sample")


async def seen(store: LearningStore, task_id: str) -> bool:
    """Whether the attempt-1 window took in the samples ending at 40, 50 and 60 s."""
    query = select(usage_windows.c.measured, usage_windows.c.samples).where(
        usage_windows.c.task_id == task_id, usage_windows.c.attempt == 1
    )
    async with store.sessions() as session:
        row = (await session.execute(query)).first()
    # 40 and 50 complete a second window at 10% (not said again); 60 starts a third
    return row is not None and (row.measured, row.samples) == (10.0, 1)


async def test_the_task_s_own_peak_is_learned_rather_than_the_node_s(
    fresh_nats: NatsServer, database_url: str
) -> None:
    service, app = build(settings(fresh_nats, database_url))
    store: LearningStore = service.state
    async with TestApp(app):
        await store.record_predictions([prediction_record("t", "qwen2", "inference", 1000, 1000)])
        await store.granted(granted("t", "alloc-1", [0]))
        await store.running(running("t", "alloc-1"))
        # the node sees 5,000 MiB on the card (a leftover context, say); the task its own 1,200
        for _ in range(3):
            await store.observe(metrics({0: 5000}))
        for s, used in ((1, 900), (2, 1200), (3, 1100)):
            sample = usage("t", s, 80.0, used_mb=used)
            await store.usage(sample.model_copy(update={"occurred_at": datetime.now(UTC)}), nop)
        result = await store.released(released("t", "alloc-1", [0], ReleaseReason.SUCCEEDED))
        assert result is not None
        assert result.outcome.value == "learned"
        peak = select(allocations.c.observed_peak_mb).where(
            allocations.c.allocation_id == "alloc-1"
        )
        assert await scalar(store, peak) == 1200
        assert result.track is not None
        assert result.track.mape is not None
        assert abs(result.track.mape - 200 / 1200) < 1e-9


async def nop(_: TaskUnderutilized) -> None:
    return None


async def test_two_replicas_folding_one_task_s_samples_at_once_lose_none(
    fresh_nats: NatsServer, database_url: str
) -> None:
    """Two predictor replicas share the task.usage durable: two samples of one task can be
    folded at the same moment, each by its own replica; the window keeps both."""
    service, app = build(
        settings(fresh_nats, database_url).model_copy(update={"sla_window_seconds": 10_000})
    )
    one: LearningStore = service.state
    two = LearningStore(one.sessions, one.rule, one.consumer, one.sla)
    async with TestApp(app):
        busy = prediction_record("busy", "qwen2", "inference", 1000, 1000, 50.0)
        await one.record_predictions([busy])
        await one.usage(usage("busy", 0, 90.0), nop)  # the window exists

        async def fold(store: LearningStore, second: float) -> None:
            for _ in range(20):  # as a redelivery would: a failed fold goes again
                try:
                    await store.usage(usage("busy", second, 90.0), nop)
                    return
                except Exception:
                    await asyncio.sleep(0.05)
            raise AssertionError(f"sample at {second} s never folded")

        seconds = [20 + 10 * n for n in range(12)]
        await asyncio.gather(*(fold(one if n % 2 else two, s) for n, s in enumerate(seconds)))
        query = select(usage_windows.c.samples).where(usage_windows.c.task_id == "busy")
        assert await scalar(one, query) == len(seconds)  # the warm-up's sample is not counted


async def test_two_submissions_of_one_task_profiled_at_once_keep_the_first_and_fail_neither(
    fresh_nats: NatsServer, database_url: str
) -> None:
    """The fuzz run dead-lettered a task.submitted: two submissions of one task id, profiled
    at the same moment, both read "not predicted" and the second insert hit the key."""
    service, app = build(settings(fresh_nats, database_url))
    store: LearningStore = service.state
    async with TestApp(app):
        await asyncio.gather(
            *(
                store.record_predictions(
                    [prediction_record(f"twice-{n % 5}", "qwen2", "inference", 100 + n, 100 + n)]
                )
                for n in range(20)
            )
        )
        async with store.sessions() as session:
            rows = (await session.execute(select(predictions))).all()
    kept = {row.task_id: row.raw_mb for row in rows}
    assert sorted(kept) == [f"twice-{k}" for k in range(5)]  # one record each
    assert all(raw in range(100 + int(task[-1]), 120, 5) for task, raw in kept.items())
