"""The measurements on tiny bounds: structure and positivity only, never timings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from crater.contracts import Cpu, Disk, NumaNode
from crater.probe.adapters import measure
from crater.probe.adapters.measure import (
    Bounds,
    disk_random_reads,
    disk_random_reads_at_depth,
    measure_node,
    memory_bandwidth,
    memory_bandwidth_all_cores,
)
from crater.probe.domain.topology import build_topology, fingerprint_of

TINY = Bounds(
    memory_buffer_mb=1,
    memory_seconds=0.01,
    memory_all_cores_buffer_mb=1,
    memory_all_cores_total_mb=1,
    disk_file_mb=1,
    disk_seconds=0.02,
)
PM1733 = "SAMSUNG MZWLJ3T8HBLS-00007"  # rated 1,450,000 (domain/datasheets.py)


def test_memory_bandwidth_pinned_to_a_node_restores_the_affinity() -> None:
    before = os.sched_getaffinity(0)
    result = memory_bandwidth(sorted(before), buffer_mb=1, seconds=0.01, numa_node=0)
    assert result.gbps > 0
    assert result.copies >= 1
    assert os.sched_getaffinity(0) == before


def test_memory_bandwidth_refuses_a_node_whose_cpus_are_not_ours() -> None:
    with pytest.raises(ValueError, match="NUMA node 3"):
        memory_bandwidth([100_000], buffer_mb=1, seconds=0.01, numa_node=3)


def test_all_core_bandwidth_runs_one_process_per_usable_cpu() -> None:
    before = os.sched_getaffinity(0)
    result = memory_bandwidth_all_cores(
        [*sorted(before), 100_000], buffer_mb=1, total_mb=1, seconds=0.05, numa_node=0
    )
    assert result.processes == len(before)  # the CPU outside our cpuset gets none
    assert result.gbps > 0
    assert result.seconds >= 0.05  # the span from the first start to the last end
    assert os.sched_getaffinity(0) == before


def test_all_core_bandwidth_refuses_a_node_whose_cpus_are_not_ours() -> None:
    with pytest.raises(ValueError, match="NUMA node 2"):
        memory_bandwidth_all_cores([100_000], buffer_mb=1, seconds=0.01, numa_node=2)


def _o_direct(directory: Path) -> bool:
    """Whether the filesystem of `directory` takes O_DIRECT (tmpfs does not)."""
    probe = directory / ".o-direct"
    probe.write_bytes(b"\0" * 4096)
    try:
        fd = measure._open_direct(str(probe))
    finally:
        probe.unlink()
    if fd is None:
        return False
    os.close(fd)
    return True


def test_reads_at_depth_keep_several_in_flight_and_leave_no_file_behind(tmp_path: Path) -> None:
    if not _o_direct(tmp_path):
        pytest.skip("this filesystem refuses O_DIRECT")
    result = disk_random_reads_at_depth(tmp_path, file_mb=1, seconds=0.05, depth=4, disk="vda")
    assert (result.depth, result.disk, result.path) == (4, "vda", str(tmp_path))
    assert result.reads >= 4
    assert result.iops > 0
    assert list(tmp_path.iterdir()) == []


def test_reads_at_depth_need_o_direct(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Buffered, the page cache would answer: no figure rather than a false one."""
    monkeypatch.setattr(measure, "_open_direct", lambda path: None)
    with pytest.raises(OSError, match="O_DIRECT"):
        disk_random_reads_at_depth(tmp_path, file_mb=1, seconds=0.02)
    assert list(tmp_path.iterdir()) == []


def test_disk_random_reads_leave_no_file_behind(tmp_path: Path) -> None:
    result = disk_random_reads(tmp_path, file_mb=1, seconds=0.02, disk="vda")
    assert result.reads >= 1
    assert result.iops > 0
    assert 0 < result.latency_us_p50 <= result.latency_us_p99
    assert result.disk == "vda"
    assert result.path == str(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_measure_node_fills_what_it_can_and_says_why_not_the_rest(tmp_path: Path) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    (tmp_path / "data").mkdir()
    node = build_topology(
        node_id="box",
        hostname="box",
        cpu=Cpu(model="x", sockets=1, cores=len(cpus), threads=len(cpus)),
        numa_nodes=[
            NumaNode(id=0, cpus=cpus, memory_mb=1024),
            NumaNode(id=1, cpus=[], memory_mb=1024),  # CXL / HBM: memory only
            NumaNode(id=2, cpus=[100_000], memory_mb=1024),  # outside our cpuset
        ],
        memory_mb=3072,
        disks=[
            Disk(name="nvme0n1", capacity_gb=1, rotational=False, nvme=True, mount_path="/data"),
            Disk(name="sdb", capacity_gb=1, rotational=True, nvme=False),
            Disk(name="sdc", capacity_gb=1, rotational=True, nvme=False, mount_path="/gone"),
        ],
    )
    lines: list[str] = []
    measured = measure_node(node, root=tmp_path, bounds=TINY, progress=lines.append)
    assert set(measured.memory) == set(measured.memory_all_cores) == {0}
    assert set(measured.disks) == {"nvme0n1"}
    at_depth = "disk nvme0n1 at depth 32"
    direct = _o_direct(tmp_path / "data")
    assert set(measured.disks_at_depth) == ({"nvme0n1"} if direct else set())
    assert set(measured.skipped) - {at_depth} == {
        "NUMA 1 memory",
        "NUMA 2 memory",
        "disk sdb",
        "disk sdc",
    }
    assert measured.skipped["disk sdb"] == "not mounted"
    assert lines
    assert any("nvme0n1" in line and "IOPS" in line for line in lines)

    filled = measured.apply(node)
    assert filled.numa_nodes[0].memory_bandwidth_gbps is not None
    assert filled.numa_nodes[0].memory_bandwidth_gbps > 0
    assert filled.numa_nodes[0].memory_bandwidth_gbps_all_cores is not None
    assert filled.numa_nodes[0].memory_bandwidth_gbps_all_cores > 0
    assert filled.numa_nodes[1].memory_bandwidth_gbps is None
    assert filled.numa_nodes[1].memory_bandwidth_gbps_all_cores is None
    disk = filled.disks[0]
    assert disk.random_read_iops is not None
    assert disk.random_read_iops > 0
    assert disk.read_latency_us_p50 is not None
    assert disk.read_latency_us_p99 is not None
    if direct:
        assert disk.random_read_iops_at_depth_source == "measured"
        assert disk.random_read_iops_at_depth is not None
        assert disk.random_read_iops_at_depth > 0
    assert filled.disks[1].random_read_iops is None
    # Measurements are not hardware: the fingerprint holds.
    assert filled.fingerprint == node.fingerprint == fingerprint_of(filled)
    assert list((tmp_path / "data").iterdir()) == []


def test_a_rated_disk_keeps_its_datasheet_figure_and_is_not_measured_at_depth(
    tmp_path: Path,
) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    (tmp_path / "data").mkdir()
    node = build_topology(
        node_id="box",
        hostname="box",
        cpu=Cpu(model="x", sockets=1, cores=len(cpus), threads=len(cpus)),
        numa_nodes=[NumaNode(id=0, cpus=cpus, memory_mb=1024)],
        memory_mb=1024,
        disks=[
            Disk(
                name="nvme0n1",
                model=PM1733,
                capacity_gb=3840,
                rotational=False,
                nvme=True,
                mount_path="/data",
            )
        ],
    )
    assert node.disks[0].random_read_iops_at_depth_source == "datasheet"
    lines: list[str] = []
    measured = measure_node(node, root=tmp_path, bounds=TINY, progress=lines.append)
    assert measured.disks_at_depth == {}
    assert any("1,450,000 IOPS from the datasheet" in line for line in lines)
    disk = measured.apply(node).disks[0]
    assert disk.random_read_iops is not None  # QD1 still measured: latency_us_max needs it
    assert (disk.random_read_iops_at_depth, disk.random_read_iops_at_depth_source) == (
        1_450_000,
        "datasheet",
    )
