"""The probe's own Prometheus metrics: what it publishes, and in local mode the GPU gauges."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


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
