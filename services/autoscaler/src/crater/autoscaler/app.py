"""Autoscaler wiring: inference latency samples -> scale decisions, as the samples arrive.

The windows live in memory: after a restart the durable consumer resumes where it acked and
the windows refill within `window_seconds`. A redelivered sample is recognised by its event id
and re-publishes the decision it caused the first time, under the same derived id, so
JetStream drops the copy.

Beside the samples it consumes `allocation.granted`/`allocation.released` (which GPUs each
replica's task holds, and when a requested standby is placed), `node.metrics.*` (those GPUs'
memory pressure) and `scale.replica_drained` (a scale-in's drain finished). A timer releases
replicas whose drain timed out. It publishes `scale.decided`, `scale.replicas_requested`
and `scale.release_requested`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import fields

from faststream.asgi import AsgiFastStream
from prometheus_client import Counter, Gauge
from pydantic import Field

from crater.autoscaler.domain import Autoscaler, ScalingPolicy
from crater.autoscaler.domain.scaling_policy import policy_annotations
from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    Event,
    LatencySamplesReported,
    NodeMetricsReported,
    ReplicaDrained,
    Subjects,
)
from crater.runtime.bus import durable, publish
from crater.runtime.service import Service, create_service, serve
from crater.runtime.settings import ServiceSettings


class AutoscalerSettings(ServiceSettings, ScalingPolicy):
    """The policy's numbers (domain/scaling_policy.py: each one's default, bounds and
    description), each from CRATER_AUTOSCALER_<NAME>; and how the service runs it."""

    # The policy's fields as it annotates them (their defaults come from it as well).
    __annotations__ = policy_annotations()
    service = "autoscaler"
    default_port = 9104  # health and metrics when http_port is 0

    drain_check_seconds: float = Field(
        default=1.0, gt=0, description="How often the drain timeouts are checked."
    )

    def policy(self) -> ScalingPolicy:
        """The policy these settings hold (checked as a whole when the settings were read)."""
        return ScalingPolicy(**{f.name: getattr(self, f.name) for f in fields(ScalingPolicy)})


def build(settings: AutoscalerSettings | None = None) -> tuple[Service, AsgiFastStream]:
    settings = settings or AutoscalerSettings()
    service = create_service("autoscaler", settings)
    autoscaler = Autoscaler(settings.policy())
    service.state = autoscaler
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

    panicking = Gauge(
        "crater_autoscaler_panic",
        "1 while a service is in panic mode (no scale-in), else 0.",
        ["service"],
        registry=service.registry,
    )
    requested = Counter(
        "crater_autoscaler_requests",
        "Replica placements and releases asked of the scheduler, by kind.",
        ["service", "kind"],
        registry=service.registry,
    )
    batch = settings.consumer_batch

    async def emit(events: tuple[Event, ...] | list[Event], counted: bool = True) -> None:
        for event in events:
            await publish(service.broker, event)
            if counted:
                kind = type(event).__name__
                if kind != "ScaleDecided":
                    requested.labels(service=getattr(event, "service", ""), kind=kind).inc()

    @durable(service.broker, Subjects.INFERENCE_LATENCY, service.name, batch=batch)
    async def on_latency_samples(event: LatencySamplesReported) -> None:
        assessment = autoscaler.observe(event)
        if assessment.p95_ms is not None:
            p95_seconds.labels(service=assessment.service).set(assessment.p95_ms / 1000)
        if assessment.pressure is not None:
            pressure.labels(service=assessment.service).set(assessment.pressure)
        replicas.labels(service=assessment.service).set(assessment.replicas)
        panicking.labels(service=assessment.service).set(1 if assessment.panic else 0)
        await emit(assessment.events, counted=not assessment.duplicate)
        if assessment.decision is not None and not assessment.duplicate:
            decisions.labels(
                service=assessment.service, direction=assessment.decision.direction.value
            ).inc()

    @durable(service.broker, Subjects.NODE_METRICS, service.name, batch=batch)
    async def on_node_metrics(event: NodeMetricsReported) -> None:
        autoscaler.node_metrics(
            event.node_id,
            event.occurred_at.timestamp(),
            {gpu.index: gpu.memory_pressure for gpu in event.gpus},
        )

    @durable(service.broker, Subjects.ALLOCATION_GRANTED, service.name, batch=batch)
    async def on_allocation_granted(event: AllocationGranted) -> None:
        autoscaler.allocation_granted(
            event.task_id, event.node, event.gpu_ids, event.occurred_at.timestamp()
        )

    @durable(service.broker, Subjects.ALLOCATION_RELEASED, service.name, batch=batch)
    async def on_allocation_released(event: AllocationReleased) -> None:
        autoscaler.allocation_released(event.task_id)

    @durable(service.broker, Subjects.SCALE_REPLICA_DRAINED, service.name, batch=batch)
    async def on_replica_drained(event: ReplicaDrained) -> None:
        await emit(autoscaler.replica_drained(event))

    ticker: list[asyncio.Task[None]] = []

    async def release_overdue_drains() -> None:
        while True:
            await asyncio.sleep(settings.drain_check_seconds)
            try:
                await emit(autoscaler.tick(time.time()))
            except Exception:  # the next tick retries; the service goes on
                logging.getLogger("crater.autoscaler").exception("drain timeout check failed")

    async def start_ticker() -> None:
        ticker.append(asyncio.create_task(release_overdue_drains()))

    async def stop_ticker() -> None:
        for task in ticker:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        ticker.clear()

    service.after_startup.append(start_ticker)
    service.on_shutdown.append(stop_ticker)
    return service, service.asgi()


def create_app() -> AsgiFastStream:
    """For `faststream run --factory crater.autoscaler.app:create_app`."""
    return build()[1]


def main() -> None:
    service, app = build()
    serve(app, service)


if __name__ == "__main__":
    main()
