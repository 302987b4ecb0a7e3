from __future__ import annotations

import logging
from pathlib import Path

import pytest

from crater.contracts import Gpu, NodeTopology
from crater.probe.adapters.pci import pci_numa_node, sysfs_bus_id
from crater.probe.adapters.sysfs import (
    VIRTUAL_DISK_PREFIXES,
    discover_cpu,
    discover_disks,
    discover_host,
    discover_local,
    relevant_flags,
)
from crater.probe.domain.topology import fingerprint_of
from tests.unit.probe.recorded import (
    cpuinfo,
    dual_socket_tree,
    single_socket_tree_without_numa,
    write_tree,
)


@pytest.fixture
def dual(tmp_path: Path) -> Path:
    return dual_socket_tree(tmp_path)


def test_dual_socket_cpu_counts_sockets_cores_and_threads(dual: Path) -> None:
    cpu = discover_cpu(dual)
    assert cpu.model == "Intel(R) Xeon(R) Platinum 8480C"
    assert (cpu.sockets, cpu.cores, cpu.threads) == (2, 8, 16)


def test_only_vector_and_matrix_flags_are_kept(dual: Path) -> None:
    flags = discover_cpu(dual).flags
    assert {"avx", "avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "fma"} <= set(flags)
    assert not {"fpu", "sse2", "sha_ni", "aes"} & set(flags)
    assert flags == sorted(flags)


def test_arm_features_line_is_read() -> None:
    assert relevant_flags("fp asimd evtstrm aes sve sve2 bf16 i8mm") == [
        "asimd",
        "bf16",
        "i8mm",
        "sve",
        "sve2",
    ]


def test_two_numa_nodes_with_their_cpus_and_memory(dual: Path) -> None:
    host = discover_host(dual)
    assert [n.id for n in host.numa_nodes] == [0, 1]
    assert host.numa_nodes[0].cpus == [0, 1, 2, 3, 8, 9, 10, 11]
    assert host.numa_nodes[1].cpus == [4, 5, 6, 7, 12, 13, 14, 15]
    assert host.numa_nodes[0].memory_mb == 131928120 // 1024
    assert host.memory_mb == 263856240 // 1024


def test_disks_skip_virtual_devices_and_read_size_kind_model_numa_and_mount(dual: Path) -> None:
    disks = {d.name: d for d in discover_disks(dual)}
    assert sorted(disks) == ["nvme0n1", "sda", "sdb"]  # no loop/zram/dm/ram/sr/hidden/empty
    nvme = disks["nvme0n1"]
    assert nvme.nvme
    assert not nvme.rotational
    assert nvme.capacity_gb == 3840  # 7501476528 sectors x 512 B, decimal GB
    assert nvme.model == "SAMSUNG MZWLJ3T8HBLS-00007"
    assert nvme.numa_node == 1
    assert nvme.mount_path == "/data"
    sda = disks["sda"]
    assert (sda.nvme, sda.rotational, sda.numa_node, sda.capacity_gb) == (False, False, None, 960)
    assert sda.mount_path == "/"  # the shortest of / and /boot/efi
    sdb = disks["sdb"]
    assert sdb.rotational
    assert sdb.mount_path == "/mnt/archive disk"


def test_no_numa_directory_means_one_node_with_every_cpu_and_all_memory(tmp_path: Path) -> None:
    root = single_socket_tree_without_numa(tmp_path)
    host = discover_host(root)
    assert len(host.numa_nodes) == 1
    assert host.numa_nodes[0].id == 0
    assert host.numa_nodes[0].cpus == [0, 1, 2, 3]
    assert host.numa_nodes[0].memory_mb == host.memory_mb == 8192
    # No sysfs CPU topology: /proc/cpuinfo's physical and core ids.
    assert (host.cpu.sockets, host.cpu.cores, host.cpu.threads) == (1, 2, 4)
    assert [d.name for d in host.disks] == ["vda"]


def test_cpuinfo_without_ids_is_one_socket_of_single_thread_cores(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        {
            "proc/cpuinfo": cpuinfo(
                [{"processor": str(i), "Features": "fp asimd sve"} for i in range(8)]
            ),
            "proc/meminfo": "MemTotal: 1048576 kB\n",
        },
    )
    cpu = discover_cpu(root)
    assert (cpu.model, cpu.sockets, cpu.cores, cpu.threads) == ("unknown", 1, 8, 8)
    assert cpu.flags == ["asimd", "sve"]


def test_recorded_tree_becomes_a_topology_with_a_node_id_from_the_short_hostname(
    dual: Path,
) -> None:
    node = discover_local(dual, gpus=[])
    assert isinstance(node, NodeTopology)
    assert node.node_id == "gpu-node-07"
    assert node.hostname == "GPU-Node-07.example.com"
    assert node.labels["crater.ai/node-role"] == "cpu"
    assert node.fingerprint == fingerprint_of(node)
    assert discover_local(dual, gpus=[]).fingerprint == node.fingerprint


def test_gpus_handed_in_are_labelled(dual: Path) -> None:
    gpu = Gpu(index=0, uuid="GPU-1", model="NVIDIA H100 80GB HBM3", memory_mb=81559)
    node = discover_local(dual, gpus=[gpu], node_id="h100-x", pool="training")
    assert node.node_id == "h100-x"
    assert node.pool == "training"
    assert node.labels["crater.ai/gpu-model"] == "h100"
    assert node.labels["crater.ai/gpu-memory"] == "80Gi"


def test_pci_numa_node_from_nvml_bus_id(dual: Path) -> None:
    assert sysfs_bus_id("00000000:B1:00.0") == "0000:b1:00.0"
    assert pci_numa_node(dual, "00000000:B1:00.0") == 1
    assert pci_numa_node(dual, "00000000:17:00.0") == 0
    assert pci_numa_node(dual, "00000000:99:00.0") is None


def test_discovery_of_this_machine(caplog: pytest.LogCaptureFixture) -> None:
    """The real thing: whatever this machine is, CPUs, NUMA, memory and disks come back; with
    no NVIDIA driver it says so and reports no GPUs."""
    with caplog.at_level(logging.INFO, logger="crater.probe.nvml"):
        node = discover_local()
    assert node.cpu.threads >= 1
    assert node.numa_nodes
    assert all(n.cpus for n in node.numa_nodes[:1])
    assert node.memory_mb > 0
    assert all(d.capacity_gb >= 0 for d in node.disks)
    assert not [d for d in node.disks if d.name.startswith(VIRTUAL_DISK_PREFIXES)]
    if node.gpus:
        assert node.labels["crater.ai/node-role"] == "gpu"
        assert node.labels["crater.ai/gpu-count"] == str(len(node.gpus))
    else:
        assert "no NVIDIA GPU found (NVML: " in caplog.text
        assert node.labels["crater.ai/node-role"] == "cpu"
