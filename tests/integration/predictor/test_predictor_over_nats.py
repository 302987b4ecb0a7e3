"""The predictor as it runs: a real nats-server, real JetStream consumers, a real database."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

import pytest
from faststream import TestApp
from sqlalchemy import select

from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    GpuMetrics,
    MessageRejected,
    NodeMetricsReported,
    ReleaseReason,
    TaskProfiled,
    TaskRejected,
    TaskRequest,
    TaskSubmitted,
)
from crater.predictor.adapters.orm import allocations
from crater.predictor.adapters.store import LearningStore
from crater.predictor.app import PredictorSettings, build
from crater.runtime.bus import publish
from crater.runtime.nats_server import NatsServer
from tests.support.events import EventTap, publish_raw


def submitted(task_id: str, **overrides: object) -> TaskSubmitted:
    body: dict[str, object] = {
        "task_id": task_id,
        "task_type": "training",
        "model_config": {"name": "meta-llama/Llama-2-7b-hf"},
        "resource_requirements": {"gpu": {"count": 2, "memory_mb": 40000}},
    }
    body.update(overrides)
    return TaskSubmitted.from_request(TaskRequest.model_validate(body))


def settings(nats: NatsServer, database_url: str) -> PredictorSettings:
    return PredictorSettings(nats_url=nats.url, database_url=database_url, correction_alpha=0.5)


async def test_submitted_task_is_profiled_once_even_when_published_twice(
    fresh_nats: NatsServer, tap: EventTap, database_url: str
) -> None:
    service, app = build(settings(fresh_nats, database_url))
    async with TestApp(app):
        event = submitted("train-1")
        await publish(service.broker, event)
        await publish(service.broker, event)  # a retrying producer: JetStream drops the copy
        [profiled] = await tap.wait_for(TaskProfiled)
        assert profiled.task.task_id == "train-1"
        assert profiled.prediction.gpu_memory_per_gpu_mb > 0
        assert profiled.prediction.timeline is not None
        await publish(service.broker, submitted("train-2"))
        await tap.wait_for(TaskProfiled, count=2)
        assert len(tap.of(TaskProfiled, lambda e: e.task.task_id == "train-1")) == 1


async def test_bad_input_is_rejected_with_field_and_reason_and_consuming_goes_on(
    fresh_nats: NatsServer, tap: EventTap, database_url: str
) -> None:
    service, app = build(settings(fresh_nats, database_url))
    async with TestApp(app):
        subject = "crater.v1.task.submitted"
        await publish_raw(fresh_nats.url, subject, b"{definitely not json")
        bad = {"task_id": "t", "task_type": "training", "model_config": {"name": "m"}}
        bad["resource_requirements"] = {"gpu": {"count": "two"}}
        await publish_raw(fresh_nats.url, subject, json.dumps(bad).encode())
        await publish_raw(fresh_nats.url, subject, b"x" * 10)
        # well-formed, but absurd: 3-way tensor parallelism over Llama-2-7B's 32 heads
        absurd = submitted(
            "absurd",
            resource_requirements={"gpu": {"count": 3}},
            training_config={"tensor_parallel": 3},
        )
        await publish(service.broker, absurd)
        await publish(service.broker, submitted("after-bad-input"))

        rejected = await tap.wait_for(MessageRejected, count=3)
        assert rejected[0].errors[0].field == "body"
        assert "not valid JSON" in rejected[0].errors[0].reason
        assert rejected[1].errors[0].field == "resource_requirements.gpu.count"
        assert rejected[1].consumer == "predictor"
        [refused] = await tap.wait_for(TaskRejected)
        assert refused.task_id == "absurd"
        assert refused.errors[0].field == "training_config.tensor_parallel"
        assert "32 attention heads" in refused.errors[0].reason
        [profiled] = await tap.wait_for(TaskProfiled)
        assert profiled.task.task_id == "after-bad-input"


def granted(task_id: str, allocation_id: str, gpu_ids: list[int]) -> AllocationGranted:
    now = datetime.now(UTC)
    return AllocationGranted(
        allocation_id=allocation_id,
        task_id=task_id,
        node="node-1",
        pool="default",
        tenant="default",
        gpu_ids=gpu_ids,
        gpu_memory_mb=40000,
        cpu_cores=[0, 1],
        numa_node=0,
        memory_mb=1024,
        checkpoint_path=None,
        reservation_token="token",
        reservation_expires_at=now + timedelta(seconds=30),
        score=1.0,
        explanation="test",
        environment={},
    )


def metrics(used: dict[int, int]) -> NodeMetricsReported:
    return NodeMetricsReported(
        node_id="node-1",
        cpu_utilization_percent=50,
        memory_used_mb=1024,
        memory_total_mb=65536,
        gpus=[
            GpuMetrics(index=i, utilization_percent=90, memory_used_mb=mb, memory_total_mb=81920)
            for i, mb in used.items()
        ],
    )


async def until(condition, timeout: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while not await condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_observed_peaks_correct_later_predictions_and_publish_the_error(
    fresh_nats: NatsServer, tap: EventTap, database_url: str
) -> None:
    service, app = build(settings(fresh_nats, database_url))
    store: LearningStore = service.state
    async with TestApp(app):
        await publish(service.broker, submitted("first"))
        [first] = await tap.wait_for(TaskProfiled)
        raw = first.prediction.gpu_memory_per_gpu_mb
        assert first.prediction.correction_factor is None

        await publish(service.broker, granted("first", "alloc-1", [2, 3]))

        async def peak() -> int | None:
            async with store.sessions() as session:
                return await session.scalar(
                    select(allocations.c.observed_peak_mb).where(
                        allocations.c.allocation_id == "alloc-1"
                    )
                )

        async def recorded() -> bool:
            return await peak() is not None

        await until(recorded)
        observed = round(raw * 1.2)
        # GPU 0 is not the task's: its reading must not count; GPU 3 peaks at 1.2x
        await publish(service.broker, metrics({0: 80000, 2: raw // 2, 3: raw}))
        await publish(service.broker, metrics({0: 80000, 2: raw // 2, 3: observed}))
        await publish(service.broker, metrics({0: 80000, 2: 100, 3: raw // 3}))

        async def peaked() -> bool:
            return await peak() == observed

        await until(peaked)
        release = AllocationReleased(
            allocation_id="alloc-1",
            task_id="first",
            node="node-1",
            gpu_ids=[2, 3],
            cpu_cores=[0, 1],
            reason=ReleaseReason.SUCCEEDED,
        )
        await publish(service.broker, release)

        async def learned() -> bool:
            return (await store.track("llama", "training")).samples == 1

        await until(learned)
        track = await store.track("llama", "training")
        factor = 0.5 + 0.5 * observed / raw  # alpha 0.5: halfway from 1.0 to the observed 1.2
        assert track.factor == pytest.approx(factor) == pytest.approx(1.1, rel=1e-4)
        assert track.mape == pytest.approx(abs(raw - observed) / observed)
        mape = service.registry.get_sample_value(
            "crater_predictor_mape", {"family": "llama", "task_type": "training"}
        )
        assert mape == pytest.approx(track.mape)

        # the same release again (a redelivery under a new message id) changes nothing
        assert await store.released(release) is None
        assert (await store.track("llama", "training")).samples == 1

        await publish(service.broker, submitted("second"))
        [second] = await tap.wait_for(TaskProfiled, lambda e: e.task.task_id == "second")
        assert second.prediction.correction_factor == pytest.approx(factor)
        assert second.prediction.gpu_memory_per_gpu_mb == round(raw * factor)
        assert "learned from 1 observed peaks" in second.prediction.method


async def test_corrections_survive_a_restart(fresh_nats: NatsServer, database_url: str) -> None:
    service, app = build(settings(fresh_nats, database_url))
    store: LearningStore = service.state
    async with TestApp(app):
        await store.record_prediction("t", "qwen2", "inference", raw_mb=1000, predicted_mb=1000)
        await store.granted(granted("t", "a-1", [0]))
        await store.observe(metrics({0: 800}))
        assert await store.released(
            AllocationReleased(
                allocation_id="a-1",
                task_id="t",
                node="node-1",
                gpu_ids=[0],
                cpu_cores=[],
                reason=ReleaseReason.CANCELLED,
            )
        )
    service, app = build(settings(fresh_nats, database_url))
    async with TestApp(app):
        value = service.registry.get_sample_value(
            "crater_predictor_mape", {"family": "qwen2", "task_type": "inference"}
        )
        assert value == pytest.approx(0.25)  # |1000 - 800| / 800, loaded from the database on start
