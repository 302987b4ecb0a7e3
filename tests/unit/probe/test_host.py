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


Timed = namedtuple("Timed", "read_count write_count read_bytes write_bytes read_time write_time")


def test_disk_wait_is_the_ms_each_completed_io_spent_queued_and_served() -> None:
    """iostat's await: the data transfer wait (crater_data_transfer_wait_time_ms)."""
    before = Timed(100, 50, 0, 0, 1_000, 500)
    after = Timed(300, 150, 0, 0, 1_600, 900)  # 300 I/Os done, 1000 ms spent on them
    assert disk_rates(before, after, 2.0, "nvme0n1", 0).wait_ms == round(1000 / 300, 3)
    assert disk_rates(before, before, 2.0, "nvme0n1", 0).wait_ms is None  # none completed
    assert disk_rates(Io(1, 1, 0, 0), Io(2, 2, 0, 0), 1.0, "sda", 0).wait_ms == 0.0  # no times


def _traffic(root: Path, counts: dict[int, str]) -> None:
    for domain, text in counts.items():
        where = root / "sys" / "fs" / "resctrl" / "mon_data" / f"mon_L3_{domain:02d}"
        where.mkdir(parents=True, exist_ok=True)
        (where / "mbm_total_bytes").write_text(text)


def test_memory_bandwidth_per_numa_node_from_resctrl(tmp_path: Path) -> None:
    nodes = [NumaNode(id=0, cpus=[0], memory_mb=1), NumaNode(id=1, cpus=[1], memory_mb=1)]
    _traffic(tmp_path, {0: "1000000000\n", 1: "0\n"})
    ticks = iter([10.0, 12.0, 14.0])
    sampler = HostSampler(tmp_path, clock=lambda: next(ticks))
    _traffic(tmp_path, {0: "21000000000\n", 1: "4000000000\n"})
    assert sampler.memory_bandwidth(nodes) == {0: 10.0, 1: 2.0}  # GB/s over the 2 s
    # A domain whose counter cannot be read ("Unavailable"): not measured, never a guess.
    _traffic(tmp_path, {1: "Unavailable\n"})
    assert sampler.memory_bandwidth(nodes) == {}


def test_memory_bandwidth_is_not_attributed_when_domains_and_numa_nodes_differ(
    tmp_path: Path,
) -> None:
    """Two NUMA nodes per socket (sub-NUMA clustering) share one L3 domain: not split."""
    nodes = [NumaNode(id=i, cpus=[i], memory_mb=1) for i in range(4)]
    _traffic(tmp_path, {0: "0", 1: "0"})
    ticks = iter([0.0, 1.0])
    sampler = HostSampler(tmp_path, clock=lambda: next(ticks))
    assert sampler.memory_bandwidth(nodes) == {}
    # No resctrl at all: nothing measured.
    assert HostSampler(tmp_path / "none", clock=lambda: 0.0).memory_bandwidth(nodes) == {}
