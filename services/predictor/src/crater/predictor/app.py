"""Predictor wiring: task submitted -> task profiled.

Stateless, so idempotent by construction: the profiled event's id is derived from the
submitted one, and JetStream drops a re-publish after a redelivery.
"""

from __future__ import annotations

from faststream.asgi import AsgiFastStream
from prometheus_client import Counter, Histogram

from crater.contracts import Subjects, TaskProfiled, TaskSubmitted, derived_event_id
from crater.predictor.domain.estimate import predict
from crater.runtime.bus import durable, publish
from crater.runtime.service import Service, create_service, serve
from crater.runtime.settings import ServiceSettings


class PredictorSettings(ServiceSettings):
    service = "predictor"


def build(settings: PredictorSettings | None = None) -> tuple[Service, AsgiFastStream]:
    settings = settings or PredictorSettings()
    service = create_service("predictor", settings)
    predictions = Counter(
        "crater_predictor_predictions",
        "Tasks profiled, by confidence.",
        ["confidence"],
        registry=service.registry,
    )
    predicted_mb = Histogram(
        "crater_predictor_gpu_memory_per_gpu_mb",
        "Predicted peak GPU memory per card.",
        buckets=(1024, 4096, 8192, 16384, 24576, 40960, 81920, 163840),
        registry=service.registry,
    )

    @durable(service.broker, Subjects.TASK_SUBMITTED, service.name, batch=settings.consumer_batch)
    async def on_task_submitted(event: TaskSubmitted) -> None:
        prediction = predict(event)
        predictions.labels(confidence=prediction.confidence.value).inc()
        predicted_mb.observe(prediction.gpu_memory_per_gpu_mb)
        await publish(
            service.broker,
            TaskProfiled(
                event_id=derived_event_id(event.event_id, "profiled"),
                task=event.request(),
                prediction=prediction,
            ),
        )

    return service, service.asgi()


def create_app() -> AsgiFastStream:
    """For `faststream run --factory crater.predictor.app:create_app`."""
    return build()[1]


def main() -> None:
    service, app = build()
    serve(app, service)


if __name__ == "__main__":
    main()
