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
"""

from __future__ import annotations

import logging
from contextlib import suppress
from pathlib import Path

from faststream.asgi import AsgiFastStream
from prometheus_client import Counter, Gauge, Histogram
from pydantic import Field

from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    FieldError,
    NodeMetricsReported,
    PredictionAnswer,
    PredictionQuery,
    QuerySubjects,
    ResolveAnswer,
    ResolveQuery,
    Subjects,
    TaskProfiled,
    TaskRejected,
    TaskRequest,
    TaskStatusReported,
    TaskSubmitted,
    TaskUnderutilized,
    TaskUsageReported,
    derived_event_id,
)
from crater.predictor.adapters.store import LearningStore
from crater.predictor.domain.estimate import Assumptions, Correction, Refused, predict
from crater.predictor.domain.estimate import family as model_family
from crater.predictor.domain.learning import Rule, Track
from crater.predictor.domain.resolve import request_for, resolve_job
from crater.predictor.domain.sla import SlaRule
from crater.runtime.bus import durable, publish
from crater.runtime.service import Service, create_service, serve
from crater.runtime.settings import ServiceSettings

MIGRATIONS_DIR = Path(__file__).parent / "adapters" / "migrations"

log = logging.getLogger("crater.predictor")


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


class PredictorMetrics:
    def __init__(self, service: Service) -> None:
        registry = service.registry
        self.predictions = Counter(
            "crater_predictor_predictions",
            "Tasks profiled, by confidence.",
            ["confidence"],
            registry=registry,
        )
        self.rejected = Counter(
            "crater_predictor_rejected", "Tasks refused as absurd or unknown.", registry=registry
        )
        self.predicted_mb = Histogram(
            "crater_predictor_gpu_memory_per_gpu_mb",
            "Predicted peak GPU memory per card.",
            buckets=(1024, 4096, 8192, 16384, 24576, 40960, 81920, 163840),
            registry=registry,
        )
        self.mape = Gauge(
            "crater_predictor_mape",
            "Mean absolute percentage error of published peak predictions (0.1 = 10%).",
            ["family", "task_type"],
            registry=registry,
        )
        self.factor = Gauge(
            "crater_predictor_correction_factor",
            "Learned multiplier applied to the modelled peak.",
            ["family", "task_type"],
            registry=registry,
        )
        self.observations = Counter(
            "crater_predictor_observations",
            "Observed peaks folded into a correction.",
            ["family", "task_type"],
            registry=registry,
        )
        self.releases = Counter(
            "crater_predictor_releases",
            "Released allocations by what their readings taught (learned, shared, never-ran, "
            "too-few-samples, saturated, uninformative, no-prediction).",
            ["outcome"],
            registry=registry,
        )
        self.duplicate_grants = Counter(
            "crater_predictor_duplicate_grants",
            "Grants repeating a known allocation id under a new event id (ignored).",
            registry=registry,
        )

        self.usage_samples = Counter(
            "crater_predictor_usage_samples",
            "Tasks' own usage samples taken in (redeliveries not counted), by whether they "
            "carried GPU readings.",
            ["gpus"],
            registry=registry,
        )
        self.underutilized = Counter(
            "crater_predictor_tasks_underutilized",
            "Attempts whose GPU utilisation stayed below their SLA minimum for a whole window.",
            registry=registry,
        )
        self.utilization = Gauge(
            "crater_predictor_task_gpu_utilization_percent",
            "A running task's GPU utilisation, mean of its last whole window.",
            ["task_id"],
            registry=registry,
        )

    def show(self, family: str, task_type: str, track: Track) -> None:
        if track.mape is not None:
            self.mape.labels(family=family, task_type=task_type).set(track.mape)
        self.factor.labels(family=family, task_type=task_type).set(track.factor)


def build(settings: PredictorSettings | None = None) -> tuple[Service, AsgiFastStream]:
    settings = settings or PredictorSettings()
    service = create_service("predictor", settings)
    metrics = PredictorMetrics(service)
    assumptions, rule = settings.assumptions(), settings.rule()
    store = LearningStore(service.database(MIGRATIONS_DIR), rule, service.name, settings.sla())
    service.state = store
    broker, name, batch = service.broker, service.name, settings.consumer_batch

    async def correction_for(request: TaskRequest) -> Correction | None:
        """The learned correction a prediction of `request` applies now, if one applies."""
        track = await store.track(model_family(request), request.task_type.value)
        if not rule.applies(track):
            return None
        return Correction(rule.bounded(track.factor), track.samples, track.mape)

    # Handlers name their message `event` (rejections report field paths below it).
    @durable(broker, Subjects.TASK_SUBMITTED, name, batch=batch)
    async def on_task_submitted(event: TaskSubmitted) -> None:
        request = event.request()
        try:
            family = model_family(request)
            prediction = predict(request, assumptions, await correction_for(request))
        except Refused as refused:
            metrics.rejected.inc()
            # A refused body under the id of a task profiled before is not that task's end:
            # a refused duplicate (the scheduler answers a valid one with the task's status).
            duplicate = await store.predicted(request.task_id)
            errors = refused.errors
            if duplicate:
                errors = [FieldError(field="task_id", reason=_profiled_before(request.task_id))]
                errors += refused.errors
            await publish(
                broker,
                TaskRejected(
                    event_id=derived_event_id(event.event_id, "rejected"),
                    task_id=request.task_id,
                    errors=errors,
                    duplicate=duplicate,
                ),
            )
            return
        metrics.predictions.labels(confidence=prediction.confidence.value).inc()
        metrics.predicted_mb.observe(prediction.gpu_memory_per_gpu_mb)
        learned = prediction.breakdown_mb.get("learned_correction", 0)
        await store.record_prediction(
            request.task_id,
            family,
            request.task_type.value,
            raw_mb=prediction.gpu_memory_per_gpu_mb - learned,
            predicted_mb=prediction.gpu_memory_per_gpu_mb,
            min_gpu_utilization_percent=request.sla.min_gpu_utilization_percent,
        )
        await publish(
            broker,
            TaskProfiled(
                event_id=derived_event_id(event.event_id, "profiled"),
                task=request,
                prediction=prediction,
            ),
        )

    # Queries: what a submission would be predicted, what a job description resolves to.
    # Nothing is recorded or counted: a dry run must not teach or skew anything.
    @broker.subscriber(QuerySubjects.PREDICTION, title="predictor-query-prediction")
    async def on_prediction_query(event: PredictionQuery) -> PredictionAnswer:
        try:
            correction = await correction_for(event.task)
            return PredictionAnswer(prediction=predict(event.task, assumptions, correction))
        except Refused as refused:
            return PredictionAnswer(errors=refused.errors)

    @broker.subscriber(QuerySubjects.RESOLVE, title="predictor-query-resolve")
    async def on_resolve_query(event: ResolveQuery) -> ResolveAnswer:
        job = event.job
        try:
            # The family and task kind (hence the correction) do not depend on the sizes.
            correction = await correction_for(request_for(job, "draft", 1, 1))
            resolved = resolve_job(job, assumptions, correction)
        except Refused as refused:
            return ResolveAnswer(errors=refused.errors)
        return ResolveAnswer(
            task=resolved.task, prediction=resolved.prediction, explanation=resolved.explanation
        )

    @durable(broker, Subjects.ALLOCATION_GRANTED, name, batch=batch)
    async def on_allocation_granted(event: AllocationGranted) -> None:
        if not await store.granted(event):
            # recorded with its event id in the inbox, so this is counted and logged once
            metrics.duplicate_grants.inc()
            log.warning(
                "allocation.granted %s repeats allocation %s (task %s): ignored",
                event.event_id,
                event.allocation_id,
                event.task_id,
            )

    @durable(broker, Subjects.TASK_STATUS, name, batch=batch)
    async def on_task_status(event: TaskStatusReported) -> None:
        await store.running(event)

    @durable(broker, Subjects.NODE_METRICS, name, batch=batch)
    async def on_node_metrics(event: NodeMetricsReported) -> None:
        await store.observe(event)

    async def publish_breach(breach: TaskUnderutilized) -> None:
        await publish(broker, breach)

    # One sample at a time, in stream order: FastStream handles the messages of one pulled
    # batch concurrently, and a task's SLA window folds its samples in the order sent.
    @durable(broker, Subjects.TASK_USAGE, name, batch=1)
    async def on_task_usage(event: TaskUsageReported) -> None:
        measured = await store.usage(event, publish_breach)
        if measured is None:
            return
        metrics.usage_samples.labels(gpus="yes" if event.gpus else "no").inc()
        if measured.measured is not None:
            metrics.utilization.labels(task_id=measured.task_id).set(measured.measured)
        breach = measured.breach
        if breach is None:
            return
        metrics.underutilized.inc()  # after the commit: a redelivery is not counted again
        log.warning(
            "task %s attempt %s used its GPUs %.1f%% over %.0f s, below its SLA of %.1f%%",
            breach.task_id,
            breach.attempt,
            breach.measured_gpu_utilization_percent,
            breach.window_seconds,
            breach.min_gpu_utilization_percent,
        )

    @durable(broker, Subjects.ALLOCATION_RELEASED, name, batch=batch)
    async def on_allocation_released(event: AllocationReleased) -> None:
        with suppress(KeyError):  # no gauge: it never completed a window here
            metrics.utilization.remove(event.task_id)
        released = await store.released(event)
        if released is None:
            return
        metrics.releases.labels(outcome=released.outcome.value).inc()
        if released.key is not None and released.track is not None:
            family, task_type = released.key
            metrics.observations.labels(family=family, task_type=task_type).inc()
            metrics.show(family, task_type, released.track)

    async def show_learned() -> None:
        for (family, task_type), track in (await store.tracks()).items():
            metrics.show(family, task_type, track)

    service.on_startup.append(show_learned)  # after the migrations (service.database)
    app = service.asgi()
    return service, app


def _profiled_before(task_id: str) -> str:
    return (
        f"task {task_id!r} was submitted and profiled before: a task id is used once; this "
        f"submission is refused and {task_id!r} is unchanged: submit under a new task_id"
    )


def create_app() -> AsgiFastStream:
    """For `faststream run --factory crater.predictor.app:create_app`."""
    return build()[1]


def main() -> None:
    service, app = build()
    serve(app, service)


if __name__ == "__main__":
    main()
