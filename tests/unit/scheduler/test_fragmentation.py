"""Crater's Fragmentation score alone: the fragmentation measure worked by hand, GPUs stranded
by CPU and memory, the workload learned online (deterministic, each request once, decaying),
and the derived traces used to check it is not tuned to one trace."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from crater.scheduler.domain.cluster import ClusterArrays, Node
from crater.scheduler.domain.core import Scheduler
from crater.scheduler.domain.demand import Demand
from crater.scheduler.domain.fragmentation import (
    cards_after,
    expected_fragmentation,
    fragmentation_growth,
    host_stranded,
    rate_fragmentation,
    reserve_cost,
)
from crater.scheduler.domain.workload import LearnedShape, WorkloadModel
from crater.scheduler.sim.openb import OpenbNode, OpenbPod, topology
from crater.scheduler.sim.variants import derive, parse_variant, variant_name
from tests.support.topologies import node
from tests.unit.scheduler.test_core import cluster as core_cluster
from tests.unit.scheduler.test_core import profiled


def demand(gpus: int, milli: int = 1000, cores: int = 1, memory_mb: int = 1024) -> Demand:
    return Demand(
        pool="default",
        gpus=gpus,
        gpu_milli=milli if gpus else 0,
        gpu_memory_mb=0,
        gpu_model=None,
        cpu_cores=cores,
        memory_mb=memory_mb,
        disk_gb=0,
        avx=None,
        numa_strict=False,
        gpu_memory_source="requested",
    )


def shape(
    gpus: int, milli: int, popularity: float, cores: float = 1, memory: float = 0
) -> LearnedShape:
    return LearnedShape(gpus, milli, None, popularity, cores, memory)


def cluster(*nodes: OpenbNode) -> ClusterArrays:
    c = ClusterArrays()
    for n in nodes:
        c.upsert(Node.empty(topology(n, cpu_unit_milli=1000)))
    return c


def test_fragmentation_is_the_free_share_each_shape_cannot_use() -> None:
    cards = np.asarray([[1000, 300], [600, 0]])
    free = np.asarray([8, 8])
    ok = np.ones((3, 2), np.bool_)
    shapes = (shape(1, 500, 0.5), shape(1, 1000, 0.25), shape(2, 1000, 0.25))
    got = expected_fragmentation(cards, free, free, ok, shapes)
    # node 0: 500 strands the 300 card; one whole card strands 300; two cards: all 1300
    # node 1: 500 uses the 600 card; a whole card: none fits, all 600; two: all 600
    assert got.tolist() == [0.5 * 300 + 0.25 * 300 + 0.25 * 1300, 0.25 * 600 + 0.25 * 600]


def test_a_node_out_of_cpu_or_memory_strands_all_its_gpus() -> None:
    cards = np.asarray([[1000, 1000], [1000, 1000], [1000, 1000]])
    cpu = np.asarray([8, 0, 8])
    memory = np.asarray([4096, 4096, 100])
    ok = np.ones((1, 3), np.bool_)
    got = expected_fragmentation(cards, cpu, memory, ok, (shape(1, 1000, 1.0, 2, 1024),))
    assert got.tolist() == [0.0, 2000.0, 2000.0]


def test_host_stranded_counts_gpus_the_cpu_left_cannot_feed() -> None:
    cards = np.asarray([[1000, 1000, 1000, 1000], [1000, 1000, 0, 0]])
    # the workload asks 8 cores and 1000 MiB per card: 16 cores feed only two cards
    got = host_stranded(cards, np.asarray([16, 16]), np.asarray([10**6, 10**6]), 8 / 1000, 1.0)
    assert got.tolist() == [2000.0, 0.0]
    # memory binds the same way
    got = host_stranded(cards, np.asarray([64, 64]), np.asarray([1000, 1000]), 8 / 1000, 1.0)
    assert got.tolist() == [3000.0, 1000.0]


def test_a_cpu_only_task_goes_where_its_cores_strand_no_gpus() -> None:
    """Same cards, one node short of CPU per card: taking its cores strands its GPUs."""
    c = cluster(
        OpenbNode("tight", 16000, 65536, 2, "T4"), OpenbNode("roomy", 96000, 65536, 2, "T4")
    )
    model = c.workload
    for _ in range(10):  # GPU tasks of 8 cores a card
        model.observe(demand(1, cores=8))
    idx = np.arange(2)
    growth = fragmentation_growth(c, demand(0, cores=12), idx)
    assert growth[0] > 0
    assert growth[1] == 0
    scores = rate_fragmentation(c, demand(0, cores=12), idx)
    assert scores[1] > scores[0]


def test_a_share_lands_on_the_fullest_card_that_holds_it() -> None:
    cards = np.asarray([[1000, 400, 600], [300, 1000, 1000]])
    after = cards_after(cards, demand(1, 350))
    assert after.tolist() == [[1000, 50, 600], [300, 650, 1000]]
    assert cards_after(cards, demand(2)).tolist() == [[0, 400, 600], [300, 0, 0]]


def test_learning_is_deterministic() -> None:
    stream = [
        d
        for _ in range(50)
        for d in (demand(1), demand(1, 500, cores=4), demand(0, cores=16), demand(1))
    ]
    first, second = WorkloadModel(), WorkloadModel()
    for d in stream:
        first.observe(d)
        second.observe(d)
    assert first.seen == second.seen == len(stream)
    assert first.shapes() == second.shapes()
    top = first.shapes()[0]
    assert (top.gpus, top.gpu_milli) == (1, 1000)
    assert abs(top.popularity - 0.5) < 0.01


def test_older_requests_weigh_less() -> None:
    model = WorkloadModel(half_life=100)
    for _ in range(100):
        model.observe(demand(1))
    for _ in range(100):
        model.observe(demand(2))
    # 100 requests on, the first hundred weigh half of the last hundred's
    popular = {(s.gpus, s.gpu_milli): s.popularity for s in model.shapes()}
    assert popular[(2, 1000)] > popular[(1, 1000)]
    assert abs(popular[(1, 1000)] / popular[(2, 1000)] - 0.5) < 0.05


def test_the_core_learns_each_accepted_task_once_and_rebuilds_it_on_restore() -> None:
    """Ranking, retries and dry runs only read what is learned: the core feeds it, once per
    accepted task, so the same events always teach the same workload."""
    scheduler, _ = core_cluster(node("n1", gpus=2))
    scheduler.handle(profiled("a", gpus=2, when=1))  # placed
    scheduler.handle(profiled("b", gpus=1, when=2))  # waits
    scheduler.handle(profiled("b", gpus=1, when=3))  # a redelivery
    scheduler.handle(profiled("never", gpus=64, when=4))  # rejected: not workload
    scheduler.dry_run(scheduler.pending["b"].demand)
    learned = scheduler.cluster.workload
    assert learned.seen == 2
    shapes = {(s.gpus, s.gpu_milli) for s in learned.shapes()}
    assert shapes == {(2, 1000), (1, 1000)}

    other, _ = core_cluster(node("n2", gpus=2))
    assert other.cluster.workload.seen == 0  # schedulers never share what they learned

    restarted = Scheduler(scheduler.config)
    restarted.restore(
        [(n.topology, n.condition, n.last_heartbeat_at) for n in scheduler.cluster.nodes],
        list(scheduler.allocations.values()),
        list(scheduler.pending.values()),
        scheduler.next_seq,
    )
    assert restarted.cluster.workload.seen == 2
    assert {(s.gpus, s.gpu_milli) for s in restarted.cluster.workload.shapes()} == shapes


NODES = [OpenbNode("g8", 96000, 393216, 8, "G2"), OpenbNode("t4", 104000, 524288, 2, "T4")]
PODS = [
    OpenbPod("whole", 8000, 30000, 1, 1000, ""),
    OpenbPod("share", 4000, 16000, 1, 500, ""),
    OpenbPod("eight", 64000, 300000, 8, 1000, ""),
    OpenbPod("cpu", 12000, 50000, 0, 0, ""),
] * 25


def test_variants_are_seeded_and_shift_the_mix_to_their_level() -> None:
    sharing = derive(PODS, NODES, "sharing40", seed=3)
    assert sharing == derive(PODS, NODES, "sharing40", seed=3)
    assert len(sharing) == len(PODS)
    assert sharing[0].name.startswith("sharing40-")
    # the CPU-only pods keep their quarter; 40% of the GPU pods (75) share a card
    assert sum(p.num_gpu == 0 for p in sharing) == 25
    assert sum(p.num_gpu == 1 and p.gpu_milli < 1000 for p in sharing) == 30
    assert sum(p.num_gpu == 0 for p in derive(PODS, NODES, "cpuheavy25", seed=3)) == 25
    assert sum(p.num_gpu == 0 for p in derive(PODS, NODES, "cpuheavy", seed=3)) == 30
    # multi-GPU pods ask the level's share of the GPU request (within rounding)
    many = derive(PODS * 10, NODES, "multigpu40", seed=3)
    multi = sum(p.gpu_request for p in many if p.num_gpu >= 2)
    assert 0.35 < multi / sum(p.gpu_request for p in many) < 0.45


def test_variant_names_read_as_the_public_traces() -> None:
    assert [variant_name(*parse_variant(t)) for t in ("gpuspec", "gpuspec:20", "gpuspec5")] == [
        "gpuspec33",
        "gpuspec20",
        "gpuspec5",
    ]
    for bad in ("gpu", "gpuspec0", "sharing101", "cpuheavy:x"):
        with pytest.raises(ValueError, match="variant"):
            parse_variant(bad)


def test_gpuspec_pins_gpu_pods_only_to_models_that_can_hold_them() -> None:
    pinned = derive(PODS, NODES, "gpuspec33", seed=3)
    specs = Counter((p.num_gpu, p.gpu_spec) for p in pinned)
    assert specs[(8, "T4")] == 0  # two-card nodes cannot hold eight
    assert specs[(8, "G2")] > 0
    assert all(not p.gpu_spec for p in pinned if not p.num_gpu)
    assert 0.2 < sum(bool(p.gpu_spec) for p in pinned) / 75 < 0.5
    # one-card pods are pinned evenly over the models, not by their number of cards
    derived = derive(PODS * 20, NODES, "gpuspec33", seed=3)
    many = Counter(p.gpu_spec for p in derived if p.num_gpu == 1)
    assert many["G2"]
    assert 0.5 < many["T4"] / many["G2"] < 2


def pinned(gpus: int, model: str | None) -> Demand:
    return replace(demand(gpus), gpu_model=model)


def test_work_that_can_go_elsewhere_leaves_pinned_capacity_to_pinned_work() -> None:
    c = cluster(
        OpenbNode("g2-a", 96000, 393216, 8, "G2"),
        OpenbNode("g2-b", 96000, 393216, 8, "G2"),
        OpenbNode("t4-a", 96000, 393216, 8, "T4"),
    )
    for _ in range(8):
        c.workload.observe(demand(1))
    for _ in range(2):
        c.workload.observe(pinned(1, "T4"))
    shapes = [s for s in c.workload.shapes() if s.gpus]
    every = np.arange(3)
    # the T4 cards are a third of the free ones and pinned work is a fifth of the demand:
    # a card taken there by work that could go anywhere costs 0.2 / (1/3) of a card
    flexible = reserve_cost(c, demand(1), every, shapes)
    assert flexible.tolist() == pytest.approx([0.0, 0.0, 0.6 * 1000], rel=0.01)  # decayed counts
    # work pinned to T4 pays nothing: the capacity is for it
    assert reserve_cost(c, pinned(1, "T4"), every, shapes).tolist() == [0.0, 0.0, 0.0]
    # as the T4 cards run short, the cost of taking one grows
    c.nodes[2].take((0, 1, 2, 3, 4, 5), 1000, (), 0, None)
    c.refresh("t4-a")
    assert reserve_cost(c, demand(1), every, shapes)[2] > flexible[2]
    # and placement ranks a G2 node first for flexible work, all else equal
    growth = fragmentation_growth(c, demand(1), every)
    assert growth[2] > max(growth[0], growth[1])


def test_no_pinned_work_no_reserve_cost() -> None:
    c = cluster(OpenbNode("g2", 96000, 393216, 8, "G2"), OpenbNode("t4", 96000, 393216, 8, "T4"))
    c.workload.observe(demand(1))
    shapes = [s for s in c.workload.shapes() if s.gpus]
    assert reserve_cost(c, demand(1), np.arange(2), shapes).tolist() == [0.0, 0.0]


def big(gpus: int, cores: int) -> Demand:
    return demand(gpus, cores=cores)


def test_work_that_fits_elsewhere_leaves_the_largest_nodes_to_the_work_only_they_hold() -> None:
    """openb's multi-GPU traces: eight-card pods asking 120 cores fit only the 128-core nodes;
    one-card pods and 64-core eight-card pods that take those nodes' cards fail them."""
    c = g3_cluster(1)
    shapes = [s for s in c.workload.shapes() if s.gpus]
    every = np.arange(3)
    one_card = reserve_cost(c, demand(1, cores=8), every, shapes)
    assert one_card[0] == one_card[1] == 0.0
    assert one_card[2] > 0
    # an eight-card pod that a G2 node could hold pays there too; one that only G3 holds does not
    assert reserve_cost(c, big(8, 64), every, shapes)[2] > 0
    assert reserve_cost(c, big(8, 120), every, shapes).tolist() == [0.0, 0.0, 0.0]
    # so the one-card pod goes to a G2 node, all else equal
    growth = fragmentation_growth(c, demand(1, cores=8), every)
    assert growth[2] > max(growth[0], growth[1])


def g3_cluster(g3_nodes: int) -> ClusterArrays:
    """Two 96-core and `g3_nodes` 128-core eight-card nodes; the workload: one-card pods and,
    rarely, eight-card pods of 120 cores (which only the 128-core nodes hold)."""
    c = cluster(
        OpenbNode("g2-a", 96000, 393216, 8, "G2"),
        OpenbNode("g2-b", 96000, 393216, 8, "G2"),
        *(OpenbNode(f"g3-{k}", 128000, 786432, 8, "G3") for k in range(g3_nodes)),
    )
    for _ in range(30):
        c.workload.observe(demand(1, cores=8))
    for _ in range(2):
        c.workload.observe(big(8, 120))
    return c


def test_a_cpu_only_task_pays_for_the_cores_it_takes_from_the_many_core_nodes() -> None:
    """openb's CPU-heavy traces: CPU-only pods took the cores of the 128-core nodes, and the
    120-core eight-card pods that only those hold failed first. Cores taken there count as
    the card thousandths they would feed at what the scarce work asks per thousandth."""
    c = g3_cluster(1)
    shapes = [s for s in c.workload.shapes() if s.gpus]
    every = np.arange(3)
    cpu_only = reserve_cost(c, demand(0, cores=4), every, shapes)
    assert cpu_only[0] == cpu_only[1] == 0.0
    assert cpu_only[2] > 0
    # in proportion to the cores (while the node can still hold the scarce shape: 120 left)
    twice = reserve_cost(c, demand(0, cores=8), every, shapes)
    assert twice[2] == pytest.approx(2 * cpu_only[2])
    # 8 cores feed 8 / 120 of the eight cards the scarce shape asks, 533 thousandths: a
    # one-card task taking 8 cores takes its 1,000 (and leaves the node 7 cards: it breaks it)
    assert reserve_cost(c, demand(1, cores=8), every, shapes)[2] > twice[2] * 1000 / 533
    # a task asking nothing of anything pays nothing
    nothing = replace(demand(0, cores=0), memory_mb=0)
    assert reserve_cost(c, nothing, every, shapes).tolist() == [0.0, 0.0, 0.0]


def test_leaving_the_last_holders_of_a_scarce_shape_unable_to_hold_it_costs_more() -> None:
    """A cut that leaves a node unable to hold the scarce shape costs its share of the demand
    over the share of the free cards on the nodes still able to, times its cards: little
    while many hold it, more as they dwindle; nothing for a cut that leaves it able."""
    c = g3_cluster(4)
    shapes = [s for s in c.workload.shapes() if s.gpus]
    every = np.arange(6)
    small_cut = reserve_cost(c, demand(0, cores=4), every, shapes)  # 124 cores stay: holds
    big_cut = reserve_cost(c, demand(0, cores=16), every, shapes)  # 112 stay: no longer
    # beyond the cores-as-cards part (proportional to the cores), the cut that breaks pays more
    assert big_cut[2] > 4 * small_cut[2] * 1.01
    assert big_cut[0] == 0.0  # a 96-core node never held it
    # three of the four holders cut: the last one's cut costs more
    for k in (3, 4, 5):
        c.nodes[k].take((), 0, tuple(range(16)), 0, None)
        c.refresh(f"g3-{k - 2}")
    last = reserve_cost(c, demand(0, cores=16), every, shapes)
    assert last[2] > big_cut[2]
    # the scarce work itself pays nothing there
    assert reserve_cost(c, big(8, 120), every, shapes).tolist() == [0.0] * 6


def test_requests_rare_by_count_but_not_by_cards_are_measured_against() -> None:
    model = WorkloadModel()
    for _ in range(1000):
        model.observe(demand(1, cores=8))
    for _ in range(4):
        model.observe(big(8, 48))
    for _ in range(4):
        model.observe(big(8, 120))
    learned = {(s.gpus, round(s.cpu_cores)) for s in model.shapes() if s.gpus}
    # under 1% of the requests each, but a few percent of the cards asked; and told apart by
    # their cores, which decide which nodes could hold them
    assert learned == {(1, 8), (8, 48), (8, 120)}


def test_nodes_with_the_same_hardware_share_a_capacity_profile_until_the_topology_changes() -> None:
    c = cluster(
        OpenbNode("g2-a", 96000, 393216, 8, "G2"),
        OpenbNode("g3-a", 128000, 786432, 8, "G3"),
        OpenbNode("g2-b", 96000, 393216, 8, "G2"),
    )
    of, first = c.capacity_profiles()
    assert of.tolist() == [0, 1, 0]
    assert first.tolist() == [0, 1]
    assert c.capacity_profiles()[0] is of  # kept while the topology stands
    c.upsert(Node.empty(topology(OpenbNode("t4-a", 96000, 393216, 8, "T4"), cpu_unit_milli=1000)))
    of, first = c.capacity_profiles()
    assert of.tolist() == [0, 1, 0, 2]
    assert first.tolist() == [0, 1, 3]
