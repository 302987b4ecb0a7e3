"""Recorded /sys and /proc trees, written under a test's tmp_path."""

from __future__ import annotations

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
