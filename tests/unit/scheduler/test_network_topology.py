"""Network topology across nodes: nodes declare their place in the fabric (NVLink domain,
leaf, spine), gangs require or prefer one domain of a level, their ranks follow the fabric,
and small work fills domains already begun so whole ones stay free for gangs."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from crater.contracts import (
    AllocationGranted,
    Event,
    FabricLevel,
    FabricPlace,
    NetworkTopology,
    NodeTopology,
    NodeTopologyReported,
    TaskPending,
    TaskPreempted,
    TaskRejected,
    TaskRequest,
    TaskStatus,
)
from crater.scheduler.audit_state import dump_core, load_core
from crater.scheduler.domain.core import Scheduler, SchedulerConfig
from crater.scheduler.domain.plugins import FILTERS, Pipeline
from tests.support.topologies import node
from tests.unit.scheduler.test_core import at, cluster, profiled
from tests.unit.scheduler.test_queue_rules import grants, status

REQUIRE_LEAF = {"required": "leaf"}


def place(spine: str | None, leaf: str | None, nvl: str | None = None) -> FabricPlace:
    return FabricPlace(spine=spine, leaf=leaf, nvlink_domain=nvl)


def racks(*leaves: tuple[str, int], gpus: int = 4, spine: str = "s1") -> list[NodeTopology]:
    """Nodes under each named leaf (one spine), named by leaf: a-1, a-2, b-1, ..."""
    return [
        node(f"{leaf}-{i}", gpus=gpus, fabric=place(spine, leaf))
        for leaf, count in leaves
        for i in range(1, count + 1)
    ]


def gang(task_id: str, members: int, gpus: int = 4, when: float = 1, **extra: Any) -> Any:
    return profiled(task_id, gpus=gpus, gang_size=members, when=when, **extra)


def leaves_of(scheduler: Scheduler, granted: list[AllocationGranted]) -> list[str | None]:
    places = [scheduler.cluster.get(g.node) for g in granted]
    return [
        None if n is None or n.topology.fabric is None else n.topology.fabric.leaf for n in places
    ]


# -- contracts ---------------------------------------------------------------------------------


def test_a_place_and_a_requirement_are_left_out_of_the_json_when_unset() -> None:
    # recorded inputs without them read byte for byte as before (replay, audit)
    assert "fabric" not in node("n1", gpus=1).model_dump_json()
    assert "network_topology" not in profiled("t").task.model_dump_json()
    placed = node("n1", gpus=1, fabric=place("s1", "l1"))
    assert NodeTopology.model_validate_json(placed.model_dump_json()).fabric == place("s1", "l1")


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"required": "rack"}, ("required",), "nvlink-domain"),
        ({}, (), "name a required or a preferred level"),
        ({"required": "leaf", "preferred": "spine"}, (), "looser than required leaf"),
    ],
)
def test_a_malformed_requirement_is_refused_naming_the_field(
    body: dict[str, str], field: tuple[str, ...], words: str
) -> None:
    request = profiled("t").task.model_dump(mode="json", by_alias=True)
    with pytest.raises(ValidationError) as caught:
        TaskRequest.model_validate(request | {"network_topology": body})
    [error] = caught.value.errors()
    assert error["loc"][: 1 + len(field)] == ("network_topology", *field)
    assert words in str(caught.value)


def test_a_malformed_place_is_refused_naming_the_field() -> None:
    body = node("n1", gpus=1).model_dump(mode="json") | {"fabric": {"leaf": "leaf 3"}}
    with pytest.raises(ValidationError) as caught:
        NodeTopology.model_validate(body)
    assert caught.value.errors()[0]["loc"] == ("fabric", "leaf")
    body["fabric"] = {"rack": "r1"}  # not a level
    with pytest.raises(ValidationError) as caught:
        NodeTopology.model_validate(body)
    assert caught.value.errors()[0]["loc"] == ("fabric", "rack")
    with pytest.raises(ValueError, match=r"crater\.ai/leaf-switch='leaf 3'"):
        FabricPlace.from_labels({"crater.ai/leaf-switch": "leaf 3"})


def test_the_place_is_read_off_the_labels_each_level_within_those_above() -> None:
    labels = {"crater.ai/spine-switch": "s1", "crater.ai/leaf-switch": "l2", "rack": "r"}
    fabric = FabricPlace.from_labels(labels)
    assert fabric == place("s1", "l2")
    assert fabric.path_to(FabricLevel.LEAF) == ("s1", "l2")
    assert fabric.path_to(FabricLevel.NVLINK_DOMAIN) is None
    assert FabricPlace.from_labels({"rack": "r"}) is None
    assert NetworkTopology(preferred="nvlink-domain").levels == (
        FabricLevel.NVLINK_DOMAIN,
        FabricLevel.LEAF,
        FabricLevel.SPINE,
        None,
    )
    assert NetworkTopology(required="leaf", preferred="nvlink-domain").levels == (
        FabricLevel.NVLINK_DOMAIN,
        FabricLevel.LEAF,
    )


# -- required: a filter, one domain, reasons ---------------------------------------------------


def test_a_level_no_node_declares_is_refused_naming_the_field() -> None:
    scheduler, _ = cluster(node("n1", gpus=4), node("n2", gpus=4))
    [refused] = scheduler.handle(gang("ddp", 2, network_topology=REQUIRE_LEAF))
    assert isinstance(refused, TaskRejected)
    [error] = refused.errors
    assert error.field == "network_topology.required"
    assert error.reason == (
        "no node in pool 'default' can ever fit: 2 nodes declare no leaf in the network fabric"
    )


def test_a_gang_no_domain_could_ever_hold_is_refused_naming_the_field() -> None:
    scheduler, _ = cluster(*racks(("a", 2), ("b", 2)))
    [refused] = scheduler.handle(gang("ddp", 3, network_topology=REQUIRE_LEAF))
    assert isinstance(refused, TaskRejected)
    [error] = refused.errors
    assert error.field == "network_topology.required"
    assert "no leaf of pool 'default' could hold all 3 members even empty: at most 2" in (
        error.reason
    )
    # the same gang anywhere fits: four nodes, one member each
    assert len(grants(scheduler.handle(gang("anywhere", 3, when=2)))) == 3


def test_a_required_gang_goes_whole_into_the_tightest_leaf_that_holds_it() -> None:
    scheduler, _ = cluster(*racks(("a", 3), ("b", 2), ("c", 1)))
    placed = grants(scheduler.handle(gang("ddp", 2, network_topology=REQUIRE_LEAF)))
    assert leaves_of(scheduler, placed) == ["b", "b"]  # a stays whole for a gang of 3
    bigger = grants(scheduler.handle(gang("ddp3", 3, when=2, network_topology=REQUIRE_LEAF)))
    assert leaves_of(scheduler, bigger) == ["a", "a", "a"]
    assert placed[0].explanation.endswith("; fabric s1/b/-"), placed[0].explanation


def test_a_gang_that_cannot_fit_under_one_leaf_says_so_and_starts_when_one_frees() -> None:
    scheduler, _ = cluster(*racks(("a", 2), ("b", 2)))
    # whole nodes fill leaf a first (packing), then b-1; a-1 then frees: one free node a leaf
    placed = [grants(scheduler.handle(profiled(f"busy-{k}", gpus=4, when=1 + k))) for k in range(3)]
    assert [g.node for [g] in placed] == ["a-1", "a-2", "b-1"]
    scheduler.handle(status("busy-0", 4, TaskStatus.SUCCEEDED))
    decisions = scheduler.handle(gang("ddp", 2, when=5, network_topology=REQUIRE_LEAF))
    [pending] = [d for d in decisions if isinstance(d, TaskPending)]
    reason = next(r for r in pending.reasons if r.filter == "FabricDomain")
    assert reason.code == "GangExceedsDomain"
    assert reason.message == (
        "no leaf has room for all 2 gang members now (network_topology.required: leaf): at "
        "most 1, under s1/a"
    )
    assert pending.summary.startswith("2/4 nodes can take a member, 2 needed at once: ")
    assert reason.message in pending.summary
    after = grants(scheduler.handle(status("busy-1", 6, TaskStatus.SUCCEEDED)))
    assert sorted(g.node for g in after) == ["a-1", "a-2"]


def test_a_single_task_requiring_a_level_only_goes_where_one_is_declared() -> None:
    scheduler, _ = cluster(
        node("a-plain", gpus=4), node("z-placed", gpus=4, fabric=place("s", "l"))
    )
    [placed] = grants(scheduler.handle(profiled("one", gpus=1, network_topology=REQUIRE_LEAF)))
    assert placed.node == "z-placed"


def test_a_required_gang_preempts_within_one_leaf_only() -> None:
    # by progress alone the victims would be b-1 (latest) and a-2: room under two leaves,
    # which the gang cannot use; within one leaf it takes a-1 and a-2 (b-2's is not
    # preemptible), and starts there when they yield
    scheduler, _ = cluster(*racks(("a", 2), ("b", 2)))
    low = {"priority": "low", "preemptible": True}
    for k, extra in enumerate((low, low, low, {"priority": "low"})):
        [_] = grants(scheduler.handle(profiled(f"busy-{k}", gpus=4, when=1 + k, **extra)))
        scheduler.handle(status(f"busy-{k}", 1.5 + k, TaskStatus.RUNNING))
    assert [a.node for a in scheduler.allocations.values()] == ["a-1", "a-2", "b-1", "b-2"]
    decisions = scheduler.handle(
        gang("ddp", 2, when=9, priority="high", network_topology=REQUIRE_LEAF)
    )
    victims = sorted((d.task_id, d.node) for d in decisions if isinstance(d, TaskPreempted))
    assert victims == [("busy-0", "a-1"), ("busy-1", "a-2")]
    scheduler.handle(status("busy-0", 10, TaskStatus.CANCELLED))
    placed = grants(scheduler.handle(status("busy-1", 11, TaskStatus.CANCELLED)))
    assert sorted(g.node for g in placed) == ["a-1", "a-2"]


def test_a_waiting_gang_that_heads_its_queue_keeps_nodes_of_one_leaf() -> None:
    # names alternate leaves (n1, n3 under a; n2, n4 under b): closest to fitting by name
    # would keep n1 and n2, under two leaves, which the gang could never use together
    nodes = [node(f"n{i}", gpus=4, fabric=place("s1", "a" if i % 2 else "b")) for i in range(1, 5)]
    scheduler, _ = cluster(*nodes)
    for k in range(4):
        assert grants(scheduler.handle(profiled(f"busy-{k}", gpus=4, when=1 + k)))
    decisions = scheduler.handle(gang("ddp", 2, when=9, network_topology=REQUIRE_LEAF))
    assert [type(d) for d in decisions] == [TaskPending]
    assert scheduler.backfill["default"].nodes == ("n1", "n3")


# -- preferred: tried first, then looser -------------------------------------------------------


def test_a_preferred_domain_is_taken_when_it_holds_the_gang_else_a_looser_one() -> None:
    nodes = [
        node("n1", gpus=4, fabric=place("s1", "a", "nvl-1")),
        node("n2", gpus=4, fabric=place("s1", "b", "nvl-2")),
        node("n3", gpus=4, fabric=place("s1", "b", "nvl-2")),
        node("n4", gpus=4, fabric=place("s2", "c")),
    ]
    scheduler, _ = cluster(*nodes)
    prefer = {"preferred": "nvlink-domain"}
    first = grants(scheduler.handle(gang("ddp", 2, network_topology=prefer)))
    assert sorted(g.node for g in first) == ["n2", "n3"]
    # one NVLink domain holds no 2 more, nor one leaf, but one spine does (n1 with... none:
    # n1 is alone under s1's free room; s2 has n4): anywhere, as nothing is required
    second = grants(scheduler.handle(gang("ddp2", 2, when=2, network_topology=prefer)))
    assert sorted(g.node for g in second) == ["n1", "n4"]


def test_a_preferred_level_with_a_required_one_never_goes_looser_than_required() -> None:
    nodes = [node(f"n{i}", gpus=4, fabric=place("s1", f"l{i}", f"nvl{i}")) for i in (1, 2)]
    scheduler, _ = cluster(*nodes)
    both = {"required": "spine", "preferred": "leaf"}
    placed = grants(scheduler.handle(gang("ddp", 2, network_topology=both)))
    assert sorted(g.node for g in placed) == ["n1", "n2"]  # one spine, two leaves
    scheduler, _ = cluster(*nodes)
    tight = {"required": "leaf", "preferred": "nvlink-domain"}
    [refused] = scheduler.handle(gang("ddp", 2, network_topology=tight))
    assert isinstance(refused, TaskRejected)


# -- ring order ---------------------------------------------------------------------------------


def ring_is_grouped(leaves: list[str | None]) -> bool:
    """Members sharing a leaf are consecutive: each leaf is entered once."""
    seen: list[str | None] = []
    for leaf in leaves:
        if seen and seen[-1] == leaf:
            continue
        if leaf in seen:
            return False
        seen.append(leaf)
    return True


@settings(max_examples=30, deadline=None)
@given(
    leaves=st.lists(st.integers(min_value=1, max_value=3), min_size=2, max_size=4),
    busy=st.lists(st.sampled_from((1, 2, 4)), max_size=6),
    members=st.integers(min_value=2, max_value=8),
    topology=st.sampled_from([None, {"preferred": "leaf"}, {"required": "spine"}]),
    seed=st.integers(min_value=0, max_value=1000),
)
def test_any_spread_gang_ranks_follow_the_fabric(
    leaves: list[int],
    busy: list[int],
    members: int,
    topology: dict[str, str] | None,
    seed: int,
) -> None:
    # Nodes named so that name order alternates leaves: the ring order is the fabric's, not
    # the names'. Some nodes partly busy, so members land unevenly.
    nodes = [
        node(f"n{i:02d}{leaf}", gpus=4, fabric=place(f"s{leaf % 2}", f"leaf{leaf}"))
        for leaf, count in enumerate(leaves)
        for i in range(count)
    ]
    random.Random(seed).shuffle(nodes)
    scheduler, _ = cluster(*nodes)
    for k, gpus in enumerate(busy):
        scheduler.handle(profiled(f"busy-{k}", gpus=gpus, when=1 + k))
    extra = {} if topology is None else {"network_topology": topology}
    placed = grants(scheduler.handle(gang("ddp", members, gpus=1, when=50, **extra)))
    if not placed:
        return
    assert [g.gang_index for g in placed] == list(range(members))
    fabric = {n.node_id: n.fabric for n in nodes if n.fabric is not None}
    spines = [fabric[g.node].spine for g in placed]
    assert ring_is_grouped(spines)
    assert ring_is_grouped([f"{fabric[g.node].spine}/{fabric[g.node].leaf}" for g in placed])
    assert ring_is_grouped([g.node for g in placed])
    if topology == {"required": "spine"}:
        assert len(set(spines)) == 1


def test_ranks_follow_the_fabric_where_the_scores_interleave_leaves() -> None:
    # without FabricPack members go by fragmentation, then name: n1 (a), n2 (b), n3 (a), n4
    # (b); their ranks go along the fabric instead: a, a, b, b, the best node still rank 0
    nodes = [node(f"n{i}", gpus=4, fabric=place("s1", "a" if i % 2 else "b")) for i in range(1, 5)]
    config = SchedulerConfig(pipeline=Pipeline.from_names(list(FILTERS), {"Fragmentation": 1.0}))
    scheduler = Scheduler(config=config)
    for t in nodes:
        scheduler.handle(NodeTopologyReported(occurred_at=at(0), node=t))
    placed = grants(scheduler.handle(gang("ddp", 4)))
    assert [(g.gang_index, g.node) for g in placed] == [(0, "n1"), (1, "n3"), (2, "n2"), (3, "n4")]
    assert {g.environment["CRATER_GANG_LEADER_NODE"] for g in placed} == {"n1"}


def test_a_fleet_without_places_ranks_and_scores_as_before() -> None:
    # where no node declares a place, FabricPack takes no part (nor shows in the scores)
    scheduler, _ = cluster(node("n1", gpus=4), node("n2", gpus=4))
    placed = grants(scheduler.handle(gang("ddp", 3, gpus=2)))
    assert [g.node for g in placed] == ["n1", "n1", "n2"]
    assert all("FabricPack" not in {s.plugin for s in g.scores} for g in placed)
    scheduler, _ = cluster(*racks(("a", 2), ("b", 1)))
    [first] = grants(scheduler.handle(profiled("t1", gpus=4)))
    assert {s.plugin: s.score for s in first.scores}["FabricPack"] == 0.0  # nothing in use yet
    [second] = grants(scheduler.handle(profiled("t2", gpus=1, when=2)))
    assert (second.node, first.node) == ("a-2", "a-1")  # leaf a begun: a-2 before b-1
    # leaf a: 4 of 8 GPUs in use; spine s1: 4 of 12; their mean
    assert {s.plugin: s.score for s in second.scores}["FabricPack"] == 0.4167


# -- packing keeps domains whole ------------------------------------------------------------------


def test_small_work_fills_a_leaf_begun_so_another_stays_whole_for_a_gang() -> None:
    # names alternate leaves (x-1 under a, x-2 under b, ...): by name alone small tasks would
    # start a second leaf; packing by leaf keeps one leaf whole
    nodes = [node(f"x-{i}", gpus=4, fabric=place("s1", "a" if i % 2 else "b")) for i in range(1, 5)]
    scheduler, _ = cluster(*nodes)
    for k in range(4):
        [_g] = grants(scheduler.handle(profiled(f"small-{k}", gpus=2, when=1 + k)))
    used = {a.node for a in scheduler.allocations.values()}
    leaves = {n.topology.fabric.leaf for n in scheduler.cluster.nodes if n.name in used}  # type: ignore[union-attr]
    assert len(leaves) == 1, used
    placed = grants(scheduler.handle(gang("ddp", 2, when=10, network_topology=REQUIRE_LEAF)))
    assert len(placed) == 2
    assert len(set(leaves_of(scheduler, placed))) == 1


# -- deterministic, and kept in snapshots -------------------------------------------------------


def test_topology_placement_replays_identically_and_survives_a_snapshot() -> None:
    nodes = racks(("a", 3), ("b", 2), ("c", 2))
    events: list[Event] = [NodeTopologyReported(occurred_at=at(0), node=n) for n in nodes]
    events += [
        profiled("s1", gpus=1, when=1),
        gang("g1", 2, when=2, network_topology=REQUIRE_LEAF),
        gang("g2", 3, gpus=1, when=3, network_topology={"preferred": "leaf"}),
        gang("g3", 3, when=4, network_topology=REQUIRE_LEAF),
    ]

    def run(scheduler: Scheduler) -> list[str]:
        return [d.model_dump_json() for e in events for d in scheduler.handle(e)]

    assert run(Scheduler()) == run(Scheduler())
    first = Scheduler()
    for e in events[: len(nodes)]:
        first.handle(e)
    restored = load_core(dump_core(first), first.config)
    assert restored.cluster.fabric_nodes == len(nodes)
    fresh = Scheduler()
    for e in events[: len(nodes)]:
        fresh.handle(e)
    rest = events[len(nodes) :]
    assert [d.model_dump_json() for e in rest for d in restored.handle(e)] == [
        d.model_dump_json() for e in rest for d in fresh.handle(e)
    ]


def test_a_node_moved_to_another_leaf_is_counted_once() -> None:
    scheduler, _ = cluster(*racks(("a", 2)))
    moved = node("a-1", gpus=4, fabric=place("s1", "b"))
    scheduler.handle(NodeTopologyReported(occurred_at=at(1), node=moved))
    scheduler.handle(NodeTopologyReported(occurred_at=at(2), node=node("a-2", gpus=4)))
    cluster_ = scheduler.cluster
    assert cluster_.fabric_nodes == 1
    assert cluster_.fabric_name(int(cluster_.fabric(FabricLevel.LEAF)[0])) == "s1/b"
    assert int(cluster_.fabric(FabricLevel.LEAF)[1]) == 0
