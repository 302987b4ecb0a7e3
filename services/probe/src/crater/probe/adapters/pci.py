"""PCI devices in sysfs."""

from __future__ import annotations

from pathlib import Path


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
