"""Probe wiring: publish the topology, metrics and health of this machine (local mode) or of
a simulated fleet (fleet mode), and in fleet mode run the tasks placed on simulated nodes.

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

from faststream.asgi import AsgiFastStream
from faststream.nats import NatsBroker

from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    Event,
    NodeCondition,
    NodeMetricsReported,
    NodeTopologyReported,
    Subjects,
    TaskPreempted,
    TaskProfiled,
)
from crater.probe.adapters.sysfs import hostname
from crater.probe.domain.topology import node_id_from_hostname
from crater.probe.executor import TaskExecutor
from crater.probe.service_layer.metrics import ProbeMetrics
from crater.probe.service_layer.nodes import FleetNodes, LocalNode, Nodes
from crater.probe.settings import ProbeSettings
from crater.probe.sim.fleet import open_fleet
from crater.probe.sim.runner import TaskRunner
from crater.probe.sim.simulation import FleetSimulator
from crater.runtime.bus import durable, publish
from crater.runtime.service import Service, create_service, serve

__all__ = ["ProbeSettings", "build", "create_app", "main"]

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


def build(settings: ProbeSettings | None = None) -> tuple[Service, AsgiFastStream]:
    settings = settings or ProbeSettings()
    service = create_service("probe", settings)
    metrics = ProbeMetrics(service.registry)
    publisher = Publisher(service.broker, metrics)
    chunk = settings.publish_chunk

    nodes: Nodes
    runner: TaskRunner | None = None
    if settings.mode == "fleet":
        # Loaded now, not on start: the runner's durable consumers are named after the fleet.
        fleet = open_fleet(settings.fleet_file, settings.seed)
        faults = fleet.faults if settings.faults else ()
        if faults:
            log.info(
                "injecting %d faults: %s",
                len(faults),
                ", ".join(f"{f.kind} on {f.node} at {f.at_seconds:g} s" for f in faults),
            )
        simulator = FleetSimulator(fleet.nodes, fleet.seed, faults)
        nodes = FleetNodes(simulator)
        runner = TaskRunner(
            simulator,
            lambda event: publish(service.broker, event),
            seed=fleet.seed,
            seconds_min=settings.task_seconds_min,
            seconds_max=settings.task_seconds_max,
            start_max_seconds=settings.task_start_seconds,
            failure_rate=settings.task_failure_rate,
        )
        _subscribe_runner(service, runner, metrics, f"fleet-{fleet.name}")
        service.state = runner
    else:
        nodes = LocalNode(settings)
    executor: TaskExecutor | None = None
    if settings.execute:
        node_id = settings.node_id or node_id_from_hostname(hostname(settings.host_root))
        executor = TaskExecutor(
            node_id,
            lambda event: publish(service.broker, event),
            state_dir=settings.state_dir,
            kill_grace_seconds=settings.kill_grace_seconds,
            poll_seconds=settings.execute_poll_seconds,
            cgroup_root=settings.cgroup_root,
        )
        _subscribe_runner(service, executor, metrics, f"agent-{node_id}")
        service.state = executor

    published: dict[str, str] = {}  # node id -> fingerprint last published

    async def publish_topologies(changed_only: bool = False) -> bool:
        """Every node's topology, or (a re-discovery) those whose fingerprint changed."""
        kind = "discovery" if changed_only else "topology"
        with metrics.round_seconds.labels(kind=kind).time():
            topologies = await nodes.topologies()
            metrics.nodes.set(len(topologies))
            if changed_only:
                topologies = [t for t in topologies if published.get(t.node_id) != t.fingerprint]
                for t in topologies:
                    if t.node_id in published:
                        log.info(
                            "topology of %s changed: fingerprint %s -> %s",
                            t.node_id,
                            published[t.node_id][:12],
                            t.fingerprint[:12],
                        )
            failed = 0
            for start in range(0, len(topologies), chunk):
                part = topologies[start : start + chunk]
                errors = await publisher.chunk(
                    "topology", [NodeTopologyReported(node=t) for t in part]
                )
                failed += errors
                if not errors:  # a failed chunk stays "changed": the next round retries it
                    published.update((t.node_id, t.fingerprint) for t in part)
        return failed == 0

    async def rediscover() -> bool:
        return await publish_topologies(changed_only=True)

    async def measure_and_publish() -> None:
        try:
            if await nodes.measure():
                # Same fingerprint (measurements are not hardware), so published outright.
                await publish_topologies()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("full measurement failed; the topology goes out without it")

    async def publish_metrics() -> bool:
        failed = 0
        busy = total = 0
        with metrics.round_seconds.labels(kind="metrics").time():
            async for batch in nodes.metrics(chunk):
                failed += await publisher.chunk("metrics", batch)
                for report in batch:
                    total += len(report.gpus)
                    busy += sum(g.utilization_percent >= 50 for g in report.gpus)
                    if settings.mode == "local":  # per-card series only for one node
                        _local_gpu_gauges(metrics, report)
        metrics.gpus.labels(state="busy").set(busy)
        metrics.gpus.labels(state="idle").set(total - busy)
        if runner is not None:
            metrics.tasks.set(runner.running)
        return failed == 0

    async def publish_health() -> bool:
        failed = 0
        counts = dict.fromkeys(NodeCondition, 0)
        with metrics.round_seconds.labels(kind="health").time():
            for batch in nodes.health(chunk):
                failed += await publisher.chunk("health", batch)
                for report in batch:
                    counts[report.condition] += 1
        for condition, count in counts.items():
            metrics.conditions.labels(condition=condition.value).set(count)
        return failed == 0

    background: list[asyncio.Task[None]] = []

    async def open_nodes() -> None:
        await nodes.open()
        if executor is not None:
            await executor.start()

    async def start_reporting() -> None:
        # Topology first, so no consumer sees metrics for a node it has never heard of.
        topology_ok = await publish_topologies()
        await publish_metrics()
        await publish_health()

        async def topology_loop() -> None:
            # The first round is done; a failed one is retried soon, not a whole interval on.
            await asyncio.sleep(settings.topology_interval_seconds if topology_ok else 5.0)
            await _every(settings.topology_interval_seconds, publish_topologies, "topology")

        async def metrics_loop() -> None:
            await asyncio.sleep(settings.metrics_interval_seconds)
            await _every(settings.metrics_interval_seconds, publish_metrics, "metrics")

        async def health_loop() -> None:
            await asyncio.sleep(settings.health_interval_seconds)
            await _every(settings.health_interval_seconds, publish_health, "health")

        async def discovery_loop() -> None:
            await asyncio.sleep(settings.discovery_interval_seconds)
            await _every(settings.discovery_interval_seconds, rediscover, "discovery")

        loops = [topology_loop, metrics_loop, health_loop, discovery_loop]
        if settings.full_measurement:
            loops.append(measure_and_publish)
        for loop in loops:
            background.append(asyncio.create_task(loop(), name=f"probe-{loop.__name__}"))

    async def stop_reporting() -> None:
        for task in background:
            task.cancel()
        for task in background:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        background.clear()
        if runner is not None:
            await runner.close()
        if executor is not None:
            await executor.close()  # its tasks go on, for the next agent to re-attach
        await nodes.close()

    service.on_startup.append(open_nodes)
    service.after_startup.append(start_reporting)
    service.on_shutdown.append(stop_reporting)
    return service, service.asgi()


def _local_gpu_gauges(metrics: ProbeMetrics, report: NodeMetricsReported) -> None:
    for gpu in report.gpus:
        label = str(gpu.index)
        metrics.gpu_utilization.labels(gpu=label).set(gpu.utilization_percent)
        metrics.gpu_memory_usage.labels(gpu=label).set(gpu.memory_pressure)
        if gpu.temperature_c is not None:
            metrics.gpu_temperature.labels(gpu=label).set(gpu.temperature_c)


def _subscribe_runner(
    service: Service, runner: TaskRunner | TaskExecutor, metrics: ProbeMetrics, consumer: str
) -> None:
    """Durable consumers for the simulated runner, named per fleet (two fleets each see every
    grant, two replicas of one fleet share the work), or for the executing agent, named per
    node."""
    batch = service.settings.consumer_batch

    @durable(
        service.broker,
        Subjects.ALLOCATION_GRANTED,
        service.name,
        batch=batch,
        name=f"{consumer}-allocation-granted",
    )
    async def on_allocation_granted(event: AllocationGranted) -> None:
        metrics.grants.labels(outcome=runner.granted(event).value).inc()
        metrics.tasks.set(runner.running)

    @durable(
        service.broker,
        Subjects.ALLOCATION_RELEASED,
        service.name,
        batch=batch,
        name=f"{consumer}-allocation-released",
    )
    async def on_allocation_released(event: AllocationReleased) -> None:
        runner.released(event)
        metrics.tasks.set(runner.running)

    @durable(
        service.broker,
        Subjects.TASK_PROFILED,
        service.name,
        batch=batch,
        name=f"{consumer}-task-profiled",
    )
    async def on_task_profiled(event: TaskProfiled) -> None:
        runner.profiled(event)  # what the task will really use, once placed

    @durable(
        service.broker,
        Subjects.TASK_PREEMPTED,
        service.name,
        batch=batch,
        name=f"{consumer}-task-preempted",
    )
    async def on_task_preempted(event: TaskPreempted) -> None:
        runner.preempted(event)
        metrics.tasks.set(runner.running)


def create_app() -> AsgiFastStream:
    """For `faststream run --factory crater.probe.app:create_app`."""
    return build()[1]


def main() -> None:
    service, app = build()
    serve(app, service)


if __name__ == "__main__":
    main()
