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
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Protocol

from faststream.asgi import AsgiFastStream
from faststream.nats import NatsBroker
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    Event,
    NodeCondition,
    NodeHealthReported,
    NodeMetricsReported,
    NodeTopology,
    NodeTopologyReported,
    Subjects,
    Taint,
    TaskPreempted,
    TaskProfiled,
)
from crater.probe.adapters.host import HostSampler
from crater.probe.adapters.measure import Measurements, measure_node
from crater.probe.adapters.nvme import disks_wear
from crater.probe.adapters.nvml import GpuSampler
from crater.probe.adapters.sysfs import discover_local, hostname
from crater.probe.domain.health import DiskWear, evaluate
from crater.probe.domain.topology import node_id_from_hostname
from crater.probe.executor import TaskExecutor
from crater.probe.settings import ProbeSettings
from crater.probe.sim.fleet import open_fleet
from crater.probe.sim.runner import TaskRunner
from crater.probe.sim.simulation import FleetSimulator
from crater.runtime.bus import durable, publish
from crater.runtime.service import Service, create_service, serve

__all__ = ["ProbeSettings", "build", "create_app", "main"]

log = logging.getLogger("crater.probe")


def chunked(items: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class Nodes(Protocol):
    """What the probe reports on: this machine, or a simulated fleet."""

    async def open(self) -> None: ...

    async def topologies(self) -> list[NodeTopology]: ...

    async def measure(self) -> bool: ...

    def metrics(self, chunk: int) -> AsyncIterator[list[NodeMetricsReported]]: ...

    def health(self, chunk: int) -> Iterator[list[NodeHealthReported]]: ...

    async def close(self) -> None: ...


class LocalNode:
    """This machine: /sys and /proc, NVML and psutil. Blocking reads run in a thread."""

    def __init__(self, settings: ProbeSettings) -> None:
        self.settings = settings
        self.topology: NodeTopology | None = None
        self.last: NodeMetricsReported | None = None
        self.measured: Measurements | None = None
        self.wear: list[DiskWear] = []
        self._host: HostSampler | None = None
        self._gpus = GpuSampler()

    def _discover(self) -> NodeTopology:
        root = self.settings.host_root
        node = discover_local(
            root,
            node_id=self.settings.node_id,
            pool=self.settings.pool,
            labels=self.settings.labels,
            taints=[Taint.parse(t) for t in self.settings.taints],
            disk_iops_at_depth=self.settings.disk_iops_at_depth,
        )
        # Wear moves slowly: read with each discovery, not each heartbeat.
        self.wear = disks_wear(node.disks, root / "dev")
        return node if self.measured is None else self.measured.apply(node)

    async def measure(self) -> bool:
        """Measure memory and disks once (blocking work in a thread); True when done."""
        assert self.topology is not None
        node = self.topology
        measured = await asyncio.to_thread(
            measure_node,
            node,
            root=self.settings.host_root,
            bounds=self.settings.bounds,
            progress=lambda line: log.info("measuring %s", line),
        )
        self.measured = measured
        self.topology = measured.apply(node)
        for what, why in measured.skipped.items():
            log.info("not measured: %s (%s)", what, why)
        return True

    async def open(self) -> None:
        self.topology = await asyncio.to_thread(self._discover)
        self._host = HostSampler(self.settings.host_root)
        if self.topology.gpus:
            await asyncio.to_thread(self._gpus.open)
        log.info(
            "local node %s: %d GPUs, %d NUMA nodes, %d threads, %d MiB, %d disks",
            self.topology.node_id,
            len(self.topology.gpus),
            len(self.topology.numa_nodes),
            self.topology.cpu.threads,
            self.topology.memory_mb,
            len(self.topology.disks),
        )

    async def topologies(self) -> list[NodeTopology]:
        # Re-discovered each time: a card that fell off the bus changes the fingerprint.
        self.topology = await asyncio.to_thread(self._discover)
        return [self.topology]

    def _sample(self) -> NodeMetricsReported:
        assert self.topology is not None
        assert self._host is not None
        cpu, used, total = self._host.sample()
        return NodeMetricsReported(
            node_id=self.topology.node_id,
            cpu_utilization_percent=cpu,
            memory_used_mb=used,
            memory_total_mb=total,
            gpus=self._gpus.sample(),
            numa_cpu_utilization_percent=self._host.numa_cpu(self.topology.numa_nodes),
            disks=self._host.disks([d.name for d in self.topology.disks]),
        )

    async def metrics(self, chunk: int) -> AsyncIterator[list[NodeMetricsReported]]:
        self.last = await asyncio.to_thread(self._sample)
        yield [self.last]

    def health(self, chunk: int) -> Iterator[list[NodeHealthReported]]:
        assert self.topology is not None
        yield [evaluate(self.topology, self.last, disk_wear=self.wear).report()]

    async def close(self) -> None:
        await asyncio.to_thread(self._gpus.close)


class FleetNodes:
    """Every node of a simulated fleet. The simulation clock (what faults are timed by) is
    the seconds since `open()`; a silent node is left out of every round."""

    def __init__(self, simulator: FleetSimulator, clock: Callable[[], float] = time.monotonic):
        self.simulator = simulator
        self._clock = clock
        self._started: float | None = None

    def _tick(self) -> None:
        if self._started is not None:
            self.simulator.advance_to(self._clock() - self._started)

    async def open(self) -> None:
        self._started = self._clock()
        _, total = self.simulator.gpu_counts()
        log.info("simulating %d nodes with %d GPUs", len(self.simulator), total)

    async def topologies(self) -> list[NodeTopology]:
        self._tick()
        sim = self.simulator
        return [sim.topology(n) for n in sim.reporting_ids]

    async def measure(self) -> bool:
        log.info("full measurement skipped: the fleet is simulated")
        return False

    async def metrics(self, chunk: int) -> AsyncIterator[list[NodeMetricsReported]]:
        self._tick()
        for ids in chunked(self.simulator.reporting_ids, chunk):
            yield [self.simulator.step_node(node_id) for node_id in ids]

    def health(self, chunk: int) -> Iterator[list[NodeHealthReported]]:
        self._tick()
        sim = self.simulator
        for ids in chunked(sim.reporting_ids, chunk):
            yield [evaluate(sim.topology(n), sim.last_metrics(n)).report() for n in ids]

    async def close(self) -> None:
        pass


class ProbeMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.nodes = Gauge("crater_probe_nodes", "Nodes this probe reports.", registry=registry)
        self.published = Counter(
            "crater_probe_events_published",
            "Events published, by kind.",
            ["kind"],
            registry=registry,
        )
        self.failures = Counter(
            "crater_probe_publish_failures",
            "Events that could not be published, by kind.",
            ["kind"],
            registry=registry,
        )
        self.round_seconds = Histogram(
            "crater_probe_round_seconds",
            "Time to publish one round for every node, by kind.",
            ["kind"],
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=registry,
        )
        self.conditions = Gauge(
            "crater_probe_node_condition",
            "Nodes by last reported condition.",
            ["condition"],
            registry=registry,
        )
        self.gpus = Gauge(
            "crater_probe_gpus",
            "GPUs in the last metrics round: busy (utilization >= 50%) or idle.",
            ["state"],
            registry=registry,
        )
        self.gpu_utilization = Gauge(
            "crater_probe_gpu_utilization_percent",
            "Local GPU utilization.",
            ["gpu"],
            registry=registry,
        )
        self.gpu_memory_usage = Gauge(
            "crater_probe_gpu_memory_usage_rate",
            "Local GPU memory used / total.",
            ["gpu"],
            registry=registry,
        )
        self.gpu_temperature = Gauge(
            "crater_probe_gpu_temperature_celsius",
            "Local GPU temperature.",
            ["gpu"],
            registry=registry,
        )
        self.tasks = Gauge(
            "crater_probe_simulated_tasks", "Simulated tasks running.", registry=registry
        )
        self.grants = Counter(
            "crater_probe_grants",
            "Allocation grants seen, by what the runner did.",
            ["outcome"],
            registry=registry,
        )


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
