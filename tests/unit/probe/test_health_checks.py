"""The checks that need NVML's ECC counters and PCIe link state, and disk wear."""

from __future__ import annotations

from crater.contracts import (
    Cpu,
    Disk,
    Gpu,
    GpuMetrics,
    NodeCondition,
    NodeMetricsReported,
    NodeTopology,
    NumaNode,
)
from crater.probe.domain.health import Assessment, CheckResult, DiskWear, evaluate
from crater.probe.domain.topology import build_topology


def node(disks: list[Disk] | None = None) -> NodeTopology:
    return build_topology(
        node_id="gpu-01",
        hostname="gpu-01",
        cpu=Cpu(model="x", sockets=1, cores=8, threads=16),
        numa_nodes=[NumaNode(id=0, cpus=list(range(16)), memory_mb=65536)],
        memory_mb=65536,
        gpus=[
            Gpu(
                index=i,
                uuid=f"GPU-{i}",
                model="NVIDIA A100-SXM4-80GB",
                memory_mb=81920,
                pcie_generation_max=4,
                pcie_width_max=16,
            )
            for i in range(2)
        ],
        disks=disks
        if disks is not None
        else [Disk(name="nvme0n1", capacity_gb=3840, rotational=False, nvme=True)],
    )


def sample(
    *,
    ecc: tuple[int, int] | None = (0, 0),
    link: tuple[int, int] = (4, 16),
    utilization: float = 90.0,
) -> NodeMetricsReported:
    return NodeMetricsReported(
        node_id="gpu-01",
        cpu_utilization_percent=10,
        memory_used_mb=1024,
        memory_total_mb=65536,
        gpus=[
            GpuMetrics(
                index=i,
                utilization_percent=utilization,
                memory_used_mb=1024,
                memory_total_mb=81920,
                pcie_generation=link[0] if i == 1 else 4,
                pcie_width=link[1] if i == 1 else 16,
                ecc_errors_corrected=None if ecc is None else (ecc[0] if i == 1 else 0),
                ecc_errors_uncorrected=None if ecc is None else (ecc[1] if i == 1 else 0),
            )
            for i in range(2)
        ],
    )


def result(
    topology: NodeTopology,
    metrics: NodeMetricsReported,
    name: str,
    disk_wear: list[DiskWear] | None = None,
) -> tuple[Assessment, CheckResult]:
    assessment = evaluate(topology, metrics, disk_wear=disk_wear)
    return assessment, {r.name: r for r in assessment.results}[name]


def test_clean_ecc_passes_with_the_counts() -> None:
    assessment, ecc = result(node(), sample(ecc=(3, 0)), "gpu-ecc")
    assert ecc.passed
    assert ecc.detail == "2 GPUs: 0 uncorrectable, 3 corrected ECC errors"
    assert assessment.condition is NodeCondition.READY


def test_an_uncorrectable_ecc_error_degrades_the_node_and_the_card_goes_out() -> None:
    assessment, ecc = result(node(), sample(ecc=(0, 2)), "gpu-ecc")
    assert not ecc.passed
    assert "GPU 1: 2" in ecc.detail
    # The card is cordoned by its gpu-faults entry; the node's other cards stay usable.
    assert assessment.condition is NodeCondition.DEGRADED


def test_many_corrected_errors_degrade() -> None:
    assessment, ecc = result(node(), sample(ecc=(5000, 0)), "gpu-ecc")
    assert not ecc.passed
    assert assessment.condition is NodeCondition.DEGRADED


def test_cards_without_ecc_pass_saying_so() -> None:
    _, ecc = result(node(), sample(ecc=None), "gpu-ecc")
    assert ecc.passed
    assert "no ECC counters" in ecc.detail


def test_a_link_at_half_width_is_degraded() -> None:
    assessment, link = result(node(), sample(link=(4, 8)), "pcie-link")
    assert not link.passed
    assert link.detail == "degraded PCIe link: GPU 1 x8 of x16"
    assert assessment.condition is NodeCondition.DEGRADED
    assert assessment.score == 85


def test_an_idle_card_at_a_lower_generation_is_power_saving_not_a_fault() -> None:
    _, link = result(node(), sample(link=(1, 16), utilization=0.0), "pcie-link")
    assert link.passed
    assert "1 idle at a lower generation" in link.detail


def test_a_busy_card_at_a_lower_generation_is_degraded() -> None:
    _, link = result(node(), sample(link=(3, 16), utilization=95.0), "pcie-link")
    assert not link.passed
    assert "GPU 1 Gen3 of Gen4 under load" in link.detail


def test_disk_wear_where_readable_and_the_reason_where_not() -> None:
    topology = node()
    _, unread = result(
        topology, sample(), "disk-wear", disk_wear=[DiskWear("nvme0n1", reason="needs root")]
    )
    assert unread.passed
    assert unread.detail == "disk wear not readable (nvme0n1: needs root)"
    _, fine = result(topology, sample(), "disk-wear", disk_wear=[DiskWear("nvme0n1", 7, 100, 0)])
    assert fine.passed
    assert fine.detail == "nvme0n1 7% used"
    worn, bad = result(topology, sample(), "disk-wear", disk_wear=[DiskWear("nvme0n1", 93, 40, 0)])
    assert not bad.passed
    assert worn.condition is NodeCondition.DEGRADED
    failing, warned = result(
        topology, sample(), "disk-wear", disk_wear=[DiskWear("nvme0n1", 20, 5, 0x01)]
    )
    assert "critical warning 0x01" in warned.detail
    assert failing.condition is NodeCondition.NOT_READY
    _, none = result(node(disks=[]), sample(), "disk-wear")
    assert none.passed
    assert none.detail == "no local disk"
