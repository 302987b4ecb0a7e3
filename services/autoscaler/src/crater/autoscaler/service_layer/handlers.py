"""The autoscaler's handlers: each message to the (pure, in-memory) `Autoscaler`, what it
decides published, and the gauges that show it. `app.py` only wires them to subjects."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from crater.autoscaler.adapters.scrape import Replica, ReplicaScraper
from crater.autoscaler.domain import Autoscaler
from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    Event,
    LatencySamplesReported,
    NodeMetricsReported,
    ReplicaDrained,
)

log = logging.getLogger("crater.autoscaler")

Publish = Callable[[Event], Awaitable[None]]


class AutoscalerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.p95_seconds = Gauge(
            "crater_inference_latency_p95",
            "p95 inference latency over the autoscaler's window, in seconds.",
            ["service"],
            registry=registry,
        )
        self.pressure = Gauge(
            "crater_gpu_memory_pressure",
            "GPU memory pressure (used/total, 0..1): the highest of the service's replicas "
            "reporting within the window.",
            ["service"],
            registry=registry,
        )
        self.replicas = Gauge(
            "crater_autoscaler_replicas",
            "Replicas the autoscaler believes a service has (its last decision or report).",
            ["service"],
            registry=registry,
        )
        self.decisions = Counter(
            "crater_scale_decisions",
            "Scale decisions published, by service and direction.",
            ["service", "direction"],
            registry=registry,
        )
        self.panicking = Gauge(
            "crater_autoscaler_panic",
            "1 while a service is in panic mode (no scale-in), else 0.",
            ["service"],
            registry=registry,
        )
        self.requested = Counter(
            "crater_autoscaler_requests",
            "Replica placements and releases asked of the scheduler, by kind.",
            ["service", "kind"],
            registry=registry,
        )


class ServiceMemorySeries(Collector):
    """`crater_inference_gpu_memory_usage_ratio{service}`: each inference service's mean GPU
    memory pressure, read off the autoscaler at scrape time (so it follows every node
    metrics report, with or without latency samples): what an HPA or KEDA scales on."""

    def __init__(self, autoscaler: Autoscaler) -> None:
        self.autoscaler = autoscaler

    def describe(self) -> Iterable[Metric]:
        return [self._family()]

    def collect(self) -> Iterable[Metric]:
        family = self._family()
        for service in self.autoscaler.services():
            _, mean = self.autoscaler.memory_pressure(service)
            if mean is not None:
                family.add_metric([service], mean)
        return [family]

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "crater_inference_gpu_memory_usage_ratio",
            "Mean GPU memory pressure (used/total, 0..1) of an inference service's replicas: "
            "each replica's fullest card by the latest node metrics, else its own report, "
            "within the autoscaler's window. For an HPA (External metric, target type Value) "
            "or KEDA (prometheus trigger); crater_gpu_memory_pressure is the highest replica's.",
            labels=["service"],
        )


class AutoscalerHandlers:
    def __init__(
        self,
        autoscaler: Autoscaler,
        metrics: AutoscalerMetrics,
        publish: Publish,
        scraper: ReplicaScraper | None = None,
    ):
        self.autoscaler = autoscaler
        self.metrics = metrics
        self.publish = publish
        # Replicas whose allocation names a metrics endpoint (AllocationGranted.scrape).
        self.scraper = scraper

    async def emit(self, events: Sequence[Event], counted: bool = True) -> None:
        for event in events:
            await self.publish(event)
            if counted:
                kind = type(event).__name__
                if kind != "ScaleDecided":
                    service = getattr(event, "service", "")
                    self.metrics.requested.labels(service=service, kind=kind).inc()

    async def latency_samples(self, event: LatencySamplesReported) -> None:
        assessment = self.autoscaler.observe(event)
        m, service = self.metrics, assessment.service
        if assessment.p95_ms is not None:
            m.p95_seconds.labels(service=service).set(assessment.p95_ms / 1000)
        if assessment.pressure is not None:
            m.pressure.labels(service=service).set(assessment.pressure)
        m.replicas.labels(service=service).set(assessment.replicas)
        m.panicking.labels(service=service).set(1 if assessment.panic else 0)
        await self.emit(assessment.events, counted=not assessment.duplicate)
        if assessment.decision is not None and not assessment.duplicate:
            direction = assessment.decision.direction.value
            m.decisions.labels(service=service, direction=direction).inc()

    async def node_metrics(self, event: NodeMetricsReported) -> None:
        self.autoscaler.node_metrics(
            event.node_id,
            event.occurred_at.timestamp(),
            {gpu.index: gpu.memory_pressure for gpu in event.gpus},
        )

    async def allocation_granted(self, event: AllocationGranted) -> None:
        self.autoscaler.allocation_granted(
            event.task_id, event.node, event.gpu_ids, event.occurred_at.timestamp()
        )
        if self.scraper is not None and event.scrape is not None:
            self.scraper.add(Replica.of(event.task_id, event.scrape))

    async def allocation_released(self, event: AllocationReleased) -> None:
        self.autoscaler.allocation_released(event.task_id)
        if self.scraper is not None:
            self.scraper.remove(event.task_id)

    async def replica_drained(self, event: ReplicaDrained) -> None:
        await self.emit(self.autoscaler.replica_drained(event))

    async def release_overdue_drains(self, every_seconds: float) -> None:
        """Forever: replicas whose drain timed out are released; a failed check is retried
        at the next tick, the service goes on."""
        while True:
            await asyncio.sleep(every_seconds)
            try:
                await self.emit(self.autoscaler.tick(time.time()))
            except Exception:
                log.exception("drain timeout check failed")
