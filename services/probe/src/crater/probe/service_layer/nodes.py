"""What the probe reports on: this machine (local mode) or a simulated fleet (fleet mode)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Protocol

from crater.contracts import (
    GpuFault,
    GpuProcess,
    NodeHealthReported,
    NodeMetricsReported,
    NodeTopology,
    RunningAllocation,
    Taint,
)
from crater.probe.adapters.host import HostSampler
from crater.probe.adapters.measure import Measurements, measure_node
from crater.probe.adapters.nvme import disks_wear
from crater.probe.adapters.nvml import GpuSampler
from crater.probe.adapters.pcie_bandwidth import PcieBandwidth, measure_local
from crater.probe.adapters.sysfs import discover_local
from crater.probe.domain.faults import CardSignals, FaultTracker, XidSeen
from crater.probe.domain.health import DiskWear, HealthLimits, evaluate
from crater.probe.settings import ProbeSettings
from crater.probe.sim.simulation import FleetSimulator

log = logging.getLogger("crater.probe")


def chunked(items: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class Nodes(Protocol):
    """What the probe reports on: this machine, or a simulated fleet."""

    async def open(self) -> None: ...

    async def topologies(self) -> list[NodeTopology]: ...

    async def measure(self) -> bool: ...

    def metrics(self, chunk: int) -> AsyncIterator[list[NodeMetricsReported]]: ...

    def health(self, chunk: int) -> Iterator[list[NodeHealthReported]]: ...

    async def close(self) -> None: ...


# Measures PCIe copy bandwidth (`only`: these bus ids; None: every card).
MeasurePcie = Callable[[ProbeSettings, frozenset[str] | None], PcieBandwidth]
# How long the probe waits for its PCIe measurement before it reports without it.
PCIE_MEASURE_TIMEOUT_SECONDS = 60.0


class LocalNode:
    """This machine: /sys and /proc, NVML and psutil. Blocking reads run in a thread."""

    def __init__(
        self,
        settings: ProbeSettings,
        on_xid: Callable[[XidSeen], None] | None = None,
        on_pcie: Callable[[str], None] | None = None,
        measure_pcie: MeasurePcie | None = None,
    ) -> None:
        self.settings = settings
        self.on_pcie = on_pcie  # counts each card's measurement outcome
        self._measure_pcie = measure_pcie or (
            lambda s, only: measure_local(root=s.host_root, bounds=s.copy_bounds, only=only)
        )
        # Host-to-card GB/s by bus id, measured at start; kept across re-discoveries.
        self.pcie_bandwidth: dict[str, float] = {}
        # Cards busy when measured (a task on them): measured at a later re-discovery, once
        # idle. The measuring thread, while it runs (one at a time: a timed-out one may).
        self.pcie_waiting: set[str] = set()
        self._pcie_running = False
        self.topology: NodeTopology | None = None
        self.last: NodeMetricsReported | None = None
        self.measured: Measurements | None = None
        self.wear: list[DiskWear] = []
        self._host: HostSampler | None = None
        self._gpus = GpuSampler()
        table, unknown = settings.xid_table()
        limits = HealthLimits()
        self.tracker = FaultTracker(
            table,
            unknown,
            hot_c=limits.gpu_temperature_warn_c,
            pcie_busy_utilization=limits.pcie_busy_utilization,
        )
        self.on_xid = on_xid
        self._sampling_gpus = False
        # The cards' faults at the last metrics round (None: no card is sampled).
        self.faults: list[GpuFault] | None = None
        # What this node's agent runs (the executing agent's runs), sent with each heartbeat;
        # None: it runs nothing, and the heartbeat carries no inventory.
        self.inventory: Callable[[], list[RunningAllocation]] | None = None
        # The processes on the cards at the last metrics round (None: not read).
        self.processes: list[GpuProcess] | None = None

    def _discover(self) -> NodeTopology:
        root = self.settings.host_root
        node = discover_local(
            root,
            node_id=self.settings.node_id,
            pool=self.settings.pool,
            labels=self.settings.labels,
            taints=[Taint.parse(t) for t in self.settings.taints],
            disk_iops_at_depth=self.settings.disk_iops_at_depth,
            pcie_bandwidth=self.pcie_bandwidth,
        )
        # Wear moves slowly: read with each discovery, not each heartbeat.
        self.wear = disks_wear(node.disks, root / "dev")
        return node if self.measured is None else self.measured.apply(node)

    async def measure(self) -> bool:
        """Measure memory and disks once (blocking work in a thread); True when done."""
        assert self.topology is not None
        node = self.topology
        measured = await asyncio.to_thread(
            measure_node,
            node,
            root=self.settings.host_root,
            bounds=self.settings.bounds,
            progress=lambda line: log.info("measuring %s", line),
        )
        self.measured = measured
        self.topology = measured.apply(node)
        for what, why in measured.skipped.items():
            log.info("not measured: %s (%s)", what, why)
        return True

    def _measure_links(self, only: frozenset[str] | None = None) -> None:
        """Each idle card's PCIe copy bandwidth (`only`: of these cards, those busy before);
        a card not measured is logged with why and counted, and keeps its nominal figure; one
        still busy on a later try is neither logged nor counted again. Nothing here stops
        the probe."""
        self._pcie_running = True
        try:
            found = self._measure_pcie(self.settings, only)
        except Exception:  # a bug, not a card: the topology still goes out, unmeasured
            log.exception("PCIe bandwidth not measured")
            return
        finally:
            self._pcie_running = False
        self.pcie_bandwidth.update(found.gbps)
        self.pcie_waiting -= set(found.gbps)
        for bus, figure in found.gbps.items():
            log.info("PCIe host-to-card copy bandwidth of %s: %.2f GB/s", bus, figure)
        outcomes: list[str] = ["measured"] * len(found.gbps)
        for bus, (outcome, why) in found.skipped.items():
            if outcome == "busy":
                if only is not None:
                    continue  # still busy: tried again at the next re-discovery
                self.pcie_waiting.add(bus)
                why += "; measured once idle"
            else:
                self.pcie_waiting.discard(bus)
            log.warning("PCIe bandwidth of %s not measured (%s): %s", bus, outcome, why)
            outcomes.append(outcome)
        if self.on_pcie is not None:
            for counted in outcomes:
                self.on_pcie(counted)

    async def _measure_links_within(self, only: frozenset[str] | None = None) -> None:
        """`_measure_links` in a thread, waited for `PCIE_MEASURE_TIMEOUT_SECONDS` at most: a
        driver that hangs (in cuInit, say) must not hold the probe's reports back. A thread
        that finishes later still records its figures (the next re-discovery sends them)."""
        if self._pcie_running:
            return
        try:
            async with asyncio.timeout(PCIE_MEASURE_TIMEOUT_SECONDS):
                await asyncio.to_thread(self._measure_links, only)
        except TimeoutError:
            log.warning(
                "PCIe bandwidth measurement still running after %.0f s: the topology goes out "
                "without it",
                PCIE_MEASURE_TIMEOUT_SECONDS,
            )
            if self.on_pcie is not None:
                self.on_pcie("timed-out")

    async def open(self) -> None:
        if self.settings.measure_pcie_bandwidth:
            # Before the first discovery, so the first topology report carries the figures
            # (no re-publication), and before the sampler holds NVML open.
            await self._measure_links_within()
        self.topology = await asyncio.to_thread(self._discover)
        self._host = HostSampler(self.settings.host_root)
        if self.topology.gpus:
            self._sampling_gpus = await asyncio.to_thread(self._gpus.open)
        log.info(
            "local node %s: %d GPUs, %d NUMA nodes, %d threads, %d MiB, %d disks",
            self.topology.node_id,
            len(self.topology.gpus),
            len(self.topology.numa_nodes),
            self.topology.cpu.threads,
            self.topology.memory_mb,
            len(self.topology.disks),
        )

    async def topologies(self) -> list[NodeTopology]:
        if self.pcie_waiting and self.settings.measure_pcie_bandwidth:
            await self._measure_links_within(frozenset(self.pcie_waiting))
        # Re-discovered each time: a card that fell off the bus changes the fingerprint.
        self.topology = await asyncio.to_thread(self._discover)
        return [self.topology]

    def _sample(self) -> NodeMetricsReported:
        assert self.topology is not None
        assert self._host is not None
        cpu, used, total = self._host.sample()
        self.processes = self._gpus.processes()
        report = NodeMetricsReported(
            node_id=self.topology.node_id,
            cpu_utilization_percent=cpu,
            memory_used_mb=used,
            memory_total_mb=total,
            gpus=self._gpus.sample(),
            numa_cpu_utilization_percent=self._host.numa_cpu(self.topology.numa_nodes),
            disks=self._host.disks([d.name for d in self.topology.disks]),
            numa_memory_bandwidth_gbps=self._host.memory_bandwidth(self.topology.numa_nodes),
        )
        if self._sampling_gpus:
            self.faults = self._read_faults(report)
        return report

    def _read_faults(self, report: NodeMetricsReported) -> list[GpuFault]:
        """The cards' faults now (after `sample`, which finds the lost cards); every Xid
        delivered is counted, and one the table does not know is logged."""
        assert self.topology is not None
        faults, seen = self.tracker.update(
            self._gpus.signals(), report, self.topology, datetime.now(UTC)
        )
        for xid in seen:
            if not xid.known:
                log.warning(
                    "GPU %d: Xid %d is in no Xid table; acting as for an unknown Xid: %s",
                    xid.gpu,
                    xid.code,
                    xid.action.value,
                )
            if self.on_xid is not None:
                self.on_xid(xid)
        return faults

    async def metrics(self, chunk: int) -> AsyncIterator[list[NodeMetricsReported]]:
        self.last = await asyncio.to_thread(self._sample)
        yield [self.last]

    def health(self, chunk: int) -> Iterator[list[NodeHealthReported]]:
        assert self.topology is not None
        report = evaluate(
            self.topology, self.last, disk_wear=self.wear, faults=self.faults
        ).report()
        if self.inventory is not None:
            report = report.model_copy(update={"running": self.inventory()})
        if self.processes is not None and self.settings.report_inventory:
            report = report.model_copy(update={"gpu_processes": self.processes})
        yield [report]

    async def close(self) -> None:
        await asyncio.to_thread(self._gpus.close)


class FleetNodes:
    """Every node of a simulated fleet. The simulation clock (what faults are timed by) is
    the seconds since `open()`; a silent node is left out of every round."""

    def __init__(
        self,
        simulator: FleetSimulator,
        clock: Callable[[], float] = time.monotonic,
        inventory: bool = True,
    ):
        self.simulator = simulator
        self._clock = clock
        self.inventory = inventory  # each heartbeat lists what the simulated node runs
        self._started: float | None = None
        # Each node's card faults as its simulated metrics show them (ECC, heat, links).
        self.trackers: dict[str, FaultTracker] = {}

    def _tick(self) -> None:
        if self._started is not None:
            self.simulator.advance_to(self._clock() - self._started)

    async def open(self) -> None:
        self._started = self._clock()
        _, total = self.simulator.gpu_counts()
        log.info("simulating %d nodes with %d GPUs", len(self.simulator), total)

    async def topologies(self) -> list[NodeTopology]:
        self._tick()
        sim = self.simulator
        return [sim.topology(n) for n in sim.reporting_ids]

    async def measure(self) -> bool:
        log.info("full measurement skipped: the fleet is simulated")
        return False

    async def metrics(self, chunk: int) -> AsyncIterator[list[NodeMetricsReported]]:
        self._tick()
        for ids in chunked(self.simulator.reporting_ids, chunk):
            yield [self.simulator.step_node(node_id) for node_id in ids]

    def health(self, chunk: int) -> Iterator[list[NodeHealthReported]]:
        self._tick()
        sim = self.simulator
        for ids in chunked(sim.reporting_ids, chunk):
            reports = [
                evaluate(sim.topology(n), sim.last_metrics(n), faults=self._faults(n)).report()
                for n in ids
            ]
            if self.inventory:
                reports = [
                    r.model_copy(update={"running": sim.inventory(r.node_id)}) for r in reports
                ]
            yield reports

    def _faults(self, node_id: str) -> list[GpuFault] | None:
        """A simulated node's card faults; None while it has none, so that a calm fleet's
        heartbeats read as they always have."""
        tracker = self.trackers.setdefault(node_id, FaultTracker())
        sim = self.simulator
        signals = [CardSignals(gpu, xids=xids) for gpu, xids in sim.xid_events(node_id).items()]
        faults, _ = tracker.update(
            signals, sim.last_metrics(node_id), sim.topology(node_id), datetime.now(UTC)
        )
        return faults or None

    async def close(self) -> None:
        pass
