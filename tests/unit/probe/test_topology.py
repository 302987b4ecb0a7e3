from __future__ import annotations

from typing import Any

import pytest

from crater.contracts import Cpu, Disk, Gpu, NodeTopology, NodeTopologyReported, NumaNode
from crater.contracts.gpus import parse_gpu_product
from crater.probe.domain.cpulist import format_cpulist, parse_cpulist
from crater.probe.domain.topology import (
    build_topology,
    fingerprint,
    fingerprint_of,
    gpu_model_key,
    gpu_model_label,
    node_id_from_hostname,
    node_labels,
)

CPU = Cpu(model="AMD EPYC 7742", sockets=2, cores=128, threads=256, flags=["avx2", "avx"])
NUMA = [
    NumaNode(id=0, cpus=list(range(64)), memory_mb=1024),
    NumaNode(id=1, cpus=list(range(64, 128)), memory_mb=1024),
]
DISKS = [Disk(name="nvme0n1", capacity_gb=3840, rotational=False, nvme=True, mount_path="/")]


def gpus(count: int = 2, model: str = "NVIDIA A100-SXM4-80GB", memory_mb: int = 81920) -> list[Gpu]:
    return [
        Gpu(index=i, uuid=f"GPU-{i}", model=model, memory_mb=memory_mb, nvlink_peers=[1 - i])
        for i in range(count)
    ]


def node(**overrides: Any) -> NodeTopology:
    fields: dict[str, Any] = {
        "node_id": "a100-01",
        "hostname": "a100-01",
        "cpu": CPU,
        "numa_nodes": NUMA,
        "memory_mb": 2048,
        "gpus": gpus(),
        "disks": DISKS,
    }
    fields.update(overrides)
    return build_topology(**fields)


def test_labels_of_a_gpu_node() -> None:
    assert node_labels(gpus(8)) == {
        "crater.ai/node-role": "gpu",
        "crater.ai/gpu-vendor": "nvidia",
        "crater.ai/gpu-model": "a100",
        "crater.ai/gpu-memory": "80Gi",
        "crater.ai/gpu-count": "8",
    }


def test_labels_of_a_cpu_node() -> None:
    assert node_labels([]) == {"crater.ai/node-role": "cpu", "crater.ai/gpu-count": "0"}


def test_mixed_cards_label_the_smallest_memory_and_the_operators_labels_win() -> None:
    mixed = [*gpus(2, "NVIDIA A100-SXM4-80GB", 81920), *gpus(1, "NVIDIA A100-PCIE-40GB", 40960)]
    assert node_labels(mixed)["crater.ai/gpu-memory"] == "40Gi"
    labels = node_labels(mixed, {"crater.ai/gpu-model": "a100-mixed", "rack": "r1"})
    assert labels["crater.ai/gpu-model"] == "a100-mixed"  # the operator's word
    assert labels["crater.ai/gpu-count"] == "3"  # derived, not overridden
    assert labels["rack"] == "r1"


# Cards as nvidia-smi (NVML) and rocm-smi name them, with the MiB they report, and the labels
# an operator would write for them.
@pytest.mark.parametrize(
    ("model", "memory_mb", "vendor", "short", "memory"),
    [
        ("NVIDIA A100-SXM4-80GB", 81920, "nvidia", "a100", "80Gi"),
        ("NVIDIA A100-PCIE-40GB", 40960, "nvidia", "a100", "40Gi"),
        ("NVIDIA H100 80GB HBM3", 81559, "nvidia", "h100", "80Gi"),
        ("NVIDIA H100 NVL", 95830, "nvidia", "h100", "94Gi"),
        ("NVIDIA H200", 143771, "nvidia", "h200", "141Gi"),
        ("NVIDIA GeForce RTX 4090", 24564, "nvidia", "rtx4090", "24Gi"),
        ("NVIDIA RTX A6000", 49140, "nvidia", "rtxa6000", "48Gi"),
        ("NVIDIA L40S", 46068, "nvidia", "l40s", "48Gi"),
        ("NVIDIA A10G", 23028, "nvidia", "a10g", "24Gi"),
        ("Tesla T4", 15360, "nvidia", "t4", "16Gi"),
        ("Tesla V100-SXM2-16GB", 16160, "nvidia", "v100", "16Gi"),
        ("Tesla V100-SXM2-32GB", 32768, "nvidia", "v100", "32Gi"),
        ("AMD Instinct MI300X", 196592, "AMD", "mi300x", "192Gi"),
        ("NVIDIA Future X9", 70000, "nvidia", "future", "68Gi"),  # unknown: as reported
    ],
)
def test_labels_as_operators_write_them(
    model: str, memory_mb: int, vendor: str, short: str, memory: str
) -> None:
    card = Gpu(index=0, uuid="GPU-0", model=model, vendor=vendor, memory_mb=memory_mb)
    labels = node_labels([card])
    assert labels["crater.ai/gpu-model"] == short
    assert labels["crater.ai/gpu-memory"] == memory
    assert labels["crater.ai/gpu-vendor"] == vendor.lower()


@pytest.mark.parametrize("product", ["a100-pcie-40gb", "A100", "h100-sxm-80gb", "rtx-4090", "t4"])
def test_the_model_label_is_the_model_of_the_products_callers_name(product: str) -> None:
    """AllData's `gpu.type: a100-pcie-40gb` and a selector `crater.ai/gpu-model: a100` name
    the same cards."""
    assert gpu_model_key(product) == parse_gpu_product(product).model


@pytest.mark.parametrize(
    ("model", "label"),
    [
        ("NVIDIA GeForce RTX 4090", "GeForce-RTX-4090"),
        ("Tesla V100-SXM2-32GB", "Tesla-V100-SXM2-32GB"),
        ("NVIDIA H100 80GB HBM3", "H100-80GB-HBM3"),
    ],
)
def test_gpu_model_labels_are_label_values(model: str, label: str) -> None:
    assert gpu_model_label(model) == label


@pytest.mark.parametrize(
    ("hostname", "node_id"),
    [
        ("gpu01.cluster.example.com", "gpu01"),
        ("GPU_Node 7", "gpu_node-7"),
        ("-weird-", "weird"),
        ("", "node"),
        ("x" * 80, "x" * 63),
    ],
)
def test_node_id_from_hostname_fits_the_node_id_pattern(hostname: str, node_id: str) -> None:
    assert node_id_from_hostname(hostname) == node_id


def test_fingerprint_is_stable_across_builds_events_and_listing_order() -> None:
    first = node()
    again = node(gpus=list(reversed(gpus())), hostname="renamed", pool="other")
    assert first.fingerprint == again.fingerprint
    assert len(first.fingerprint) == 64
    flags_reordered = CPU.model_copy(update={"flags": ["avx", "avx2"]})
    assert node(cpu=flags_reordered).fingerprint == first.fingerprint
    # Two reports of the same topology: different event ids and times, same fingerprint.
    a = NodeTopologyReported(node=first)
    b = NodeTopologyReported(node=first)
    assert a.event_id != b.event_id
    assert a.node.fingerprint == b.node.fingerprint == fingerprint_of(a.node)


def test_fingerprint_changes_with_the_hardware_but_not_mount_points() -> None:
    base = node().fingerprint
    assert node(gpus=gpus(1)).fingerprint != base
    assert node(memory_mb=4096).fingerprint != base
    swapped = [g.model_copy(update={"uuid": "GPU-new"}) if g.index == 0 else g for g in gpus()]
    assert node(gpus=swapped).fingerprint != base
    remounted = [d.model_copy(update={"mount_path": "/data"}) for d in DISKS]
    assert node(disks=remounted).fingerprint == base
    assert fingerprint(CPU, NUMA, 2048, gpus(), DISKS) == base


def test_cpulist_round_trip() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpulist("") == []
    assert format_cpulist([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    assert format_cpulist([]) == ""
