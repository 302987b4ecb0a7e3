"""PCIe locality: the root complex of every GPU and NVMe disk, from a recorded 8-GPU box."""

from __future__ import annotations

from pathlib import Path

from crater.probe.adapters.nvml import discover_gpus
from crater.probe.adapters.pci import pci_root, root_complex_of
from crater.probe.adapters.sysfs import discover_local
from crater.probe.domain.topology import fingerprint_of
from tests.unit.probe.fake_nvml import SWITCH_BUS, Card, FakeNvml
from tests.unit.probe.recorded import HGX_GPUS, dual_socket_8gpu_tree


def hgx_cards() -> list[Card]:
    return [
        Card(
            "NVIDIA H100 80GB HBM3",
            f"0000{bus_id}".upper(),  # NVML spells the domain with 8 digits
            81559,
            [(SWITCH_BUS, True)] * 18,
            mig=True,
            pcie_max=(5, 16),
        )
        for bus_id, _ in HGX_GPUS
    ]


def test_root_complex_comes_from_the_real_path(tmp_path: Path) -> None:
    tree = dual_socket_8gpu_tree(tmp_path)
    assert pci_root(tree, "00000000:9A:00.0") == "pci0000:97"
    assert root_complex_of(tree / "sys/block/nvme0n1") == "pci0000:15"
    assert root_complex_of(tree / "sys/block/loop0") is None
    assert pci_root(tree, "0000:ff:00.0") is None  # no such device
    assert root_complex_of(tmp_path / "nowhere") is None


def test_dual_socket_8gpu_box_knows_which_gpus_and_disks_share_a_root_complex(
    tmp_path: Path,
) -> None:
    tree = dual_socket_8gpu_tree(tmp_path)
    gpus = discover_gpus(FakeNvml(hgx_cards()), root=tree)
    node = discover_local(tree, gpus=gpus)
    assert [g.numa_node for g in node.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [g.pci_root for g in node.gpus] == [bridge for _, bridge in HGX_GPUS]
    assert all(g.pcie_generation_max == 5 and g.pcie_width_max == 16 for g in node.gpus)
    assert all(g.mig_capable and g.mig_enabled is False for g in node.gpus)
    disks = {d.name: d for d in node.disks}
    assert set(disks) == {"nvme0n1", "nvme1n1", "sda"}  # loop0 is virtual
    assert disks["nvme0n1"].pci_root == node.gpus[0].pci_root == "pci0000:15"
    assert disks["nvme1n1"].pci_root == node.gpus[4].pci_root == "pci0000:97"
    assert (disks["nvme0n1"].numa_node, disks["nvme1n1"].numa_node) == (0, 1)
    assert disks["nvme0n1"].model == "SAMSUNG MZQL23T8HCLS-00A07"
    assert disks["nvme1n1"].mount_path == "/raid1"
    assert disks["sda"].pci_root == "pci0000:00"
    assert disks["sda"].mount_path == "/"
    assert node.fingerprint == fingerprint_of(node)
    # The same box discovered again: the same fingerprint.
    again = discover_local(tree, gpus=discover_gpus(FakeNvml(hgx_cards()), root=tree))
    assert again.fingerprint == node.fingerprint


def test_mig_turned_on_changes_the_fingerprint(tmp_path: Path) -> None:
    tree = dual_socket_8gpu_tree(tmp_path)
    before = discover_local(tree, gpus=discover_gpus(FakeNvml(hgx_cards()), root=tree))
    cards = hgx_cards()
    cards[3].mig_enabled = True
    after = discover_local(tree, gpus=discover_gpus(FakeNvml(cards), root=tree))
    assert after.gpus[3].mig_enabled is True
    assert after.fingerprint != before.fingerprint
