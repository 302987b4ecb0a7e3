"""Node health: named checks over a topology and its latest metrics, and the verdict.

A failed check is either a warning (the node still runs work, worse: Degraded) or critical
(new work should not land there: NotReady). The score starts at 100 and loses a fixed amount
per failure, so a scheduler can prefer the healthier of two otherwise equal nodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from uuid import UUID, uuid4

from crater.contracts import (
    HealthCheck,
    NodeCondition,
    NodeHealthReported,
    NodeMetricsReported,
    NodeTopology,
)

CHECK_GPUS_VISIBLE = "gpus-visible"
CHECK_GPU_TEMPERATURE = "gpu-temperature"
CHECK_MEMORY_PRESSURE = "memory-pressure"
CHECK_DISK_PRESENT = "disk-present"
CHECK_NUMA_BALANCE = "numa-balance"


class Severity(StrEnum):
    WARNING = "warning"
    CRITICAL = "critical"


PENALTY = {Severity.WARNING: 15, Severity.CRITICAL: 50}


@dataclass(frozen=True)
class HealthLimits:
    gpu_temperature_warn_c: float = 85.0
    # Datacenter cards start throttling near 90 °C and shut down past ~100 °C.
    gpu_temperature_critical_c: float = 95.0
    memory_pressure_warn: float = 0.95
    memory_pressure_critical: float = 0.99
    # A NUMA node with less than half the memory of another usually means a failed DIMM.
    numa_imbalance_ratio: float = 2.0


@dataclass(frozen=True)
class CheckResult:
    name: str
    passed: bool
    detail: str
    severity: Severity | None = None  # what the failure costs; None when passed

    def contract(self) -> HealthCheck:
        return HealthCheck(name=self.name, passed=self.passed, detail=self.detail)


@dataclass(frozen=True)
class Assessment:
    node_id: str
    condition: NodeCondition
    score: int
    results: tuple[CheckResult, ...]

    @property
    def checks(self) -> list[HealthCheck]:
        return [r.contract() for r in self.results]

    def report(self, event_id: UUID | None = None) -> NodeHealthReported:
        return NodeHealthReported(
            event_id=event_id or uuid4(),
            node_id=self.node_id,
            condition=self.condition,
            score=self.score,
            checks=self.checks,
        )


def _ok(name: str, detail: str) -> CheckResult:
    return CheckResult(name, True, detail)


def _fail(name: str, detail: str, severity: Severity) -> CheckResult:
    return CheckResult(name, False, detail, severity)


def check_gpus_visible(node: NodeTopology, metrics: NodeMetricsReported | None) -> CheckResult:
    if not node.gpus:
        return _ok(CHECK_GPUS_VISIBLE, "no GPUs in the topology")
    if metrics is None:
        return _ok(CHECK_GPUS_VISIBLE, "no metrics sample yet")
    reporting = {g.index for g in metrics.gpus}
    missing = sorted(g.index for g in node.gpus if g.index not in reporting)
    if missing:
        # A card that stopped answering (e.g. fallen off the bus) rarely comes back unrebooted.
        return _fail(
            CHECK_GPUS_VISIBLE,
            f"GPU {', '.join(map(str, missing))} of {len(node.gpus)} not reporting",
            Severity.CRITICAL,
        )
    return _ok(CHECK_GPUS_VISIBLE, f"all {len(node.gpus)} GPUs reporting")


def check_gpu_temperature(metrics: NodeMetricsReported | None, limits: HealthLimits) -> CheckResult:
    temperatures = [
        (g.temperature_c, g.index)
        for g in (metrics.gpus if metrics else [])
        if g.temperature_c is not None
    ]
    if not temperatures:
        return _ok(CHECK_GPU_TEMPERATURE, "no GPU temperature reported")
    hottest, index = max(temperatures)
    detail = f"hottest GPU {index} at {hottest:.0f} C"
    if hottest >= limits.gpu_temperature_critical_c:
        return _fail(
            CHECK_GPU_TEMPERATURE,
            f"{detail} >= {limits.gpu_temperature_critical_c:.0f} C",
            Severity.CRITICAL,
        )
    if hottest >= limits.gpu_temperature_warn_c:
        return _fail(
            CHECK_GPU_TEMPERATURE,
            f"{detail} >= {limits.gpu_temperature_warn_c:.0f} C",
            Severity.WARNING,
        )
    return _ok(CHECK_GPU_TEMPERATURE, f"{detail} < {limits.gpu_temperature_warn_c:.0f} C")


def check_memory_pressure(metrics: NodeMetricsReported | None, limits: HealthLimits) -> CheckResult:
    if metrics is None or not metrics.memory_total_mb:
        return _ok(CHECK_MEMORY_PRESSURE, "no memory sample yet")
    pressure = metrics.memory_used_mb / metrics.memory_total_mb
    detail = (
        f"{pressure:.0%} of host memory used "
        f"({metrics.memory_used_mb}/{metrics.memory_total_mb} MiB)"
    )
    if pressure >= limits.memory_pressure_critical:
        return _fail(CHECK_MEMORY_PRESSURE, detail, Severity.CRITICAL)
    if pressure >= limits.memory_pressure_warn:
        return _fail(CHECK_MEMORY_PRESSURE, detail, Severity.WARNING)
    return _ok(CHECK_MEMORY_PRESSURE, detail)


def check_disk_present(node: NodeTopology) -> CheckResult:
    if not node.disks:
        return _fail(
            CHECK_DISK_PRESENT,
            "no local disk: datasets and checkpoints cannot be staged",
            Severity.WARNING,
        )
    nvme = sum(d.nvme for d in node.disks)
    return _ok(CHECK_DISK_PRESENT, f"{len(node.disks)} local disk(s), {nvme} NVMe")


def check_numa_balance(node: NodeTopology, limits: HealthLimits) -> CheckResult:
    known = {n.id for n in node.numa_nodes}
    stray = sorted(
        g.index for g in node.gpus if g.numa_node is not None and g.numa_node not in known
    )
    if stray:
        return _fail(
            CHECK_NUMA_BALANCE,
            f"GPU {', '.join(map(str, stray))} on a NUMA node the host does not list",
            Severity.WARNING,
        )
    # Memory-only NUMA nodes (CXL, HBM) hold no CPUs and are not expected to match.
    compute = [n for n in node.numa_nodes if n.cpus]
    if len(compute) < 2:
        return _ok(CHECK_NUMA_BALANCE, f"{len(compute)} NUMA node with CPUs")
    memory = [n.memory_mb for n in compute]
    cpus = [len(n.cpus) for n in compute]
    detail = (
        f"{len(compute)} NUMA nodes: memory {min(memory)}-{max(memory)} MiB, "
        f"CPUs {min(cpus)}-{max(cpus)}"
    )
    ratio = limits.numa_imbalance_ratio
    if min(memory) * ratio < max(memory) or min(cpus) * ratio < max(cpus):
        return _fail(CHECK_NUMA_BALANCE, f"unbalanced: {detail}", Severity.WARNING)
    return _ok(CHECK_NUMA_BALANCE, detail)


def evaluate(
    node: NodeTopology,
    metrics: NodeMetricsReported | None = None,
    limits: HealthLimits | None = None,
) -> Assessment:
    """Every check, the node's condition and its score: what `crater diagnose --node` shows."""
    limits = limits or HealthLimits()
    results = (
        check_gpus_visible(node, metrics),
        check_gpu_temperature(metrics, limits),
        check_memory_pressure(metrics, limits),
        check_disk_present(node),
        check_numa_balance(node, limits),
    )
    failed = [r.severity for r in results if not r.passed and r.severity is not None]
    if Severity.CRITICAL in failed:
        condition = NodeCondition.NOT_READY
    elif failed:
        condition = NodeCondition.DEGRADED
    else:
        condition = NodeCondition.READY
    score = max(0, 100 - sum(PENALTY[s] for s in failed))
    return Assessment(node.node_id, condition, score, results)


def health_report(
    node: NodeTopology,
    metrics: NodeMetricsReported | None = None,
    limits: HealthLimits | None = None,
) -> NodeHealthReported:
    """The heartbeat event for a node."""
    return evaluate(node, metrics, limits).report()
