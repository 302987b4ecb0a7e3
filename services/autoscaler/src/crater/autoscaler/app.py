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
from typing import Literal, cast

from faststream.asgi import AsgiFastStream
from prometheus_client import Counter, Gauge
from pydantic import Field, model_validator

from crater.autoscaler.domain import Autoscaler, ScalingPolicy
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

# One source of defaults: the settings' defaults are the policy's, which the simulator
# (`crater autoscale-sim`) and the benchmarks run as well.
_POLICY = ScalingPolicy()
Strategy = Literal["demand", "rule"]


class AutoscalerSettings(ServiceSettings):
    """The rule's numbers, each from CRATER_AUTOSCALER_<NAME>."""

    service = "autoscaler"
    default_port = 9104  # health and metrics when http_port is 0

    scale_out_p95_ms: float = Field(
        default=_POLICY.scale_out_p95_ms, gt=0, description="Scale out above this p95."
    )
    scale_out_pressure: float = Field(
        default=_POLICY.scale_out_pressure,
        ge=0,
        le=1,
        description="...and above this GPU memory pressure.",
    )
    scale_in_p95_ms: float = Field(
        default=_POLICY.scale_in_p95_ms, gt=0, description="Scale in below this p95."
    )
    scale_in_pressure: float = Field(
        default=_POLICY.scale_in_pressure,
        ge=0,
        le=1,
        description="...and below this GPU memory pressure.",
    )
    window_seconds: float = Field(
        default=_POLICY.window_seconds, gt=0, description="Latency window for the p95."
    )
    stabilisation_seconds: float = Field(
        default=_POLICY.stabilisation_seconds,
        ge=0,
        description="How long calm must hold before a scale-in.",
    )
    cooldown_seconds: float = Field(
        default=_POLICY.cooldown_seconds,
        ge=0,
        description="Least time between two scale-outs of one service.",
    )
    min_replicas: int = Field(default=_POLICY.min_replicas, ge=0)
    max_replicas: int = Field(default=_POLICY.max_replicas, ge=1)
    min_samples: int = Field(
        default=_POLICY.min_samples,
        ge=1,
        description="Samples needed since the last decision to scale out.",
    )
    max_window_samples: int = Field(
        default=_POLICY.max_samples,
        ge=10_000,
        description="Per-service memory bound of the window.",
    )
    max_scale_out_factor: float = Field(
        default=_POLICY.max_scale_out_factor,
        ge=1,
        description="A scale-out at most multiplies the replicas by this.",
    )
    scale_out_period_seconds: float = Field(
        default=_POLICY.scale_out_period_seconds,
        ge=0,
        description="The period of the scale-out rate limit.",
    )
    scale_out_period_replicas: int = Field(
        default=_POLICY.scale_out_period_replicas,
        ge=1,
        description="Per period the fleet grows by at most +this...",
    )
    scale_out_period_factor: float = Field(
        default=_POLICY.scale_out_period_factor,
        ge=1,
        description="...or xthis, whichever allows more.",
    )
    max_scale_in_step: int = Field(
        default=_POLICY.max_scale_in_step,
        ge=1,
        description="Replicas removed per scale-in (rule: one scale-in per stabilisation "
        "window; demand: scale-ins a cooldown apart).",
    )
    scale_in_headroom: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="Also scale in when fewer replicas keep p95 and mean pressure within "
        "this share of the scale-out lines; 0: the field's rule alone.",
    )
    panic_p95_ms: float = Field(
        default=_POLICY.panic_p95_ms or 0.0,
        ge=0,
        description="Panic: p95 over the panic window above this scales out at once, ahead of "
        "the cooldown, and holds off scale-in; 0 turns panic mode off.",
    )
    panic_window_seconds: float = Field(
        default=_POLICY.panic_window_seconds, gt=0, description="The panic window."
    )
    panic_hold_seconds: float = Field(
        default=_POLICY.panic_hold_seconds,
        ge=0,
        description="No scale-in until the panic has been over this long.",
    )
    warm_pool_size: int = Field(
        default=_POLICY.warm_pool_size,
        ge=0,
        description="Standby replicas kept placed per service, promoted first.",
    )
    drain_timeout_seconds: float = Field(
        default=_POLICY.drain_timeout_seconds,
        ge=0,
        description="Release a draining replica after this even if busy.",
    )
    replica_start_timeout_seconds: float = Field(
        default=_POLICY.replica_start_timeout_seconds,
        gt=0,
        description="A requested replica silent this long is not counted.",
    )
    drain_check_seconds: float = Field(
        default=1.0, gt=0, description="How often the drain timeouts are checked."
    )
    strategy: Strategy = Field(
        default=cast(Strategy, _POLICY.strategy),
        description="demand: size the fleet by Little's law to hold the mean GPU memory "
        "pressure at target_pressure, plus the queue; scale in to the most it asked for over "
        "the stabilisation window. rule: the field's rule alone (the thresholds above).",
    )
    target_pressure: float = Field(
        default=_POLICY.target_pressure,
        gt=0,
        le=1,
        description="demand: the mean GPU memory pressure the fleet is sized for.",
    )
    drain_seconds: float = Field(
        default=_POLICY.drain_seconds,
        gt=0,
        description="demand: serve the queued requests as well as the arrivals within this.",
    )
    demand_window_seconds: float = Field(
        default=_POLICY.demand_window_seconds,
        gt=0,
        description="demand: pressure and queue wait averaged over this.",
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
            scale_out_period_seconds=self.scale_out_period_seconds,
            scale_out_period_replicas=self.scale_out_period_replicas,
            scale_out_period_factor=self.scale_out_period_factor,
            max_scale_in_step=self.max_scale_in_step,
            scale_in_headroom=self.scale_in_headroom or None,
            panic_p95_ms=self.panic_p95_ms or None,
            panic_window_seconds=self.panic_window_seconds,
            panic_hold_seconds=self.panic_hold_seconds,
            warm_pool_size=self.warm_pool_size,
            drain_timeout_seconds=self.drain_timeout_seconds,
            replica_start_timeout_seconds=self.replica_start_timeout_seconds,
            strategy=self.strategy,
            target_pressure=self.target_pressure,
            drain_seconds=self.drain_seconds,
            demand_window_seconds=self.demand_window_seconds,
        )


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
