"""Reporting: publish the topology, metrics and health of the nodes the probe reports on.

Topology goes out on start, again at once when a re-discovery (every
`discovery_interval_seconds`) finds a node's fingerprint changed, and in full every
`topology_interval_seconds` (the stream keeps the latest per node). With `full_measurement`
the local node's memory bandwidth and disk random reads are measured once, in a thread, after
start, and the topology is published again carrying them. Metrics and health go out on their
own intervals. Every loop is a background task started after the broker and cancelled before
it stops. Big fleets publish in concurrent chunks: one awaited JetStream ack at a time would
cap a round at a few hundred nodes a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from faststream.nats import NatsBroker

from crater.contracts import (
    Event,
    NodeCondition,
    NodeTopologyReported,
)
from crater.probe.domain.topology import measured_figures
from crater.probe.service_layer.metrics import ProbeMetrics
from crater.probe.service_layer.nodes import Nodes
from crater.probe.settings import ProbeSettings
from crater.probe.sim.runner import TaskRunner
from crater.runtime.bus import publish

log = logging.getLogger("crater.probe")


class Publisher:
    """Publishes a round of events in concurrent chunks, counting what got through."""

    def __init__(self, broker: NatsBroker, metrics: ProbeMetrics) -> None:
        self.broker = broker
        self.metrics = metrics

    async def chunk(self, kind: str, events: Sequence[Event]) -> int:
        """Publish one chunk concurrently; returns how many failed (logged once per chunk)."""
        results = await asyncio.gather(
            *(publish(self.broker, e) for e in events), return_exceptions=True
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        self.metrics.published.labels(kind=kind).inc(len(events) - len(errors))
        if errors:
            self.metrics.failures.labels(kind=kind).inc(len(errors))
            log.warning(
                "%d of %d %s events not published: %r", len(errors), len(events), kind, errors[0]
            )
        return len(errors)


async def _every(
    seconds: float, job: Callable[[], Awaitable[bool]], what: str, retry_seconds: float = 5.0
) -> None:
    """Run `job` every `seconds` (start to start); a failed round is retried sooner."""
    while True:
        started = time.monotonic()
        try:
            ok = await job()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s round failed", what)
            ok = False
        wait = seconds if ok else min(seconds, retry_seconds)
        await asyncio.sleep(max(0.0, wait - (time.monotonic() - started)))


class Reporting:
    """The rounds and the loops that repeat them: started after the broker, stopped before."""

    def __init__(
        self,
        settings: ProbeSettings,
        nodes: Nodes,
        metrics: ProbeMetrics,
        publisher: Publisher,
        runner: TaskRunner | None,
    ) -> None:
        self.settings = settings
        self.nodes = nodes
        self.metrics = metrics
        self.publisher = publisher
        self.runner = runner
        self.chunk = settings.publish_chunk
        # node id -> (fingerprint, measured figures) last published: a figure measured late
        # (a card busy at start) goes out on the next re-discovery though the hardware is the same
        self.published: dict[str, tuple[str, str]] = {}
        self.background: list[asyncio.Task[None]] = []

    async def publish_topologies(self, changed_only: bool = False) -> bool:
        """Every node's topology, or (a re-discovery) those whose fingerprint changed."""
        kind = "discovery" if changed_only else "topology"
        with self.metrics.round_seconds.labels(kind=kind).time():
            topologies = await self.nodes.topologies()
            self.metrics.nodes.set(len(topologies))
            keys = {t.node_id: (t.fingerprint, measured_figures(t)) for t in topologies}
            if changed_only:
                topologies = [
                    t for t in topologies if self.published.get(t.node_id) != keys[t.node_id]
                ]
                for t in topologies:
                    before = self.published.get(t.node_id)
                    if before is None:
                        continue
                    if before[0] != t.fingerprint:
                        log.info(
                            "topology of %s changed: fingerprint %s -> %s",
                            t.node_id,
                            before[0][:12],
                            t.fingerprint[:12],
                        )
                    else:
                        log.info("measured figures of %s changed", t.node_id)
            failed = 0
            for start in range(0, len(topologies), self.chunk):
                part = topologies[start : start + self.chunk]
                errors = await self.publisher.chunk(
                    "topology", [NodeTopologyReported(node=t) for t in part]
                )
                failed += errors
                if not errors:  # a failed chunk stays "changed": the next round retries it
                    self.published.update((t.node_id, keys[t.node_id]) for t in part)
        return failed == 0

    async def rediscover(self) -> bool:
        return await self.publish_topologies(changed_only=True)

    async def measure_and_publish(self) -> None:
        try:
            if await self.nodes.measure():
                # Same fingerprint (measurements are not hardware), so published outright.
                await self.publish_topologies()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("full measurement failed; the topology goes out without it")

    async def publish_metrics(self) -> bool:
        failed = 0
        busy = total = 0
        complete = False
        try:
            with self.metrics.round_seconds.labels(kind="metrics").time():
                async for batch in self.nodes.metrics(self.chunk):
                    failed += await self.publisher.chunk("metrics", batch)
                    for report in batch:
                        total += len(report.gpus)
                        busy += sum(g.utilization_percent >= 50 for g in report.gpus)
                        self.metrics.series.add(report)
            complete = True
        finally:
            self.metrics.series.end_round(complete)
        self.metrics.gpus.labels(state="busy").set(busy)
        self.metrics.gpus.labels(state="idle").set(total - busy)
        if self.runner is not None:
            self.metrics.tasks.set(self.runner.running)
        return failed == 0

    async def publish_health(self) -> bool:
        failed = 0
        counts = dict.fromkeys(NodeCondition, 0)
        with self.metrics.round_seconds.labels(kind="health").time():
            for batch in self.nodes.health(self.chunk):
                failed += await self.publisher.chunk("health", batch)
                for report in batch:
                    counts[report.condition] += 1
        for condition, count in counts.items():
            self.metrics.conditions.labels(condition=condition.value).set(count)
        return failed == 0

    async def start(self) -> None:
        # Topology first, so no consumer sees metrics for a node it has never heard of.
        topology_ok = await self.publish_topologies()
        await self.publish_metrics()
        await self.publish_health()

        async def topology_loop() -> None:
            # The first round is done; a failed one is retried soon, not a whole interval on.
            await asyncio.sleep(self.settings.topology_interval_seconds if topology_ok else 5.0)
            await _every(
                self.settings.topology_interval_seconds, self.publish_topologies, "topology"
            )

        async def metrics_loop() -> None:
            await asyncio.sleep(self.settings.metrics_interval_seconds)
            await _every(self.settings.metrics_interval_seconds, self.publish_metrics, "metrics")

        async def health_loop() -> None:
            await asyncio.sleep(self.settings.health_interval_seconds)
            await _every(self.settings.health_interval_seconds, self.publish_health, "health")

        async def discovery_loop() -> None:
            await asyncio.sleep(self.settings.discovery_interval_seconds)
            await _every(self.settings.discovery_interval_seconds, self.rediscover, "discovery")

        loops = [topology_loop, metrics_loop, health_loop, discovery_loop]
        if self.settings.full_measurement:
            loops.append(self.measure_and_publish)
        for loop in loops:
            self.background.append(asyncio.create_task(loop(), name=f"probe-{loop.__name__}"))

    async def stop(self) -> None:
        for task in self.background:
            task.cancel()
        for task in self.background:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.background.clear()
