"""The predictor's consume -> decide -> commit: each consumed event or query, decided by the
domain (estimate, learning, sla) and recorded through the store; app.py only subscribes them."""

from __future__ import annotations

import logging
import time
from collections import Counter as Tally
from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    Event,
    FieldError,
    NodeMetricsReported,
    PredictionAnswer,
    PredictionQuery,
    ResolveAnswer,
    ResolveQuery,
    TaskProfiled,
    TaskRejected,
    TaskRequest,
    TaskStatusReported,
    TaskSubmitted,
    TaskUnderutilized,
    TaskUsageReported,
    TraceContext,
    derived_event_id,
)
from crater.predictor.adapters.model_configs import with_model_config
from crater.predictor.adapters.store import LearningStore, prediction_record
from crater.predictor.domain.estimate import Assumptions, Correction, Refused, predict
from crater.predictor.domain.estimate import family as model_family
from crater.predictor.domain.learning import Rule, Track
from crater.predictor.domain.resolve import request_for, resolve_job
from crater.runtime.service import Service

log = logging.getLogger("crater.predictor")

Publish = Callable[[Event], Awaitable[None]]
# Events published together; each one's outcome: None once JetStream holds it, else why not.
PublishMany = Callable[[Sequence[Event]], Awaitable[list[BaseException | None]]]


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


# How old a learned track a query may answer with (corrections move slowly: one release at a
# time, bounded).
QUERY_TRACK_SECONDS = 30.0


class PredictorHandlers:
    """What the predictor does with each message; `publish` puts an event on the bus."""

    def __init__(
        self,
        store: LearningStore,
        metrics: PredictorMetrics,
        assumptions: Assumptions,
        rule: Rule,
        publish: Publish,
        publish_many: PublishMany,
        model_config_dir: Path | None = None,
    ) -> None:
        self.publish_many = publish_many
        self.model_config_dir = model_config_dir
        self.store = store
        self.metrics = metrics
        self.assumptions = assumptions
        self.rule = rule
        self.publish = publish
        # Queries (dry runs, resolve) answer from a recent copy of the learned tracks, so a
        # busy database (the predictor's own commits) never delays a synchronous answer past
        # the gateway's timeout; a submission's prediction reads the database itself.
        self._recent: dict[tuple[str, str], tuple[float, Track]] = {}

    async def correction_for(self, request: TaskRequest, recent: bool = False) -> Correction | None:
        """The learned correction a prediction of `request` applies now, if one applies;
        `recent`: as read at most QUERY_TRACK_SECONDS ago (for queries)."""
        key = (model_family(request), request.task_type.value)
        kept = self._recent.get(key) if recent else None
        if kept is not None and kept[0] > time.monotonic():
            track = kept[1]
        else:
            track = await self.store.track(*key)
            self._recent[key] = (time.monotonic() + QUERY_TRACK_SECONDS, track)
        if not self.rule.applies(track):
            return None
        return Correction(self.rule.bounded(track.factor), track.samples, track.mape)

    async def tasks_submitted(
        self, received: Sequence[tuple[TaskSubmitted, TraceContext | None]]
    ) -> list[BaseException | None]:
        """A pull batch of submissions, each with the trace context it came with: predicted
        in one pass (a model family's learned track read once), the predictions recorded in
        one transaction, then every answer (`task.profiled`, or `task.rejected`) published
        together with asynchronous acks, each carrying its own submission's trace context.
        Returns each submission's outcome: None once its answer is on the bus, else why not
        (that message alone is delivered again; its answer's event id is derived from the
        submission's, so JetStream drops a copy)."""
        tracks: dict[tuple[str, str], Correction | None] = {}
        answers: list[Event | BaseException] = []
        records: list[dict[str, Any]] = []
        confidences: Tally[str] = Tally()
        for event, trace in received:
            try:
                answer = await self._answer(event, tracks, records, confidences)
            except Exception as error:  # not this submission's answer: delivered again
                answers.append(error)
                continue
            answers.append(answer if trace is None else answer.model_copy(update={"trace": trace}))
        for confidence, count in confidences.items():
            self.metrics.predictions.labels(confidence=confidence).inc(count)
        # Recorded before any answer goes out: a task profiled is one the predictor knows.
        await self.store.record_predictions(records)
        ready = [a for a in answers if not isinstance(a, BaseException)]
        published = iter(await self.publish_many(ready))
        return [a if isinstance(a, BaseException) else next(published) for a in answers]

    async def _answer(
        self,
        event: TaskSubmitted,
        tracks: dict[tuple[str, str], Correction | None],
        records: list[dict[str, Any]],
        confidences: Tally[str],
    ) -> Event:
        """One submission's answer; its prediction's record is added to `records`."""
        request = event.request()
        try:
            request = with_model_config(request, self.model_config_dir)
            family = model_family(request)
            key = (family, request.task_type.value)
            if key not in tracks:
                tracks[key] = await self.correction_for(request)
            prediction = predict(request, self.assumptions, tracks[key])
        except Refused as refused:
            self.metrics.rejected.inc()
            # A refused body under the id of a task profiled before is not that task's end:
            # a refused duplicate (the scheduler answers a valid one with the task's status).
            duplicate = await self.store.predicted(request.task_id)
            errors = refused.errors
            if duplicate:
                errors = [FieldError(field="task_id", reason=_profiled_before(request.task_id))]
                errors += refused.errors
            return TaskRejected(
                event_id=derived_event_id(event.event_id, "rejected"),
                task_id=request.task_id,
                errors=errors,
                duplicate=duplicate,
            )
        confidences[prediction.confidence.value] += 1
        self.metrics.predicted_mb.observe(prediction.gpu_memory_per_gpu_mb)
        learned = prediction.breakdown_mb.get("learned_correction", 0)
        records.append(
            prediction_record(
                request.task_id,
                family,
                request.task_type.value,
                raw_mb=prediction.gpu_memory_per_gpu_mb - learned,
                predicted_mb=prediction.gpu_memory_per_gpu_mb,
                min_gpu_utilization_percent=request.sla.min_gpu_utilization_percent,
            )
        )
        return TaskProfiled(
            event_id=derived_event_id(event.event_id, "profiled"),
            task=request,
            prediction=prediction,
        )

    # Queries: what a submission would be predicted, what a job description resolves to.
    # Nothing is recorded or counted: a dry run must not teach or skew anything.
    async def prediction_query(self, event: PredictionQuery) -> PredictionAnswer:
        try:
            task = with_model_config(event.task, self.model_config_dir)
            correction = await self.correction_for(task, recent=True)
            return PredictionAnswer(prediction=predict(task, self.assumptions, correction))
        except Refused as refused:
            return PredictionAnswer(errors=refused.errors)

    async def resolve_query(self, event: ResolveQuery) -> ResolveAnswer:
        job = event.job
        try:
            # The family and task kind (hence the correction) do not depend on the sizes.
            correction = await self.correction_for(request_for(job, "draft", 1, 1), recent=True)
            resolved = resolve_job(job, self.assumptions, correction)
        except Refused as refused:
            return ResolveAnswer(errors=refused.errors)
        return ResolveAnswer(
            task=resolved.task, prediction=resolved.prediction, explanation=resolved.explanation
        )

    async def allocation_granted(self, event: AllocationGranted) -> None:
        [outcome] = await self.allocations_granted([event])
        if outcome is not None:
            raise outcome

    async def allocations_granted(
        self, events: Sequence[AllocationGranted]
    ) -> list[BaseException | None]:
        """A pull batch of grants, recorded in one transaction; each one's outcome."""
        outcomes: list[BaseException | None] = []
        for event, recorded in zip(events, await self.store.granted_many(events), strict=True):
            if isinstance(recorded, BaseException):
                outcomes.append(recorded)
                continue
            outcomes.append(None)
            if not recorded:
                # recorded with its event id in the inbox, so this is counted and logged once
                self.metrics.duplicate_grants.inc()
                log.warning(
                    "allocation.granted %s repeats allocation %s (task %s): ignored",
                    event.event_id,
                    event.allocation_id,
                    event.task_id,
                )
        return outcomes

    async def task_status(self, event: TaskStatusReported) -> None:
        await self.store.running(event)

    async def tasks_status(
        self, events: Sequence[TaskStatusReported]
    ) -> list[BaseException | None]:
        """A pull batch of nodes' reports: the runs' starts noted in one transaction."""
        return await self.store.running_many(events)

    async def node_metrics(self, event: NodeMetricsReported) -> None:
        await self.store.observe(event)

    async def publish_breach(self, breach: TaskUnderutilized) -> None:
        await self.publish(breach)

    async def task_usage(self, event: TaskUsageReported) -> None:
        measured = await self.store.usage(event, self.publish_breach)
        if measured is None:
            return
        self.metrics.usage_samples.labels(gpus="yes" if event.gpus else "no").inc()
        if measured.measured is not None:
            self.metrics.utilization.labels(task_id=measured.task_id).set(measured.measured)
        breach = measured.breach
        if breach is None:
            return
        self.metrics.underutilized.inc()  # after the commit: a redelivery is not counted again
        log.warning(
            "task %s attempt %s used its GPUs %.1f%% over %.0f s, below its SLA of %.1f%%",
            breach.task_id,
            breach.attempt,
            breach.measured_gpu_utilization_percent,
            breach.window_seconds,
            breach.min_gpu_utilization_percent,
        )

    async def allocation_released(self, event: AllocationReleased) -> None:
        [outcome] = await self.allocations_released([event])
        if outcome is not None:
            raise outcome

    async def allocations_released(
        self, events: Sequence[AllocationReleased]
    ) -> list[BaseException | None]:
        """A pull batch of releases, closed and learned from in one transaction; each one's
        outcome."""
        for event in events:
            with suppress(KeyError):  # no gauge: it never completed a window here
                self.metrics.utilization.remove(event.task_id)
        outcomes: list[BaseException | None] = []
        for released in await self.store.released_many(events):
            if isinstance(released, BaseException):
                outcomes.append(released)
                continue
            outcomes.append(None)
            if released is None:
                continue
            self.metrics.releases.labels(outcome=released.outcome.value).inc()
            if released.key is not None and released.track is not None:
                family, task_type = released.key
                self.metrics.observations.labels(family=family, task_type=task_type).inc()
                self.metrics.show(family, task_type, released.track)
        return outcomes

    async def show_learned(self) -> None:
        for (family, task_type), track in (await self.store.tracks()).items():
            self.metrics.show(family, task_type, track)


def _profiled_before(task_id: str) -> str:
    return (
        f"task {task_id!r} was submitted and profiled before: a task id is used once; this "
        f"submission is refused and {task_id!r} is unchanged: submit under a new task_id"
    )
