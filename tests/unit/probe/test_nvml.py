from __future__ import annotations

import logging
from pathlib import Path

import pytest

from crater.probe.adapters.nvml import GpuSampler, discover_gpus
from tests.unit.probe.fake_nvml import Card, FakeNvml, bus, hgx, nvlink_pair, pcie_only
from tests.unit.probe.recorded import write_tree


def test_nvswitch_fabric_makes_every_card_a_peer_of_every_other() -> None:
    nvml = FakeNvml(hgx(8))
    gpus = discover_gpus(nvml, root=Path("/nonexistent"))
    assert [g.index for g in gpus] == list(range(8))
    assert gpus[3].nvlink_peers == [0, 1, 2, 4, 5, 6, 7]
    assert all(g.mig_capable for g in gpus)
    assert gpus[0].memory_mb == 81559
    assert gpus[0].model == "NVIDIA H100 80GB HBM3"
    assert gpus[0].pci_bus_id == bus(0)
    assert nvml.initialised == 0  # shut down again


def test_direct_nvlink_pair_is_found_by_remote_bus_id() -> None:
    gpus = discover_gpus(FakeNvml(nvlink_pair()), root=Path("/nonexistent"))
    assert [g.nvlink_peers for g in gpus] == [[1], [0]]
    assert not any(g.mig_capable for g in gpus)


def test_pcie_cards_have_no_peers_and_numa_from_sysfs(tmp_path: Path) -> None:
    write_tree(
        tmp_path,
        {
            "sys/bus/pci/devices/0000:17:00.0/numa_node": "0\n",
            "sys/bus/pci/devices/0000:27:00.0/numa_node": "1\n",
            "sys/bus/pci/devices/0000:37:00.0/numa_node": "-1\n",
        },
    )
    gpus = discover_gpus(FakeNvml(pcie_only(4)), root=tmp_path)
    assert [g.nvlink_peers for g in gpus] == [[], [], [], []]
    assert [g.numa_node for g in gpus] == [0, 1, None, None]


def test_missing_driver_means_no_gpus_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="crater.probe.nvml"):
        assert discover_gpus(FakeNvml([], loads=False)) == []
    assert "no NVIDIA GPU found (NVML: NVML Shared Library Not Found)" in caplog.text


def test_driver_without_cards_says_so(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="crater.probe.nvml"):
        assert discover_gpus(FakeNvml([])) == []
    assert "no NVIDIA GPU found (NVML: driver loaded, 0 devices)" in caplog.text


def test_sampler_reads_load_and_leaves_out_a_lost_card() -> None:
    cards = pcie_only(3)
    cards[1] = Card("NVIDIA GeForce RTX 4090", bus(1), 24564, lost=True)
    cards[2] = Card(
        "NVIDIA GeForce RTX 4090", bus(2), 24564, temperature=None, power_mw=None, used_mb=12000
    )
    sampler = GpuSampler(FakeNvml(cards))
    assert sampler.open()
    readings = sampler.sample()
    assert [r.index for r in readings] == [0, 2]
    assert readings[0].utilization_percent == 37
    assert readings[0].temperature_c == 61
    assert readings[0].power_w == 250
    assert readings[1].memory_used_mb == 12000
    assert readings[1].memory_total_mb == 24564
    assert readings[1].temperature_c is None
    assert readings[1].power_w is None
    sampler.close()
    assert sampler.sample() == []


def test_sampler_without_driver_samples_nothing() -> None:
    sampler = GpuSampler(FakeNvml([], loads=False))
    assert not sampler.open()
    assert sampler.sample() == []


def test_discovery_reads_pcie_maximum_and_mig_mode() -> None:
    cards = hgx(2)
    cards[0].pcie_max = (5, 16)
    cards[1].mig_enabled = True
    gpus = discover_gpus(FakeNvml(cards), root=Path("/nonexistent"))
    assert (gpus[0].pcie_generation_max, gpus[0].pcie_width_max) == (5, 16)
    assert [g.mig_enabled for g in gpus] == [False, True]
    assert gpus[0].pci_root is None  # no sysfs links here
    geforce = discover_gpus(FakeNvml(pcie_only(1)), root=Path("/nonexistent"))[0]
    assert geforce.mig_enabled is None
    assert not geforce.mig_capable


def test_sampler_reads_clocks_link_and_ecc_and_tolerates_their_absence() -> None:
    cards = [*hgx(2), *pcie_only(1)]
    cards[0].pcie_now = (1, 16)  # idle: trained down
    cards[1].ecc = (12, 1)
    cards[2].clocks_mhz = None
    cards[2].pcie_now = None
    sampler = GpuSampler(FakeNvml(cards))
    assert sampler.open()
    first, second, geforce = sampler.sample()
    assert (first.sm_clock_mhz, first.memory_clock_mhz) == (1410, 1593)
    assert (first.pcie_generation, first.pcie_width) == (1, 16)
    assert (first.ecc_errors_corrected, first.ecc_errors_uncorrected) == (0, 0)
    assert (second.ecc_errors_corrected, second.ecc_errors_uncorrected) == (12, 1)
    assert geforce.sm_clock_mhz is None
    assert geforce.pcie_generation is None
    assert geforce.ecc_errors_uncorrected is None
    sampler.close()


def test_sampler_lists_the_processes_on_each_card_with_their_memory() -> None:
    cards = pcie_only(3)
    cards[0].processes = [(4242, 2048 * FakeNvml.MIB), (77, None)]  # None: NVML cannot say
    cards[1].lost = True  # lists nothing; the others are still read
    sampler = GpuSampler(FakeNvml(cards))
    assert sampler.processes() is None  # not open: nothing read, not "nothing runs"
    assert sampler.open()
    assert [(p.gpu, p.pid, p.memory_mb) for p in sampler.processes() or []] == [
        (0, 4242, 2048),
        (0, 77, 0),
    ]
    cards[0].processes = []
    assert sampler.processes() == []
    sampler.close()
