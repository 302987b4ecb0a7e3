"""NVMe wear from the SMART health log: the parser, the ioctl layout, and the fallbacks."""

from __future__ import annotations

from pathlib import Path

import pytest

from crater.contracts import Disk
from crater.probe.adapters import nvme
from crater.probe.adapters.nvme import NVME_IOCTL_ADMIN_CMD, disk_wear, parse_smart_log


def smart_page(critical: int = 0, spare: int = 100, used: int = 3) -> bytes:
    page = bytearray(512)
    page[0], page[3], page[4], page[5] = critical, spare, 10, used
    return bytes(page)


def test_ioctl_matches_the_kernel_header() -> None:
    assert nvme._ADMIN_CMD.size == 72  # sizeof(struct nvme_admin_cmd)
    assert NVME_IOCTL_ADMIN_CMD == 0xC0484E41


def test_smart_log_fields() -> None:
    assert parse_smart_log(smart_page(critical=0x04, spare=42, used=97)) == (0x04, 42, 97)
    with pytest.raises(ValueError, match="need 6"):
        parse_smart_log(b"\x00\x01")


def test_wear_of_an_nvme_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[Path] = []

    def fake_read(device: Path) -> bytes:
        read.append(device)
        return smart_page(used=12)

    monkeypatch.setattr(nvme, "_read_smart_log", fake_read)
    wear = disk_wear(Disk(name="nvme2n1", capacity_gb=1, rotational=False, nvme=True))
    assert read == [Path("/dev/nvme2")]
    assert wear.readable
    assert (wear.percentage_used, wear.available_spare, wear.critical_warning) == (12, 100, 0)


def test_wear_not_readable_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sata = disk_wear(Disk(name="sda", capacity_gb=1, rotational=False, nvme=False))
    assert not sata.readable
    assert "not NVMe" in sata.reason
    missing = disk_wear(Disk(name="nvme0n1", capacity_gb=1, rotational=False, nvme=True), tmp_path)
    assert not missing.readable
    assert str(tmp_path / "nvme0") in missing.reason

    def refused(device: Path) -> bytes:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(nvme, "_read_smart_log", refused)
    denied = disk_wear(Disk(name="nvme0n1", capacity_gb=1, rotational=False, nvme=True))
    assert "needs root" in denied.reason
