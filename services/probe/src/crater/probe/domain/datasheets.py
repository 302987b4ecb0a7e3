"""Datasheet figures the probe cannot measure from Python: 4 KiB random-read IOPS at depth.

A datacenter NVMe is rated at hundreds of thousands to ~1.5 million random reads per second,
measured with fio-like tools at queue depth 32 or more over several jobs. The probe's own
reads (measure.py) are Python system calls, a few microseconds each, so even many threads
stay far below that: what it measures at depth is a lower bound. Where the disk's model
(as /sys/block/<disk>/device/model reads) is one of the table's, its datasheet figure is
reported instead, marked `datasheet`; an operator's figure (a probe setting) overrides both.

The table holds models whose rated figure we could cite; others are left unrated (the probe
measures a lower bound for them, and an operator can state the figure).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from crater.contracts import Disk


@dataclass(frozen=True)
class Rating:
    pattern: re.Pattern[str]  # matched (search, case-insensitive) against the model string
    random_read_iops: float  # 4 KiB random reads per second at depth, as the vendor rates it
    product: str


def _rating(pattern: str, iops: float, product: str) -> Rating:
    return Rating(re.compile(pattern, re.IGNORECASE), iops, product)


RATINGS: tuple[Rating, ...] = (
    # Samsung PM1733 U.2 (model MZWLJ<capacity>HBLS/HBJR), 3.84 TB and up: 1,450K random-read
    # IOPS (Samsung PM1733/PM1735 product brief, 2019; as reported by hardwareluxx.de news
    # 50889, "Samsungs SSDs sterben nicht mehr"). The smaller capacities are rated lower and
    # are not matched.
    _rating(r"\bMZWLJ(3T8|7T6|15T|30T)", 1_450_000, "Samsung PM1733"),
    # Kioxia CM6, 3.84 TB and up (model KCM6xxxx3T84 etc.): up to 1.4 million random-read
    # IOPS (Kioxia CM6/CD6 announcement, Feb 2020; as reported by heise.de, "Kioxia bringt
    # PCIe-4.0-SSDs mit bis zu 30,72 TByte Speicherplatz").
    _rating(r"\bKCM6\w{4}(3T84|7T68|15T3|30T7)", 1_400_000, "Kioxia CM6"),
    # Samsung 990 PRO 2 TB: up to 1,400K random-read IOPS at QD32 with 16 threads
    # (Samsung 990 PRO data sheet, 2022; the 1 TB model is rated 1,200K and is not matched).
    _rating(r"\bSamsung SSD 990 PRO (2|4)TB\b", 1_400_000, "Samsung 990 PRO"),
)


def datasheet_random_read_iops(model: str | None) -> Rating | None:
    """The table's rating for a disk model, if it holds one."""
    if not model:
        return None
    return next((r for r in RATINGS if r.pattern.search(model.strip())), None)


def rate_disks(disks: Sequence[Disk], operator: Mapping[str, float] | None = None) -> list[Disk]:
    """The disks with their at-depth random-read IOPS where known: an operator's figure (by
    disk name) first, then a figure the disk carries already, then the datasheet table's."""
    operator = operator or {}
    rated = []
    for disk in disks:
        if disk.name in operator:
            disk = disk.model_copy(
                update={
                    "random_read_iops_at_depth": float(operator[disk.name]),
                    "random_read_iops_at_depth_source": "operator",
                }
            )
        elif disk.random_read_iops_at_depth is None:
            rating = datasheet_random_read_iops(disk.model)
            if rating is not None:
                disk = disk.model_copy(
                    update={
                        "random_read_iops_at_depth": rating.random_read_iops,
                        "random_read_iops_at_depth_source": "datasheet",
                    }
                )
        rated.append(disk)
    return rated
