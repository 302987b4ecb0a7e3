"""Autoscaler wiring: inference latency samples -> scale decisions, as the samples arrive.

The windows live in memory: after a restart the durable consumer resumes where it acked and
the windows refill within `window_seconds`. A redelivered sample is recognised by its event id
and re-publishes the decision it caused the first time, under the same derived id, so
JetStream drops the copy.
"""

from __future__ import annotations

from faststream.asgi import AsgiFastStream
from prometheus_client import Counter, Gauge
from pydantic import Field, model_validator

from crater.autoscaler.domain import Autoscaler, ScalingPolicy
from crater.contracts import LatencySamplesReported, Subjects
from crater.runtime.bus import durable, publish
from crater.runtime.service import Service, create_service, serve
from crater.runtime.settings import ServiceSettings


class AutoscalerSettings(ServiceSettings):
    """The rule's numbers, each from CRATER_AUTOSCALER_<NAME>."""

    service = "autoscaler"

    scale_out_p95_ms: float = Field(default=200.0, gt=0, description="Scale out above this p95.")
    scale_out_pressure: float = Field(
        default=0.8, ge=0, le=1, description="...and above this GPU memory pressure."
    )
    scale_in_p95_ms: float = Field(default=100.0, gt=0, description="Scale in below this p95.")
    scale_in_pressure: float = Field(
        default=0.3, ge=0, le=1, description="...and below this GPU memory pressure."
    )
    window_seconds: float = Field(default=60.0, gt=0, description="Latency window for the p95.")
    stabilisation_seconds: float = Field(
        default=300.0, ge=0, description="How long calm must hold before a scale-in."
    )
    cooldown_seconds: float = Field(
        default=15.0, ge=0, description="Least time between two scale-outs of one service."
    )
    min_replicas: int = Field(default=1, ge=0)
    max_replicas: int = Field(default=16, ge=1)
    min_samples: int = Field(
        default=10, ge=1, description="Samples needed since the last decision to scale out."
    )
    max_window_samples: int = Field(
        default=50_000, ge=10_000, description="Per-service memory bound of the window."
    )
    max_scale_out_factor: float = Field(
        default=2.0, ge=1, description="A scale-out at most multiplies the replicas by this."
    )

    @model_validator(mode="after")
    def _consistent(self) -> AutoscalerSettings:
        self.policy()  # the policy checks that thresholds and limits are ordered
        return self

    def policy(self) -> ScalingPolicy:
        return ScalingPolicy(
            scale_out_p95_ms=self.scale_out_p95_ms,
            scale_out_pressure=self.scale_out_pressure,
            scale_in_p95_ms=self.scale_in_p95_ms,
            scale_in_pressure=self.scale_in_pressure,
            window_seconds=self.window_seconds,
            stabilisation_seconds=self.stabilisation_seconds,
            cooldown_seconds=self.cooldown_seconds,
            min_replicas=self.min_replicas,
            max_replicas=self.max_replicas,
            min_samples=self.min_samples,
            max_samples=self.max_window_samples,
            max_scale_out_factor=self.max_scale_out_factor,
        )


def build(settings: AutoscalerSettings | None = None) -> tuple[Service, AsgiFastStream]:
    settings = settings or AutoscalerSettings()
    service = create_service("autoscaler", settings)
    autoscaler = Autoscaler(settings.policy())
    p95_seconds = Gauge(
        "crater_inference_latency_p95",
        "p95 inference latency over the autoscaler's window, in seconds.",
        ["service"],
        registry=service.registry,
    )
    pressure = Gauge(
        "crater_gpu_memory_pressure",
        "GPU memory pressure (used/total, 0..1): the highest of the service's replicas "
        "reporting within the window.",
        ["service"],
        registry=service.registry,
    )
    replicas = Gauge(
        "crater_autoscaler_replicas",
        "Replicas the autoscaler believes a service has (its last decision or report).",
        ["service"],
        registry=service.registry,
    )
    decisions = Counter(
        "crater_scale_decisions",
        "Scale decisions published, by service and direction.",
        ["service", "direction"],
        registry=service.registry,
    )

    @durable(
        service.broker, Subjects.INFERENCE_LATENCY, service.name, batch=settings.consumer_batch
    )
    async def on_latency_samples(event: LatencySamplesReported) -> None:
        assessment = autoscaler.observe(event)
        if assessment.p95_ms is not None:
            p95_seconds.labels(service=assessment.service).set(assessment.p95_ms / 1000)
        if assessment.pressure is not None:
            pressure.labels(service=assessment.service).set(assessment.pressure)
        replicas.labels(service=assessment.service).set(assessment.replicas)
        if assessment.decision is None:
            return
        await publish(service.broker, assessment.decision)
        if not assessment.duplicate:
            decisions.labels(
                service=assessment.service, direction=assessment.decision.direction.value
            ).inc()

    return service, service.asgi()


def create_app() -> AsgiFastStream:
    """For `faststream run --factory crater.autoscaler.app:create_app`."""
    return build()[1]


def main() -> None:
    service, app = build()
    serve(app, service)


if __name__ == "__main__":
    main()
