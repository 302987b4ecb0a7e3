"""Rated random-read IOPS at depth: the datasheet table, an operator's figure, the order."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from crater.contracts import Cpu, Disk, NumaNode
from crater.probe.domain.datasheets import datasheet_random_read_iops, rate_disks
from crater.probe.domain.topology import build_topology


def disk(name: str, model: str | None) -> Disk:
    return Disk(name=name, model=model, capacity_gb=3840, rotational=False, nvme=True)


@pytest.mark.parametrize(
    ("model", "iops"),
    [
        ("SAMSUNG MZWLJ3T8HBLS-00007", 1_450_000),  # PM1733 3.84 TB, as sysfs reads it
        ("KIOXIA KCM6DRUL3T84", 1_400_000),  # CM6-R 3.84 TB
        ("Samsung SSD 990 PRO 2TB", 1_400_000),
        ("Samsung SSD 990 PRO 1TB", None),  # rated lower: not in the table
        ("SAMSUNG MZWLJ1T9HBJR-00007", None),  # PM1733 1.92 TB: rated lower
        ("INTEL SSDPE2KX010T8", None),  # unknown to the table
        (None, None),
    ],
)
def test_the_table_matches_models_as_sysfs_reads_them(model: str | None, iops: int | None) -> None:
    rating = datasheet_random_read_iops(model)
    assert (rating.random_read_iops if rating else None) == iops


def test_operator_beats_a_figure_carried_and_that_beats_the_datasheet() -> None:
    carried = disk("nvme2n1", "SAMSUNG MZWLJ3T8HBLS-00007").model_copy(
        update={
            "random_read_iops_at_depth": 90_000.0,
            "random_read_iops_at_depth_source": "measured",
        }
    )
    rated = rate_disks(
        [
            disk("nvme0n1", "SAMSUNG MZWLJ3T8HBLS-00007"),
            disk("nvme1n1", "SAMSUNG MZWLJ3T8HBLS-00007"),
            carried,
            disk("nvme3n1", "unknown"),
        ],
        {"nvme1n1": 1_000_000},
    )
    figures = [(d.random_read_iops_at_depth, d.random_read_iops_at_depth_source) for d in rated]
    assert figures == [
        (1_450_000, "datasheet"),
        (1_000_000, "operator"),
        (90_000, "measured"),
        (None, None),
    ]


def test_a_figure_without_its_source_is_refused() -> None:
    with pytest.raises(ValidationError, match="go together"):
        Disk(name="x", capacity_gb=1, rotational=False, nvme=True, random_read_iops_at_depth=1.0)
    with pytest.raises(ValidationError, match="go together"):
        Disk(
            name="x",
            capacity_gb=1,
            rotational=False,
            nvme=True,
            random_read_iops_at_depth_source="datasheet",
        )


def test_discovery_rates_disks_and_the_fingerprint_ignores_the_figure() -> None:
    def topology(operator: dict[str, float] | None) -> object:
        return build_topology(
            node_id="box",
            hostname="box",
            cpu=Cpu(model="x", sockets=1, cores=1, threads=1),
            numa_nodes=[NumaNode(id=0, cpus=[0], memory_mb=1024)],
            memory_mb=1024,
            disks=[disk("nvme0n1", "SAMSUNG MZWLJ3T8HBLS-00007")],
            disk_iops_at_depth=operator,
        )

    from_table = topology(None)
    from_operator = topology({"nvme0n1": 1_200_000})
    assert from_table.disks[0].random_read_iops_at_depth_source == "datasheet"  # type: ignore[attr-defined]
    assert from_operator.disks[0].random_read_iops_at_depth == 1_200_000  # type: ignore[attr-defined]
    assert from_table.fingerprint == from_operator.fingerprint  # type: ignore[attr-defined]
