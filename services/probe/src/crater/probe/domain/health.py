"""Node health: named checks over a topology and its latest metrics, and the verdict.

A failed check is either a warning (the node still runs work, worse: Degraded) or critical
(new work should not land there: NotReady). The score starts at 100 and loses a fixed amount
per failure, so a scheduler can prefer the healthier of two otherwise equal nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from uuid import UUID, uuid4

from crater.contracts import (
    GpuFault,
    GpuFaultAction,
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
CHECK_GPU_ECC = "gpu-ecc"
CHECK_PCIE_LINK = "pcie-link"
CHECK_DISK_WEAR = "disk-wear"
CHECK_GPU_FAULTS = "gpu-faults"


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
    # Uncorrectable errors mean lost data and a pending row remap: no new work until a reset.
    # Corrected ones are routine in small numbers; a steady stream predicts a failing card.
    ecc_corrected_warn: int = 1000
    # A link that trained down only shows under load: idle cards drop their PCIe gen to save
    # power, so the generation counts only at or above this utilization.
    pcie_busy_utilization: float = 50.0
    disk_wear_warn_percent: int = 90  # NVMe "percentage used" of rated endurance


@dataclass(frozen=True)
class DiskWear:
    """A disk's wear as its SMART health log reports it, or why it could not be read."""

    disk: str
    percentage_used: int | None = None
    available_spare: int | None = None
    critical_warning: int | None = None
    reason: str = ""

    @property
    def readable(self) -> bool:
        return self.percentage_used is not None


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
    # The cards' faults (None: not read), sent with the heartbeat for the scheduler to act on.
    faults: list[GpuFault] | None = None

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
            gpu_faults=self.faults,
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


def check_gpu_ecc(metrics: NodeMetricsReported | None, limits: HealthLimits) -> CheckResult:
    gpus = [g for g in (metrics.gpus if metrics else []) if g.ecc_errors_uncorrected is not None]
    if not gpus:
        return _ok(CHECK_GPU_ECC, "no ECC counters reported (no ECC, or ECC off)")
    uncorrected = [(g.index, g.ecc_errors_uncorrected or 0) for g in gpus]
    bad = [f"GPU {i}: {n}" for i, n in uncorrected if n > 0]
    if bad:
        # The card is cordoned until a reset (its gpu-faults entry), not the whole node.
        return _fail(
            CHECK_GPU_ECC,
            f"uncorrectable ECC errors since boot ({', '.join(bad)}): the card is held out "
            "until reset",
            Severity.WARNING,
        )
    corrected = [(g.index, g.ecc_errors_corrected or 0) for g in gpus]
    noisy = [f"GPU {i}: {n}" for i, n in corrected if n >= limits.ecc_corrected_warn]
    if noisy:
        return _fail(
            CHECK_GPU_ECC,
            f"corrected ECC errors >= {limits.ecc_corrected_warn} ({', '.join(noisy)})",
            Severity.WARNING,
        )
    total = sum(n for _, n in corrected)
    return _ok(CHECK_GPU_ECC, f"{len(gpus)} GPUs: 0 uncorrectable, {total} corrected ECC errors")


def check_pcie_link(
    node: NodeTopology, metrics: NodeMetricsReported | None, limits: HealthLimits
) -> CheckResult:
    maxima = {g.index: g for g in node.gpus}
    degraded: list[str] = []
    idle_downshift = 0
    compared = 0
    for reading in metrics.gpus if metrics else []:
        gpu = maxima.get(reading.index)
        if gpu is None:
            continue
        if gpu.pcie_width_max and reading.pcie_width:
            compared += 1
            if reading.pcie_width < gpu.pcie_width_max:
                degraded.append(
                    f"GPU {reading.index} x{reading.pcie_width} of x{gpu.pcie_width_max}"
                )
        if gpu.pcie_generation_max and reading.pcie_generation:
            compared += 1
            if reading.pcie_generation < gpu.pcie_generation_max:
                if reading.utilization_percent >= limits.pcie_busy_utilization:
                    degraded.append(
                        f"GPU {reading.index} Gen{reading.pcie_generation} of "
                        f"Gen{gpu.pcie_generation_max} under load"
                    )
                else:
                    idle_downshift += 1
    if not compared:
        return _ok(CHECK_PCIE_LINK, "no PCIe link state reported")
    if degraded:
        return _fail(
            CHECK_PCIE_LINK, f"degraded PCIe link: {'; '.join(degraded)}", Severity.WARNING
        )
    detail = "every GPU link at its maximum width"
    if idle_downshift:
        detail += f" ({idle_downshift} idle at a lower generation, power saving)"
    return _ok(CHECK_PCIE_LINK, detail)


def check_disk_wear(
    node: NodeTopology, wear: Sequence[DiskWear] | None, limits: HealthLimits
) -> CheckResult:
    if not node.disks:
        return _ok(CHECK_DISK_WEAR, "no local disk")
    if not wear:
        return _ok(CHECK_DISK_WEAR, "disk wear not readable here")
    readable = [w for w in wear if w.readable]
    if not readable:
        reasons = "; ".join(f"{w.disk}: {w.reason}" for w in wear)
        return _ok(CHECK_DISK_WEAR, f"disk wear not readable ({reasons})")
    critical = [
        f"{w.disk} critical warning 0x{w.critical_warning:02x}"
        for w in readable
        if w.critical_warning
    ]
    if critical:
        return _fail(CHECK_DISK_WEAR, "; ".join(critical), Severity.CRITICAL)
    worn = [
        f"{w.disk} {w.percentage_used}% of rated endurance used"
        for w in readable
        if (w.percentage_used or 0) >= limits.disk_wear_warn_percent
    ]
    if worn:
        return _fail(CHECK_DISK_WEAR, "; ".join(worn), Severity.WARNING)
    figures = ", ".join(f"{w.disk} {w.percentage_used}% used" for w in readable)
    unread = len(wear) - len(readable)
    return _ok(CHECK_DISK_WEAR, figures + (f"; {unread} not readable" if unread else ""))


def check_gpu_faults(faults: Sequence[GpuFault] | None) -> CheckResult:
    """A card fault that needs a reboot makes the node NotReady; one the card's reset (or an
    operator) clears is a warning: the scheduler cordons that card only."""
    acted = [f for f in faults or () if f.action is not GpuFaultAction.NONE]
    if not acted:
        return _ok(CHECK_GPU_FAULTS, "no card fault" if faults is not None else "not read")
    detail = "; ".join(f"GPU {f.gpu}: {f.detail or f.kind.value} ({f.action.value})" for f in acted)
    if any(f.action is GpuFaultAction.REBOOT_NODE for f in acted):
        return _fail(CHECK_GPU_FAULTS, detail, Severity.CRITICAL)
    return _fail(CHECK_GPU_FAULTS, detail, Severity.WARNING)


def evaluate(
    node: NodeTopology,
    metrics: NodeMetricsReported | None = None,
    limits: HealthLimits | None = None,
    disk_wear: Sequence[DiskWear] | None = None,
    faults: list[GpuFault] | None = None,
) -> Assessment:
    """Every check, the node's condition and its score: what `crater diagnose --node` shows.
    `faults`: the cards' faults as read (None: not read): the gpu-faults check, only then."""
    limits = limits or HealthLimits()
    results = (
        check_gpus_visible(node, metrics),
        check_gpu_temperature(metrics, limits),
        check_gpu_ecc(metrics, limits),
        check_pcie_link(node, metrics, limits),
        check_memory_pressure(metrics, limits),
        check_disk_present(node),
        check_disk_wear(node, disk_wear, limits),
        check_numa_balance(node, limits),
    ) + ((check_gpu_faults(faults),) if faults is not None else ())
    failed = [r.severity for r in results if not r.passed and r.severity is not None]
    if Severity.CRITICAL in failed:
        condition = NodeCondition.NOT_READY
    elif failed:
        condition = NodeCondition.DEGRADED
    else:
        condition = NodeCondition.READY
    score = max(0, 100 - sum(PENALTY[s] for s in failed))
    return Assessment(node.node_id, condition, score, results, faults)


def health_report(
    node: NodeTopology,
    metrics: NodeMetricsReported | None = None,
    limits: HealthLimits | None = None,
) -> NodeHealthReported:
    """The heartbeat event for a node."""
    return evaluate(node, metrics, limits).report()
