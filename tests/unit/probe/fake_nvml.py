"""A stand-in for pynvml: the calls the probe makes, answered from a description of cards."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

SWITCH_BUS = "00000000:C0:00.0"


class NVMLError(Exception):
    pass


class NVMLErrorNotSupported(NVMLError):
    def __str__(self) -> str:
        return "Not Supported"


class NVMLErrorTimeout(NVMLError):
    value = 10

    def __str__(self) -> str:
        return "Timeout"


class NVMLErrorLibraryNotFound(NVMLError):
    def __str__(self) -> str:
        return "NVML Shared Library Not Found"


class NVMLErrorGpuIsLost(NVMLError):
    value = 15  # NVML_ERROR_GPU_IS_LOST, as pynvml's errors carry their return code

    def __str__(self) -> str:
        return "GPU is lost"


@dataclass
class Card:
    name: str
    bus: str
    memory_mb: int = 81920
    # Per link: the remote bus id, and whether it is an NVSwitch.
    links: list[tuple[str, bool]] = field(default_factory=list)
    mig: bool = False
    lost: bool = False
    used_mb: int = 1024
    utilization: int = 37
    temperature: int | None = 61
    power_mw: int | None = 250_000
    mig_enabled: bool = False
    # PCIe link: (generation, width) the card and slot can run, and what it runs now.
    pcie_max: tuple[int, int] | None = (4, 16)
    pcie_now: tuple[int, int] | None = (4, 16)
    clocks_mhz: tuple[int, int] | None = (1410, 1593)  # SM, memory
    # ECC (corrected, uncorrected) since boot; None: no ECC on this card (GeForce).
    ecc: tuple[int, int] | None = (0, 0)
    # Compute processes: (pid, bytes held; None: NVML cannot say).
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    # Xid events waiting to be delivered (the driver queues them per event set).
    xids: list[int] = field(default_factory=list)
    # Retired pages pending (None: the card has row remapping instead, NotSupported).
    pages_pending: bool | None = False
    # Row remapper: (corrected rows, uncorrected rows, pending, failure); None: before Ampere.
    remap: tuple[int, int, int, int] | None = (0, 0, 0, 0)
    # NVLinks down now, of `links` (the last ones).
    links_down: int = 0


class FakeNvml:
    MIB = 1024 * 1024

    def __init__(self, cards: list[Card], *, loads: bool = True) -> None:
        self.cards = cards
        self.loads = loads
        self.initialised = 0

    def nvmlInit(self) -> None:
        if not self.loads:
            raise NVMLErrorLibraryNotFound()
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self.initialised -= 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Card:
        return self.cards[index]

    def nvmlDeviceGetPciInfo(self, card: Card) -> Any:
        return SimpleNamespace(busId=card.bus.encode())  # older pynvml hands back bytes

    def nvmlDeviceGetUUID(self, card: Card) -> str:
        return f"GPU-{self.cards.index(card):08d}-0000-0000-0000-000000000000"

    def nvmlDeviceGetName(self, card: Card) -> str:
        return card.name

    def nvmlDeviceGetMemoryInfo(self, card: Card) -> Any:
        if card.lost:
            raise NVMLErrorGpuIsLost()
        return SimpleNamespace(total=card.memory_mb * self.MIB, used=card.used_mb * self.MIB)

    def nvmlDeviceGetNvLinkState(self, card: Card, link: int) -> int:
        if not card.links:
            raise NVMLErrorNotSupported()
        if link >= len(card.links):
            raise NVMLError("Invalid Argument")
        return 0 if link >= len(card.links) - card.links_down else 1

    def nvmlDeviceGetIndex(self, card: Card) -> int:
        return self.cards.index(card)

    # Events: one set; every registered card's queued Xids come out one at a time.
    def nvmlEventSetCreate(self) -> str:
        self.registered: list[Card] = []
        return "event-set"

    def nvmlDeviceRegisterEvents(self, card: Card, kinds: int, events: str) -> None:
        assert kinds == 0x8  # nvmlEventTypeXidCriticalError
        self.registered.append(card)

    def nvmlEventSetWait_v2(self, events: str, timeout_ms: int) -> Any:
        for card in self.registered:
            if card.xids:
                return SimpleNamespace(device=card, eventType=0x8, eventData=card.xids.pop(0))
        raise NVMLErrorTimeout()

    def nvmlEventSetFree(self, events: str) -> None:
        self.registered = []

    def nvmlDeviceGetRetiredPagesPendingStatus(self, card: Card) -> int:
        if card.pages_pending is None:
            raise NVMLErrorNotSupported()
        return int(card.pages_pending)

    def nvmlDeviceGetRemappedRows(self, card: Card) -> tuple[int, int, int, int]:
        if card.remap is None:
            raise NVMLErrorNotSupported()
        return card.remap

    def nvmlDeviceGetNvLinkRemotePciInfo(self, card: Card, link: int) -> Any:
        return SimpleNamespace(busId=card.links[link][0])

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, card: Card, link: int) -> int:
        return 2 if card.links[link][1] else 0

    def nvmlDeviceGetMigMode(self, card: Card) -> tuple[int, int]:
        if not card.mig:
            raise NVMLErrorNotSupported()
        mode = int(card.mig_enabled)
        return (mode, mode)

    def nvmlDeviceGetUtilizationRates(self, card: Card) -> Any:
        if card.lost:
            raise NVMLErrorGpuIsLost()
        return SimpleNamespace(gpu=card.utilization, memory=10)

    def nvmlDeviceGetTemperature(self, card: Card, sensor: int) -> int:
        if card.temperature is None:
            raise NVMLErrorNotSupported()
        return card.temperature

    def nvmlDeviceGetPowerUsage(self, card: Card) -> int:
        if card.power_mw is None:
            raise NVMLErrorNotSupported()
        return card.power_mw

    def _pcie(self, value: tuple[int, int] | None, which: int) -> int:
        if value is None:
            raise NVMLErrorNotSupported()
        return value[which]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, card: Card) -> int:
        return self._pcie(card.pcie_max, 0)

    def nvmlDeviceGetMaxPcieLinkWidth(self, card: Card) -> int:
        return self._pcie(card.pcie_max, 1)

    def nvmlDeviceGetCurrPcieLinkGeneration(self, card: Card) -> int:
        if card.lost:
            raise NVMLErrorGpuIsLost()
        return self._pcie(card.pcie_now, 0)

    def nvmlDeviceGetCurrPcieLinkWidth(self, card: Card) -> int:
        return self._pcie(card.pcie_now, 1)

    def nvmlDeviceGetComputeRunningProcesses(self, card: Card) -> list[Any]:
        if card.lost:
            raise NVMLErrorGpuIsLost()
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in card.processes]

    def nvmlDeviceGetClockInfo(self, card: Card, clock: int) -> int:
        if card.clocks_mhz is None:
            raise NVMLErrorNotSupported()
        return card.clocks_mhz[clock - 1]  # NVML_CLOCK_SM = 1, NVML_CLOCK_MEM = 2

    def nvmlDeviceGetTotalEccErrors(self, card: Card, error_type: int, counter: int) -> int:
        if card.ecc is None:
            raise NVMLErrorNotSupported()
        return card.ecc[error_type]  # CORRECTED = 0, UNCORRECTED = 1


def bus(i: int) -> str:
    return f"00000000:{0x17 + i * 0x10:02X}:00.0"


def hgx(count: int = 8) -> list[Card]:
    """Cards on an NVSwitch fabric: every link ends at a switch."""
    return [
        Card("NVIDIA H100 80GB HBM3", bus(i), 81559, [(SWITCH_BUS, True)] * 18, mig=True)
        for i in range(count)
    ]


def nvlink_pair() -> list[Card]:
    return [
        Card("Tesla V100-SXM2-32GB", bus(0), 32768, [(bus(1), False)] * 4),
        Card("Tesla V100-SXM2-32GB", bus(1), 32768, [(bus(0), False)] * 4),
    ]


def pcie_only(count: int = 4) -> list[Card]:
    return [Card("NVIDIA GeForce RTX 4090", bus(i), 24564, ecc=None) for i in range(count)]
