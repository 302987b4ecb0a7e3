"""Pools that lend and reclaim (docs/pools.md): a task that does not fit its own pool borrows
a cohort mate's idle nodes within the limits; the lender's own task takes them back by
preemption with the grace period, whatever the priorities.

Properties over random clusters and workloads, through the core: nothing is held past
capacity, borrowing stays within both limits, and an owner's task (its pool's own tasks never
asking more than the pool has) waits at most the grace period plus a tick for its guarantee."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    Confidence,
    Event,
    NodeCondition,
    NodeHealthReported,
    NodeTopologyReported,
    ResourcePrediction,
    TaskPending,
    TaskPreempted,
    TaskProfiled,
    TaskRequest,
    TaskStatus,
    TaskStatusReported,
)
from crater.scheduler.adapters.pools_file import PoolsFileError, parse_pools
from crater.scheduler.domain.core import Scheduler, SchedulerConfig
from crater.scheduler.domain.pools import PoolPolicy
from crater.scheduler.domain.quotas import Quota
from tests.support.topologies import node

T0 = datetime(2026, 1, 1, tzinfo=UTC)
GRACE = 10
PREDICTION = ResourcePrediction(
    gpu_memory_per_gpu_mb=20000,
    host_memory_mb=1000,
    confidence=Confidence.LOW,
    method="test",
    dataloader_num_workers=1,
    dataloader_prefetch_factor=1,
)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def submit(task_id: str, when: float, pool: str, gpus: int, **body: Any) -> TaskProfiled:
    request = TaskRequest.model_validate(
        {
            "task_id": task_id,
            "task_type": "training",
            "model_config": {"name": "m"},
            "pool": pool,
            "resource_requirements": {
                "gpu": {"count": gpus},
                "cpu": {"cores": body.pop("cores", 1)},
                "memory": {"capacity_mb": 1000},
            },
            **body,
        }
    )
    return TaskProfiled(occurred_at=at(when), task=request, prediction=PREDICTION)


def lending(
    lend: Quota | None = None, borrow: Quota | None = None, infer_borrows: bool = True
) -> SchedulerConfig:
    return SchedulerConfig(
        grace_period_seconds=GRACE,
        pools={
            "inference": PoolPolicy(
                cohort="shared",
                lend_limit=lend or Quota(),
                borrow_limit=Quota() if infer_borrows else Quota(gpus=0),
            ),
            "training": PoolPolicy(cohort="shared", borrow_limit=borrow or Quota()),
        },
    )


def cluster(config: SchedulerConfig, infer_gpus: list[int], train_gpus: list[int]) -> Scheduler:
    scheduler = Scheduler(config=config)
    for i, gpus in enumerate(infer_gpus):
        topology = node(f"inf-{i}", gpus=gpus, pool="inference")
        scheduler.handle(NodeTopologyReported(occurred_at=T0, node=topology))
    for i, gpus in enumerate(train_gpus):
        topology = node(f"trn-{i}", gpus=gpus, pool="training")
        scheduler.handle(NodeTopologyReported(occurred_at=T0, node=topology))
    return scheduler


def grants(decisions: list[Event]) -> list[AllocationGranted]:
    return [d for d in decisions if isinstance(d, AllocationGranted)]


def test_without_a_cohort_no_pool_borrows() -> None:
    scheduler = cluster(SchedulerConfig(), [8], [2])
    decisions = scheduler.handle(submit("t1", 1, "training", 4))
    assert not grants(decisions)
    assert not scheduler.lent


def test_a_task_borrows_idle_capacity_and_the_owner_reclaims_it_within_the_grace() -> None:
    scheduler = cluster(lending(), [8], [4])
    assert grants(scheduler.handle(submit("t0", 0, "training", 4)))
    placed = grants(scheduler.handle(submit("t1", 1, "training", 4, priority="high")))
    assert [g.node for g in placed] == ["inf-0"]
    assert placed[0].borrowed_from == "inference"
    assert "borrowed 4 GPUs from pool inference" in placed[0].explanation
    assert scheduler.allocations["t1"].borrowed_from == "inference"
    # The owner's task, lower priority and all: the borrower yields with the grace period.
    decisions = scheduler.handle(submit("i1", 2, "inference", 6, priority="low"))
    preempted = [d for d in decisions if isinstance(d, TaskPreempted)]
    assert [(p.task_id, p.reclaimed_by_pool) for p in preempted] == [("t1", "inference")]
    assert preempted[0].must_stop_by == at(2 + GRACE)
    assert "i1" in scheduler.pending
    # Nobody borrows the pool while its own task waits.
    assert not grants(scheduler.handle(submit("t2", 3, "training", 2)))
    pending = scheduler.pending["t2"].live_reasons
    assert any(r.filter == "Borrow" and "inference" in r.message for r in pending)
    # The borrower stops (checkpointed): the owner gets its capacity at once.
    stopped = TaskStatusReported(occurred_at=at(5), task_id="t1", status=TaskStatus.CANCELLED)
    placed = grants(scheduler.handle(stopped))
    assert [g.task_id for g in placed] == ["i1"]
    assert placed[0].borrowed_from is None
    assert not scheduler.lent


def test_limits_bound_what_is_lent_and_borrowed() -> None:
    scheduler = cluster(lending(lend=Quota(gpus=4), borrow=Quota(gpus=6)), [8, 8], [4])
    assert grants(scheduler.handle(submit("t0", 0, "training", 4)))
    assert grants(scheduler.handle(submit("t1", 1, "training", 4)))
    decisions = scheduler.handle(submit("t2", 2, "training", 2))
    assert not grants(decisions)
    said = next(d for d in decisions if isinstance(d, TaskPending))
    assert "pool inference lends no more (gpus 6 > 4)" in said.summary
    assert sum(u.gpus for u in scheduler.lent.values()) == 4


def test_a_pool_with_capacity_lent_reclaims_rather_than_borrows() -> None:
    scheduler = cluster(lending(), [4], [4])
    assert grants(scheduler.handle(submit("t1", 1, "training", 4)))
    assert grants(scheduler.handle(submit("t2", 2, "training", 4)))  # borrows inference
    decisions = scheduler.handle(submit("i1", 3, "inference", 4))
    assert [d.task_id for d in decisions if isinstance(d, TaskPreempted)] == ["t2"]
    assert not grants(decisions)


def test_restore_knows_what_was_borrowed() -> None:
    scheduler = cluster(lending(), [8], [4])
    scheduler.handle(submit("t0", 0, "training", 4))
    scheduler.handle(submit("t1", 1, "training", 4))
    held = scheduler.allocations["t1"]
    again = Scheduler(config=lending())
    nodes = [(n.topology, n.condition, None) for n in scheduler.cluster.nodes]
    held.borrowed_from = None  # the store keeps the task's pool only: it is derived again
    again.restore(nodes, [scheduler.allocations["t0"], held], [], scheduler.next_seq)
    assert again.allocations["t1"].borrowed_from == "inference"
    assert again.lent[("inference", "training")].gpus == 4


def test_the_pools_file_takes_cohorts_and_limits() -> None:
    pools = parse_pools(
        "pools:\n"
        "  inference: {cohort: shared, lend: {limit: {gpus: 16}}, borrow: {limit: {gpus: 0}}}\n"
        "  training: {cohort: shared, borrow: {limit: {gpus: 8, cpu_cores: 64}}}\n"
    )
    assert pools["inference"].lend_limit == Quota(gpus=16)
    assert pools["inference"].borrow_limit == Quota(gpus=0)
    assert pools["training"].borrow_limit == Quota(gpus=8, cpu_cores=64)
    assert pools["training"].lend_limit == Quota()
    with pytest.raises(PoolsFileError, match="need a cohort"):
        parse_pools("pools:\n  a: {lend: {limit: {gpus: 1}}}\n")
    with pytest.raises(PoolsFileError, match="gpus"):
        parse_pools("pools:\n  a: {cohort: c, lend: {limit: {gpus: -1}}}\n")


# -- properties ------------------------------------------------------------------------------

steps = st.lists(
    st.one_of(
        st.tuples(st.just("train"), st.integers(1, 8), st.booleans(), st.integers(0, 2)),
        st.tuples(st.just("infer"), st.integers(1, 2), st.booleans(), st.integers(0, 2)),
        st.tuples(st.just("finish"), st.integers(0, 100), st.booleans(), st.integers(0, 2)),
        st.tuples(st.just("wait"), st.integers(1, 3 * GRACE), st.booleans(), st.integers(0, 2)),
    ),
    min_size=1,
    max_size=50,
)
limits = st.one_of(st.none(), st.integers(0, 16))


@settings(max_examples=150, deadline=None)
@given(
    infer_nodes=st.lists(st.sampled_from([2, 4, 8]), min_size=1, max_size=3),
    train_nodes=st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=3),
    lend=limits,
    borrow=limits,
    victims_report=st.booleans(),
    script=steps,
)
def test_owners_get_their_guarantee_within_the_grace_and_loans_stay_within_limits(
    infer_nodes: list[int],
    train_nodes: list[int],
    lend: int | None,
    borrow: int | None,
    victims_report: bool,
    script: list[tuple[str, int, bool, int]],
) -> None:
    config = lending(lend=Quota(gpus=lend), borrow=Quota(gpus=borrow), infer_borrows=False)
    scheduler = cluster(config, infer_nodes, train_nodes)
    clock_node = node("clock", cores=2, pool="clock")
    scheduler.handle(NodeTopologyReported(occurred_at=T0, node=clock_node))
    infer_capacity = sum(infer_nodes)
    granted: dict[str, AllocationGranted] = {}
    submitted_at: dict[str, int] = {}  # inference tasks waiting, since when
    stop_at: dict[str, int] = {}  # victims that report their stop, when
    clock = 0
    priorities = ["low", "medium", "high"]

    def feed(event: Event) -> None:
        decisions = scheduler.handle(event)
        for d in decisions:
            if isinstance(d, AllocationReleased):
                granted.pop(d.allocation_id)
        for g in grants(decisions):
            granted[g.allocation_id] = g
            submitted_at.pop(g.task_id, None)
        for d in decisions:
            if isinstance(d, TaskPreempted) and victims_report:
                stop_at.setdefault(d.task_id, clock + GRACE // 2)
        check(clock)

    def check(now: int) -> None:
        held: dict[tuple[str, int], int] = {}
        for g in granted.values():
            for gpu in g.gpu_ids:
                held[(g.node, gpu)] = held.get((g.node, gpu), 0) + g.gpu_milli
        assert all(share <= 1000 for share in held.values()), "a GPU held past whole"
        cores = [(g.node, c) for g in granted.values() for c in g.cpu_cores]
        assert len(cores) == len(set(cores)), "a CPU core held twice"
        on_loan = sum(len(g.gpu_ids) for g in granted.values() if g.borrowed_from)
        assert lend is None or on_loan <= lend, "lent past the lend limit"
        assert borrow is None or on_loan <= borrow, "borrowed past the borrow limit"
        assert all(g.borrowed_from != "training" for g in granted.values()), "limit 0"
        assert on_loan == sum(u.gpus for u in scheduler.lent.values()), "the ledger drifts"
        for g in granted.values():
            pool = "inference" if g.node.startswith("inf-") else "training"
            assert g.borrowed_from == (None if pool == g.pool else pool)
        for task_id, since in submitted_at.items():
            assert now - since <= GRACE + 1, f"owner {task_id} waited {now - since} s"

    def tick(seconds: int) -> None:
        nonlocal clock
        for _ in range(seconds):
            clock += 1
            for task_id in sorted(t for t, when in stop_at.items() if when <= clock):
                del stop_at[task_id]
                feed(
                    TaskStatusReported(
                        occurred_at=at(clock), task_id=task_id, status=TaskStatus.CANCELLED
                    )
                )
            if clock % 10 == 0:  # every node's heartbeat
                for n in scheduler.cluster.nodes:
                    feed(
                        NodeHealthReported(
                            occurred_at=at(clock),
                            node_id=n.name,
                            condition=NodeCondition.READY,
                            score=100,
                        )
                    )
            else:  # the clock moves
                feed(
                    NodeHealthReported(
                        occurred_at=at(clock),
                        node_id="clock",
                        condition=NodeCondition.READY,
                        score=100,
                    )
                )

    for i, (kind, size, flag, rank) in enumerate(script):
        tick(1)
        if kind == "wait":
            tick(size)
        elif kind == "train":
            body = {"priority": priorities[rank], "preemptible": flag, "cores": 2}
            feed(submit(f"t{i}", clock, "training", size, **body))
        elif kind == "infer":
            outstanding = sum(
                len(g.gpu_ids) for g in granted.values() if g.pool == "inference"
            ) + sum(
                t.demand.gpus for t in scheduler.pending.values() if t.request.pool == "inference"
            )
            if outstanding + size > infer_capacity or size > max(infer_nodes):
                continue  # the pool's own tasks never ask more than it has
            submitted_at[f"i{i}"] = clock
            feed(submit(f"i{i}", clock, "inference", size, priority=priorities[rank]))
        else:
            live = sorted({g.task_id for g in granted.values()})
            if live:
                task_id = live[size % len(live)]
                stop_at.pop(task_id, None)
                done = TaskStatusReported(
                    occurred_at=at(clock), task_id=task_id, status=TaskStatus.SUCCEEDED
                )
                feed(done)
    tick(GRACE + 2)
    assert not submitted_at, "an owner's task still waits past the grace period"
