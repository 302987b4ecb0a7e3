"""Properties under random event sequences with over-commit and MIG: nothing is ever promised
past capacity x ratio (per card, per core, per node), and MIG slices never share a card with
whole or shared use nor exceed the card's compute and memory slices."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    Confidence,
    NodeTopology,
    NodeTopologyReported,
    ResourcePrediction,
    TaskProfiled,
    TaskRequest,
    TaskStatus,
    TaskStatusReported,
)
from crater.scheduler.domain.cluster import Overcommit
from crater.scheduler.domain.core import Scheduler, SchedulerConfig
from crater.scheduler.domain.mig import MigProfile, card_geometry
from crater.scheduler.domain.plugins import DEFAULT_PIPELINE
from crater.scheduler.domain.pools import PoolPolicy
from tests.support.topologies import node

T0 = datetime(2026, 1, 1, tzinfo=UTC)
A100_MIG = ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]
RATIOS = {
    "default": Overcommit(),
    "batch": Overcommit(cpu=1.5, memory=2.0, gpu=2.0),
}
PREDICTION = ResourcePrediction(
    gpu_memory_per_gpu_mb=0,
    host_memory_mb=0,
    confidence=Confidence.LOW,
    method="test",
    dataloader_num_workers=1,
    dataloader_prefetch_factor=1,
)


def mig_capable(t: NodeTopology) -> NodeTopology:
    cards = [g.model_copy(update={"mig_capable": True, "mig_profiles": A100_MIG}) for g in t.gpus]
    return t.model_copy(update={"gpus": cards})


NODES = (
    mig_capable(node("a100-01", gpus=4, cores=16, memory_mb=256_000)),
    node("batch-01", gpus=2, cores=16, memory_mb=128_000, pool="batch"),
    mig_capable(node("batch-02", gpus=2, cores=8, numa_nodes=1, memory_mb=64_000, pool="batch")),
)

task_shapes = st.tuples(
    st.sampled_from(["default", "batch"]),
    st.sampled_from([0, 1, 1, 1, 2, 4]),  # GPUs
    st.sampled_from([None, "1g.10gb", "2g.20gb", "3g.40gb", "3g.40gb", "7g.80gb"]),  # 1 GPU
    st.sampled_from([1000, 1000, 250, 500]),  # share of a card (with 1 GPU, no MIG)
    st.integers(0, 12),  # CPU cores
    st.integers(0, 90_000),  # memory MiB
    st.sampled_from(["strict", "best-effort"]),
)
steps = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), task_shapes),
        st.tuples(st.just("finish"), st.integers(0, 200)),
        st.tuples(st.just("wait"), st.integers(1, 40)),
    ),
    min_size=1,
    max_size=50,
)

Shape = tuple[str, int, str | None, int, int, int, str]


def profiled(i: int, clock: int, shape: Shape) -> TaskProfiled:
    pool, gpus, mig, milli, cores, memory, numa = shape
    gpu: dict[str, object] = {"count": gpus}
    if gpus == 1 and mig is not None:
        gpu["mig_profile"] = mig
    elif gpus == 1:
        gpu["milli"] = milli
    request = TaskRequest.model_validate(
        {
            "task_id": f"t{i}",
            "task_type": "training",
            "model_config": {"name": "m"},
            "pool": pool,
            "resource_requirements": {
                "gpu": gpu,
                "cpu": {"cores": cores},
                "memory": {"capacity_mb": memory},
            },
            "affinity": {"numa": numa},
        }
    )
    return TaskProfiled(
        occurred_at=T0 + timedelta(seconds=clock), task=request, prediction=PREDICTION
    )


def check(scheduler: Scheduler, granted: dict[str, AllocationGranted]) -> None:
    for n in scheduler.cluster.nodes:
        ratio = RATIOS[n.topology.pool]
        mine = [g for g in granted.values() if g.node == n.name]
        # memory: within capacity x ratio, and the node's books agree
        memory = sum(g.memory_mb for g in mine)
        assert memory <= math.floor(n.topology.memory_mb * ratio.memory), "memory over-promised"
        assert n.memory_free_mb == math.floor(n.topology.memory_mb * ratio.memory) - memory
        # cores: at most ceil(ratio) tasks on one, floor(cores x ratio) in all, none twice
        holders: dict[int, int] = {}
        for g in mine:
            assert len(g.cpu_cores) == len(set(g.cpu_cores)), "a task given one core twice"
            for core in g.cpu_cores:
                holders[core] = holders.get(core, 0) + 1
        assert all(h <= math.ceil(ratio.cpu) for h in holders.values()), "a core over-shared"
        assert sum(holders.values()) <= math.floor(n.cpu_total * ratio.cpu), "CPU over-promised"
        assert {c: h for c, h in n.cpu_held.items() if h} == holders
        # cards: whole and shared use within 1000 x ratio; MIG alone on its card, in slices
        for card in n.topology.gpus:
            on_card = [g for g in mine if card.index in g.gpu_ids]
            slices = [MigProfile.parse(g.mig_profile) for g in on_card if g.mig_profile]
            others = [g for g in on_card if g.mig_profile is None]
            if slices:
                assert not others, "a MIG card also held whole or shared"
                shape = card_geometry(card.mig_profiles)
                assert shape is not None
                assert sum(shape.cost(p)[0] for p in slices) <= shape.compute_slices
                assert sum(shape.cost(p)[1] for p in slices) <= shape.memory_slices
                assert n.gpu_milli_free[card.index] == 0
            else:
                held = sum(g.gpu_milli for g in others)
                assert held <= math.floor(1000 * ratio.gpu), "a card over-promised"
                assert n.gpu_milli_free[card.index] == math.floor(1000 * ratio.gpu) - held


@settings(max_examples=150, deadline=None)
@given(steps)
def test_nothing_is_promised_past_capacity_times_ratio(script: list[tuple[str, object]]) -> None:
    pools = {
        pool: PoolPolicy(DEFAULT_PIPELINE, ratio)
        for pool, ratio in RATIOS.items()
        if pool != "default"
    }
    scheduler = Scheduler(config=SchedulerConfig(pools=pools))
    for topology in NODES:
        scheduler.handle(NodeTopologyReported(occurred_at=T0, node=topology))
    granted: dict[str, AllocationGranted] = {}
    clock = 0
    for i, (kind, arg) in enumerate(script, start=1):
        clock += 1
        if kind == "wait":
            clock += int(arg)  # type: ignore[call-overload]
            continue
        if kind == "submit":
            decisions = scheduler.handle(profiled(i, clock, arg))  # type: ignore[arg-type]
        else:
            live = sorted(granted)
            if not live:
                continue
            task_id = live[int(arg) % len(live)]  # type: ignore[call-overload]
            decisions = scheduler.handle(
                TaskStatusReported(
                    occurred_at=T0 + timedelta(seconds=clock),
                    task_id=task_id,
                    status=TaskStatus.SUCCEEDED,
                )
            )
        for d in decisions:
            if isinstance(d, AllocationReleased):
                granted.pop(d.task_id)
        granted.update({d.task_id: d for d in decisions if isinstance(d, AllocationGranted)})
        check(scheduler, granted)


mig_steps = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.sampled_from(["1g.10gb", "2g.20gb", "3g.40gb"])),
        st.tuples(st.just("finish"), st.integers(0, 200)),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=100, deadline=None)
@given(mig_steps)
def test_mig_slices_never_pass_a_cards_compute_or_memory_slices(
    script: list[tuple[str, object]],
) -> None:
    scheduler = Scheduler()
    scheduler.handle(NodeTopologyReported(occurred_at=T0, node=NODES[0]))
    granted: dict[str, AllocationGranted] = {}
    for i, (kind, arg) in enumerate(script, start=1):
        when = T0 + timedelta(seconds=i)
        if kind == "submit":
            shape: Shape = ("default", 1, str(arg), 1000, 0, 0, "best-effort")
            decisions = scheduler.handle(profiled(i, i, shape))
        elif granted:
            live = sorted(granted)
            task_id = live[int(arg) % len(live)]  # type: ignore[call-overload]
            decisions = scheduler.handle(
                TaskStatusReported(occurred_at=when, task_id=task_id, status=TaskStatus.SUCCEEDED)
            )
        else:
            continue
        for d in decisions:
            if isinstance(d, AllocationReleased):
                granted.pop(d.task_id)
        granted.update({d.task_id: d for d in decisions if isinstance(d, AllocationGranted)})
        check(scheduler, granted)
