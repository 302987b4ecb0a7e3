"""This machine as /sys and /proc describe it: CPUs, NUMA nodes, memory and disks.

Every path is read under `root`, so a recorded tree (a test's tmp_path, or the host's
filesystem mounted into a container at /host) is discovered exactly like the live one.
"""

from __future__ import annotations

import logging
import os
import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from crater.contracts import Cpu, Disk, Gpu, NodeTopology, NumaNode, Taint
from crater.probe.adapters.nvml import discover_gpus
from crater.probe.adapters.pci import root_complex_of
from crater.probe.domain.cpulist import parse_cpulist
from crater.probe.domain.topology import build_topology, node_id_from_hostname

log = logging.getLogger("crater.probe.sysfs")

# Vector and matrix extensions decide which kernels a task can run (CpuRequirement.avx_support).
RELEVANT_FLAG_PREFIXES = ("avx", "amx")
RELEVANT_FLAGS = frozenset({"fma", "f16c", "sse4_2", "asimd", "sve", "sve2", "bf16", "i8mm"})
# Block devices that are not hardware: loopback, RAM disks, device-mapper, software RAID,
# optical and floppy drives, network block devices.
VIRTUAL_DISK_PREFIXES = ("loop", "ram", "zram", "dm-", "md", "sr", "fd", "nbd", "rbd")
SECTOR_BYTES = 512  # /sys/block/*/size counts 512-byte sectors whatever the device's own
_NODE_DIR = re.compile(r"^node(\d+)$")
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class Host:
    """Everything but the GPUs."""

    hostname: str
    cpu: Cpu
    numa_nodes: list[NumaNode]
    memory_mb: int
    disks: list[Disk]


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


def _read_int(path: Path) -> int | None:
    text = _read(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _cpuinfo_blocks(root: Path) -> list[dict[str, str]]:
    text = _read(root / "proc/cpuinfo") or ""
    blocks: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if current:
                blocks.append(current)
                current = {}
            continue
        key, _, value = line.partition(":")
        current.setdefault(key.strip().lower(), value.strip())
    if current:
        blocks.append(current)
    return blocks


def memory_total_mb(root: Path) -> int:
    """MemTotal from /proc/meminfo, in MiB."""
    for line in (_read(root / "proc/meminfo") or "").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    log.warning("no MemTotal in %s", root / "proc/meminfo")
    return 0


def online_cpus(root: Path) -> list[int]:
    online = _read(root / "sys/devices/system/cpu/online")
    if online:
        return parse_cpulist(online)
    processors = [b["processor"] for b in _cpuinfo_blocks(root) if "processor" in b]
    if processors:
        return sorted(int(p) for p in processors if p.isdigit())
    return list(range(os.cpu_count() or 1))


def relevant_flags(flags: str) -> list[str]:
    return sorted(
        {f for f in flags.split() if f in RELEVANT_FLAGS or f.startswith(RELEVANT_FLAG_PREFIXES)}
    )


def _sysfs_sockets_and_cores(root: Path, cpus: Sequence[int]) -> tuple[int, int] | None:
    base = root / "sys/devices/system/cpu"
    sockets: set[int] = set()
    cores: set[tuple[int, str]] = set()
    for cpu in cpus:
        topology = base / f"cpu{cpu}/topology"
        package = _read_int(topology / "physical_package_id")
        # The set of hardware threads sharing a core names the core, whatever its core_id
        # (core ids repeat across the dies of one package).
        siblings = _read(topology / "core_cpus_list") or _read(topology / "thread_siblings_list")
        if package is None or siblings is None:
            return None
        sockets.add(package)
        cores.add((package, siblings))
    return (len(sockets), len(cores)) if cpus else None


def _cpuinfo_sockets_and_cores(blocks: Sequence[Mapping[str, str]]) -> tuple[int, int] | None:
    packages = {b["physical id"] for b in blocks if "physical id" in b}
    cores = {
        (b["physical id"], b["core id"]) for b in blocks if {"physical id", "core id"} <= b.keys()
    }
    return (len(packages), len(cores)) if packages and cores else None


def discover_cpu(root: Path) -> Cpu:
    blocks = _cpuinfo_blocks(root)
    cpus = online_cpus(root)
    first = next((b for b in blocks if "processor" in b), blocks[0] if blocks else {})
    model = first.get("model name") or first.get("cpu model") or first.get("hardware") or "unknown"
    threads = len(cpus) or 1
    # sysfs first; /proc/cpuinfo's ids where it is missing (old kernels, some containers);
    # else one socket of single-threaded cores.
    sockets, cores = (
        _sysfs_sockets_and_cores(root, cpus) or _cpuinfo_sockets_and_cores(blocks) or (1, threads)
    )
    return Cpu(
        model=model,
        sockets=sockets,
        cores=cores,
        threads=threads,
        flags=relevant_flags(first.get("flags") or first.get("features") or ""),
    )


def discover_numa(root: Path, cpus: Sequence[int], memory_mb: int) -> list[NumaNode]:
    """NUMA nodes with their CPUs and memory; a kernel without NUMA support means one node."""
    base = root / "sys/devices/system/node"
    nodes: list[NumaNode] = []
    if base.is_dir():
        for entry in sorted(base.iterdir()):
            match = _NODE_DIR.match(entry.name)
            if not match:
                continue
            node_memory = 0
            for line in (_read(entry / "meminfo") or "").splitlines():
                # "Node 0 MemTotal:       131927724 kB"
                parts = line.split()
                if len(parts) >= 4 and parts[2] == "MemTotal:":
                    node_memory = int(parts[3]) // 1024
                    break
            nodes.append(
                NumaNode(
                    id=int(match.group(1)),
                    cpus=parse_cpulist(_read(entry / "cpulist") or ""),
                    memory_mb=node_memory,
                )
            )
    if not nodes:
        return [NumaNode(id=0, cpus=list(cpus), memory_mb=memory_mb)]
    return sorted(nodes, key=lambda n: n.id)


def _numa_of(device: Path) -> int | None:
    # NVMe namespaces hang off the controller, whose parent is the PCI function.
    for path in (device / "numa_node", device / "device/numa_node"):
        value = _read_int(path)
        if value is not None:
            return value if value >= 0 else None
    return None


def _unescape(path: str) -> str:
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), path)


def _mounts(root: Path, block: Path, disks: Sequence[str]) -> dict[str, str]:
    """The shortest mount point of each disk or one of its partitions (`/` wins)."""
    found: dict[str, str] = {}
    for line in (_read(root / "proc/mounts") or "").splitlines():
        parts = line.split()
        if len(parts) < 2 or not parts[0].startswith("/dev/"):
            continue
        device, mount = parts[0].removeprefix("/dev/"), _unescape(parts[1])
        for disk in disks:
            # Partitions are subdirectories of their disk in /sys/block.
            if device == disk or (block / disk / device).is_dir():
                if disk not in found or len(mount) < len(found[disk]):
                    found[disk] = mount
                break
    return found


def discover_disks(root: Path) -> list[Disk]:
    block = root / "sys/block"
    if not block.is_dir():
        return []
    names: list[str] = []
    for entry in sorted(block.iterdir(), key=lambda p: p.name):
        name = entry.name
        if name.startswith(VIRTUAL_DISK_PREFIXES) or _read_int(entry / "hidden") == 1:
            continue
        if not _read_int(entry / "size"):
            continue  # an empty card reader or ejected medium
        names.append(name)
    mounts = _mounts(root, block, names)
    disks = []
    for name in names:
        entry = block / name
        size = (_read_int(entry / "size") or 0) * SECTOR_BYTES
        model = _read(entry / "device/model")
        disks.append(
            Disk(
                name=name,
                model=model or None,
                capacity_gb=size // 10**9,  # vendors' decimal gigabytes, as on the label
                rotational=_read_int(entry / "queue/rotational") == 1,
                nvme=name.startswith("nvme"),
                numa_node=_numa_of(entry / "device"),
                mount_path=mounts.get(name),
                # /sys/block/<disk> links into /sys/devices/pciDDDD:BB/...; virtio and
                # platform disks have no PCI root complex.
                pci_root=root_complex_of(entry),
            )
        )
    return disks


def hostname(root: Path) -> str:
    return _read(root / "proc/sys/kernel/hostname") or socket.gethostname()


def discover_host(root: Path = Path("/")) -> Host:
    cpu = discover_cpu(root)
    memory = memory_total_mb(root)
    return Host(
        hostname=hostname(root),
        cpu=cpu,
        numa_nodes=discover_numa(root, online_cpus(root), memory),
        memory_mb=memory,
        disks=discover_disks(root),
    )


def discover_local(
    root: Path = Path("/"),
    *,
    gpus: Sequence[Gpu] | None = None,
    node_id: str | None = None,
    pool: str = "default",
    labels: Mapping[str, str] | None = None,
    taints: Sequence[Taint] = (),
    disk_iops_at_depth: Mapping[str, float] | None = None,
    pcie_bandwidth: Mapping[str, float] | None = None,
) -> NodeTopology:
    """This machine's topology; GPUs come from NVML unless given (a recorded tree has none).
    `disk_iops_at_depth`: an operator's rated random-read IOPS, by disk name;
    `pcie_bandwidth`: measured host-to-card copy GB/s, by the card's PCI bus id."""
    host = discover_host(root)
    if gpus is None:
        gpus = discover_gpus(root=root, pcie_bandwidth=pcie_bandwidth)
    return build_topology(
        node_id=node_id or node_id_from_hostname(host.hostname),
        hostname=host.hostname,
        pool=pool,
        labels=labels,
        cpu=host.cpu,
        numa_nodes=host.numa_nodes,
        memory_mb=host.memory_mb,
        gpus=gpus,
        disks=host.disks,
        taints=taints,
        disk_iops_at_depth=disk_iops_at_depth,
    )
