"""What the simulated fleet tells the scheduler's newer filters: labels and taints, measured
memory bandwidth and disk IOPS/latency, MIG profiles, PCIe root complexes."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from crater.contracts import NodeTopologyReported, PlacementQuery, Taint
from crater.probe.app import ProbeSettings
from crater.probe.domain.topology import fingerprint_of
from crater.probe.sim.fleet import FleetError, builtin_profiles, load_fleet
from crater.scheduler.domain.core import Scheduler
from crater.scheduler.domain.demand import Demand


def test_demo_fleet_carries_taints_labels_and_measured_figures() -> None:
    nodes = {n.node_id: n for n in load_fleet(None)}
    assert len(nodes) == 38
    tainted = sorted(name for name, n in nodes.items() if n.taints)
    assert tainted == ["h100-03", "h100-04"]
    assert nodes["h100-03"].taints == [Taint.parse("dedicated=llm:NoSchedule")]
    assert nodes["a100-01"].labels["crater.ai/rack"] == "r1"
    for n in nodes.values():
        assert all(numa.memory_bandwidth_gbps for numa in n.numa_nodes), n.node_id
        assert all(numa.memory_bandwidth_gbps_all_cores for numa in n.numa_nodes), n.node_id
        assert all(d.random_read_iops and d.read_latency_us_p50 for d in n.disks), n.node_id
    a100 = nodes["a100-01"]
    assert a100.gpus[0].mig_capable
    assert "1g.10gb" in a100.gpus[0].mig_profiles
    assert [g.pci_root for g in nodes["rtx4090-01"].gpus] == [
        "pci0000:10",
        "pci0000:10",
        "pci0000:30",
        "pci0000:30",
    ]


def test_measured_figures_vary_by_node_within_five_percent_and_repeat_under_the_seed() -> None:
    profile = builtin_profiles()["dgx-a100-8"]
    figures = {
        n.node_id: n.numa_nodes[0].memory_bandwidth_gbps
        for n in load_fleet(None, seed=7)
        if n.labels["crater.ai/profile"] == "dgx-a100-8"
    }
    assert figures == {
        n.node_id: n.numa_nodes[0].memory_bandwidth_gbps
        for n in load_fleet(None, seed=7)
        if n.labels["crater.ai/profile"] == "dgx-a100-8"
    }
    assert len(set(figures.values())) > 1
    nominal = profile.memory_bandwidth_gbps
    assert nominal is not None
    assert all(abs(v - nominal) <= 0.05 * nominal + 0.05 for v in figures.values() if v)


def test_measured_figures_and_taints_leave_the_fingerprint_alone() -> None:
    for n in load_fleet(None):
        assert n.fingerprint == fingerprint_of(n)
    bare = load_fleet(None)[0]
    assert fingerprint_of(bare.model_copy(update={"taints": []})) == bare.fingerprint


def test_fleet_entries_add_taints_and_refuse_a_bad_one(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("nodes: [{profile: t4-1, count: 1, taints: ['gpu=small:PreferNoSchedule']}]")
    [t4] = load_fleet(good)
    assert [str(t) for t in t4.taints] == ["gpu=small:PreferNoSchedule"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes: [{profile: t4-1, count: 1, taints: ['gpu=small:Never']}]")
    with pytest.raises(FleetError, match=r"nodes\.0\.taints\.0"):
        load_fleet(bad)


def test_mig_profiles_need_a_mig_capable_card(tmp_path: Path) -> None:
    fleet = tmp_path / "mig.yaml"
    fleet.write_text(
        """
profiles:
  - name: t4-mig
    id_prefix: t4m
    cpu: {model: Xeon, sockets: 1, cores_per_socket: 8}
    memory_gb: 64
    gpu: {model: Tesla T4, count: 1, memory_mb: 15360, mig_profiles: [1g.5gb]}
nodes: [{profile: t4-mig, count: 1}]
"""
    )
    with pytest.raises(FleetError, match="mig_profiles on a card that is not mig_capable"):
        load_fleet(fleet)


def test_local_probe_settings_take_labels_and_taints() -> None:
    settings = ProbeSettings(labels={"rack": "r9"}, taints=["dedicated=llm:NoSchedule"])
    assert settings.labels == {"rack": "r9"}
    with pytest.raises(ValueError, match="effect"):
        ProbeSettings(taints=["dedicated=llm:Whenever"])


def test_the_scheduler_sees_the_demo_fleets_facts_in_a_dry_run() -> None:
    scheduler = Scheduler()
    for topology in load_fleet(None):
        scheduler.handle(NodeTopologyReported(occurred_at=datetime.now(UTC), node=topology))

    def fits(body: dict[str, object]) -> list[str]:
        answer = scheduler.dry_run(Demand.of_query(PlacementQuery.model_validate(body)))
        return sorted(f.node_id for f in answer.fits)

    h100 = {"gpu": {"count": 8, "type": "H100"}}
    assert fits({"resource_requirements": h100, "pool": "training"}) == ["h100-01", "h100-02"]
    tolerating = [{"key": "dedicated", "value": "llm"}]
    assert (
        len(fits({"resource_requirements": h100, "pool": "training", "tolerations": tolerating}))
        == 4
    )
    fast = {"gpu": {"count": 1}, "ssd": {"iops_min": 17000, "latency_us_max": 60}}
    assert fits({"resource_requirements": fast, "pool": "inference"}) == [
        f"rtx4090-0{i}" for i in range(1, 9)
    ]
    mig = {"gpu": {"count": 1, "mig_profile": "1g.10gb"}}
    assert fits({"resource_requirements": mig, "pool": "training"}) == [
        "a100-01",
        "a100-02",
        "a100-03",
        "a100-04",
        "h100-01",
        "h100-02",
    ]
    # compared with a NUMA node's all-core figure: DDR5 (h100, ~230 GB/s) over DDR4 (~150)
    bandwidth = {"memory": {"bandwidth_gbps": 200}}
    assert fits({"resource_requirements": bandwidth, "pool": "training"}) == ["h100-01", "h100-02"]
