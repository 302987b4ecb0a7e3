from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from crater.contracts import NodeTopology
from crater.probe.domain.dot import nvlink_pairs, topology_to_dot
from crater.probe.sim.fleet import load_fleet


@pytest.fixture(scope="module")
def fleet() -> dict[str, NodeTopology]:
    return {n.node_id: n for n in load_fleet(None, seed=3)}


def edges(dot: str, label: str) -> list[tuple[str, str]]:
    return re.findall(rf'"(\w+)" -- "(\w+)" \[label="{label}"', dot)


def test_dgx_shows_gpus_numa_nvlink_pcie_memory_and_disks(fleet: dict[str, NodeTopology]) -> None:
    dot = topology_to_dot(fleet["a100-01"])
    assert dot.startswith('graph "a100-01" {')
    assert dot.rstrip().endswith("}")
    assert dot.count("{") == dot.count("}")
    assert 'subgraph "cluster_numa0"' in dot
    assert 'subgraph "cluster_numa1"' in dot
    # 8 cards all-to-all (28 pairs) meet at one NVSwitch fabric vertex.
    assert len(nvlink_pairs(fleet["a100-01"])) == 28
    assert edges(dot, "NVLink") == [(f"gpu{i}", "nvswitch") for i in range(8)]
    pcie = edges(dot, "PCIe")
    assert ("numa0", "gpu0") in pcie
    assert ("numa1", "gpu7") in pcie
    assert ("numa1", "disk_nvme4n1") in pcie
    assert edges(dot, "DDR") == [("numa0", "mem0"), ("numa1", "mem1")]
    assert edges(dot, "inter-socket") == [("numa0", "numa1")]
    assert "A100-SXM4-80GB" in dot
    assert "MIG capable" in dot
    assert "1024 GiB" in dot


def test_pcie_only_node_has_no_nvlink_and_a_pair_has_one(fleet: dict[str, NodeTopology]) -> None:
    assert edges(topology_to_dot(fleet["rtx4090-01"]), "NVLink") == []
    assert nvlink_pairs(fleet["v100-01"]) == [(0, 1)]
    assert edges(topology_to_dot(fleet["v100-01"]), "NVLink") == [("gpu0", "gpu1")]


def test_cpu_node_and_unknown_numa_devices(fleet: dict[str, NodeTopology]) -> None:
    cpu = fleet["cpu-01"]
    dot = topology_to_dot(cpu)
    assert "gpu" not in re.sub(r'label="[^"]*"', "", dot)
    assert ("numa0", "disk_sda") in edges(dot, "SATA/SAS")
    stray = cpu.model_copy(
        update={"disks": [d.model_copy(update={"numa_node": None}) for d in cpu.disks]}
    )
    stray_dot = topology_to_dot(stray)
    assert '"host" [label="PCIe root (NUMA unknown)"' in stray_dot
    assert ("host", "disk_nvme0n1") in edges(stray_dot, "PCIe")


def test_quotes_in_names_are_escaped(fleet: dict[str, NodeTopology]) -> None:
    node = fleet["t4-01"]
    odd = node.model_copy(update={"cpu": node.cpu.model_copy(update={"model": 'Xeon "Gold"'})})
    assert 'Xeon \\"Gold\\"' in topology_to_dot(odd)


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz not installed")
def test_graphviz_accepts_it(fleet: dict[str, NodeTopology]) -> None:
    for node in fleet.values():
        subprocess.run(
            ["dot", "-Tsvg"],
            input=topology_to_dot(node),
            text=True,
            check=True,
            capture_output=True,
        )


def test_a_card_shows_its_link_and_its_measured_bandwidth(fleet: dict[str, NodeTopology]) -> None:
    node = fleet["a100-01"]
    gpu = node.gpus[0]
    assert gpu.pcie_generation_max
    assert gpu.pcie_width_max
    link = f"PCIe gen{gpu.pcie_generation_max} x{gpu.pcie_width_max}"
    unmeasured = gpu.model_copy(update={"pcie_bandwidth_gbps": None})
    dot = topology_to_dot(node.model_copy(update={"gpus": [unmeasured]}))
    assert link + "\\n" in dot
    assert "measured" not in dot
    # as the probe reported an H200's link (benchmarks/results/device_h200/topology.json)
    measured = gpu.model_copy(update={"pcie_bandwidth_gbps": 55.17})
    dot = topology_to_dot(node.model_copy(update={"gpus": [measured]}))
    assert f"{link}, 55.2 GB/s measured" in dot
