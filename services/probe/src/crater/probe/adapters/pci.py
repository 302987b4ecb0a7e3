"""PCI devices in sysfs."""

from __future__ import annotations

import os
import re
from pathlib import Path

from crater.probe.domain.cpulist import parse_cpulist

# A host bridge directory under /sys/devices: `pci0000:17` (domain 0000, root bus 17).
_ROOT_COMPLEX = re.compile(r"^pci[0-9a-f]{4,8}:[0-9a-f]{2}$")


def sysfs_bus_id(bus_id: str) -> str:
    """NVML's `00000000:17:00.0` (8-digit domain) as sysfs spells it: `0000:17:00.0`."""
    domain, _, rest = bus_id.strip().lower().partition(":")
    return f"{domain[-4:].rjust(4, '0')}:{rest}" if rest else bus_id.strip().lower()


def pci_numa_node(root: Path, bus_id: str) -> int | None:
    """The NUMA node a PCI device hangs off, or None where the platform does not say (-1)."""
    try:
        text = (root / "sys/bus/pci/devices" / sysfs_bus_id(bus_id) / "numa_node").read_text()
        value = int(text.strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


def pci_local_cpus(root: Path, bus_id: str) -> list[int]:
    """The CPUs nearest a PCI device (its `local_cpulist`); [] where sysfs does not say."""
    try:
        text = (root / "sys/bus/pci/devices" / sysfs_bus_id(bus_id) / "local_cpulist").read_text()
        return parse_cpulist(text)
    except (OSError, ValueError):
        return []


def root_complex_of(path: Path) -> str | None:
    """The PCI root complex above a sysfs device: the `pciDDDD:BB` host bridge in its real
    path (`/sys/bus/pci/devices/0000:18:00.0` -> `/sys/devices/pci0000:17/0000:17:01.0/
    0000:18:00.0` -> `pci0000:17`); None when the path does not resolve under one (a
    virtual device, or a recorded tree without the links)."""
    try:
        real = Path(os.path.realpath(path, strict=True))
    except OSError:
        return None
    for part in real.parts:
        if _ROOT_COMPLEX.match(part):
            return part
    return None


def pci_root(root: Path, bus_id: str) -> str | None:
    """The root complex of a PCI device named by its bus id."""
    return root_complex_of(root / "sys/bus/pci/devices" / sysfs_bus_id(bus_id))
