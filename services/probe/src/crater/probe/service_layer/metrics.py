"""The probe's own Prometheus metrics: what it publishes, and the series operators expect of
every node and card it reports on (`NodeSeries`), local mode and simulated fleet alike."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from crater.contracts import NodeMetricsReported

MIB = 1024 * 1024


class ProbeMetrics:
    def __init__(self, registry: CollectorRegistry, max_nodes: int = 5000) -> None:
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
        self.tasks = Gauge(
            "crater_probe_simulated_tasks", "Simulated tasks running.", registry=registry
        )
        self.grants = Counter(
            "crater_probe_grants",
            "Allocation grants seen, by what the runner did.",
            ["outcome"],
            registry=registry,
        )
        self.xids = Counter(
            "crater_probe_gpu_xid_events",
            "Xid events read from NVML, by code, the action taken (none, reset-card, "
            "reboot-node, operator) and whether the Xid table knows the code (catalog: known, "
            "unknown).",
            ["xid", "action", "catalog"],
            registry=registry,
        )
        self.pcie_measurements = Counter(
            "crater_probe_pcie_bandwidth_measurements",
            "Cards whose host-to-card copy bandwidth the probe measured, or did not, by "
            "outcome: measured, busy (a task on it, or MIG on: measured once idle, at a later "
            "re-discovery), unavailable (no cuda-bindings, no CUDA driver), unmatched (no CUDA "
            "device at its bus id), failed (a CUDA error); timed-out counts a measurement that "
            "ran past 60 s (the topology went out without it).",
            ["outcome"],
            registry=registry,
        )
        self.unexported = Gauge(
            "crater_probe_nodes_not_exported",
            "Nodes reported on the bus whose per node and card series are left out of this "
            "probe's /metrics: past CRATER_PROBE_METRICS_MAX_NODES (by node id).",
            registry=registry,
        )
        self.series = NodeSeries(max_nodes, self.unexported)
        registry.register(self.series)


class NodeSeries(Collector):
    """Per node and per card series, rendered at scrape time from each node's latest metrics
    report: nothing is updated per round, so a fleet of thousands costs only its scrapes.

    A round's reports replace the last round's once the round is over: a node that stops
    reporting (gone silent, removed) leaves the series with it. At most `max_nodes` nodes
    are exported, the first by node id; the rest are counted in `unexported`.
    """

    def __init__(self, max_nodes: int, unexported: Gauge | None = None) -> None:
        self.max_nodes = max_nodes
        self.unexported = unexported
        self.latest: dict[str, NodeMetricsReported] = {}
        self._round: dict[str, NodeMetricsReported] = {}

    def add(self, report: NodeMetricsReported) -> None:
        self._round[report.node_id] = report

    def end_round(self, complete: bool = True) -> None:
        """The round's reports become the latest; an incomplete round (it failed part way)
        only updates the nodes it reached."""
        if complete:
            self.latest = self._round
        else:
            self.latest.update(self._round)
        self._round = {}
        if self.unexported is not None:
            self.unexported.set(max(0, len(self.latest) - self.max_nodes))

    def exported(self) -> list[NodeMetricsReported]:
        return [self.latest[n] for n in sorted(self.latest)[: self.max_nodes]]

    def describe(self) -> Iterable[Metric]:
        return list(_Families().all())

    def collect(self) -> Iterable[Metric]:
        families = _Families()
        for report in self.exported():
            families.add(report)
        return list(families.all())


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


def sm_utilization_variance(report: NodeMetricsReported) -> float | None:
    """Population variance of the node's cards' utilisation, as ratios (0..1, so at most
    0.25): how unevenly its GPUs are kept busy. None without GPUs."""
    values = [g.utilization_percent / 100 for g in report.gpus]
    if not values:
        return None
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / len(values)


class _Families:
    """One scrape's metric families (names, help, labels: docs/operations.md lists them)."""

    def __init__(self) -> None:
        card = ["node", "gpu"]
        self.gpu_utilization = _gauge(
            "crater_gpu_utilization_percent", "GPU utilisation (SM busy time), percent.", card
        )
        self.gpu_memory_used = _gauge(
            "crater_gpu_memory_used_bytes", "GPU memory in use on the card.", card
        )
        self.gpu_memory_total = _gauge(
            "crater_gpu_memory_total_bytes", "The card's GPU memory.", card
        )
        self.gpu_memory_rate = _gauge(
            "crater_gpu_memory_usage_rate",
            "GPU memory in use as a share of the physical card (0..1). A task's use as a share "
            "of what it asked for is crater_task_gpu_memory_request_usage_ratio.",
            card,
        )
        self.gpu_temperature = _gauge("crater_gpu_temperature_celsius", "GPU temperature.", card)
        self.gpu_power = _gauge("crater_gpu_power_watts", "GPU power draw.", card)
        self.gpu_sm_clock = _gauge("crater_gpu_sm_clock_hertz", "GPU SM clock.", card)
        self.gpu_ecc = CounterMetricFamily(
            "crater_gpu_ecc_errors",
            "ECC errors since the card's driver loaded (a reset starts again from 0), by kind: "
            "corrected, uncorrected.",
            labels=[*card, "kind"],
        )
        self.sm_variance = _gauge(
            "crater_gpu_sm_utilization_variance",
            "Variance of the node's cards' utilisation as ratios (0..0.25): how unevenly the "
            "node's GPUs are kept busy (0: evenly).",
            ["node"],
        )
        self.cpu = _gauge("crater_node_cpu_utilization_percent", "Node CPU use, percent.", ["node"])
        self.numa_cpu = _gauge(
            "crater_node_numa_cpu_utilization_percent",
            "CPU use of each NUMA node's CPUs, percent.",
            ["node", "numa"],
        )
        self.memory_used = _gauge(
            "crater_node_memory_used_bytes",
            "Host memory in use (what cannot be given to a new task; page cache excluded).",
            ["node"],
        )
        self.memory_total = _gauge("crater_node_memory_total_bytes", "Host memory.", ["node"])
        self.memory_bandwidth = _gauge(
            "crater_node_numa_memory_bandwidth_bytes_per_second",
            "Memory bandwidth in use per NUMA node (reads and writes), where measured (resctrl).",
            ["node", "numa"],
        )
        disk = ["node", "disk"]
        self.disk_read = _gauge(
            "crater_node_disk_read_bytes_per_second", "Bytes read per second.", disk
        )
        self.disk_written = _gauge(
            "crater_node_disk_write_bytes_per_second", "Bytes written per second.", disk
        )
        self.disk_reads = _gauge(
            "crater_node_disk_reads_per_second", "Reads completed per second.", disk
        )
        self.disk_writes = _gauge(
            "crater_node_disk_writes_per_second", "Writes completed per second.", disk
        )
        self.disk_queue = _gauge(
            "crater_node_disk_io_in_flight", "I/Os in flight when sampled (queue depth).", disk
        )
        self.transfer_wait = _gauge(
            "crater_data_transfer_wait_time_ms",
            "Mean time an I/O completed in the interval spent queued and served (iostat's "
            "await), in ms: how long a data transfer from this disk waits. Named as the field "
            "names it (milliseconds).",
            disk,
        )

    def add(self, report: NodeMetricsReported) -> None:
        node = report.node_id
        for gpu in report.gpus:
            card = [node, str(gpu.index)]
            self.gpu_utilization.add_metric(card, gpu.utilization_percent)
            self.gpu_memory_used.add_metric(card, gpu.memory_used_mb * MIB)
            self.gpu_memory_total.add_metric(card, gpu.memory_total_mb * MIB)
            self.gpu_memory_rate.add_metric(card, gpu.memory_pressure)
            if gpu.temperature_c is not None:
                self.gpu_temperature.add_metric(card, gpu.temperature_c)
            if gpu.power_w is not None:
                self.gpu_power.add_metric(card, gpu.power_w)
            if gpu.sm_clock_mhz is not None:
                self.gpu_sm_clock.add_metric(card, gpu.sm_clock_mhz * 1e6)
            if gpu.ecc_errors_corrected is not None:
                self.gpu_ecc.add_metric([*card, "corrected"], gpu.ecc_errors_corrected)
            if gpu.ecc_errors_uncorrected is not None:
                self.gpu_ecc.add_metric([*card, "uncorrected"], gpu.ecc_errors_uncorrected)
        variance = sm_utilization_variance(report)
        if variance is not None:
            self.sm_variance.add_metric([node], variance)
        self.cpu.add_metric([node], report.cpu_utilization_percent)
        for numa, percent in sorted(report.numa_cpu_utilization_percent.items()):
            self.numa_cpu.add_metric([node, str(numa)], percent)
        self.memory_used.add_metric([node], report.memory_used_mb * MIB)
        self.memory_total.add_metric([node], report.memory_total_mb * MIB)
        for numa, gbps in sorted(report.numa_memory_bandwidth_gbps.items()):
            self.memory_bandwidth.add_metric([node, str(numa)], gbps * 1e9)
        for d in report.disks:
            labels = [node, d.name]
            self.disk_read.add_metric(labels, d.read_mb_s * MIB)
            self.disk_written.add_metric(labels, d.write_mb_s * MIB)
            self.disk_reads.add_metric(labels, d.read_iops)
            self.disk_writes.add_metric(labels, d.write_iops)
            if d.in_flight is not None:
                self.disk_queue.add_metric(labels, d.in_flight)
            if d.wait_ms is not None:
                self.transfer_wait.add_metric(labels, d.wait_ms)

    def all(self) -> Iterator[Metric]:
        yield from (value for value in vars(self).values() if isinstance(value, Metric))
