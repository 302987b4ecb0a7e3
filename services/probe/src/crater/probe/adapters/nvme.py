"""NVMe wear from the drive's SMART / health log page (log id 02h).

Linux exposes no wear figure in sysfs; the log page is read with the NVMe admin passthrough
ioctl on the controller's character device (/dev/nvme0), which needs CAP_SYS_ADMIN. Where
that is refused, or the disk is not NVMe, wear is reported as not readable, never guessed.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import re
import struct
from collections.abc import Sequence
from pathlib import Path

from crater.contracts import Disk
from crater.probe.domain.health import DiskWear

SMART_LOG_ID = 0x02
SMART_LOG_BYTES = 512
ADMIN_GET_LOG_PAGE = 0x02
ALL_NAMESPACES = 0xFFFFFFFF
# struct nvme_admin_cmd (linux/nvme_ioctl.h): 72 bytes; _IOWR('N', 0x41, struct nvme_admin_cmd)
_ADMIN_CMD = struct.Struct("=BBHIIIQQII6III")
NVME_IOCTL_ADMIN_CMD = (3 << 30) | (_ADMIN_CMD.size << 16) | (ord("N") << 8) | 0x41
_NAMESPACE = re.compile(r"^(nvme\d+)n\d+$")


def parse_smart_log(page: bytes) -> tuple[int, int, int]:
    """(critical warning bits, available spare %, percentage used) from the health log."""
    if len(page) < 6:
        raise ValueError(f"SMART log of {len(page)} bytes, need 6")
    return page[0], page[3], page[5]


def _read_smart_log(device: Path) -> bytes:
    buffer = ctypes.create_string_buffer(SMART_LOG_BYTES)
    dwords = SMART_LOG_BYTES // 4 - 1
    command = bytearray(
        _ADMIN_CMD.pack(
            ADMIN_GET_LOG_PAGE,  # opcode
            0,  # flags
            0,  # rsvd1
            ALL_NAMESPACES,  # nsid
            0,  # cdw2
            0,  # cdw3
            0,  # metadata
            ctypes.addressof(buffer),  # addr
            0,  # metadata_len
            SMART_LOG_BYTES,  # data_len
            (dwords << 16) | SMART_LOG_ID,  # cdw10: number of dwords - 1, log id
            0,  # cdw11
            0,  # cdw12
            0,  # cdw13
            0,  # cdw14
            0,  # cdw15
            1000,  # timeout_ms
            0,  # result
        )
    )
    fd = os.open(device, os.O_RDONLY)
    try:
        fcntl.ioctl(fd, NVME_IOCTL_ADMIN_CMD, command)
    finally:
        os.close(fd)
    return buffer.raw


def disk_wear(disk: Disk, dev: Path = Path("/dev")) -> DiskWear:
    """One disk's wear, or why it is not readable."""
    match = _NAMESPACE.match(disk.name)
    if not disk.nvme or match is None:
        return DiskWear(disk.name, reason="not NVMe (no SMART health log read)")
    controller = dev / match.group(1)
    try:
        warning, spare, used = parse_smart_log(_read_smart_log(controller))
    except PermissionError:
        return DiskWear(disk.name, reason=f"{controller}: needs root (CAP_SYS_ADMIN)")
    except (OSError, ValueError) as error:
        return DiskWear(disk.name, reason=f"{controller}: {getattr(error, 'strerror', error)}")
    return DiskWear(
        disk.name, percentage_used=used, available_spare=spare, critical_warning=warning
    )


def disks_wear(disks: Sequence[Disk], dev: Path = Path("/dev")) -> list[DiskWear]:
    return [disk_wear(d, dev) for d in disks]
