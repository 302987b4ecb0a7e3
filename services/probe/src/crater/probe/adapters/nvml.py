"""NVIDIA GPUs through NVML (pynvml, from nvidia-ml-py): what they are and how loaded.

A machine without the driver or without cards is a normal case, not an error: discovery
returns no GPUs and says why once. Every NVML call is made through `lib`, the pynvml module
by default, so tests can hand in a fake driver.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crater.contracts import Gpu, GpuMetrics, GpuProcess
from crater.probe.adapters.pci import pci_local_cpus, pci_numa_node, pci_root, sysfs_bus_id
from crater.probe.domain.faults import CardSignals

log = logging.getLogger("crater.probe.nvml")

MIB = 1024 * 1024
MAX_NVLINKS = 36  # NVML_NVLINK_MAX_LINKS in current drivers (18 on Hopper, 12 on Ampere)
FEATURE_ENABLED = 1  # NVML_FEATURE_ENABLED
DEVICE_TYPE_SWITCH = 2  # NVML_NVLINK_DEVICE_TYPE_SWITCH
TEMPERATURE_GPU = 0  # NVML_TEMPERATURE_GPU
CLOCK_SM = 1  # NVML_CLOCK_SM
CLOCK_MEM = 2  # NVML_CLOCK_MEM
ECC_CORRECTED = 0  # NVML_MEMORY_ERROR_TYPE_CORRECTED
ECC_UNCORRECTED = 1  # NVML_MEMORY_ERROR_TYPE_UNCORRECTED
ECC_VOLATILE = 0  # NVML_VOLATILE_ECC: since the driver last loaded (boot, or a GPU reset)
EVENT_XID = 0x8  # nvmlEventTypeXidCriticalError
ERROR_GPU_IS_LOST = 15  # NVML_ERROR_GPU_IS_LOST: the card has fallen off the bus
MAX_EVENTS_PER_ROUND = 1024  # Xid events drained per round (a storm is not read forever)

# NVML reports failures as NVMLError subclasses, and the ctypes layer underneath as OSError;
# at this boundary either means "this fact is not available", never "stop the probe".
NvmlFailure = Exception


def _pynvml() -> Any:
    import pynvml

    return pynvml


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _bus_id(pci_info: Any) -> str:
    return _text(pci_info.busId)


def _start(lib: Any | None) -> Any | None:
    """NVML initialised, or None with the reason logged once."""
    try:
        lib = lib if lib is not None else _pynvml()
        lib.nvmlInit()
    except NvmlFailure as error:  # ImportError included: no nvidia-ml-py at all
        log.info("no NVIDIA GPU found (NVML: %s)", error or type(error).__name__)
        return None
    return lib


def _stop(lib: Any) -> None:
    try:
        lib.nvmlShutdown()
    except NvmlFailure as error:
        log.debug("nvmlShutdown failed: %s", error)


def _nvlinks(lib: Any, handle: Any, gpu_by_bus: dict[str, int]) -> tuple[set[int], bool]:
    """GPUs this one reaches over NVLink directly, and whether it is on an NVSwitch fabric."""
    peers: set[int] = set()
    on_switch = False
    for link in range(MAX_NVLINKS):
        try:
            if lib.nvmlDeviceGetNvLinkState(handle, link) != FEATURE_ENABLED:
                continue
            remote = sysfs_bus_id(_bus_id(lib.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)))
        except NvmlFailure:
            continue  # no such link, or no NVLink on this card at all
        if remote in gpu_by_bus:
            peers.add(gpu_by_bus[remote])
            continue
        try:
            kind = lib.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
        except NvmlFailure:
            kind = DEVICE_TYPE_SWITCH  # old drivers: a non-GPU NVLink end is an NVSwitch
        on_switch = on_switch or kind == DEVICE_TYPE_SWITCH
    return peers, on_switch


def _mig_mode(lib: Any, handle: Any) -> bool | None:
    """Whether MIG is on now; None when the card has no MIG (NotSupported)."""
    try:
        current, _pending = lib.nvmlDeviceGetMigMode(handle)
    except NvmlFailure:
        return None
    return int(current) == FEATURE_ENABLED


def _optional_int(read: Callable[..., Any], *args: Any) -> int | None:
    try:
        value = int(read(*args))
    except NvmlFailure:
        return None  # NotSupported on this card or driver
    return value if value > 0 else None


def _list_gpus(lib: Any, root: Path, pcie_bandwidth: Mapping[str, float]) -> list[Gpu]:
    count = int(lib.nvmlDeviceGetCount())
    if count == 0:
        log.info("no NVIDIA GPU found (NVML: driver loaded, 0 devices)")
        return []
    handles = [lib.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    bus_ids = [_bus_id(lib.nvmlDeviceGetPciInfo(h)) for h in handles]
    gpu_by_bus = {sysfs_bus_id(bus): i for i, bus in enumerate(bus_ids)}
    links = [_nvlinks(lib, h, gpu_by_bus) for h in handles]
    # Behind NVSwitches (DGX/HGX) every card reaches every other card on the fabric.
    fabric = {i for i, (_, on_switch) in enumerate(links) if on_switch}
    gpus = []
    for index, handle in enumerate(handles):
        peers, on_switch = links[index]
        if on_switch:
            peers = peers | (fabric - {index})
        peers.discard(index)
        mig = _mig_mode(lib, handle)
        gpus.append(
            Gpu(
                index=index,
                uuid=_text(lib.nvmlDeviceGetUUID(handle)),
                model=_text(lib.nvmlDeviceGetName(handle)),
                vendor="nvidia",
                memory_mb=int(lib.nvmlDeviceGetMemoryInfo(handle).total) // MIB,
                pci_bus_id=bus_ids[index],
                # The PCIe root's node, which is what a task's CPUs should share; NVML's own
                # nvmlDeviceGetNumaNodeId names GPU memory's node on coherent (Grace) systems.
                numa_node=pci_numa_node(root, bus_ids[index]),
                nvlink_peers=sorted(peers),
                mig_capable=mig is not None,
                mig_enabled=mig,
                # The most the card and its slot can run; the link trains down when idle.
                pcie_generation_max=_optional_int(lib.nvmlDeviceGetMaxPcieLinkGeneration, handle),
                pcie_width_max=_optional_int(lib.nvmlDeviceGetMaxPcieLinkWidth, handle),
                pci_root=pci_root(root, bus_ids[index]),
                pcie_bandwidth_gbps=pcie_bandwidth.get(sysfs_bus_id(bus_ids[index])),
            )
        )
    return gpus


def discover_gpus(
    lib: Any | None = None,
    root: Path = Path("/"),
    pcie_bandwidth: Mapping[str, float] | None = None,
) -> list[Gpu]:
    """Every NVIDIA GPU, or [] (logged: "no NVIDIA GPU found (NVML: <reason>)").
    `pcie_bandwidth`: measured host-to-card GB/s by PCI bus id (any spelling of the domain),
    put on the card at that bus id."""
    nvml = _start(lib)
    if nvml is None:
        return []
    measured = {sysfs_bus_id(bus): gbps for bus, gbps in (pcie_bandwidth or {}).items()}
    try:
        return _list_gpus(nvml, root, measured)
    except NvmlFailure as error:
        log.warning("no NVIDIA GPU found (NVML: listing devices failed: %s)", error)
        return []
    finally:
        _stop(nvml)


@dataclass(frozen=True)
class CardUse:
    """What a card is doing, for a measurement that must not disturb a task on it."""

    index: int  # NVML's
    bus_id: str  # as sysfs spells it (0000:17:00.0), which is also CUDA's spelling
    processes: int | None  # compute processes on it now; None: NVML could not say
    mig_enabled: bool = False
    local_cpus: tuple[int, ...] = ()  # the CPUs nearest its link; (): sysfs does not say


def card_uses(lib: Any | None = None, root: Path = Path("/")) -> list[CardUse]:
    """Each card's compute processes now, by bus id; [] without NVML (logged by _start)."""
    nvml = _start(lib)
    if nvml is None:
        return []
    found = []
    try:
        for index in range(int(nvml.nvmlDeviceGetCount())):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            bus = sysfs_bus_id(_bus_id(nvml.nvmlDeviceGetPciInfo(handle)))
            try:
                processes: int | None = len(nvml.nvmlDeviceGetComputeRunningProcesses(handle))
            except NvmlFailure as error:
                log.debug("GPU %d lists no processes: %s", index, error)
                processes = None
            mig = bool(_mig_mode(nvml, handle))
            cpus = tuple(pci_local_cpus(root, bus))
            found.append(CardUse(index, bus, processes, mig, cpus))
    except NvmlFailure as error:
        log.warning("NVML could not list devices: %s", error)
    finally:
        _stop(nvml)
    return found


def _optional(read: Callable[..., Any], *args: Any) -> float | None:
    try:
        return float(read(*args))
    except NvmlFailure:
        return None  # not every card has this sensor


def _watts(milliwatts: float | None) -> float | None:
    return None if milliwatts is None else milliwatts / 1000.0


def _ecc(lib: Any, handle: Any, kind: int) -> int | None:
    """Volatile ECC error count; None on cards without ECC or with ECC off."""
    try:
        return max(0, int(lib.nvmlDeviceGetTotalEccErrors(handle, kind, ECC_VOLATILE)))
    except NvmlFailure:
        return None


def _is_lost(error: BaseException) -> bool:
    """NVML's GPU_IS_LOST (pynvml's NVMLError carries the return code as `value`)."""
    return getattr(error, "value", None) == ERROR_GPU_IS_LOST


def _active_links(lib: Any, handle: Any) -> int:
    """NVLinks up now (0 on cards without NVLink)."""
    up = 0
    for link in range(MAX_NVLINKS):
        try:
            up += lib.nvmlDeviceGetNvLinkState(handle, link) == FEATURE_ENABLED
        except NvmlFailure:
            if link == 0:
                return 0  # no NVLink on this card
            continue
    return up


class GpuSampler:
    """Reads GPU load through one NVML session held for the life of the probe."""

    def __init__(self, lib: Any | None = None) -> None:
        self._lib = lib
        self._nvml: Any | None = None
        self._handles: list[tuple[int, Any]] = []
        self._events: Any | None = None  # the Xid event set; None: not available
        self._links: dict[int, int] = {}  # NVLinks up per card when opened
        self._lost: set[int] = set()  # cards that answered GPU_IS_LOST in the last sample

    def open(self) -> bool:
        """True when there are GPUs to sample."""
        self._nvml = _start(self._lib)
        if self._nvml is None:
            return False
        try:
            count = int(self._nvml.nvmlDeviceGetCount())
            self._handles = [(i, self._nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)]
        except NvmlFailure as error:
            log.warning("NVML could not list devices: %s", error)
            self.close()
            return False
        self._links = {i: _active_links(self._nvml, h) for i, h in self._handles}
        self._events = self._register_xids()
        return bool(self._handles)

    def _register_xids(self) -> Any | None:
        """An event set delivering every card's Xid events; None (logged) where the driver
        cannot (then no Xid is read, the other faults still are)."""
        nvml = self._nvml
        assert nvml is not None
        try:
            events = nvml.nvmlEventSetCreate()
        except NvmlFailure as error:
            log.warning("Xid events not read: NVML event set: %s", error)
            return None
        registered = 0
        for index, handle in self._handles:
            try:
                nvml.nvmlDeviceRegisterEvents(handle, EVENT_XID, events)
                registered += 1
            except NvmlFailure as error:
                log.warning("GPU %d: Xid events not read: %s", index, error)
        return events if registered else None

    def _drain_xids(self) -> dict[int, list[int]]:
        """Xid codes delivered since the last round, by card index."""
        nvml, events = self._nvml, self._events
        found: dict[int, list[int]] = {}
        if nvml is None or events is None:
            return found
        index_of = {id(h): i for i, h in self._handles}
        for _ in range(MAX_EVENTS_PER_ROUND):
            try:
                data = nvml.nvmlEventSetWait_v2(events, 0)
            except NvmlFailure:
                break  # NVML_ERROR_TIMEOUT: none waiting
            if not int(data.eventType) & EVENT_XID:
                continue
            index = index_of.get(id(data.device))
            if index is None:
                try:
                    index = int(nvml.nvmlDeviceGetIndex(data.device))
                except NvmlFailure:
                    continue
            found.setdefault(index, []).append(int(data.eventData))
        return found

    def signals(self) -> list[CardSignals]:
        """Each card's faults this round: Xid events, a card lost (as the last sample
        found), retired pages pending, a failed row remap, NVLinks down since opened."""
        nvml = self._nvml
        if nvml is None:
            return []
        xids = self._drain_xids()
        found = []
        for index, handle in self._handles:
            lost = index in self._lost
            pending = remap_failure = False
            links_down = 0
            if not lost:
                # NotSupported: no page retirement (row remapping instead), or no row
                # remapping (before Ampere)
                with contextlib.suppress(NvmlFailure):
                    pending = int(nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle)) == 1
                with contextlib.suppress(NvmlFailure):
                    remap_failure = bool(int(nvml.nvmlDeviceGetRemappedRows(handle)[3]))
                if self._links.get(index):
                    links_down = max(0, self._links[index] - _active_links(nvml, handle))
            found.append(
                CardSignals(
                    gpu=index,
                    lost=lost,
                    xids=tuple(xids.get(index, ())),
                    pages_pending=pending,
                    remap_failure=remap_failure,
                    nvlinks_down=links_down,
                )
            )
        return found

    def sample(self) -> list[GpuMetrics]:
        """One reading per GPU that answers; a card that does not (fallen off the bus) is left
        out, which the gpus-visible health check turns into NotReady."""
        nvml = self._nvml
        if nvml is None:
            return []
        readings = []
        for index, handle in self._handles:
            try:
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                utilization = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            except NvmlFailure as error:
                log.warning("GPU %d not answering NVML: %s", index, error)
                if _is_lost(error):
                    self._lost.add(index)
                continue
            self._lost.discard(index)
            readings.append(
                GpuMetrics(
                    index=index,
                    utilization_percent=min(max(utilization, 0.0), 100.0),
                    memory_used_mb=int(memory.used) // MIB,
                    memory_total_mb=int(memory.total) // MIB,
                    temperature_c=_optional(nvml.nvmlDeviceGetTemperature, handle, TEMPERATURE_GPU),
                    power_w=_watts(_optional(nvml.nvmlDeviceGetPowerUsage, handle)),
                    sm_clock_mhz=_optional(nvml.nvmlDeviceGetClockInfo, handle, CLOCK_SM),
                    memory_clock_mhz=_optional(nvml.nvmlDeviceGetClockInfo, handle, CLOCK_MEM),
                    pcie_generation=_optional_int(nvml.nvmlDeviceGetCurrPcieLinkGeneration, handle),
                    pcie_width=_optional_int(nvml.nvmlDeviceGetCurrPcieLinkWidth, handle),
                    ecc_errors_corrected=_ecc(nvml, handle, ECC_CORRECTED),
                    ecc_errors_uncorrected=_ecc(nvml, handle, ECC_UNCORRECTED),
                )
            )
        return readings

    def processes(self) -> list[GpuProcess] | None:
        """The compute processes on each card that answers, with the memory each holds;
        None without NVML (nothing read, which is not "nothing runs")."""
        nvml = self._nvml
        if nvml is None:
            return None
        found: list[GpuProcess] = []
        for index, handle in self._handles:
            try:
                running = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except NvmlFailure as error:
                log.debug("GPU %d lists no processes: %s", index, error)
                continue
            for process in running:
                used = getattr(process, "usedGpuMemory", None)  # None: not available (MIG, WDDM)
                found.append(
                    GpuProcess(
                        gpu=index,
                        pid=int(process.pid),
                        memory_mb=int(used) // MIB if isinstance(used, int) and used > 0 else 0,
                    )
                )
        return found

    def close(self) -> None:
        if self._nvml is not None and self._events is not None:
            try:
                self._nvml.nvmlEventSetFree(self._events)
            except NvmlFailure as error:
                log.debug("nvmlEventSetFree failed: %s", error)
        self._events = None
        if self._nvml is not None:
            _stop(self._nvml)
        self._nvml = None
        self._handles = []
