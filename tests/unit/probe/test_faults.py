"""Fault injection and the IO / NUMA metrics of the simulated fleet."""

from __future__ import annotations

from pathlib import Path

import pytest

from crater.contracts import NodeCondition, NodeMetricsReported
from crater.probe.domain.health import (
    CHECK_GPU_ECC,
    CHECK_GPU_TEMPERATURE,
    CHECK_PCIE_LINK,
    Assessment,
    evaluate,
)
from crater.probe.sim.fleet import FleetError, open_fleet, read_fleet_spec
from crater.probe.sim.simulation import Fault, FaultKind, FleetSimulator, Load

FLEET = """seed: 9
nodes:
  - {profile: dgx-a100-8, count: 2, pool: training}
  - {profile: h100-sxm-8, count: 1, pool: training}
  - {profile: rtx4090-4, count: 1, pool: inference}
  - {profile: cpu-only, count: 2, pool: default}
faults:
  - {node: a100-01, kind: gpu-failing, at_seconds: 60, gpu: 3}
  - {node: cpu-02, kind: silent, at_seconds: 90, for_seconds: 60}
  - {node: h100-01, kind: ecc, at_seconds: 30, gpu: 5}
  - {node: rtx4090-01, kind: degraded-link, at_seconds: 10, for_seconds: 20, gpu: 1}
"""


@pytest.fixture
def fleet_file(tmp_path: Path) -> Path:
    path = tmp_path / "faulty.yaml"
    path.write_text(FLEET)
    return path


def simulator(fleet_file: Path, seed: int | None = None) -> FleetSimulator:
    fleet = open_fleet(fleet_file, seed)
    return FleetSimulator(fleet.nodes, fleet.seed, fleet.faults)


def assess(sim: FleetSimulator, node: str) -> Assessment:
    return evaluate(sim.topology(node), sim.last_metrics(node))


def failed(assessment: Assessment) -> set[str]:
    return {r.name for r in assessment.results if not r.passed}


def run(sim: FleetSimulator, until: float, every: float = 5.0) -> list[NodeMetricsReported]:
    """Step the fleet every `every` seconds of simulation time up to `until`."""
    out: list[NodeMetricsReported] = []
    t = sim.seconds
    while t <= until:
        sim.advance_to(t)
        out += sim.step()
        t += every
    return out


def strip(report: NodeMetricsReported) -> dict[str, object]:
    return report.model_dump(exclude={"event_id", "occurred_at"})


def test_fleet_file_faults_are_read_and_checked(fleet_file: Path, tmp_path: Path) -> None:
    fleet = open_fleet(fleet_file)
    assert [(f.node, f.kind) for f in fleet.faults] == [
        ("a100-01", FaultKind.GPU_FAILING),
        ("cpu-02", FaultKind.SILENT),
        ("h100-01", FaultKind.ECC),
        ("rtx4090-01", FaultKind.DEGRADED_LINK),
    ]
    bad = tmp_path / "bad.yaml"
    bad.write_text(FLEET.replace("node: cpu-02", "node: cpu-09"))
    with pytest.raises(FleetError, match="cpu-09: no such node"):
        open_fleet(bad)
    bad.write_text(FLEET.replace("gpu: 1}", "gpu: 4}"))
    with pytest.raises(FleetError, match="no GPU 4"):
        open_fleet(bad)
    bad.write_text(FLEET.replace("kind: ecc", "kind: meteor"))
    with pytest.raises(FleetError, match=r"faults\.2\.kind"):
        open_fleet(bad)
    with pytest.raises(ValueError, match="no such simulated node"):
        FleetSimulator(fleet.nodes, 1, [Fault("ghost-01", FaultKind.SILENT)])


def test_the_demo_fleet_lists_faults_but_the_simulator_gets_them_only_when_asked() -> None:
    spec = read_fleet_spec(None)
    assert {f.kind for f in spec.faults} == set(FaultKind)
    fleet = open_fleet(None)
    calm = FleetSimulator(fleet.nodes, fleet.seed)
    run(calm, 600, every=30)
    assert {assess(calm, n).condition for n in calm.node_ids} == {NodeCondition.READY}
    faulty = FleetSimulator(fleet.nodes, fleet.seed, fleet.faults)
    run(faulty, 200, every=10)
    conditions = {n: assess(faulty, n).condition for n in faulty.reporting_ids}
    # Uncorrected ECC errors hold the card out (its heartbeat's gpu_faults), not the node.
    assert conditions["a100-03"] is NodeCondition.DEGRADED
    assert conditions["h100-02"] is NodeCondition.DEGRADED
    assert conditions["rtx4090-03"] is NodeCondition.DEGRADED
    assert "cpu-02" in conditions  # silent from 90 s to 150 s: back by 200 s


def test_faulty_runs_are_deterministic_under_the_seed(fleet_file: Path) -> None:
    def trace(seed: int) -> list[dict[str, object]]:
        sim = simulator(fleet_file, seed)
        sim.place("a100-01", Load("alloc-1", (0, 1, 2, 3), 40000, 32, 65536))
        return [strip(m) for m in run(sim, 180)]

    assert trace(3) == trace(3)
    assert trace(3) != trace(4)


def test_faults_draw_nothing_from_the_load_dynamics(fleet_file: Path) -> None:
    """A faulty node's utilisation follows the numbers it would have healthy."""
    fleet = open_fleet(fleet_file)
    healthy = FleetSimulator(fleet.nodes, fleet.seed)
    faulty = FleetSimulator(fleet.nodes, fleet.seed, fleet.faults)
    for t in range(0, 200, 5):
        healthy.advance_to(t)
        faulty.advance_to(t)
        a, b = healthy.step_node("a100-01"), faulty.step_node("a100-01")
        assert [g.utilization_percent for g in a.gpus] == [g.utilization_percent for g in b.gpus]
        assert a.disks == b.disks
        assert a.numa_cpu_utilization_percent == b.numa_cpu_utilization_percent


def test_a_failing_gpu_heats_up_and_turns_the_node_degraded_then_not_ready(
    fleet_file: Path,
) -> None:
    sim = simulator(fleet_file)
    seen: list[tuple[float, NodeCondition]] = []
    for t in range(0, 240, 5):
        sim.advance_to(t)
        sim.step_node("a100-01")
        seen.append((t, assess(sim, "a100-01").condition))
    before = [c for t, c in seen if t < 60]
    assert set(before) == {NodeCondition.READY}
    order = [c for _, c in seen]
    first_degraded = order.index(NodeCondition.DEGRADED)
    first_not_ready = order.index(NodeCondition.NOT_READY)
    assert seen[first_degraded][0] > 60
    assert first_degraded < first_not_ready
    assert set(order[first_not_ready:]) == {NodeCondition.NOT_READY}  # it does not recover
    last = sim.last_metrics("a100-01")
    assert last is not None
    card = next(g for g in last.gpus if g.index == 3)
    others = [g for g in last.gpus if g.index != 3]
    assert card.temperature_c is not None
    assert card.temperature_c >= 85
    assert (card.ecc_errors_uncorrected or 0) > 0
    assert (card.ecc_errors_corrected or 0) >= 1000
    assert all(g.ecc_errors_uncorrected == 0 and g.ecc_errors_corrected == 0 for g in others)
    assert {CHECK_GPU_ECC, CHECK_GPU_TEMPERATURE} <= failed(assess(sim, "a100-01"))
    # The twin node, unfaulted, stays Ready.
    run(sim, 240)
    assert assess(sim, "a100-02").condition is NodeCondition.READY


def test_ecc_fault_fails_the_ecc_check(fleet_file: Path) -> None:
    sim = simulator(fleet_file)
    run(sim, 25)
    assert assess(sim, "h100-01").condition is NodeCondition.READY
    run(sim, 40)
    assessment = assess(sim, "h100-01")
    assert assessment.condition is NodeCondition.DEGRADED  # the card is cordoned, not the node
    assert failed(assessment) == {CHECK_GPU_ECC}
    detail = next(r.detail for r in assessment.results if r.name == CHECK_GPU_ECC)
    assert "GPU 5" in detail


def test_degraded_link_fails_the_pcie_check_for_its_window(fleet_file: Path) -> None:
    sim = simulator(fleet_file)
    run(sim, 5)
    assessment = assess(sim, "rtx4090-01")
    assert assessment.condition is NodeCondition.READY
    assert CHECK_PCIE_LINK not in failed(assessment)
    run(sim, 20)
    assessment = assess(sim, "rtx4090-01")
    assert assessment.condition is NodeCondition.DEGRADED
    assert failed(assessment) == {CHECK_PCIE_LINK}
    last = sim.last_metrics("rtx4090-01")
    assert last is not None
    assert [g.pcie_width for g in last.gpus] == [16, 8, 16, 16]
    run(sim, 35)  # the window (10 s + 20 s) is over
    assert assess(sim, "rtx4090-01").condition is NodeCondition.READY


def test_a_silent_node_sends_nothing_during_its_window(fleet_file: Path) -> None:
    sim = simulator(fleet_file)
    reports: dict[float, set[str]] = {}
    for t in range(0, 200, 10):
        sim.advance_to(t)
        reports[t] = {m.node_id for m in sim.step()}
        assert set(sim.reporting_ids) == reports[t]
    for t, nodes in reports.items():
        silent = 90 <= t < 150
        assert ("cpu-02" in nodes) is not silent, t
        assert "cpu-01" in nodes


def test_simulated_numa_and_disk_metrics_follow_the_load(fleet_file: Path) -> None:
    sim = simulator(fleet_file)
    idle = sim.step_node("a100-02")
    topology = sim.topology("a100-02")
    assert set(idle.numa_cpu_utilization_percent) == {n.id for n in topology.numa_nodes}
    assert [d.name for d in idle.disks] == [d.name for d in topology.disks]
    assert all(d.read_mb_s < 10 and d.in_flight is not None for d in idle.disks)
    sim.place("a100-02", Load("alloc-7", (0, 1), 40000, 200, 65536))
    busy = sim.step_node("a100-02")
    assert sum(d.read_mb_s for d in busy.disks) > 10 * sum(d.read_mb_s for d in idle.disks)
    assert all(d.read_iops > 0 and d.write_mb_s <= d.read_mb_s for d in busy.disks)
    assert sum(d.in_flight or 0 for d in busy.disks) > 0
    numa = busy.numa_cpu_utilization_percent
    mean = sum(numa.values()) / len(numa)
    assert mean == pytest.approx(busy.cpu_utilization_percent, abs=0.2)
    assert all(0 <= v <= 100 for v in numa.values())
