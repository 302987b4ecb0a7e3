"""Local CPU-per-NUMA-node and disk IO sampling."""

from __future__ import annotations

from collections import namedtuple
from pathlib import Path

from crater.contracts import NumaNode
from crater.probe.adapters.host import (
    MIB,
    HostSampler,
    disk_rates,
    numa_utilization,
    read_in_flight,
)

Io = namedtuple("Io", "read_count write_count read_bytes write_bytes")


def test_numa_utilization_averages_each_nodes_cpus() -> None:
    nodes = [
        NumaNode(id=0, cpus=[0, 1], memory_mb=1),
        NumaNode(id=1, cpus=[2, 3], memory_mb=1),
        NumaNode(id=2, cpus=[], memory_mb=1),  # memory only (CXL)
        NumaNode(id=3, cpus=[99], memory_mb=1),  # offline CPUs: psutil does not list them
    ]
    assert numa_utilization([10.0, 30.0, 100.0, 90.0], nodes) == {0: 20.0, 1: 95.0}


def test_disk_rates_and_queue_depth(tmp_path: Path) -> None:
    before = Io(100, 50, 10 * MIB, 4 * MIB)
    after = Io(300, 150, 30 * MIB, 8 * MIB)
    rates = disk_rates(before, after, 2.0, "nvme0n1", 3)
    assert (rates.read_mb_s, rates.write_mb_s) == (10.0, 2.0)
    assert (rates.read_iops, rates.write_iops) == (100.0, 50.0)
    assert rates.in_flight == 3
    # A counter that went backwards (reset) counts as no IO.
    assert disk_rates(after, before, 2.0, "sda", None).read_iops == 0
    (tmp_path / "nvme0n1").mkdir()
    (tmp_path / "nvme0n1" / "inflight").write_text("       4        2\n")
    assert read_in_flight(tmp_path, "nvme0n1") == 6
    assert read_in_flight(tmp_path, "sdz") is None


def test_host_sampler_on_this_machine() -> None:
    ticks = iter([100.0, 102.0])
    sampler = HostSampler(Path("/"), clock=lambda: next(ticks))
    names = list(sampler._io)
    cpus = len(sampler.numa_cpu([NumaNode(id=0, cpus=list(range(512)), memory_mb=1)]))
    assert cpus == 1
    disks = sampler.disks([*names, "not-a-disk"])
    assert [d.name for d in disks] == names
    assert all(d.read_mb_s >= 0 and d.write_iops >= 0 for d in disks)
