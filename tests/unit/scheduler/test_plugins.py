"""Each filter and score plugin alone, on hand-made nodes: labels, taints, GPU model lists,
MIG, memory bandwidth, SSD IOPS and latency, over-commit, the field's weighted score and
topology locality."""

from __future__ import annotations

from typing import Any, get_args

import numpy as np
import pytest
from pydantic import BaseModel

from crater.contracts import (
    Affinity,
    Disk,
    NodeTopology,
    PlacementQuery,
    ResourceRequirements,
    Taint,
    TaskRequest,
    Toleration,
)
from crater.scheduler.domain.cluster import ClusterArrays, Node, Overcommit
from crater.scheduler.domain.demand import Demand
from crater.scheduler.domain.mig import MigProfile, card_geometry
from crater.scheduler.domain.placement import locality, select
from crater.scheduler.domain.plugins import FIELD_WEIGHTS, FILTERS, SCORES, judged_field
from tests.support.topologies import node

A100_MIG = ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]


def arrays(*nodes: NodeTopology | Node) -> ClusterArrays:
    c = ClusterArrays()
    for n in nodes:
        c.upsert(n if isinstance(n, Node) else Node.empty(n))
    return c


def demand(
    needs: dict[str, Any] | None = None,
    *,
    node_selector: dict[str, str] | None = None,
    tolerations: list[dict[str, Any]] | None = None,
    numa: str = "best-effort",
) -> Demand:
    query = PlacementQuery(
        resource_requirements=ResourceRequirements.model_validate(needs or {}),
        affinity=Affinity(numa=numa),  # type: ignore[arg-type]
        node_selector=node_selector or {},
        tolerations=[Toleration.model_validate(t) for t in tolerations or []],
    )
    return Demand.of_query(query)


def passing(c: ClusterArrays, name: str, d: Demand, free: bool = True) -> list[str]:
    verdict = FILTERS[name].passes(c, d, free)
    return [c.nodes[i].name for i in np.flatnonzero(verdict)]


def with_(topology: NodeTopology, **update: Any) -> NodeTopology:
    return topology.model_copy(update=update)


def mig_node(name: str, gpus: int = 2) -> NodeTopology:
    t = node(name, gpus=gpus)
    cards = [g.model_copy(update={"mig_capable": True, "mig_profiles": A100_MIG}) for g in t.gpus]
    return with_(t, gpus=cards)


def measured(
    t: NodeTopology, bandwidth: float | None, iops: float | None, p50: float | None
) -> NodeTopology:
    numa = [n.model_copy(update={"memory_bandwidth_gbps": bandwidth}) for n in t.numa_nodes]
    disks = [
        d.model_copy(update={"random_read_iops": iops, "read_latency_us_p50": p50}) for d in t.disks
    ]
    return with_(t, numa_nodes=numa, disks=disks)


# -- labels and taints -----------------------------------------------------------------------


def test_node_selector_keeps_the_nodes_carrying_every_label() -> None:
    c = arrays(
        with_(node("a"), labels={"rack": "r1", "zone": "x"}),
        with_(node("b"), labels={"rack": "r1"}),
        with_(node("c"), labels={"rack": "r2", "zone": "x"}),
    )
    assert passing(c, "NodeLabels", demand(node_selector={"rack": "r1", "zone": "x"})) == ["a"]
    assert passing(c, "NodeLabels", demand(node_selector={"rack": "r1"})) == ["a", "b"]
    assert passing(c, "NodeLabels", demand()) == ["a", "b", "c"]
    assert FILTERS["NodeLabels"].explain(demand(node_selector={"rack": "r2"})) == (
        "lacks the labels rack=r2"
    )


def test_no_schedule_taints_keep_off_tasks_that_do_not_tolerate_them() -> None:
    c = arrays(
        with_(node("plain")),
        with_(node("llm"), taints=[Taint.parse("dedicated=llm:NoSchedule")]),
        with_(node("evict"), taints=[Taint.parse("maintenance:NoExecute")]),
        with_(node("soft"), taints=[Taint.parse("spot=true:PreferNoSchedule")]),
    )
    assert passing(c, "TaintToleration", demand()) == ["plain", "soft"]
    equal = [{"key": "dedicated", "value": "llm"}]
    assert passing(c, "TaintToleration", demand(tolerations=equal)) == ["plain", "llm", "soft"]
    wrong_value = [{"key": "dedicated", "value": "batch"}]
    assert "llm" not in passing(c, "TaintToleration", demand(tolerations=wrong_value))
    exists = [{"key": "maintenance", "operator": "Exists", "effect": "NoExecute"}]
    assert "evict" in passing(c, "TaintToleration", demand(tolerations=exists))
    wrong_effect = [{"key": "maintenance", "operator": "Exists", "effect": "NoSchedule"}]
    assert "evict" not in passing(c, "TaintToleration", demand(tolerations=wrong_effect))
    everything = [{"operator": "Exists"}]
    assert len(passing(c, "TaintToleration", demand(tolerations=everything))) == 4


def test_a_toleration_without_key_must_say_exists() -> None:
    with pytest.raises(ValueError, match="operator Exists"):
        Toleration.model_validate({"value": "x"})


def test_taint_text_round_trips_and_refuses_an_unknown_effect() -> None:
    assert str(Taint.parse("dedicated=llm:NoExecute")) == "dedicated=llm:NoExecute"
    assert Taint.parse("gpu").effect == "NoSchedule"
    with pytest.raises(ValueError, match="effect"):
        Taint.parse("a=b:Sometimes")


# -- GPU model, MIG --------------------------------------------------------------------------


def test_gpu_model_list_allows_any_of_its_models() -> None:
    c = arrays(
        node("a100", gpus=2),
        node("v100", gpus=2, gpu_model="Tesla V100-SXM2-32GB"),
        node("t4", gpus=1, gpu_model="Tesla T4"),
    )
    d = demand({"gpu": {"count": 1, "types": ["V100", "T4"]}})
    assert passing(c, "GpuModel", d) == ["v100", "t4"]
    assert FILTERS["GpuModel"].explain(d) == "has no V100 or T4 GPU"
    both = demand({"gpu": {"count": 1, "type": "A100", "types": ["T4"]}})
    assert passing(c, "GpuModel", both) == ["a100", "t4"]


def test_mig_profile_needs_a_card_offering_it_with_the_slice_free() -> None:
    carved = Node.empty(mig_node("carved", gpus=1))
    for _ in range(7):
        carved.take((0,), MigProfile.parse("1g.10gb").milli, (), 0, None, "1g.10gb")
    c = arrays(mig_node("mig"), node("plain", gpus=2), carved)
    d = demand({"gpu": {"count": 1, "mig_profile": "1g.10gb"}})
    assert passing(c, "MigProfile", d) == ["mig"]
    assert passing(c, "MigProfile", d, free=False) == ["mig", "carved"]
    assert passing(c, "GpuCount", d) == ["mig", "plain", "carved"]  # MigProfile judges
    unknown = demand({"gpu": {"count": 1, "mig_profile": "2g.10gb"}})
    assert passing(c, "MigProfile", unknown, free=False) == []
    assert FILTERS["MigProfile"].explain(d) == "has no card with a free MIG 1g.10gb slice"


def test_mig_slice_memory_is_compared_with_what_the_task_needs() -> None:
    c = arrays(mig_node("mig"))
    small = demand({"gpu": {"count": 1, "mig_profile": "1g.10gb", "memory_mb": 9000}})
    large = demand({"gpu": {"count": 1, "mig_profile": "1g.10gb", "memory_mb": 20000}})
    assert passing(c, "GpuMemory", small) == ["mig"]
    assert passing(c, "GpuMemory", large) == []
    assert "(MIG 1g.10gb)" in FILTERS["GpuMemory"].explain(large)


def test_mig_geometry_counts_compute_and_memory_slices() -> None:
    shape = card_geometry(A100_MIG)
    assert shape is not None
    assert (shape.compute_slices, shape.memory_slices, shape.memory_unit_gb) == (7, 8, 10)
    three = MigProfile.parse("3g.40gb")
    assert shape.cost(three) == (3, 4)
    assert shape.fits(three, (3, 4))  # the second 3g.40gb
    assert not shape.fits(MigProfile.parse("1g.10gb"), (6, 8))  # memory spent
    assert not shape.fits(MigProfile.parse("2g.10gb"), (0, 0))  # not offered


def test_a_carved_card_serves_only_slices_and_is_whole_again_when_they_return() -> None:
    n = Node.empty(mig_node("m", gpus=1))
    slice_milli = MigProfile.parse("3g.40gb").milli
    n.take((0,), slice_milli, (), 0, None, "3g.40gb")
    assert (n.whole_gpus_free, n.largest_share_free, n.mig_used) == (0, 0, {0: (3, 4)})
    n.take((0,), slice_milli, (), 0, None, "3g.40gb")
    assert not n.mig_fits(MigProfile.parse("1g.10gb"), 0)  # memory slices all held
    n.give_back((0,), slice_milli, (), 0, None, "3g.40gb")
    n.give_back((0,), slice_milli, (), 0, None, "3g.40gb")
    assert (n.whole_gpus_free, n.mig_used) == (1, {})


def test_a_shared_card_is_not_carved() -> None:
    n = Node.empty(mig_node("m", gpus=1))
    n.take((0,), 300, (), 0, None)
    assert not n.mig_fits(MigProfile.parse("1g.10gb"), 0)


def test_mig_placement_fills_a_carved_card_before_cutting_a_whole_one() -> None:
    n = Node.empty(mig_node("m", gpus=2))
    d = demand({"gpu": {"count": 1, "mig_profile": "1g.10gb"}})
    picks = []
    for _ in range(8):
        chosen = select(n, d)
        assert chosen is not None
        assert chosen.mig_profile == "1g.10gb"
        picks.append(chosen.gpu_ids[0])
        n.take(chosen.gpu_ids, d.gpu_milli, chosen.cpu_cores, 0, None, chosen.mig_profile)
    assert picks == [0] * 7 + [1]


# -- memory bandwidth, SSD -------------------------------------------------------------------


def test_memory_bandwidth_filter_takes_the_best_numa_node_and_refuses_the_unmeasured() -> None:
    fast = measured(node("fast"), 25.0, None, None)
    mixed = node("mixed")
    numa = [
        mixed.numa_nodes[0].model_copy(update={"memory_bandwidth_gbps": 8.0}),
        mixed.numa_nodes[1].model_copy(update={"memory_bandwidth_gbps": 14.0}),
    ]
    c = arrays(fast, with_(mixed, numa_nodes=numa), node("unmeasured"))
    assert passing(c, "MemoryBandwidth", demand({"memory": {"bandwidth_gbps": 12}})) == [
        "fast",
        "mixed",
    ]
    assert passing(c, "MemoryBandwidth", demand({"memory": {"bandwidth_gbps": 20}})) == ["fast"]
    assert len(passing(c, "MemoryBandwidth", demand())) == 3
    assert FILTERS["MemoryBandwidth"].explain(demand({"memory": {"bandwidth_gbps": 20}})) == (
        "has less than 20 GB/s of memory bandwidth over a NUMA node's cores (one thread's "
        "where no such figure), or none measured"
    )


def test_memory_bandwidth_filter_compares_the_aggregate_where_it_was_measured() -> None:
    """AllData's 140 GB/s is a node's aggregate (STREAM over all cores): a node measured at
    18 GB/s one thread at a time but 150 GB/s all cores at once has it; a node measured only
    one thread at a time passes on that figure alone (a lower bound of its aggregate)."""
    socket = node("socket")
    numa = [
        n.model_copy(
            update={"memory_bandwidth_gbps": 18.0, "memory_bandwidth_gbps_all_cores": 150.0}
        )
        for n in socket.numa_nodes
    ]
    one_thread = measured(node("one-thread"), 25.0, None, None)
    c = arrays(with_(socket, numa_nodes=numa), one_thread, node("unmeasured"))
    assert passing(c, "MemoryBandwidth", demand({"memory": {"bandwidth_gbps": 140}})) == ["socket"]
    assert passing(c, "MemoryBandwidth", demand({"memory": {"bandwidth_gbps": 20}})) == [
        "socket",
        "one-thread",
    ]
    assert passing(c, "MemoryBandwidth", demand({"memory": {"bandwidth_gbps": 151}})) == []


def test_ssd_iops_and_latency_against_the_measured_disks() -> None:
    hdd = Disk(
        name="sda",
        capacity_gb=8000,
        rotational=True,
        nvme=False,
        random_read_iops=90_000,  # a spinning disk never counts, whatever it reports
        read_latency_us_p50=10.0,
    )
    slow = measured(node("slow"), None, 6000.0, 160.0)
    c = arrays(
        measured(node("fast"), None, 15000.0, 70.0),
        with_(slow, disks=[*slow.disks, hdd]),
        node("unmeasured"),
    )
    assert passing(c, "SsdIops", demand({"ssd": {"iops_min": 10000}})) == ["fast"]
    assert passing(c, "SsdIops", demand({"ssd": {"iops_min": 5000}})) == ["fast", "slow"]
    assert passing(c, "SsdLatency", demand({"ssd": {"latency_us_max": 100}})) == ["fast"]
    assert passing(c, "SsdLatency", demand({"ssd": {"latency_us_max": 200}})) == ["fast", "slow"]
    assert len(passing(c, "SsdIops", demand())) == 3
    assert FILTERS["SsdLatency"].explain(demand({"ssd": {"latency_us_max": 100}})) == (
        "has no SSD reading within 100 us, or none measured"
    )


def at_depth(t: NodeTopology, iops: float, source: str = "datasheet") -> NodeTopology:
    disks = [
        d.model_copy(
            update={"random_read_iops_at_depth": iops, "random_read_iops_at_depth_source": source}
        )
        for d in t.disks
    ]
    return with_(t, disks=disks)


def test_ssd_iops_compares_the_figure_at_depth_where_known_else_qd1() -> None:
    """AllData's 800,000 IOPS is a datasheet figure (4 KiB at depth): a PM1733 measured at
    13,000 IOPS one read at a time but rated 1,450,000 has it; a disk with no figure at depth
    is judged on its QD1 one, a lower bound."""
    rated = at_depth(measured(node("rated"), None, 13_000.0, 75.0), 1_450_000)
    lower = at_depth(measured(node("lower"), None, 13_000.0, 75.0), 120_000, "measured")
    qd1 = measured(node("qd1"), None, 15_000.0, 70.0)
    hdd = Disk(
        name="sda",
        capacity_gb=8000,
        rotational=True,
        nvme=False,
        random_read_iops_at_depth=2_000_000,  # a spinning disk never counts
        random_read_iops_at_depth_source="operator",
    )
    spinning = with_(node("spinning"), disks=[hdd])
    c = arrays(rated, lower, qd1, spinning, node("unmeasured"))
    assert passing(c, "SsdIops", demand({"ssd": {"iops_min": 800_000}})) == ["rated"]
    assert passing(c, "SsdIops", demand({"ssd": {"iops_min": 100_000}})) == ["rated", "lower"]
    assert passing(c, "SsdIops", demand({"ssd": {"iops_min": 14_000}})) == ["rated", "lower", "qd1"]
    assert FILTERS["SsdIops"].explain(demand({"ssd": {"iops_min": 800_000}})) == (
        "has no SSD doing 800000 random-read IOPS at depth (at QD1 where no such figure), "
        "or none measured"
    )


# -- over-commit -----------------------------------------------------------------------------


def test_over_commit_lets_cpu_and_memory_be_promised_past_the_hardware() -> None:
    ratios = Overcommit(cpu=2.0, memory=1.5)
    n = Node.empty(node("over", cores=32, memory_mb=100_000), ratios)
    plain = Node.empty(node("plain", cores=32, memory_mb=100_000))
    for held in (n, plain):
        held.take((), 0, tuple(range(32)), 100_000, None)  # every core, all the memory
    c = arrays(n, plain)
    d = demand({"cpu": {"cores": 16}, "memory": {"capacity_mb": 40_000}})
    assert passing(c, "CpuCores", d) == ["over"]
    assert passing(c, "Memory", d) == ["over"]
    assert (c.cpu_free[0], c.memory_free_mb[0]) == (32, 50_000)
    # never more distinct cores or memory than the hardware has
    too_many = demand({"cpu": {"cores": 33}, "memory": {"capacity_mb": 100_001}})
    assert passing(c, "CpuCores", too_many, free=False) == []
    assert passing(c, "Memory", too_many, free=False) == []


def test_over_committed_cores_go_to_the_least_shared_and_no_core_past_its_ratio() -> None:
    n = Node.empty(node("over", cores=8, numa_nodes=1), Overcommit(cpu=1.5))
    assert (n.cpu_capacity, n.cpu_holders_max) == (12, 2)
    first = select(n, demand({"cpu": {"cores": 6}, "memory": {"capacity_mb": 0}}))
    assert first is not None
    assert first.cpu_cores == (0, 1, 2, 3, 4, 5)
    n.take((), 0, first.cpu_cores, 0, None)
    second = select(n, demand({"cpu": {"cores": 6}, "memory": {"capacity_mb": 0}}))
    assert second is not None
    assert second.cpu_cores == (0, 1, 2, 3, 6, 7)
    n.take((), 0, second.cpu_cores, 0, None)
    assert n.cpu_slots_free == 0  # 12 promised: the ratio is spent
    assert select(n, demand({"cpu": {"cores": 1}, "memory": {"capacity_mb": 0}})) is None
    assert max(n.cpu_held.values()) <= 2


def test_gpu_over_commit_time_slices_whole_cards() -> None:
    n = Node.empty(node("g", gpus=1), Overcommit(gpu=2.0))
    d = demand({"gpu": {"count": 1}})
    for _ in range(2):
        chosen = select(n, d)
        assert chosen is not None
        n.take(chosen.gpu_ids, 1000, chosen.cpu_cores, 0, None)
    assert select(n, d) is None
    assert n.gpu_milli_free == [0]


# -- scores ----------------------------------------------------------------------------------


def rate(name: str, c: ClusterArrays, d: Demand) -> list[float]:
    score = SCORES[name](1.0)
    return [round(float(v), 4) for v in score.rate(c, d, np.arange(len(c)))]


def test_field_weighted_score_by_hand() -> None:
    big = measured(node("big", gpus=4, cores=64), 20.0, 10000.0, 80.0)
    small = measured(node("small", gpus=2, cores=32), 10.0, 20000.0, 60.0)
    c = arrays(big, small, node("unmeasured", gpus=4, cores=16))
    assert sum(FIELD_WEIGHTS.values()) == pytest.approx(1.0)
    # GPU memory free: 4, 2, 4 cards of 80 GiB -> 1, .5, 1; cores 64, 32, 16 -> 1, .5, .25;
    # bandwidth 20, 10, - -> 1, .5, 0; IOPS 10k, 20k, - -> .5, 1, 0
    expected = [
        0.45 * 1 + 0.20 * 1 + 0.20 * 1 + 0.15 * 0.5,
        0.45 * 0.5 + 0.20 * 0.5 + 0.20 * 0.5 + 0.15 * 1,
        0.45 * 1 + 0.20 * 0.25 + 0.0 + 0.0,
    ]
    assert rate("FieldWeighted", c, demand({"gpu": {"count": 1}})) == [
        round(e, 4) for e in expected
    ]
    # a task without GPUs: the GPU memory term stays out
    cpu_only = rate("FieldWeighted", c, demand())
    assert cpu_only[0] == round(0.20 + 0.20 + 0.15 * 0.5, 4)


def test_topology_locality_prefers_nvlink_then_one_pci_root_then_one_numa_node() -> None:
    linked = node("linked", gpus=4)
    pcie = node("pcie", gpus=4, nvlink=False)
    rooted = with_(
        pcie,
        node_id="rooted",
        gpus=[g.model_copy(update={"pci_root": "pci0000:10"}) for g in pcie.gpus],
    )
    c = arrays(linked, rooted, pcie)
    two = demand({"gpu": {"count": 2}, "cpu": {"cores": 4}})
    assert rate("TopologyLocality", c, two) == [1.0, round(0.75 * 2 / 3 + 0.25, 4), 0.5]
    # four cards on two NUMA nodes, no NVLink: spread
    four = demand({"gpu": {"count": 4}, "cpu": {"cores": 4}})
    assert rate("TopologyLocality", c, four)[2] == 0.0


def test_locality_of_a_cpu_task_is_whether_its_cores_share_a_numa_node() -> None:
    n = Node.empty(node("cpu", cores=16, numa_nodes=2))
    fits = select(n, demand({"cpu": {"cores": 8}}))
    spread = select(n, demand({"cpu": {"cores": 12}}))
    assert fits is not None
    assert spread is not None
    assert (locality(n, fits), locality(n, spread)) == (1.0, 0.0)


def test_gpus_without_nvlink_are_picked_behind_one_pci_root() -> None:
    t = node("pcie", gpus=4, nvlink=False, numa_nodes=1)
    roots = ["pci0000:10", "pci0000:30", "pci0000:10", "pci0000:30"]
    t = with_(
        t, gpus=[g.model_copy(update={"pci_root": r}) for g, r in zip(t.gpus, roots, strict=True)]
    )
    chosen = select(Node.empty(t), demand({"gpu": {"count": 2}}))
    assert chosen is not None
    assert chosen.gpu_ids == (0, 2)


@pytest.mark.parametrize(
    "needs",
    [
        {"gpu": {"count": 2}, "cpu": {"cores": 4}},
        {"gpu": {"count": 3}, "cpu": {"cores": 12}},
        {"gpu": {"count": 1, "milli": 300}, "cpu": {"cores": 2}},
        {"gpu": {"count": 1, "mig_profile": "1g.10gb"}, "cpu": {"cores": 2}},
        {"cpu": {"cores": 10}},
        {"cpu": {"cores": 20}},
    ],
)
def test_the_locality_score_matches_the_selection_it_predicts(needs: dict[str, Any]) -> None:
    """The score rates without picking cores; it must agree with what `select` picks, on
    empty and on half-used nodes, NVLink or PCIe, over-committed or not."""
    d = demand(needs)
    pcie = node("pcie", gpus=4, nvlink=False, cores=32)
    roots = ["pci0000:10", "pci0000:10", "pci0000:30", "pci0000:30"]
    pcie = with_(
        pcie,
        gpus=[g.model_copy(update={"pci_root": r}) for g, r in zip(pcie.gpus, roots, strict=True)],
    )
    for topology in (mig_node("mig", gpus=4), pcie, node("linked", gpus=8, cores=32)):
        for ratios in (Overcommit(), Overcommit(cpu=2.0)):
            n = Node.empty(topology, ratios)
            for busy in (0, 1, 2):
                chosen = select(n, d)
                if chosen is not None:
                    assert SCORES["TopologyLocality"](1.0).rate(arrays(n), d, np.arange(1))[
                        0
                    ] == pytest.approx(locality(n, chosen))
                    n.take(
                        chosen.gpu_ids,
                        d.gpu_milli or 1000,
                        chosen.cpu_cores,
                        0,
                        None,
                        chosen.mig_profile,
                    )
                # a neighbour takes cores on NUMA node 0
                free = n.cpu_free
                n.take((), 0, tuple(c for c in range(busy * 6, busy * 6 + 6) if c in free), 0, None)


def _request_field(path: str) -> bool:
    """`path` (dotted) names a field of the task request, through nested models."""
    model: Any = TaskRequest
    for part in path.split("."):
        if model is None or part not in model.model_fields:
            return False
        annotation = model.model_fields[part].annotation
        nested = [a for a in (annotation, *get_args(annotation)) if _is_model(a)]
        model = nested[0] if nested else None
    return True


def _is_model(t: object) -> bool:
    return isinstance(t, type) and issubclass(t, BaseModel)


def test_every_filter_names_a_request_field_or_none_and_rejections_read_it() -> None:
    for f in FILTERS.values():
        assert f.field is None or _request_field(f.field), f.name
        assert f.checks, f.name
        assert judged_field(f.name) == (f.field or f.name)
    assert not _request_field("resource_requirements.gpu.nothing")
    assert judged_field("Backfill") == "Backfill"  # the core's own, not a plugin
