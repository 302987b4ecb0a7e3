"""Measured host-to-card copy bandwidth over each card's PCIe link (what CUDA's bandwidthTest
reports as Host to Device, pinned): the figure `Gpu.pcie_bandwidth_gbps` carries.

Per card: a pinned (page-locked) host buffer and a device buffer of the same size, a few
untimed copies to warm the link and the driver's paths, then `runs` copies each timed
between two CUDA events on the null stream; the figure is the median of the runs' GB/s
(decimal: 1e9 bytes a second, one way), which one slow run (a page fault, an interrupt)
does not move. Pinned memory, because that is what a loader doing its best achieves (a
pageable buffer is staged through a pinned one by the driver, at a lower rate).

The CUDA driver API comes from NVIDIA's `cuda-bindings` (the `cuda` extra of crater-probe),
loaded only when a measurement is asked for; every call goes through `driver`, the
`cuda.bindings.driver` module by default, so tests hand in a fake. CUDA devices are matched
to NVML's cards by PCI bus id: CUDA's ordinals follow CUDA_VISIBLE_DEVICES and
CUDA_DEVICE_ORDER, NVML's indexes do not.

It never disturbs a task: a card with a compute process on it (or whose processes NVML cannot
list, or with MIG on) is left unmeasured, and each measured card's context is the device's
primary context, released when done so that nothing of the probe stays on the card (no
memory held, no process listed). The measuring thread runs on the card's local CPUs while it
allocates and copies, so the pinned buffer sits on the card's NUMA node and no inter-socket
hop is counted against the link (a task placed on that node has none either). Nothing here
raises: a card that cannot be measured is named in `skipped` with the reason, and its link
then counts at its nominal figure.
"""

from __future__ import annotations

import logging
import os
import statistics
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from crater.probe.adapters.nvml import CardUse, card_uses
from crater.probe.adapters.pci import sysfs_bus_id

log = logging.getLogger("crater.probe.pcie")

MIB = 1024 * 1024
BUS_ID_LENGTH = 32  # cuDeviceGetPCIBusId needs 13 characters with the NUL; room to spare

# Why a card has no measured figure, the `outcome` label of the probe's counter.
Outcome = Literal["measured", "busy", "unavailable", "unmatched", "failed"]


class CudaError(Exception):
    """A CUDA driver call that did not return CUDA_SUCCESS."""


@dataclass(frozen=True)
class CopyBounds:
    """How much one card's measurement may cost: 2 x buffer_mb of memory (half of it pinned
    host memory) and warmup + runs copies (at 25 GB/s, 12 copies of 128 MiB take 65 ms)."""

    buffer_mb: int = 128
    runs: int = 10
    warmup: int = 2


@dataclass
class PcieBandwidth:
    """What a measurement found: GB/s by bus id, and why each other card has none."""

    gbps: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, tuple[Outcome, str]] = field(default_factory=dict)

    def outcomes(self) -> list[Outcome]:
        """One outcome per card looked at, for the counter."""
        measured: list[Outcome] = ["measured"] * len(self.gbps)
        return measured + [outcome for outcome, _ in self.skipped.values()]


def _cuda_driver() -> Any:
    from cuda.bindings import driver  # the `cuda` extra; ImportError without it

    return driver


def _ok(result: Any, call: str) -> Any:
    """The value of a driver call's (CUresult, value...) tuple; CudaError when it failed."""
    status, *values = result if isinstance(result, tuple) else (result,)
    if int(status) != 0:  # CUDA_SUCCESS is 0
        raise CudaError(f"{call}: {getattr(status, 'name', f'CUresult {int(status)}')}")
    return values[0] if len(values) == 1 else tuple(values)


def _quietly(driver: Any, call: str, *args: Any) -> None:
    """A release on the way out: its failure is logged, never raised over the first error."""
    try:
        _ok(getattr(driver, call)(*args), call)
    except Exception as error:
        log.debug("%s failed: %s", call, error)


@contextmanager
def _held(
    driver: Any, allocate: str, free: str, *args: Any, release_with: Any = None
) -> Iterator[Any]:
    """A driver object, released by `free` (given `release_with`, else the object itself)."""
    value = _ok(getattr(driver, allocate)(*args), allocate)
    try:
        yield value
    finally:
        _quietly(driver, free, value if release_with is None else release_with)


@contextmanager
def _current(driver: Any, context: Any) -> Iterator[None]:
    """`context` bound to the calling thread, unbound again (after the frees, which need it)
    before its release destroys it: the pool thread that measured keeps no dangling context."""
    _ok(driver.cuCtxSetCurrent(context), "cuCtxSetCurrent")
    try:
        yield
    finally:
        _quietly(driver, "cuCtxSetCurrent", None)


def gbps(nbytes: int, milliseconds: float) -> float:
    """Decimal GB a second for `nbytes` copied in `milliseconds`."""
    if milliseconds <= 0:
        raise CudaError(f"a copy timed at {milliseconds} ms")
    return nbytes / (milliseconds / 1000.0) / 1e9


def copy_gbps(driver: Any, device: Any, bounds: CopyBounds = CopyBounds()) -> float:
    """The median host-to-device GB/s of `bounds.runs` copies of pinned memory to `device`
    (a CUdevice), in its primary context, everything freed again; CudaError on a failure."""
    nbytes = bounds.buffer_mb * MIB
    timed: list[float] = []
    # The primary context is released by device, not by context; once its last reference
    # goes the driver destroys it, and with it everything below.
    retain = ("cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRelease")
    with (
        _held(driver, *retain, device, release_with=device) as context,
        _current(driver, context),
        _held(driver, "cuMemAllocHost", "cuMemFreeHost", nbytes) as host,
        _held(driver, "cuMemAlloc", "cuMemFree", nbytes) as card,
        _held(driver, "cuEventCreate", "cuEventDestroy", 0) as start,
        _held(driver, "cuEventCreate", "cuEventDestroy", 0) as end,
    ):
        for _ in range(bounds.warmup):
            _ok(driver.cuMemcpyHtoD(card, host, nbytes), "cuMemcpyHtoD")
        _ok(driver.cuCtxSynchronize(), "cuCtxSynchronize")
        for _ in range(bounds.runs):
            # Events on the null stream bracket the copy on the card's own clock, so the
            # figure is the transfer, not Python's call overhead around it.
            _ok(driver.cuEventRecord(start, 0), "cuEventRecord")
            _ok(driver.cuMemcpyHtoD(card, host, nbytes), "cuMemcpyHtoD")
            _ok(driver.cuEventRecord(end, 0), "cuEventRecord")
            _ok(driver.cuEventSynchronize(end), "cuEventSynchronize")
            elapsed = _ok(driver.cuEventElapsedTime(start, end), "cuEventElapsedTime")
            timed.append(gbps(nbytes, float(elapsed)))
    return statistics.median(timed)


def _text(value: str | bytes) -> str:
    raw = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    return raw.split("\0", 1)[0].strip().lower()


def cuda_devices(driver: Any) -> dict[str, Any]:
    """Every CUDA device (CUdevice) by PCI bus id as sysfs spells it (0000:17:00.0)."""
    found = {}
    for ordinal in range(int(_ok(driver.cuDeviceGetCount(), "cuDeviceGetCount"))):
        device = _ok(driver.cuDeviceGet(ordinal), "cuDeviceGet")
        bus = _ok(driver.cuDeviceGetPCIBusId(BUS_ID_LENGTH, device), "cuDeviceGetPCIBusId")
        found[sysfs_bus_id(_text(bus))] = device
    return found


@contextmanager
def near(cpus: Sequence[int]) -> Iterator[None]:
    """Run the calling thread on those of `cpus` it may use (a container's cpuset may allow
    fewer; none allowed, or none known: where it was). Pid 0 is the calling thread."""
    before = os.sched_getaffinity(0)
    usable = [c for c in cpus if c in before]
    pinned = False
    if usable:
        try:
            os.sched_setaffinity(0, usable)
            pinned = True
        except OSError as error:  # measured unpinned: a figure all the same, perhaps lower
            log.debug("measuring from CPUs %s failed: %s", usable, error)
    try:
        yield
    finally:
        if pinned:
            os.sched_setaffinity(0, before)


Pin = Callable[[Sequence[int]], AbstractContextManager[None]]


def _why_not(card: CardUse) -> str | None:
    """Why this card must not be touched now; None: it is idle."""
    if card.processes is None:
        return "NVML cannot list its processes, so it may be serving a task"
    if card.processes:
        return f"{card.processes} compute process(es) on it: measuring would disturb them"
    if card.mig_enabled:
        return "MIG is on: a slice has only some of the card's copy engines"
    return None


def measure_cards(
    cards: Sequence[CardUse],
    *,
    driver: Any | None = None,
    load: Callable[[], Any] = _cuda_driver,
    bounds: CopyBounds = CopyBounds(),
    pin: Pin = near,
) -> PcieBandwidth:
    """Measure every idle card, one at a time (two at once would share the host's memory
    and perhaps a PCIe switch, and measure that instead); never raises."""
    found = PcieBandwidth()
    idle = []
    for card in cards:
        why = _why_not(card)
        if why is None:
            idle.append(card)
        else:
            found.skipped[card.bus_id] = ("busy", why)
    if not idle:
        return found
    try:
        driver = driver if driver is not None else load()
        _ok(driver.cuInit(0), "cuInit")
        devices = cuda_devices(driver)
    except ImportError as error:
        reason = f"cuda-bindings is not installed (the probe's `cuda` extra): {error}"
        found.skipped.update((c.bus_id, ("unavailable", reason)) for c in idle)
        return found
    except Exception as error:  # no libcuda (RuntimeError), a driver that cannot start
        reason = f"CUDA driver unavailable: {error}"
        found.skipped.update((c.bus_id, ("unavailable", reason)) for c in idle)
        return found
    for card in idle:
        device = devices.get(card.bus_id)
        if device is None:
            found.skipped[card.bus_id] = (
                "unmatched",
                "no CUDA device at this bus id (hidden by CUDA_VISIBLE_DEVICES?)",
            )
            continue
        try:
            with pin(card.local_cpus):
                found.gbps[card.bus_id] = round(copy_gbps(driver, device, bounds), 2)
        except Exception as error:  # CudaError, or the bindings' own (a bad argument)
            found.skipped[card.bus_id] = ("failed", str(error) or type(error).__name__)
    return found


def measure_local(
    *,
    root: Path = Path("/"),
    nvml: Any | None = None,
    driver: Any | None = None,
    load: Callable[[], Any] = _cuda_driver,
    bounds: CopyBounds = CopyBounds(),
    pin: Pin = near,
    only: Collection[str] | None = None,
) -> PcieBandwidth:
    """This machine's cards (`only`: those at these bus ids), found and checked for tasks
    through NVML, then measured; `root`: where the host's /sys is (the cards' local CPUs)."""
    cards = [c for c in card_uses(nvml, root) if only is None or c.bus_id in only]
    return measure_cards(cards, driver=driver, load=load, bounds=bounds, pin=pin)
