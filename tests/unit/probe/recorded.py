"""Recorded /sys and /proc trees, written under a test's tmp_path."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

KB_PER_MIB = 1024


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for relative, content in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    return root


def cpuinfo(processors: list[dict[str, str]]) -> str:
    return (
        "\n\n".join(
            "\n".join(f"{key}\t: {value}" for key, value in block.items()) for block in processors
        )
        + "\n\n"
    )


XEON_FLAGS = (
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge sse sse2 ht ssse3 fma cx16 sse4_1 "
    "sse4_2 x2apic popcnt aes xsave avx f16c rdrand avx2 bmi1 bmi2 avx512f avx512dq avx512cd "
    "avx512bw avx512vl avx512_bf16 avx512_vnni amx_bf16 amx_tile amx_int8 sha_ni"
)


def dual_socket_tree(root: Path) -> Path:
    """2 sockets x 4 cores x 2 threads, one NUMA node per socket, Linux numbering: first
    threads 0-7 (socket 0: 0-3, socket 1: 4-7), their siblings 8-15. Disks: an NVMe on NUMA
    node 1 with a partition mounted at /data, a SATA SSD holding /, a hard disk with a space in
    its mount point, and the virtual devices a real machine has (loop, zram, dm, ram, sr,
    a hidden NVMe multipath path)."""
    files: dict[str, str] = {}
    blocks = []
    for cpu in range(16):
        core = cpu % 8
        package = 0 if core < 4 else 1
        siblings = f"{core},{core + 8}"
        blocks.append(
            {
                "processor": str(cpu),
                "vendor_id": "GenuineIntel",
                "model name": "Intel(R) Xeon(R) Platinum 8480C",
                "physical id": str(package),
                "core id": str(core % 4),
                "flags": XEON_FLAGS,
            }
        )
        topology = f"sys/devices/system/cpu/cpu{cpu}/topology"
        files[f"{topology}/physical_package_id"] = f"{package}\n"
        files[f"{topology}/core_cpus_list"] = f"{siblings}\n"
    files["proc/cpuinfo"] = cpuinfo(blocks)
    files["sys/devices/system/cpu/online"] = "0-15\n"
    files["proc/meminfo"] = "MemTotal:       263856240 kB\nMemFree:        200000000 kB\n"
    node_kb = 131928120
    for node, cpus in ((0, "0-3,8-11"), (1, "4-7,12-15")):
        base = f"sys/devices/system/node/node{node}"
        files[f"{base}/cpulist"] = f"{cpus}\n"
        files[f"{base}/meminfo"] = (
            f"Node {node} MemTotal:       {node_kb} kB\nNode {node} MemFree:  1 kB\n"
        )
    files["sys/devices/system/node/online"] = "0-1\n"
    files["sys/devices/system/node/possible"] = "0-1\n"

    # nvme0n1: 3.84 TB, its controller's PCI function on NUMA node 1.
    files["sys/block/nvme0n1/size"] = "7501476528\n"
    files["sys/block/nvme0n1/queue/rotational"] = "0\n"
    files["sys/block/nvme0n1/device/model"] = "SAMSUNG MZWLJ3T8HBLS-00007          \n"
    files["sys/block/nvme0n1/device/device/numa_node"] = "1\n"
    files["sys/block/nvme0n1/nvme0n1p1/partition"] = "1\n"
    files["sys/block/nvme0c0n1/size"] = "7501476528\n"
    files["sys/block/nvme0c0n1/hidden"] = "1\n"
    # sda: 960 GB SATA SSD, no NUMA affinity reported (-1).
    files["sys/block/sda/size"] = "1875385008\n"
    files["sys/block/sda/queue/rotational"] = "0\n"
    files["sys/block/sda/device/model"] = "INTEL SSDSC2KG96\n"
    files["sys/block/sda/device/numa_node"] = "-1\n"
    files["sys/block/sda/sda1/partition"] = "1\n"
    files["sys/block/sda/sda2/partition"] = "2\n"
    # sdb: 8 TB hard disk.
    files["sys/block/sdb/size"] = "15628053168\n"
    files["sys/block/sdb/queue/rotational"] = "1\n"
    files["sys/block/sdb/device/model"] = "ST8000NM017B\n"
    files["sys/block/sdb/sdb1/partition"] = "1\n"
    for virtual in ("loop0", "zram0", "dm-0", "ram0", "sr0"):
        files[f"sys/block/{virtual}/size"] = "2048\n"
        files[f"sys/block/{virtual}/queue/rotational"] = "0\n"
    files["sys/block/sdc/size"] = "0\n"  # an empty card reader
    files["proc/mounts"] = (
        "sysfs /sys sysfs rw 0 0\n"
        "/dev/sda2 / ext4 rw,relatime 0 0\n"
        "/dev/sda1 /boot/efi vfat rw 0 0\n"
        "/dev/nvme0n1p1 /data xfs rw 0 0\n"
        "/dev/mapper/vg-home /home ext4 rw 0 0\n"
        "/dev/sdb1 /mnt/archive\\040disk ext4 rw 0 0\n"
    )
    files["proc/sys/kernel/hostname"] = "GPU-Node-07.example.com\n"
    # The PCI functions of two GPUs, for NVML's NUMA lookup.
    files["sys/bus/pci/devices/0000:17:00.0/numa_node"] = "0\n"
    files["sys/bus/pci/devices/0000:b1:00.0/numa_node"] = "1\n"
    return write_tree(root, files)


def single_socket_tree_without_numa(root: Path) -> Path:
    """A kernel without NUMA support and without sysfs CPU topology: /proc only."""
    blocks = [
        {
            "processor": str(cpu),
            "model name": "AMD EPYC 7543 32-Core Processor",
            "physical id": "0",
            "core id": str(cpu // 2),
            "flags": "fpu sse sse2 avx avx2 fma f16c sse4_2 sha_ni",
        }
        for cpu in range(4)
    ]
    return write_tree(
        root,
        {
            "proc/cpuinfo": cpuinfo(blocks),
            "proc/meminfo": "MemTotal:        8388608 kB\n",
            "proc/sys/kernel/hostname": "box\n",
            "sys/block/vda/size": "209715200\n",
            "sys/block/vda/queue/rotational": "1\n",
        },
    )


def _link(root: Path, link: str, target: str) -> None:
    """A relative symlink, as sysfs has them, so the tree resolves wherever it lies."""
    path = root / link
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(os.path.relpath(root / target, path.parent))


# A DGX H100-like box: per GPU its bus id and the root complex (host bridge) above it; the
# first four on socket 0, the rest on socket 1. Two NVMe drives sit under the root complexes of
# GPU 0 and GPU 4, the SATA boot disk under the chipset's pci0000:00.
HGX_GPUS = (
    ("0000:18:00.0", "pci0000:15"),
    ("0000:2a:00.0", "pci0000:27"),
    ("0000:3a:00.0", "pci0000:37"),
    ("0000:5d:00.0", "pci0000:59"),
    ("0000:9a:00.0", "pci0000:97"),
    ("0000:ab:00.0", "pci0000:a7"),
    ("0000:ba:00.0", "pci0000:b7"),
    ("0000:db:00.0", "pci0000:d7"),
)
HGX_NVME = (("nvme0", "0000:19:00.0", "pci0000:15", 0), ("nvme1", "0000:9b:00.0", "pci0000:97", 1))


def _pci_function(root: Path, host_bridge: str, bus_id: str, numa: int) -> str:
    """/sys/devices/<bridge>/<port>/<function> with its numa_node, and the bus link to it."""
    bus = host_bridge.removeprefix("pci")
    device = f"sys/devices/{host_bridge}/{bus}:01.0/{bus_id}"
    write_tree(root, {f"{device}/numa_node": f"{numa}\n", f"{device}/class": "0x030200\n"})
    _link(root, f"sys/bus/pci/devices/{bus_id}", device)
    return device


def dual_socket_8gpu_tree(root: Path) -> Path:
    """The dual-socket host of `dual_socket_tree` as an 8-GPU HGX box whose /sys has the
    links a real one has: /sys/bus/pci/devices/<bdf> and /sys/block/<disk> point into
    /sys/devices/pciDDDD:BB/..., which names each device's PCI root complex."""
    dual_socket_tree(root)
    shutil.rmtree(root / "sys/block")
    shutil.rmtree(root / "sys/bus")
    for index, (bus_id, bridge) in enumerate(HGX_GPUS):
        _pci_function(root, bridge, bus_id, 0 if index < 4 else 1)
    mounts = ["/dev/sda2 / ext4 rw 0 0"]
    for controller, bus_id, bridge, numa in HGX_NVME:
        function = _pci_function(root, bridge, bus_id, numa)
        namespace = f"{controller}n1"
        ctrl = f"{function}/nvme/{controller}"
        disk = f"{ctrl}/{namespace}"
        write_tree(
            root,
            {
                f"{ctrl}/model": "SAMSUNG MZQL23T8HCLS-00A07\n",
                f"{disk}/size": "7501476528\n",
                f"{disk}/queue/rotational": "0\n",
                f"{disk}/{namespace}p1/partition": "1\n",
            },
        )
        _link(root, f"{ctrl}/device", function)
        _link(root, f"{disk}/device", ctrl)
        _link(root, f"sys/block/{namespace}", disk)
        mounts.append(f"/dev/{namespace}p1 /raid{numa} xfs rw 0 0")
    sata = "sys/devices/pci0000:00/0000:00:17.0/ata1/host0/target0:0:0/0:0:0:0"
    write_tree(
        root,
        {
            f"{sata}/model": "INTEL SSDSC2KG96\n",
            f"{sata}/block/sda/size": "1875385008\n",
            f"{sata}/block/sda/queue/rotational": "0\n",
            f"{sata}/block/sda/sda2/partition": "2\n",
        },
    )
    _link(root, f"{sata}/block/sda/device", sata)
    _link(root, "sys/block/sda", f"{sata}/block/sda")
    # A virtual disk: no PCI root complex above it.
    write_tree(root, {"sys/devices/virtual/block/loop0/size": "2048\n"})
    _link(root, "sys/block/loop0", "sys/devices/virtual/block/loop0")
    (root / "proc/mounts").write_text("\n".join(mounts) + "\n")
    return root
