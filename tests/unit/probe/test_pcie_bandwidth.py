"""The probe's PCIe copy-bandwidth measurement, driven by a CUDA driver stand-in whose copies
take known times (so each GB/s is exact) and NVML's stand-in for the cards and their tasks."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from crater.probe.adapters import sysfs
from crater.probe.adapters.nvml import CardUse, card_uses, discover_gpus
from crater.probe.adapters.pcie_bandwidth import (
    MIB,
    CopyBounds,
    CudaError,
    PcieBandwidth,
    copy_gbps,
    gbps,
    measure_cards,
    measure_local,
    near,
)
from crater.probe.service_layer import nodes
from crater.probe.service_layer.metrics import ProbeMetrics
from crater.probe.service_layer.nodes import LocalNode
from crater.probe.service_layer.reporting import Reporting
from crater.probe.settings import ProbeSettings
from tests.unit.probe.fake_cuda import CUresult, Device, FakeCudaDriver
from tests.unit.probe.fake_nvml import Card, FakeNvml, bus, pcie_only
from tests.unit.probe.recorded import write_tree

BOUNDS = CopyBounds(buffer_mb=64, runs=5, warmup=2)
NBYTES = 64 * MIB
A, B = "0000:17:00.0", "0000:27:00.0"  # bus(0), bus(1) as sysfs and CUDA spell them


def idle(*buses: str) -> list[CardUse]:
    return [CardUse(i, b, processes=0) for i, b in enumerate(buses)]


def no_bindings() -> Any:
    raise AssertionError("the CUDA driver was loaded")


def test_gigabytes_are_decimal_and_one_way() -> None:
    assert gbps(128 * MIB, 10.0) == pytest.approx(13.4217728)
    assert gbps(1_000_000_000, 1000.0) == 1.0
    with pytest.raises(CudaError):
        gbps(MIB, 0.0)  # a zero-length event pair would be infinite bandwidth


def test_a_copy_timed_by_events_gives_gb_per_second_and_frees_everything() -> None:
    driver = FakeCudaDriver([Device(A, copy_ms=[5.0])])
    driver.cuInit(0)
    figure = copy_gbps(driver, 0, BOUNDS)
    assert figure == pytest.approx(NBYTES / 0.005 / 1e9)  # 13.42 GB/s
    assert driver.devices[0].copies == 7  # 2 to warm up, 5 timed
    assert driver.copied_bytes == [NBYTES] * 7
    assert driver.released()


def test_the_figure_is_the_median_run_so_one_slow_or_fast_copy_does_not_move_it() -> None:
    # Warm-up copies (100 ms: a cold link) are not timed; the runs take 10, 40, 20, 2.5, 8 ms.
    driver = FakeCudaDriver([Device(A, copy_ms=[100.0, 100.0, 10.0, 40.0, 20.0, 2.5, 8.0])])
    driver.cuInit(0)
    assert copy_gbps(driver, 0, BOUNDS) == pytest.approx(gbps(NBYTES, 10.0))


def test_cards_are_matched_to_cuda_devices_by_bus_id_not_by_index() -> None:
    # CUDA lists the cards the other way round (CUDA_DEVICE_ORDER=FASTEST_FIRST, say) and
    # spells the bus id in upper case; each figure still lands on its own card.
    driver = FakeCudaDriver(
        [Device("0000:27:00.0", copy_ms=[2.0]), Device("0000:17:00.0", copy_ms=[4.0])]
    )
    found = measure_cards(idle(A, B), driver=driver, bounds=BOUNDS)
    assert found.gbps == {A: round(gbps(NBYTES, 4.0), 2), B: round(gbps(NBYTES, 2.0), 2)}
    assert found.skipped == {}
    assert found.outcomes() == ["measured", "measured"]
    assert driver.released()


def test_the_nvml_topology_carries_the_measured_figure_on_the_card_at_that_bus_id() -> None:
    cards = pcie_only(3)
    gpus = discover_gpus(FakeNvml(cards), Path("/nonexistent"), pcie_bandwidth={B: 24.6})
    assert [g.pcie_bandwidth_gbps for g in gpus] == [None, 24.6, None]
    assert gpus[1].pci_bus_id == bus(1)  # NVML's 8-digit domain, matched all the same
    assert gpus[1].pcie_link_gbps() == 24.6  # what the scheduler checks: measured wins
    assert gpus[0].pcie_link_gbps() == 31.504  # unmeasured: nominal gen 4 x16


def test_busy_cards_are_not_touched() -> None:
    cards = [
        CardUse(0, A, processes=1),
        CardUse(1, B, processes=None),
        CardUse(2, "0000:37:00.0", processes=0, mig_enabled=True),
        CardUse(3, "0000:47:00.0", processes=0),
    ]
    devices = [Device(c.bus_id.upper(), copy_ms=[4.0]) for c in cards]
    driver = FakeCudaDriver(devices)
    found = measure_cards(cards, driver=driver, bounds=BOUNDS)
    assert list(found.gbps) == ["0000:47:00.0"]
    assert {b: outcome for b, (outcome, _) in found.skipped.items()} == {
        A: "busy",
        B: "busy",
        "0000:37:00.0": "busy",
    }
    assert "1 compute process" in found.skipped[A][1]
    assert "cannot list its processes" in found.skipped[B][1]
    assert "MIG" in found.skipped["0000:37:00.0"][1]
    assert [d.copies for d in devices] == [0, 0, 0, 7]


def test_with_every_card_busy_cuda_is_not_even_loaded() -> None:
    found = measure_cards([CardUse(0, A, processes=2)], load=no_bindings)
    assert found.gbps == {}
    assert found.outcomes() == ["busy"]


def test_without_cuda_bindings_nothing_is_measured_and_it_says_why() -> None:
    def missing() -> Any:
        raise ImportError("No module named 'cuda'")

    found = measure_cards(idle(A, B), load=missing)
    assert found.gbps == {}
    assert found.outcomes() == ["unavailable", "unavailable"]
    assert "cuda-bindings is not installed" in found.skipped[A][1]


def test_without_the_cuda_driver_library_nothing_is_measured() -> None:
    class NoLibcuda:  # what the bindings do where libcuda.so is not installed
        def cuInit(self, flags: int) -> Any:
            raise RuntimeError('"cuda" is an NVIDIA driver library and can only be found ...')

    found = measure_cards(idle(A), driver=NoLibcuda())
    assert found.skipped[A][0] == "unavailable"
    assert "NVIDIA driver library" in found.skipped[A][1]


def test_a_driver_that_will_not_start_leaves_every_card_unmeasured() -> None:
    driver = FakeCudaDriver([Device(A)], init=CUresult.CUDA_ERROR_NO_DEVICE)
    found = measure_cards(idle(A), driver=driver, bounds=BOUNDS)
    assert found.skipped == {
        A: ("unavailable", "CUDA driver unavailable: cuInit: CUDA_ERROR_NO_DEVICE")
    }


def test_a_card_cuda_does_not_see_is_unmatched() -> None:
    driver = FakeCudaDriver([Device(A)])  # B hidden by CUDA_VISIBLE_DEVICES
    found = measure_cards(idle(A, B), driver=driver, bounds=BOUNDS)
    assert list(found.gbps) == [A]
    assert found.skipped[B][0] == "unmatched"


@pytest.mark.parametrize(
    ("call", "error"),
    [
        ("cuDevicePrimaryCtxRetain", CUresult.CUDA_ERROR_INVALID_DEVICE),
        ("cuCtxSetCurrent", CUresult.CUDA_ERROR_INVALID_DEVICE),
        ("cuMemAllocHost", CUresult.CUDA_ERROR_OUT_OF_MEMORY),
        ("cuMemAlloc", CUresult.CUDA_ERROR_OUT_OF_MEMORY),
        ("cuEventCreate", CUresult.CUDA_ERROR_OUT_OF_MEMORY),
        ("cuMemcpyHtoD", CUresult.CUDA_ERROR_LAUNCH_FAILED),
        ("cuEventElapsedTime", CUresult.CUDA_ERROR_LAUNCH_FAILED),
    ],
)
def test_a_cuda_error_on_one_card_fails_that_card_frees_what_it_took_and_measures_the_next(
    call: str, error: CUresult
) -> None:
    driver = FakeCudaDriver([Device(A, fail={call: error}), Device(B, copy_ms=[4.0])])
    found = measure_cards(idle(A, B), driver=driver, bounds=BOUNDS)
    assert found.skipped == {A: ("failed", f"{call}: {error.name}")}
    assert list(found.gbps) == [B]
    assert driver.released()


def test_measuring_this_machine_reads_the_cards_and_their_tasks_from_nvml() -> None:
    cards = pcie_only(2)
    cards[0].processes = [(4242, 1024 * FakeNvml.MIB)]
    nvml = FakeNvml(cards)
    assert card_uses(nvml) == [CardUse(0, A, 1), CardUse(1, B, 0)]
    assert nvml.initialised == 0  # shut down again
    driver = FakeCudaDriver([Device(A), Device(B, copy_ms=[4.0])])
    found = measure_local(nvml=nvml, driver=driver, bounds=BOUNDS)
    assert found.gbps == {B: round(gbps(NBYTES, 4.0), 2)}
    assert found.skipped[A][0] == "busy"


def test_each_card_is_measured_from_its_own_cpus_read_from_sysfs(tmp_path: Path) -> None:
    write_tree(
        tmp_path,
        {
            "sys/bus/pci/devices/0000:17:00.0/local_cpulist": "0-3,8\n",
            "sys/bus/pci/devices/0000:27:00.0/local_cpulist": "4-7\n",
        },
    )
    pinned: list[tuple[int, ...]] = []

    @contextmanager
    def record(cpus: Sequence[int]) -> Iterator[None]:
        pinned.append(tuple(cpus))
        yield

    driver = FakeCudaDriver([Device(A), Device(B)])
    nvml = FakeNvml(pcie_only(3))  # the third card's sysfs entry is missing: no CPUs known
    found = measure_local(root=tmp_path, nvml=nvml, driver=driver, bounds=BOUNDS, pin=record)
    assert pinned == [(0, 1, 2, 3, 8), (4, 5, 6, 7)]  # the third card CUDA does not see
    assert list(found.gbps) == [A, B]


def test_pinning_runs_the_thread_on_the_allowed_cpus_and_puts_it_back() -> None:
    before = os.sched_getaffinity(0)
    one = min(before)
    with near([one, 100_000]):  # a CPU this process may not use is left out
        assert os.sched_getaffinity(0) == {one}
    assert os.sched_getaffinity(0) == before
    with near([100_000]):  # none usable: where it was
        assert os.sched_getaffinity(0) == before
    with near([]):
        assert os.sched_getaffinity(0) == before


def test_without_nvml_there_is_nothing_to_measure() -> None:
    found = measure_local(nvml=FakeNvml([], loads=False), load=no_bindings)
    assert found == PcieBandwidth()


@pytest.fixture
def fake_cards(monkeypatch: pytest.MonkeyPatch) -> list[Card]:
    """This machine's discovery answered by NVML's stand-in (the machine has no card)."""
    cards = pcie_only(2)
    real = discover_gpus

    def discover(root: Path, pcie_bandwidth: dict[str, float] | None = None) -> Any:
        return real(FakeNvml(cards), root, pcie_bandwidth)

    monkeypatch.setattr(sysfs, "discover_gpus", discover)
    return cards


async def test_the_setting_off_measures_nothing(fake_cards: list[Card]) -> None:
    def measure(settings: ProbeSettings, only: frozenset[str] | None) -> PcieBandwidth:
        raise AssertionError("measured with the setting off")

    node = LocalNode(ProbeSettings(mode="local", node_id="here-01"), measure_pcie=measure)
    await node.open()
    assert node.topology is not None
    assert [g.pcie_bandwidth_gbps for g in node.topology.gpus] == [None, None]
    await node.close()


async def test_the_first_topology_carries_the_figures_and_each_outcome_is_counted(
    fake_cards: list[Card], caplog: pytest.LogCaptureFixture
) -> None:
    fake_cards[0].processes = [(4242, None)]
    registry = CollectorRegistry()
    metrics = ProbeMetrics(registry)
    driver = FakeCudaDriver([Device(A), Device(B, copy_ms=[4.0])])
    settings = ProbeSettings(
        mode="local", node_id="here-01", measure_pcie_bandwidth=True, measure_pcie_buffer_mb=64
    )
    node = LocalNode(
        settings,
        on_pcie=lambda outcome: metrics.pcie_measurements.labels(outcome=outcome).inc(),
        measure_pcie=lambda s, only: measure_local(
            nvml=FakeNvml(fake_cards), driver=driver, bounds=s.copy_bounds, only=only
        ),
    )
    with caplog.at_level(logging.INFO, logger="crater.probe"):
        await node.open()
    assert node.topology is not None
    expected = round(gbps(NBYTES, 4.0), 2)
    assert [g.pcie_bandwidth_gbps for g in node.topology.gpus] == [None, expected]
    [topology] = await node.topologies()  # a re-discovery keeps the figure
    assert [g.pcie_bandwidth_gbps for g in topology.gpus] == [None, expected]
    assert driver.released()
    assert f"PCIe bandwidth of {A} not measured (busy): 1 compute process" in caplog.text
    counted = "crater_probe_pcie_bandwidth_measurements_total"
    assert registry.get_sample_value(counted, {"outcome": "measured"}) == 1
    assert registry.get_sample_value(counted, {"outcome": "busy"}) == 1
    await node.close()


async def test_a_measurement_that_breaks_does_not_stop_the_probe(
    fake_cards: list[Card], caplog: pytest.LogCaptureFixture
) -> None:
    def broken(settings: ProbeSettings, only: frozenset[str] | None) -> PcieBandwidth:
        raise ValueError("a bug")

    node = LocalNode(
        ProbeSettings(mode="local", node_id="here-01", measure_pcie_bandwidth=True),
        measure_pcie=broken,
    )
    await node.open()
    assert node.topology is not None
    assert [g.pcie_bandwidth_gbps for g in node.topology.gpus] == [None, None]
    assert "PCIe bandwidth not measured" in caplog.text
    await node.close()


class Recorded:
    """What `Reporting` published, chunk by chunk (its publisher's one call)."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    async def chunk(self, kind: str, events: Sequence[Any]) -> int:
        self.events.extend(events)
        return 0


async def test_a_card_busy_at_start_is_measured_once_idle_and_its_figure_goes_out(
    fake_cards: list[Card], caplog: pytest.LogCaptureFixture
) -> None:
    fake_cards[0].processes = [(4242, None)]
    registry = CollectorRegistry()
    metrics = ProbeMetrics(registry)
    driver = FakeCudaDriver([Device(A, copy_ms=[5.0]), Device(B, copy_ms=[4.0])])
    settings = ProbeSettings(
        mode="local", node_id="here-01", measure_pcie_bandwidth=True, measure_pcie_buffer_mb=64
    )
    node = LocalNode(
        settings,
        on_pcie=lambda outcome: metrics.pcie_measurements.labels(outcome=outcome).inc(),
        measure_pcie=lambda s, only: measure_local(
            nvml=FakeNvml(fake_cards), driver=driver, bounds=s.copy_bounds, only=only
        ),
    )
    sent = Recorded()
    reporting = Reporting(settings, node, metrics, cast(Any, sent), None)
    await node.open()
    assert node.pcie_waiting == {A}
    await reporting.publish_topologies()
    counted = "crater_probe_pcie_bandwidth_measurements_total"
    # still busy at the next re-discovery: not measured, not logged or counted again
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="crater.probe"):
        await reporting.rediscover()
    assert sent.events[1:] == []
    assert "not measured" not in caplog.text
    assert registry.get_sample_value(counted, {"outcome": "busy"}) == 1
    # idle now: measured at the next re-discovery, and sent though the hardware is the same
    fake_cards[0].processes = []
    with caplog.at_level(logging.INFO, logger="crater.probe"):
        await reporting.rediscover()
    [first, again] = sent.events
    assert first.node.fingerprint == again.node.fingerprint
    assert [g.pcie_bandwidth_gbps for g in first.node.gpus] == [None, round(gbps(NBYTES, 4.0), 2)]
    assert [g.pcie_bandwidth_gbps for g in again.node.gpus] == [
        round(gbps(NBYTES, 5.0), 2),
        round(gbps(NBYTES, 4.0), 2),
    ]
    assert "measured figures of here-01 changed" in caplog.text
    assert node.pcie_waiting == set()
    assert registry.get_sample_value(counted, {"outcome": "measured"}) == 2
    # nothing left to measure, nothing changed: nothing sent
    await reporting.rediscover()
    assert len(sent.events) == 2
    await node.close()


async def test_a_measurement_that_hangs_does_not_hold_the_topology_back(
    fake_cards: list[Card], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nodes, "PCIE_MEASURE_TIMEOUT_SECONDS", 0.2)
    release = threading.Event()
    calls: list[frozenset[str] | None] = []

    def hangs(settings: ProbeSettings, only: frozenset[str] | None) -> PcieBandwidth:
        calls.append(only)
        release.wait(10)  # a driver stuck in cuInit, until it is not
        return PcieBandwidth(gbps={A: 25.0})

    outcomes: list[str] = []
    settings = ProbeSettings(mode="local", node_id="here-01", measure_pcie_bandwidth=True)
    node = LocalNode(settings, on_pcie=outcomes.append, measure_pcie=hangs)
    await asyncio.wait_for(node.open(), 5)  # reports without the figure
    assert node.topology is not None
    assert [g.pcie_bandwidth_gbps for g in node.topology.gpus] == [None, None]
    assert outcomes == ["timed-out"]
    release.set()
    for _ in range(100):  # the thread finishes in its own time and records its figure
        if node.pcie_bandwidth:
            break
        await asyncio.sleep(0.02)
    [topology] = await node.topologies()
    assert [g.pcie_bandwidth_gbps for g in topology.gpus] == [25.0, None]
    assert calls == [None]  # one measurement at a time, and nothing waiting to retry
    assert outcomes == ["timed-out", "measured"]
    await node.close()
