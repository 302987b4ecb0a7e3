"""A stand-in for cuda.bindings.driver: the calls the PCIe measurement makes, answered as the
bindings answer them ((CUresult, value) tuples), from a description of devices.

Time is the fake's: each timed copy takes what its device's `copy_ms` says (cycled), and an
event records the device clock, so the GB/s a test expects is exact."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any


class CUresult(IntEnum):  # the names and numbers of cuda.h
    CUDA_SUCCESS = 0
    CUDA_ERROR_OUT_OF_MEMORY = 2
    CUDA_ERROR_NOT_INITIALIZED = 3
    CUDA_ERROR_NO_DEVICE = 100
    CUDA_ERROR_INVALID_DEVICE = 101
    CUDA_ERROR_LAUNCH_FAILED = 719


OK = CUresult.CUDA_SUCCESS


@dataclass
class Device:
    bus: str  # as CUDA spells it: 0000:17:00.0 (4-digit domain, upper-case hex)
    copy_ms: list[float] = field(default_factory=lambda: [10.0])
    # A call that fails on this device, and how: {"cuMemAlloc": CUDA_ERROR_OUT_OF_MEMORY}.
    fail: dict[str, CUresult] = field(default_factory=dict)
    clock_ms: float = 0.0
    copies: int = 0  # copies made, warm-up ones included


class FakeCudaDriver:
    def __init__(self, devices: list[Device], *, init: CUresult = OK) -> None:
        self.devices = devices
        self.init = init
        self.initialised = False
        self.current: Device | None = None
        self.retained: dict[int, int] = {}  # ordinal -> primary context references
        self.held: dict[str, int] = {}  # live host buffers, device buffers, events
        self.copied_bytes: list[int] = []
        self.calls: list[str] = []
        self.bound: Any = None  # the context bound to the calling thread
        self._next = 1

    def _call(self, name: str) -> CUresult:
        self.calls.append(name)
        if name != "cuInit" and not self.initialised:
            return CUresult.CUDA_ERROR_NOT_INITIALIZED
        device = self.current
        return device.fail.get(name, OK) if device is not None else OK

    def _hold(self, kind: str) -> int:
        self.held[kind] = self.held.get(kind, 0) + 1
        self._next += 1
        return self._next

    def _free(self, kind: str) -> None:
        self.held[kind] -= 1

    def cuInit(self, flags: int) -> tuple[CUresult]:
        self.calls.append("cuInit")
        self.initialised = self.init == OK
        return (self.init,)

    def cuDeviceGetCount(self) -> tuple[CUresult, int]:
        return self._call("cuDeviceGetCount"), len(self.devices)

    def cuDeviceGet(self, ordinal: int) -> tuple[CUresult, int]:
        return self._call("cuDeviceGet"), ordinal

    def cuDeviceGetPCIBusId(self, length: int, device: int) -> tuple[CUresult, bytes]:
        # The bindings hand back the whole buffer, NUL-padded.
        return self._call("cuDeviceGetPCIBusId"), self.devices[device].bus.encode().ljust(
            length, b"\0"
        )

    def cuDevicePrimaryCtxRetain(self, device: int) -> tuple[CUresult, Any]:
        self.current = self.devices[device]
        status = self._call("cuDevicePrimaryCtxRetain")
        if status == OK:
            self.retained[device] = self.retained.get(device, 0) + 1
        return status, ("context", device)

    def cuDevicePrimaryCtxRelease(self, device: int) -> tuple[CUresult]:
        self.retained[device] -= 1
        self.current = None
        return (OK,)

    def cuCtxSetCurrent(self, context: Any) -> tuple[CUresult]:
        self.bound = context  # None: unbound
        return (self._call("cuCtxSetCurrent"),)

    def cuMemAllocHost(self, nbytes: int) -> tuple[CUresult, int]:
        status = self._call("cuMemAllocHost")
        return status, self._hold("host") if status == OK else 0

    def cuMemFreeHost(self, pointer: int) -> tuple[CUresult]:
        self._free("host")
        return (OK,)

    def cuMemAlloc(self, nbytes: int) -> tuple[CUresult, int]:
        status = self._call("cuMemAlloc")
        return status, self._hold("device") if status == OK else 0

    def cuMemFree(self, pointer: int) -> tuple[CUresult]:
        self._free("device")
        return (OK,)

    def cuEventCreate(self, flags: int) -> tuple[CUresult, Any]:
        status = self._call("cuEventCreate")
        return status, {"at": None, "id": self._hold("event")} if status == OK else None

    def cuEventDestroy(self, event: Any) -> tuple[CUresult]:
        self._free("event")
        return (OK,)

    def cuMemcpyHtoD(self, card: int, host: int, nbytes: int) -> tuple[CUresult]:
        status = self._call("cuMemcpyHtoD")
        device = self.current
        if status == OK and device is not None:
            device.clock_ms += device.copy_ms[device.copies % len(device.copy_ms)]
            device.copies += 1
            self.copied_bytes.append(nbytes)
        return (status,)

    def cuCtxSynchronize(self) -> tuple[CUresult]:
        return (self._call("cuCtxSynchronize"),)

    def cuEventRecord(self, event: Any, stream: int) -> tuple[CUresult]:
        status = self._call("cuEventRecord")
        assert self.current is not None
        event["at"] = self.current.clock_ms
        return (status,)

    def cuEventSynchronize(self, event: Any) -> tuple[CUresult]:
        return (self._call("cuEventSynchronize"),)

    def cuEventElapsedTime(self, start: Any, end: Any) -> tuple[CUresult, float]:
        return self._call("cuEventElapsedTime"), end["at"] - start["at"]

    def released(self) -> bool:
        """Nothing left behind: every buffer and event freed, every context released and
        none left bound to the thread."""
        bound = self.bound is not None
        return not any(self.held.values()) and not any(self.retained.values()) and not bound
