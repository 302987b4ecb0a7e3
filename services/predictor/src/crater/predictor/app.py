"""Predictor wiring: task submitted -> task profiled (or task rejected), and learning; and two
queries (request-reply) that record nothing: a task's prediction (dry runs), and AllData's job
description resolved into a task request (domain/resolve.py).

Profiling stays idempotent by construction: the profiled (or rejected) event's id is derived
from the submitted one, so JetStream drops a re-publish after a redelivery, and the recorded
prediction keeps its first row.

Learning (domain/learning.py has the rule): `allocation.granted` and `allocation.released` say
which task holds which cards of which node, `task.status` when it started running, and
`node.metrics.*` the memory in use on each card. On release, the highest reading taken while
the task ran, on cards it held whole and alone, is folded into a bounded correction per
(model family, task type), persisted, applied to later predictions once enough are in, and
the error of the published predictions is exported as `crater_predictor_mape{family,task_type}`.
A reservation never enters: learning from it would feed each prediction back into itself.
A task's own usage samples (`usage.task`, from crater_client) are the better reading of its
peak: when an allocation has them, the release judges those instead of the node's, by the
same rule.

SLA: each usage sample also joins its attempt's GPU utilisation window (domain/sla.py); a
whole window below the task's `sla.min_gpu_utilization_percent` publishes `task.underutilized`
once per attempt, counted in `crater_predictor_tasks_underutilized_total`.

Usage and chargeback (domain/usage.py): every grant is also a usage record, closed by its
release, and a task's usage samples add its measured GPU utilisation to it; the usage query
(`GET /api/v1/usage`, `crater cost`) prices them with the price file, the `crater_tenant_*`
gauges and budgets are refreshed from them, and each finished hour can be exported as CSV.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from faststream.asgi import AsgiFastStream
from pydantic import Field

from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    Event,
    NodeMetricsReported,
    PredictionAnswer,
    PredictionQuery,
    QuerySubjects,
    ResolveAnswer,
    ResolveQuery,
    Subjects,
    TaskStatusReported,
    TaskSubmitted,
    TaskUsageReported,
    UsageAnswer,
    UsageQuery,
)
from crater.predictor.adapters.store import LearningStore
from crater.predictor.domain.estimate import Assumptions
from crater.predictor.domain.learning import Rule
from crater.predictor.domain.sla import SlaRule
from crater.predictor.domain.usage import load_prices
from crater.predictor.service_layer.handlers import PredictorHandlers, PredictorMetrics
from crater.predictor.service_layer.usage import (
    PriceWatch,
    TaskMetrics,
    TenantMetrics,
    UsageReporter,
)
from crater.runtime.batches import Outcome, Received, batch_durable
from crater.runtime.bus import durable, outgoing, publish, publish_batch
from crater.runtime.service import Service, create_service, serve
from crater.runtime.settings import ServiceSettings

MIGRATIONS_DIR = Path(__file__).parent / "adapters" / "migrations"


class PredictorSettings(ServiceSettings):
    """Own settings from CRATER_PREDICTOR_<NAME> (CRATER_PREDICTOR_CUDA_CONTEXT_MB, ...)."""

    service = "predictor"
    default_port = 9102  # health and metrics when http_port is 0

    cuda_context_mb: int = Field(
        default=1024, ge=0, le=16_384, description="CUDA context and kernels per GPU, MiB."
    )
    allocator_overhead: float = Field(
        default=0.05, ge=0, le=1, description="Caching-allocator fragmentation, share of tensors."
    )
    max_sequence_length: int = Field(
        default=1 << 20, ge=1, le=1 << 24, description="Longer sequences are refused."
    )
    model_flops_utilisation: float = Field(
        default=0.4, gt=0, le=1, description="Achieved share of the GPU's peak, for step time."
    )
    checkpoint_write_mb_per_s: float = Field(
        default=2000.0, gt=0, le=1_000_000, description="Checkpoint disk write rate, MB/s."
    )
    disk_read_mb_per_s: float = Field(
        default=3000.0, gt=0, le=1_000_000, description="Dataset disk read rate, MB/s."
    )
    correction_alpha: float = Field(
        default=0.3, gt=0, le=1, description="Weight of the newest observed peak in a correction."
    )
    correction_min: float = Field(default=0.5, gt=0, le=1, description="Lowest correction.")
    correction_max: float = Field(default=2.0, ge=1, le=10, description="Highest correction.")
    correction_max_step: float = Field(
        default=0.1, gt=0, le=1, description="Most a correction moves per observation (share)."
    )
    correction_min_samples: int = Field(
        default=3, ge=1, le=1000, description="Readings of a running task an observation needs."
    )
    correction_min_observations: int = Field(
        default=3, ge=1, le=1000, description="Observations before a correction is applied."
    )

    sla_window_seconds: float = Field(
        default=300.0,
        ge=10,
        le=86_400,
        description="GPU utilisation is averaged (time-weighted) over windows this long before "
        "it is compared with a task's sla.min_gpu_utilization_percent.",
    )
    sla_warmup_seconds: float = Field(
        default=60.0,
        ge=0,
        le=86_400,
        description="An attempt's first seconds (loading data and weights) do not count.",
    )

    price_file: Path | None = Field(
        default=None,
        description="Prices and tenant budgets (YAML or JSON; docs/operations.md, Usage and "
        "cost): usage is priced with them; unset, usage is answered unpriced. Read again when "
        "it changes (checked every usage refresh); an invalid change is refused, the running "
        "one kept.",
    )
    usage_refresh_seconds: float = Field(
        default=60.0,
        ge=1,
        le=3600,
        description="How often the crater_tenant_* and crater_task_* gauges and budgets are "
        "refreshed.",
    )
    task_metrics_limit: int = Field(
        default=1000,
        ge=0,
        le=1_000_000,
        description="/metrics has crater_task_* series for at most this many allocations held "
        "(the longest held); the rest are counted in "
        "crater_predictor_allocations_not_exported.",
    )
    usage_export_dir: Path | None = Field(
        default=None,
        description="Where each finished UTC hour's usage by tenant is written as "
        "usage-YYYYMMDDTHH.csv (for AllData); unset: no export.",
    )

    model_config_dir: Path | None = Field(
        default=None,
        description="Where model_config.hf_config_path finds a task's config.json (a model "
        "store mounted read-only); unset: only config.json sent in the request is read.",
    )

    def assumptions(self) -> Assumptions:
        return Assumptions(
            cuda_context_mb=self.cuda_context_mb,
            allocator_overhead=self.allocator_overhead,
            max_sequence_length=self.max_sequence_length,
            model_flops_utilisation=self.model_flops_utilisation,
            checkpoint_write_mb_per_s=self.checkpoint_write_mb_per_s,
            disk_read_mb_per_s=self.disk_read_mb_per_s,
        )

    def sla(self) -> SlaRule:
        return SlaRule(self.sla_window_seconds, self.sla_warmup_seconds)

    def rule(self) -> Rule:
        return Rule(
            alpha=self.correction_alpha,
            minimum=self.correction_min,
            maximum=self.correction_max,
            max_step=self.correction_max_step,
            min_samples=self.correction_min_samples,
            min_observations=self.correction_min_observations,
        )


def build(settings: PredictorSettings | None = None) -> tuple[Service, AsgiFastStream]:
    settings = settings or PredictorSettings()
    service = create_service("predictor", settings)
    rule = settings.rule()
    store = LearningStore(service.database(MIGRATIONS_DIR), rule, service.name, settings.sla())
    service.state = store
    broker, name, batch = service.broker, service.name, settings.consumer_batch

    async def publish_event(event: Event) -> None:
        await publish(broker, event)

    async def publish_events(events: Sequence[Event]) -> list[BaseException | None]:
        return await publish_batch(broker, [outgoing(e) for e in events])

    handlers = PredictorHandlers(
        store,
        PredictorMetrics(service),
        settings.assumptions(),
        rule,
        publish_event,
        publish_events,
        model_config_dir=settings.model_config_dir,
    )

    reporter = UsageReporter(
        store,
        TenantMetrics(service.registry),
        load_prices(settings.price_file),
        settings.usage_refresh_seconds,
        settings.usage_export_dir,
        TaskMetrics(service.registry),
        settings.task_metrics_limit,
        publish_event,
        PriceWatch(settings.price_file),
    )

    # The hot path, a pull batch at a time (crater.runtime.batches): predicted in one pass,
    # recorded in one transaction, answered with asynchronous acks.
    @batch_durable(broker, Subjects.TASK_SUBMITTED, name, batch=batch)
    async def on_task_submitted(received: list[Received[TaskSubmitted]]) -> list[Outcome]:
        return await handlers.tasks_submitted([(r.event, r.trace) for r in received])

    service.consume(on_task_submitted)

    # Handlers name their message `event` (rejections report field paths below it).
    @broker.subscriber(QuerySubjects.PREDICTION, title="predictor-query-prediction")
    async def on_prediction_query(event: PredictionQuery) -> PredictionAnswer:
        return await handlers.prediction_query(event)

    @broker.subscriber(QuerySubjects.RESOLVE, title="predictor-query-resolve")
    async def on_resolve_query(event: ResolveQuery) -> ResolveAnswer:
        return await handlers.resolve_query(event)

    @broker.subscriber(QuerySubjects.USAGE, title="predictor-query-usage")
    async def on_usage_query(event: UsageQuery) -> UsageAnswer:
        return await reporter.answer(event)

    # The task path's other hops, a pull batch in one transaction each (as above).
    @batch_durable(broker, Subjects.ALLOCATION_GRANTED, name, batch=batch)
    async def on_allocation_granted(received: list[Received[AllocationGranted]]) -> list[Outcome]:
        return await handlers.allocations_granted([r.event for r in received])

    @batch_durable(broker, Subjects.TASK_STATUS, name, batch=batch)
    async def on_task_status(received: list[Received[TaskStatusReported]]) -> list[Outcome]:
        return await handlers.tasks_status([r.event for r in received])

    @batch_durable(broker, Subjects.ALLOCATION_RELEASED, name, batch=batch)
    async def on_allocation_released(
        received: list[Received[AllocationReleased]],
    ) -> list[Outcome]:
        return await handlers.allocations_released([r.event for r in received])

    for consumer in (on_allocation_granted, on_task_status, on_allocation_released):
        service.consume(consumer)

    @durable(broker, Subjects.NODE_METRICS, name, batch=batch)
    async def on_node_metrics(event: NodeMetricsReported) -> None:
        await handlers.node_metrics(event)

    # One sample at a time, in stream order: FastStream handles the messages of one pulled
    # batch concurrently, and a task's SLA window folds its samples in the order sent.
    @durable(broker, Subjects.TASK_USAGE, name, batch=1)
    async def on_task_usage(event: TaskUsageReported) -> None:
        await handlers.task_usage(event)

    service.on_startup.append(handlers.show_learned)  # after the migrations (service.database)
    # After the broker connects: a refresh may publish (a budget passed).
    service.after_startup.append(reporter.start)
    service.on_shutdown.insert(0, reporter.stop)
    app = service.asgi()
    return service, app


def create_app() -> AsgiFastStream:
    """For `faststream run --factory crater.predictor.app:create_app`."""
    return build()[1]


def main() -> None:
    service, app = build()
    serve(app, service)


if __name__ == "__main__":
    main()
