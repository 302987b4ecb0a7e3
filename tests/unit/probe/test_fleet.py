from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from crater.contracts import NodeMetricsReported
from crater.probe.domain.health import evaluate
from crater.probe.sim.fleet import (
    FleetError,
    builtin_profiles,
    load_fleet,
    open_fleet,
    read_fleet_spec,
)
from crater.probe.sim.simulation import FleetSimulator, Load, plan_run


def strip(report: NodeMetricsReported) -> dict[str, object]:
    """A metrics report without what differs between any two events: id and time."""
    return report.model_dump(exclude={"event_id", "occurred_at"})


def test_builtin_profiles() -> None:
    profiles = builtin_profiles()
    assert {"dgx-a100-8", "h100-sxm-8", "rtx4090-4", "v100-2", "t4-1", "cpu-only"} <= set(profiles)
    dgx = profiles["dgx-a100-8"]
    assert dgx.gpu is not None
    assert (dgx.gpu.count, dgx.gpu.memory_mb, dgx.gpu.nvlink) == (8, 81920, "all")
    assert (dgx.cpu.sockets, dgx.numa_nodes, dgx.memory_gb) == (2, 2, 2048)


def test_default_demo_fleet() -> None:
    nodes = load_fleet(None, seed=42)
    assert len(nodes) == 38
    ids = [n.node_id for n in nodes]
    assert len(set(ids)) == 38
    assert ids[0] == "a100-01"
    assert {"h100-01", "rtx4090-08", "v100-04", "t4-08", "cpu-03", "a100-pcie-02"} <= set(ids)
    assert Counter(n.pool for n in nodes) == {"training": 8, "inference": 16, "default": 14}
    assert all(n.simulated for n in nodes)
    roles = Counter(n.labels["crater.ai/node-role"] for n in nodes)
    assert roles == {"gpu": 30, "cpu": 8}
    # Every simulated node is healthy at rest.
    assert {evaluate(n).condition.value for n in nodes} == {"Ready"}


def test_dgx_a100_topology() -> None:
    a100 = next(n for n in load_fleet(None, seed=42) if n.node_id == "a100-01")
    assert a100.labels["crater.ai/gpu-model"] == "a100"
    assert a100.labels["crater.ai/gpu-memory"] == "80Gi"
    assert (a100.cpu.sockets, a100.cpu.cores, a100.cpu.threads) == (2, 128, 256)
    assert a100.memory_mb == 2048 * 1024
    assert [n.id for n in a100.numa_nodes] == [0, 1]
    # Linux numbering: physical cores first, then their hyperthread siblings.
    assert a100.numa_nodes[0].cpus[:2] == [0, 1]
    assert 128 in a100.numa_nodes[0].cpus
    assert 64 in a100.numa_nodes[1].cpus
    assert [g.numa_node for g in a100.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert all(len(g.nvlink_peers) == 7 for g in a100.gpus)
    assert all(d.nvme for d in a100.disks)
    rtx = next(n for n in load_fleet(None, seed=42) if n.node_id == "rtx4090-01")
    assert all(g.nvlink_peers == [] for g in rtx.gpus)
    assert any(d.rotational for d in rtx.disks)


def test_same_seed_same_fleet_different_seed_different_cards() -> None:
    one, two = load_fleet(None, seed=7), load_fleet(None, seed=7)
    assert one == two
    other = load_fleet(None, seed=8)
    assert [n.node_id for n in other] == [n.node_id for n in one]
    assert other[0].gpus[0].uuid != one[0].gpus[0].uuid
    assert other[0].fingerprint != one[0].fingerprint


def test_seed_defaults_to_the_file_seed() -> None:
    assert load_fleet(None) == load_fleet(None, seed=read_fleet_spec(None).seed)


def simulate(seed: int, ticks: int = 4) -> list[dict[str, object]]:
    fleet = open_fleet(None, seed)
    sim = FleetSimulator(fleet.nodes, fleet.seed)
    out = [strip(m) for m in sim.step()]
    sim.place("a100-01", Load("alloc-1", (0, 1), 40000, 16, 65536))
    for _ in range(ticks):
        out += [strip(m) for m in sim.step()]
    sim.release("alloc-1")
    out += [strip(m) for m in sim.step()]
    return out


def test_metrics_sequence_is_deterministic_under_the_seed() -> None:
    assert simulate(11) == simulate(11)
    assert simulate(11) != simulate(12)


def test_gpus_held_by_a_task_get_busy_and_the_rest_stay_idle() -> None:
    fleet = open_fleet(None, 5)
    sim = FleetSimulator(fleet.nodes, fleet.seed)
    idle = sim.step_node("a100-01")
    assert sim.place("a100-01", Load("alloc-1", (0, 1), 40000, 32, 131072))
    assert not sim.place("a100-01", Load("alloc-1", (0, 1), 40000, 32, 131072))  # redelivery
    assert not sim.place("nowhere-01", Load("alloc-2", (0,), 1, 1, 1))
    for _ in range(3):
        busy = sim.step_node("a100-01")
    assert sim.busy_gpus("a100-01") == {0, 1}
    by_index = {g.index: g for g in busy.gpus}
    for i in (0, 1):
        assert by_index[i].utilization_percent > 70
        assert 0.85 * 40000 <= by_index[i].memory_used_mb <= 40000
        assert by_index[i].temperature_c is not None
        power = by_index[i].power_w
        assert power is not None
        assert power > 300
    assert by_index[2].utilization_percent < 5
    assert by_index[2].memory_used_mb < 100
    assert busy.memory_used_mb > idle.memory_used_mb + 131072 * 0.9
    assert busy.cpu_utilization_percent > idle.cpu_utilization_percent
    assert sim.gpu_counts() == (2, sum(len(n.topology.gpus) for n in fleet.nodes))
    assert sim.release("alloc-1")
    assert not sim.release("alloc-1")
    for _ in range(6):
        after = sim.step_node("a100-01")
    assert all(g.utilization_percent < 5 for g in after.gpus)


def test_a_big_fleet_steps(tmp_path: Path) -> None:
    fleet_file = tmp_path / "big.yaml"
    fleet_file.write_text(
        "seed: 1\nnodes:\n  - {profile: t4-1, count: 1000}\n"
        "  - {profile: cpu-only, count: 100, pool: batch}\n"
    )
    fleet = open_fleet(fleet_file)
    assert fleet.name == "big"
    ids = [n.topology.node_id for n in fleet.nodes]
    assert ids[0] == "t4-0001"  # numbering widens past 99 nodes of one prefix
    assert ids[-1] == "cpu-100"
    sim = FleetSimulator(fleet.nodes, fleet.seed)
    assert len(sim.step()) == 1100


def test_fleet_file_with_its_own_profile_prefixes_and_labels(tmp_path: Path) -> None:
    fleet_file = tmp_path / "lab.yaml"
    fleet_file.write_text(
        """
name: lab
seed: 3
profiles:
  - name: l40s-2
    id_prefix: l40s
    cpu: {model: AMD EPYC 9354, sockets: 1, cores_per_socket: 32, threads_per_core: 2}
    memory_gb: 384
    gpu: {model: NVIDIA L40S, count: 2, memory_mb: 46068, nvlink: none}
    disks: [{name: nvme0n1, capacity_gb: 3840}]
nodes:
  - {profile: l40s-2, count: 2, pool: inference, labels: {rack: r7}}
  - {profile: t4-1, count: 1, prefix: edge}
"""
    )
    nodes = load_fleet(fleet_file, seed=3)
    assert [n.node_id for n in nodes] == ["l40s-01", "l40s-02", "edge-01"]
    assert nodes[0].labels["rack"] == "r7"
    assert nodes[0].labels["crater.ai/gpu-model"] == "l40s"
    assert nodes[0].labels["crater.ai/gpu-memory"] == "48Gi"  # 46068 MiB, sold as 48 GB
    assert nodes[0].disks[0].nvme
    assert nodes[2].pool == "default"


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("nodes: [{profile: dgx-z9000, count: 1}]", "unknown profile dgx-z9000"),
        ("nodes: [{profile: t4-1, count: -1}]", "nodes.0.count"),
        ("nodes: [{profile: t4-1, count: 1, pool: Not_A_Pool}]", "nodes.0.pool"),
        ("nodes: [{profile: t4-1, count: 1, colour: red}]", "nodes.0.colour"),
        ("nodes: [oops", "not valid YAML"),
    ],
)
def test_bad_fleet_files_name_the_field(tmp_path: Path, body: str, reason: str) -> None:
    fleet_file = tmp_path / "bad.yaml"
    fleet_file.write_text(body)
    with pytest.raises(FleetError, match=reason):
        load_fleet(fleet_file)


def test_one_prefix_over_two_profiles_keeps_counting(tmp_path: Path) -> None:
    fleet_file = tmp_path / "mixed.yaml"
    fleet_file.write_text(
        "nodes: [{profile: t4-1, count: 1, prefix: x}, {profile: cpu-only, count: 1, prefix: x}]"
    )
    assert [n.node_id for n in load_fleet(fleet_file)] == ["x-01", "x-02"]


def test_missing_fleet_file(tmp_path: Path) -> None:
    with pytest.raises(FleetError, match="No such file"):
        load_fleet(tmp_path / "absent.yaml")


def test_run_plan_is_seeded_per_allocation() -> None:
    plan = plan_run("alloc-1", 42, seconds_min=8, seconds_max=30)
    assert plan == plan_run("alloc-1", 42, seconds_min=8, seconds_max=30)
    assert 8 <= plan.duration_seconds <= 30
    assert 0 <= plan.start_delay_seconds <= 1
    assert plan.succeeds
    durations = {
        plan_run(f"a-{i}", 42, seconds_min=8, seconds_max=30).duration_seconds for i in range(20)
    }
    assert len(durations) == 20
    failures = sum(
        not plan_run(f"a-{i}", 42, seconds_min=1, seconds_max=2, failure_rate=0.5).succeeds
        for i in range(200)
    )
    assert 60 < failures < 140
