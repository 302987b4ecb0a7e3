"""The predictor as it runs: a real nats-server, real JetStream consumers, a real database."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from faststream import TestApp
from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    GpuMetrics,
    MessageRejected,
    NodeMetricsReported,
    NodeTopologyReported,
    ReleaseReason,
    TaskProfiled,
    TaskRejected,
    TaskRequest,
    TaskStatus,
    TaskStatusReported,
    TaskSubmitted,
)
from crater.predictor.adapters import orm
from crater.predictor.adapters.orm import allocations, early_running, samples
from crater.predictor.adapters.store import LearningStore, prediction_record
from crater.predictor.app import MIGRATIONS_DIR, PredictorSettings, build
from crater.probe.app import ProbeSettings
from crater.probe.app import build as build_probe
from crater.probe.sim.runner import TaskRunner
from crater.probe.sim.simulation import true_use_mb
from crater.runtime.bus import publish
from crater.runtime.db import make_engine, upgrade_to_head_async
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
    # one observation suffices here, so that a test sees it applied
    return PredictorSettings(
        nats_url=nats.url,
        database_url=database_url,
        correction_alpha=0.5,
        correction_min_observations=1,
    )


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


def granted(
    task_id: str, allocation_id: str, gpu_ids: list[int], gpu_milli: int = 1000
) -> AllocationGranted:
    now = datetime.now(UTC)
    return AllocationGranted(
        allocation_id=allocation_id,
        task_id=task_id,
        node="node-1",
        pool="default",
        tenant="default",
        gpu_ids=gpu_ids,
        gpu_memory_mb=40000,
        gpu_milli=gpu_milli,
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


def running(task_id: str, allocation_id: str) -> TaskStatusReported:
    return TaskStatusReported(
        task_id=task_id, status=TaskStatus.RUNNING, allocation_id=allocation_id
    )


def metrics(used: dict[int, int], total_mb: int = 81920) -> NodeMetricsReported:
    return NodeMetricsReported(
        node_id="node-1",
        cpu_utilization_percent=50,
        memory_used_mb=1024,
        memory_total_mb=65536,
        gpus=[
            GpuMetrics(index=i, utilization_percent=90, memory_used_mb=mb, memory_total_mb=total_mb)
            for i, mb in used.items()
        ],
    )


def released(
    task_id: str, allocation_id: str, gpu_ids: list[int], reason: ReleaseReason
) -> AllocationReleased:
    return AllocationReleased(
        allocation_id=allocation_id,
        task_id=task_id,
        node="node-1",
        gpu_ids=gpu_ids,
        cpu_cores=[0, 1],
        reason=reason,
    )


async def until(condition, timeout: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while not await condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def scalar(store: LearningStore, query: Any) -> Any:
    async with store.sessions() as session:
        return await session.scalar(query)


def sample_count(store: LearningStore, allocation_id: str) -> Callable[[int], Awaitable[bool]]:
    async def reached(n: int) -> bool:
        query = select(func.count()).where(samples.c.allocation_id == allocation_id)
        found: int = await scalar(store, query)
        return found >= n

    return reached


def counted(service: Any, name: str, labels: dict[str, str] | None = None) -> float:
    return service.registry.get_sample_value(name, labels or {}) or 0.0


async def test_a_running_task_s_own_use_leads_to_a_bounded_correction(
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
        enough = sample_count(store, "alloc-1")

        async def recorded() -> bool:
            query = select(allocations.c.task_id).where(allocations.c.allocation_id == "alloc-1")
            return await scalar(store, query) is not None

        await until(recorded)  # metrics of a node with no known allocation teach nothing
        # granted, not yet running: the card may still hold the last tenant's memory
        await publish(service.broker, metrics({2: 79_000, 3: 79_000}, total_mb=400_000))
        await until(lambda: enough(1))
        await publish(service.broker, running("first", "alloc-1"))

        async def started() -> bool:
            query = select(allocations.c.running_at).where(allocations.c.allocation_id == "alloc-1")
            return await scalar(store, query) is not None

        await until(started)
        observed = round(raw * 2.5)  # far above the model: one observation moves it 10%
        # GPU 0 is not the task's: its reading must not count; GPU 3 peaks at 2.5x
        for used in ({0: 80000, 2: raw // 2, 3: raw}, {0: 80000, 2: raw, 3: observed}):
            await publish(service.broker, metrics(used, total_mb=400_000))
        await publish(service.broker, metrics({0: 80000, 2: 100, 3: raw // 3}, total_mb=400_000))
        await until(lambda: enough(4))
        release = released("first", "alloc-1", [2, 3], ReleaseReason.SUCCEEDED)
        await publish(service.broker, release)

        async def learned() -> bool:
            return (await store.track("llama", "training")).samples == 1

        await until(learned)
        track = await store.track("llama", "training")
        # alpha 0.5 would take it to 1.75; the step bound holds it to 1.1
        assert track.factor == pytest.approx(1.1)
        assert track.mape == pytest.approx(abs(raw - observed) / observed)
        peak = select(allocations.c.observed_peak_mb).where(
            allocations.c.allocation_id == "alloc-1"
        )
        assert await scalar(store, peak) == observed  # not the 79,000 before it ran
        assert await scalar(store, select(func.count()).select_from(samples)) == 0
        mape = counted(
            service, "crater_predictor_mape", {"family": "llama", "task_type": "training"}
        )
        assert mape == pytest.approx(track.mape)
        assert counted(service, "crater_predictor_releases_total", {"outcome": "learned"}) == 1

        # the same release again (a redelivery under a new message id) changes nothing
        assert await store.released(release) is None
        assert (await store.track("llama", "training")).samples == 1

        await publish(service.broker, submitted("second"))
        [second] = await tap.wait_for(TaskProfiled, lambda e: e.task.task_id == "second")
        assert second.prediction.correction_factor == pytest.approx(1.1)
        assert second.prediction.gpu_memory_per_gpu_mb == round(raw * 1.1)
        assert "learned from 1 observed peaks" in second.prediction.method


async def test_a_repeated_allocation_id_under_a_new_event_id_changes_nothing(
    fresh_nats: NatsServer, tap: EventTap, database_url: str
) -> None:
    service, app = build(settings(fresh_nats, database_url))
    store: LearningStore = service.state
    async with TestApp(app):
        grant = granted("first", "alloc-1", [2, 3])
        await publish(service.broker, grant)
        # the same allocation id under a new event id, even naming other cards and another
        # task: it must neither fail (a UniqueViolation redelivered forever) nor overwrite
        again = granted("other", "alloc-1", [0])
        assert again.event_id != grant.event_id
        await publish(service.broker, again)
        await publish(service.broker, again)  # JetStream drops this copy (same event id)
        await publish(service.broker, granted("next", "alloc-2", [5]))

        async def duplicate_counted() -> bool:
            return bool(counted(service, "crater_predictor_duplicate_grants_total") == 1)

        async def next_recorded() -> bool:
            query = select(allocations.c.task_id).where(allocations.c.allocation_id == "alloc-2")
            task: str | None = await scalar(store, query)
            return task == "next"

        await until(duplicate_counted)
        await until(next_recorded)  # consuming went on past it
        row = select(allocations.c.task_id, allocations.c.gpu_ids).where(
            allocations.c.allocation_id == "alloc-1"
        )
        async with store.sessions() as session:
            kept = (await session.execute(row)).one()
        assert (kept.task_id, kept.gpu_ids) == ("first", [2, 3])
        # even handed straight to the store again, under a third event id
        assert not await store.granted(granted("first", "alloc-1", [2, 3]))
        await asyncio.sleep(0.5)
        assert counted(service, "crater_predictor_duplicate_grants_total") == 1
        assert not tap.of(MessageRejected)


async def test_shared_cards_unconfirmed_runs_and_few_readings_teach_nothing(
    fresh_nats: NatsServer, database_url: str
) -> None:
    service, app = build(settings(fresh_nats, database_url))
    store: LearningStore = service.state
    async with TestApp(app):
        await store.record_predictions([prediction_record("t", "qwen2", "inference", 1000, 1000)])
        cases = {
            "shared": (granted("t", "a-shared", [0], gpu_milli=500), True, 3),
            "never-ran": (granted("t", "a-never", [1]), False, 3),
            "too-few-samples": (granted("t", "a-few", [2]), True, 2),
        }
        for grant, runs, _ in cases.values():
            await store.granted(grant)
            if runs:
                await store.running(running("t", grant.allocation_id))
        for n in range(3):
            await store.observe(metrics({0: 900, 1: 900, 2: 900} if n < 2 else {0: 900, 1: 900}))
        # a neighbour on the same card: those moments are not this task's
        await store.granted(granted("u", "a-neighbour", [3]))
        await store.granted(granted("t", "a-crowded", [3]))
        await store.running(running("t", "a-crowded"))
        for _ in range(3):
            await store.observe(metrics({3: 1800}))
        for outcome, (grant, _, _) in cases.items():
            result = await store.released(
                released("t", grant.allocation_id, grant.gpu_ids, ReleaseReason.SUCCEEDED)
            )
            assert result is not None
            assert result.outcome.value == outcome
        crowded = await store.released(released("t", "a-crowded", [3], ReleaseReason.SUCCEEDED))
        assert crowded is not None
        assert crowded.outcome.value == "too-few-samples"
        assert (await store.track("qwen2", "inference")).samples == 0


async def test_a_running_report_ahead_of_its_grant_is_kept(
    fresh_nats: NatsServer, database_url: str
) -> None:
    service, app = build(settings(fresh_nats, database_url))
    store: LearningStore = service.state
    async with TestApp(app):
        await store.record_predictions([prediction_record("t", "qwen2", "inference", 1000, 1000)])
        await store.running(running("t", "a-1"))  # the status consumer ran ahead
        await store.granted(granted("t", "a-1", [0]))
        for _ in range(3):
            await store.observe(metrics({0: 1200}))
        result = await store.released(released("t", "a-1", [0], ReleaseReason.SUCCEEDED))
        assert result is not None
        assert result.outcome.value == "learned"
        assert result.track is not None
        assert result.track.factor == pytest.approx(1.1)
        assert await scalar(store, select(func.count()).select_from(early_running)) == 0


async def test_corrections_survive_a_restart(fresh_nats: NatsServer, database_url: str) -> None:
    service, app = build(settings(fresh_nats, database_url))
    store: LearningStore = service.state
    async with TestApp(app):
        await store.record_predictions([prediction_record("t", "qwen2", "inference", 1000, 1000)])
        await store.granted(granted("t", "a-1", [0]))
        await store.running(running("t", "a-1"))
        for _ in range(3):
            await store.observe(metrics({0: 800}))
        result = await store.released(released("t", "a-1", [0], ReleaseReason.CANCELLED))
        assert result is not None
        assert result.track is not None
    service, app = build(settings(fresh_nats, database_url))
    async with TestApp(app):
        value = service.registry.get_sample_value(
            "crater_predictor_mape", {"family": "qwen2", "task_type": "inference"}
        )
        assert value == pytest.approx(0.25)  # |1000 - 800| / 800, loaded from the database on start


async def test_migrations_create_exactly_the_tables_the_code_uses(database_url: str) -> None:
    await upgrade_to_head_async(database_url, MIGRATIONS_DIR)
    engine = make_engine(database_url)

    def differences(connection: Connection) -> list[Any]:
        context = MigrationContext.configure(
            connection, opts={"version_table": "predictor_alembic_version"}
        )
        return [
            diff
            for diff in compare_metadata(context, orm.metadata)
            # Other services' tables may share the database; only ours must match.
            if not (diff[0] == "remove_table" and not diff[1].name.startswith("predictor_"))
        ]

    try:
        async with engine.connect() as connection:
            assert await connection.run_sync(differences) == []
    finally:
        await engine.dispose()


async def test_the_simulated_fleet_s_true_use_teaches_the_predictor_not_the_reservation(
    fresh_nats: NatsServer, tap: EventTap, database_url: str, tmp_path: Path
) -> None:
    """Predictor and simulated fleet over one nats-server, the scheduler played by the test:
    the probe learns the task's true use from its profile, shows it on the cards it runs on
    (whatever was reserved: here nearly the whole card), and the predictor learns that."""
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("seed: 5\nnodes:\n  - {profile: dgx-a100-8, count: 1, pool: training}\n")
    probe_settings = ProbeSettings(
        nats_url=fresh_nats.url,
        mode="fleet",
        fleet_file=fleet,
        metrics_interval_seconds=0.2,
        health_interval_seconds=0.2,
        task_seconds_min=2.0,
        task_seconds_max=2.0,
        task_start_seconds=0.05,
    )
    predictor, predictor_app = build(settings(fresh_nats, database_url))
    probe, probe_app = build_probe(probe_settings)
    store: LearningStore = predictor.state
    runner: TaskRunner = probe.state
    async with TestApp(predictor_app), TestApp(probe_app):
        await tap.wait_for(NodeTopologyReported)
        await publish(predictor.broker, submitted("first", pool="training"))
        [profiled] = await tap.wait_for(TaskProfiled)
        raw = profiled.prediction.gpu_memory_per_gpu_mb
        true = true_use_mb(5, "llama", "training", raw, "first")

        async def probe_knows() -> bool:
            return runner.true_use("first") == true

        await until(probe_knows, timeout=30)
        grant = granted("first", "alloc-1", [0, 1]).model_copy(
            update={"node": "a100-01", "pool": "training", "gpu_memory_mb": 80_000}
        )
        await publish(predictor.broker, grant)
        await tap.wait_for(
            TaskStatusReported, lambda e: e.status is TaskStatus.SUCCEEDED, timeout=30
        )
        release = released("first", "alloc-1", [0, 1], ReleaseReason.SUCCEEDED)
        await publish(predictor.broker, release.model_copy(update={"node": "a100-01"}))

        async def learned() -> bool:
            return (await store.track("llama", "training")).samples == 1

        await until(learned, timeout=30)
        peak = await scalar(
            store,
            select(allocations.c.observed_peak_mb).where(allocations.c.allocation_id == "alloc-1"),
        )
        assert 0.85 * true <= peak <= true  # the task's use, read below its peak by 0-15%
        assert peak < 0.95 * 80_000  # not the reservation (a first prediction near 64 GiB)
        track = await store.track("llama", "training")
        # alpha 0.5 from 1.0 toward what was read, one step of at most 10%
        assert track.factor == pytest.approx(min(max(0.5 + 0.5 * peak / raw, 1 / 1.1), 1.1))
