"""Autoscaler wiring: inference latency samples -> scale decisions, as the samples arrive.

The windows live in memory: after a restart the durable consumer resumes where it acked and
the windows refill within `window_seconds`. A redelivered sample is recognised by its event id
and re-publishes the decision it caused the first time, under the same derived id, so
JetStream drops the copy.

Beside the samples it consumes `allocation.granted`/`allocation.released` (which GPUs each
replica's task holds, and when a requested standby is placed), `node.metrics.*` (those GPUs'
memory pressure) and `scale.replica_drained` (a scale-in's drain finished). A timer releases
replicas whose drain timed out. Replicas whose grant names a metrics endpoint (vLLM, TGI,
Triton: `AllocationGranted.scrape`) are scraped every `scrape_interval_seconds` while this
autoscaler leads, each scrape a sample batch for the same handler (adapters/scrape.py). It
publishes `scale.decided`, `scale.replicas_requested` and `scale.release_requested`, and the
leader answers `crater.v1.query.fleets` (each fleet's figures and latest decisions, from its
memory).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import fields

import httpx
from faststream.asgi import AsgiFastStream
from pydantic import Field

from crater.autoscaler.adapters.scrape import ReplicaScraper, ScrapeMetrics
from crater.autoscaler.domain import Autoscaler, ScalingPolicy
from crater.autoscaler.domain.scaling_policy import policy_annotations
from crater.autoscaler.service_layer.handlers import (
    AutoscalerHandlers,
    AutoscalerMetrics,
    ServiceMemorySeries,
)
from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    Event,
    FleetsAnswer,
    FleetsQuery,
    LatencySamplesReported,
    NodeMetricsReported,
    QuerySubjects,
    ReplicaDrained,
    Subjects,
)
from crater.runtime.bus import durable, publish
from crater.runtime.leadership import (
    Deposed,
    LeaderGate,
    Leadership,
    LeaseSettings,
    default_holder,
    epoch_header,
    leadership_gauges,
    open_lease,
)
from crater.runtime.service import Service, create_service, serve
from crater.runtime.settings import ServiceSettings


class AutoscalerSettings(ServiceSettings, LeaseSettings, ScalingPolicy):
    """The policy's numbers (domain/scaling_policy.py: each one's default, bounds and
    description), each from CRATER_AUTOSCALER_<NAME>; and how the service runs it."""

    # The policy's fields as it annotates them (their defaults come from it as well).
    __annotations__ = policy_annotations()
    service = "autoscaler"
    default_port = 9104  # health and metrics when http_port is 0

    drain_check_seconds: float = Field(
        default=1.0, gt=0, description="How often the drain timeouts are checked."
    )
    scrape_interval_seconds: float = Field(
        default=2.0,
        gt=0,
        le=300,
        description="How often the metrics endpoint of each replica whose request names one "
        "(inference_config.metrics: vllm, tgi, triton) is scraped; each scrape that saw "
        "requests is one sample batch.",
    )
    scrape_timeout_seconds: float = Field(
        default=1.5,
        gt=0,
        le=60,
        description="How long a scrape may take; one slower counts as failed (reason timeout).",
    )

    def policy(self) -> ScalingPolicy:
        """The policy these settings hold (checked as a whole when the settings were read)."""
        return ScalingPolicy(**{f.name: getattr(self, f.name) for f in fields(ScalingPolicy)})


def build(settings: AutoscalerSettings | None = None) -> tuple[Service, AsgiFastStream]:
    settings = settings or AutoscalerSettings()
    service = create_service("autoscaler", settings)
    autoscaler = Autoscaler(settings.policy())
    service.state = autoscaler
    service.registry.register(ServiceMemorySeries(autoscaler))
    broker, name, batch = service.broker, service.name, settings.consumer_batch

    # One autoscaler decides (docs/operations.md, high availability): a standby binds no
    # consumer; what the leader publishes carries its epoch, and a deposed one publishes
    # nothing more.
    gate = LeaderGate(broker)
    leader = gate.router
    holder = default_holder(name)
    leading: dict[str, int] = {}

    async def publish_one(event: Event) -> None:
        epoch = leading.get("epoch")
        if epoch is None:
            raise Deposed("this autoscaler does not lead: it publishes no decision")
        await publish(broker, event, epoch_header(name, epoch))

    scraper = ReplicaScraper(
        httpx.AsyncClient(follow_redirects=False),
        ScrapeMetrics(service.registry),
        timeout_seconds=settings.scrape_timeout_seconds,
    )
    handlers = AutoscalerHandlers(
        autoscaler, AutoscalerMetrics(service.registry), publish_one, scraper
    )

    @durable(broker, Subjects.INFERENCE_LATENCY, name, batch=batch, router=leader)
    async def on_latency_samples(event: LatencySamplesReported) -> None:
        await handlers.latency_samples(event)

    @durable(broker, Subjects.NODE_METRICS, name, batch=batch, router=leader)
    async def on_node_metrics(event: NodeMetricsReported) -> None:
        await handlers.node_metrics(event)

    @durable(broker, Subjects.ALLOCATION_GRANTED, name, batch=batch, router=leader)
    async def on_allocation_granted(event: AllocationGranted) -> None:
        await handlers.allocation_granted(event)

    @durable(broker, Subjects.ALLOCATION_RELEASED, name, batch=batch, router=leader)
    async def on_allocation_released(event: AllocationReleased) -> None:
        await handlers.allocation_released(event)

    @durable(broker, Subjects.SCALE_REPLICA_DRAINED, name, batch=batch, router=leader)
    async def on_replica_drained(event: ReplicaDrained) -> None:
        await handlers.replica_drained(event)

    @leader.subscriber(QuerySubjects.FLEETS, title="autoscaler-query-fleets")
    async def on_fleets_query(event: FleetsQuery) -> FleetsAnswer:
        return fleets_answer(autoscaler, event)

    ticker: list[asyncio.Task[None]] = []

    async def lead(epoch: int) -> None:
        # A standby consumed nothing: its windows fill within window_seconds from now.
        leading["epoch"] = epoch
        await gate.open()
        ticker.append(
            asyncio.create_task(handlers.release_overdue_drains(settings.drain_check_seconds))
        )
        # Replicas that do not publish their samples: their metrics endpoints, read here and
        # handed to the same handler as a published sample.
        ticker.append(
            asyncio.create_task(
                scraper.run(settings.scrape_interval_seconds, handlers.latency_samples)
            )
        )

    async def step_down() -> None:
        leading.pop("epoch", None)
        await gate.close()
        for task in ticker:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        ticker.clear()

    async def elect() -> None:
        lease = await open_lease(
            broker, name, settings.lease_timing, settings.stream_replicas, holder
        )
        leadership = Leadership(lease, lead, step_down, leadership_gauges(service.registry))
        service.leadership = leadership
        await leadership.start()

    async def resign() -> None:
        await step_down()
        if service.leadership is not None:
            await service.leadership.stop()
        await scraper.client.aclose()

    service.after_startup.append(elect)
    service.on_shutdown.append(resign)
    return service, service.asgi()


def fleets_answer(autoscaler: Autoscaler, query: FleetsQuery) -> FleetsAnswer:
    """The leader's answer to `crater.v1.query.fleets`: the policy's lines and each fleet."""
    policy = autoscaler.policy
    return FleetsAnswer(
        strategy=policy.strategy,
        scale_out_p95_ms=policy.scale_out_p95_ms,
        scale_out_pressure=policy.scale_out_pressure,
        scale_in_p95_ms=policy.scale_in_p95_ms,
        scale_in_pressure=policy.scale_in_pressure,
        min_replicas=policy.min_replicas,
        max_replicas=policy.max_replicas,
        fleets=autoscaler.fleets(query.service, query.decisions),
    )


def create_app() -> AsgiFastStream:
    """For `faststream run --factory crater.autoscaler.app:create_app`."""
    return build()[1]


def main() -> None:
    service, app = build()
    serve(app, service)


if __name__ == "__main__":
    main()
