"""Preempting to borrow (docs/pools.md, Kueue's borrowWithinCohort): a task whose own pool
has no room even by its own preemptions and reclaims has a cohort mate's lower-priority
preemptible tasks yield, with the grace period, and borrows the room they leave; a lender
whose `reclaim` is `lower-priority` does not take it back for tasks of lower priority.

Scenarios through the core, and properties over random scripts: nothing held past capacity,
borrowing within its limit, every such victim preemptible and of lower priority (and at most
the threshold), no borrower taken back by a lower priority, and the same decisions on replay."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    Event,
    NodeCondition,
    NodeHealthReported,
    TaskPending,
    TaskPreempted,
    TaskStatus,
    TaskStatusReported,
)
from crater.scheduler.adapters.pools_file import PoolsFileError, load_pools, parse_pools
from crater.scheduler.domain.core import Scheduler, SchedulerConfig
from crater.scheduler.domain.pools import PoolPolicy, Reclaim
from crater.scheduler.domain.quotas import Quota
from tests.unit.scheduler.test_lending import GRACE, at, cluster, grants, submit


def config(
    preempts: bool = True,
    reclaim: Reclaim = "lower-priority",
    borrow: Quota | None = None,
    ceiling: int | None = None,
) -> SchedulerConfig:
    return SchedulerConfig(
        grace_period_seconds=GRACE,
        pools={
            "inference": PoolPolicy(
                cohort="shared",
                borrow_limit=borrow or Quota(),
                borrow_preempts=preempts,
                borrow_preempt_max_priority=ceiling,
            ),
            "training": PoolPolicy(cohort="shared", reclaim=reclaim),
        },
    )


def replica(task_id: str, when: float, gpus: int = 1, **body: Any) -> Any:
    return submit(task_id, when, "inference", gpus, priority="high", preemptible=False, **body)


def training(task_id: str, when: float, gpus: int, **body: Any) -> Any:
    body.setdefault("priority", "low")
    body.setdefault("preemptible", True)
    return submit(task_id, when, "training", gpus, **body)


def preempted(decisions: list[Event]) -> list[TaskPreempted]:
    return [d for d in decisions if isinstance(d, TaskPreempted)]


def stopped(task_id: str, when: float) -> TaskStatusReported:
    return TaskStatusReported(occurred_at=at(when), task_id=task_id, status=TaskStatus.CANCELLED)


def full_day(scheduler: Scheduler) -> None:
    """Inference's own card taken, training's card held by a low-priority task, another
    training task waiting."""
    assert grants(scheduler.handle(replica("i0", 0, 2)))
    assert grants(scheduler.handle(training("t0", 1, 2)))
    assert not grants(scheduler.handle(training("t1", 2, 1)))


def test_a_replica_its_pool_cannot_hold_has_training_yield_and_borrows_the_room() -> None:
    scheduler = cluster(config(), [2], [2])
    full_day(scheduler)
    decisions = scheduler.handle(replica("i1", 3))
    [victim] = preempted(decisions)
    assert (victim.task_id, victim.preempted_by) == ("t0", "i1")
    assert victim.reclaimed_by_pool is None  # a priority preemption, not a reclaim
    assert victim.must_stop_by == at(3 + GRACE)
    said = next(d for d in decisions if isinstance(d, TaskPending))
    assert (
        "preempting to borrow: 1 task of lower priority of pool training yield their room"
        in said.summary
    )
    # Its reason, from the next look on: why it still waits.
    scheduler.handle(
        NodeHealthReported(
            occurred_at=at(5), node_id="trn-0", condition=NodeCondition.READY, score=100
        )
    )
    assert scheduler.pending["i1"].nominated == ("trn-0",)
    # The victim stops: the replica is tried first and borrows the room; the waiting
    # training task takes the card it leaves.
    placed = grants(scheduler.handle(stopped("t0", 8)))
    assert [g.task_id for g in placed] == ["i1", "t1"]
    assert placed[0].node == "trn-0"
    assert placed[0].borrowed_from == "training"
    assert "borrowed 1 GPU from pool training" in placed[0].explanation
    assert scheduler.lent[("training", "inference")].gpus == 1


def test_the_lender_does_not_take_back_from_a_higher_priority_borrower() -> None:
    scheduler = cluster(config(), [2], [2])
    full_day(scheduler)
    scheduler.handle(replica("i1", 3))
    scheduler.handle(stopped("t0", 8))
    # Training waits with capacity lent to a higher priority: no reclaim, and it still may
    # borrow (nothing it could take back is lent).
    decisions = scheduler.handle(training("t2", 9, 1))
    assert not preempted(decisions)
    said = next(d for d in decisions if isinstance(d, TaskPending))
    assert "reclaims that first" not in said.summary
    # A training task of higher priority than the replica would take it back.
    decisions = scheduler.handle(training("t3", 10, 1, priority=950))
    assert [(p.task_id, p.reclaimed_by_pool) for p in preempted(decisions)] == [("i1", "training")]


def test_with_reclaim_any_the_lender_takes_back_whatever_the_priority() -> None:
    scheduler = cluster(config(reclaim="any"), [2], [2])
    full_day(scheduler)
    scheduler.handle(replica("i1", 3))
    scheduler.handle(stopped("t0", 8))
    decisions = scheduler.handle(training("t2", 9, 1))
    assert [(p.task_id, p.reclaimed_by_pool) for p in preempted(decisions)] == [("i1", "training")]


def test_with_reclaim_never_nothing_lent_is_taken_back() -> None:
    scheduler = cluster(config(reclaim="never"), [2], [2])
    full_day(scheduler)
    scheduler.handle(replica("i1", 3))
    scheduler.handle(stopped("t0", 8))
    decisions = scheduler.handle(training("t3", 10, 1, priority=950))
    assert "i1" not in [p.task_id for p in preempted(decisions)]
    assert ("training", "inference") in scheduler.lent


@pytest.mark.parametrize(
    ("policy", "body", "why"),
    [
        (config(preempts=False), {}, "the default: a pool does not preempt to borrow"),
        (config(borrow=Quota(gpus=0)), {}, "its borrowing limit"),
        (config(ceiling=50), {}, "victims above the threshold"),
        (config(), {"preemptible": False}, "a task that may not be preempted"),
        (config(), {"priority": "high"}, "a task of the same priority"),
    ],
)
def test_no_victim_abroad(policy: SchedulerConfig, body: dict[str, Any], why: str) -> None:
    scheduler = cluster(policy, [2], [2])
    assert grants(scheduler.handle(replica("i0", 0, 2)))
    assert grants(scheduler.handle(training("t0", 1, 2, **body)))
    decisions = scheduler.handle(replica("i1", 3))
    assert not preempted(decisions), why
    assert "i1" in scheduler.pending


def test_its_own_pool_comes_first_and_the_fewest_victims_abroad() -> None:
    scheduler = cluster(config(), [2], [2, 2])
    assert grants(scheduler.handle(replica("i0", 0, 1)))
    assert grants(scheduler.handle(training("t0", 1, 1)))
    assert grants(scheduler.handle(training("t1", 2, 1)))
    assert grants(scheduler.handle(training("t2", 3, 2)))
    # A card free at home: no victim anywhere.
    decisions = scheduler.handle(replica("i1", 4))
    assert grants(decisions)
    assert not preempted(decisions)
    # Home full: two cards abroad, one task to yield (t2) rather than two.
    decisions = scheduler.handle(replica("i2", 5, 2))
    assert [p.task_id for p in preempted(decisions)] == ["t2"]


def test_a_replica_placed_at_home_meanwhile_leaves_the_room_to_training() -> None:
    scheduler = cluster(config(), [2], [2])
    full_day(scheduler)
    scheduler.handle(replica("i1", 3))
    # Its own pool frees a card before the victim goes: it takes that one.
    done = TaskStatusReported(occurred_at=at(4), task_id="i0", status=TaskStatus.SUCCEEDED)
    placed = grants(scheduler.handle(done))
    assert ("i1", "inf-0") in [(g.task_id, g.node) for g in placed]
    # The victim still goes by its deadline; the room is training's again.
    scheduler.handle(stopped("t0", 8))
    assert "i1" in scheduler.allocations
    assert ("training", "inference") not in scheduler.lent


def test_the_pools_file_takes_preempting_to_borrow_and_the_reclaim_policy() -> None:
    pools = parse_pools(
        "pools:\n"
        "  inference: {cohort: c, borrow: {limit: {gpus: 16}, preempt: lower-priority,"
        " preempt_max_priority: 500}}\n"
        "  training: {cohort: c, lend: {reclaim: lower-priority}}\n"
    )
    assert pools["inference"].borrow_preempts
    assert pools["inference"].borrow_preempt_max_priority == 500
    assert pools["inference"].reclaim == "any"
    assert pools["training"].reclaim == "lower-priority"
    assert not pools["training"].borrow_preempts
    for text, field in [
        ("a: {cohort: c, lend: {preempt: lower-priority}}", "preempt is a borrower's"),
        ("a: {cohort: c, borrow: {reclaim: never}}", "reclaim is a lender's"),
        ("a: {cohort: c, borrow: {preempt: always}}", "preempt"),
        ("a: {cohort: c, borrow: {preempt_max_priority: 100}}", "preempt_max_priority"),
        ("a: {cohort: c, lend: {reclaim: sometimes}}", "reclaim"),
    ]:
        with pytest.raises(PoolsFileError, match=field):
            parse_pools("pools:\n  " + text + "\n")
    # A mate that takes back whatever the priority would trade the card back and forth.
    with pytest.raises(PoolsFileError, match=r"pools\.inference\.borrow\.preempt.*training"):
        parse_pools(
            "pools:\n"
            "  inference: {cohort: c, borrow: {preempt: lower-priority}}\n"
            "  training: {cohort: c}\n"
        )


# -- properties ------------------------------------------------------------------------------

steps = st.lists(
    st.one_of(
        st.tuples(st.just("train"), st.integers(1, 4), st.booleans(), st.integers(0, 2)),
        st.tuples(st.just("infer"), st.integers(1, 2), st.booleans(), st.integers(0, 2)),
        st.tuples(st.just("finish"), st.integers(0, 100), st.booleans(), st.integers(0, 2)),
        st.tuples(st.just("wait"), st.integers(1, 2 * GRACE), st.booleans(), st.integers(0, 2)),
    ),
    min_size=1,
    max_size=40,
)
PRIORITIES = (100, 500, 900)


def run_script(
    infer_nodes: list[int],
    train_nodes: list[int],
    borrow: int | None,
    ceiling: int | None,
    reclaim: Reclaim,
    script: list[tuple[str, int, bool, int]],
) -> list[Event]:
    """The script through the core, checking the invariants after every event; every
    decision, in order."""
    scheduler = cluster(
        config(reclaim=reclaim, borrow=Quota(gpus=borrow), ceiling=ceiling),
        infer_nodes,
        train_nodes,
    )
    capacity = {n.name: len(n.topology.gpus) for n in scheduler.cluster.nodes}
    granted: dict[str, AllocationGranted] = {}
    priority: dict[str, int] = {}
    preemptible: dict[str, bool] = {}
    stop_at: dict[str, int] = {}
    every: list[Event] = []
    clock = 0

    def feed(event: Event) -> None:
        decisions = scheduler.handle(event)
        every.extend(decisions)
        for d in decisions:
            if isinstance(d, AllocationReleased):
                granted.pop(d.allocation_id)
            elif isinstance(d, AllocationGranted):
                granted[d.allocation_id] = d
            elif isinstance(d, TaskPreempted):
                stop_at.setdefault(d.task_id, clock + GRACE // 2)
                by = d.preempted_by
                abroad = d.node.startswith("trn-") and d.reclaimed_by_pool is None
                if by is not None and by.startswith("i") and abroad:  # preempting to borrow
                    assert preemptible[d.task_id], "a task that may not be preempted"
                    assert priority[d.task_id] < priority[by], "not a lower priority"
                    assert ceiling is None or priority[d.task_id] <= ceiling
                if d.reclaimed_by_pool == "training" and by is not None:
                    assert reclaim != "never", "taken back under reclaim: never"
                    if reclaim == "lower-priority":
                        assert priority[d.task_id] < priority[by], "taken back by a lower"
        held: dict[str, int] = {}
        for g in granted.values():
            held[g.node] = held.get(g.node, 0) + len(g.gpu_ids)
        assert all(held[n] <= capacity[n] for n in held), "a node held past its cards"
        abroad = sum(len(g.gpu_ids) for g in granted.values() if g.borrowed_from == "training")
        assert borrow is None or abroad <= borrow, "borrowed past the limit"
        on_loan = sum(len(g.gpu_ids) for g in granted.values() if g.borrowed_from)
        assert on_loan == sum(u.gpus for u in scheduler.lent.values()), "the ledger drifts"

    def tick(seconds: int) -> None:
        nonlocal clock
        for _ in range(seconds):
            clock += 1
            for task_id in sorted(t for t, when in stop_at.items() if when <= clock):
                del stop_at[task_id]
                feed(stopped(task_id, clock))
            feed(
                NodeHealthReported(
                    occurred_at=at(clock), node_id="inf-0", condition=NodeCondition.READY, score=100
                )
            )

    for i, (kind, size, flag, rank) in enumerate(script):
        tick(1)
        if kind == "wait":
            tick(size)
        elif kind == "train":
            task_id = f"t{i}"
            priority[task_id], preemptible[task_id] = PRIORITIES[rank], flag
            feed(training(task_id, clock, size, priority=PRIORITIES[rank], preemptible=flag))
        elif kind == "infer":
            task_id = f"i{i}"
            priority[task_id], preemptible[task_id] = PRIORITIES[2], False
            feed(replica(task_id, clock, size))
        else:
            live = sorted({g.task_id for g in granted.values()})
            if live:
                task_id = live[size % len(live)]
                stop_at.pop(task_id, None)
                feed(
                    TaskStatusReported(
                        occurred_at=at(clock), task_id=task_id, status=TaskStatus.SUCCEEDED
                    )
                )
    tick(GRACE + 2)
    return every


@settings(max_examples=120, deadline=None)
@given(
    infer_nodes=st.lists(st.sampled_from([1, 2, 4]), min_size=1, max_size=2),
    train_nodes=st.lists(st.sampled_from([1, 2, 4]), min_size=1, max_size=3),
    borrow=st.one_of(st.none(), st.integers(0, 4)),
    ceiling=st.sampled_from([None, 100, 500]),
    reclaim=st.sampled_from(["any", "lower-priority", "never"]),
    script=steps,
)
def test_borrowing_by_preemption_stays_within_capacity_limits_and_priorities(
    infer_nodes: list[int],
    train_nodes: list[int],
    borrow: int | None,
    ceiling: int | None,
    reclaim: Reclaim,
    script: list[tuple[str, int, bool, int]],
) -> None:
    first = run_script(infer_nodes, train_nodes, borrow, ceiling, reclaim, script)
    again = run_script(infer_nodes, train_nodes, borrow, ceiling, reclaim, script)
    assert [decided(e) for e in first] == [decided(e) for e in again]


def decided(event: Event) -> tuple[Any, ...]:
    """What a decision says, without the ids drawn afresh for each run's inputs."""
    return (
        type(event).__name__,
        getattr(event, "task_id", None),
        getattr(event, "node", None),
        tuple(getattr(event, "gpu_ids", ())),
        getattr(event, "preempted_by", None),
        getattr(event, "reclaimed_by_pool", None),
        getattr(event, "borrowed_from", None),
        event.occurred_at,
    )


def test_the_example_lending_file_loads_as_documented() -> None:
    pools = load_pools(Path(__file__).parents[3] / "examples" / "pools-lending.yaml")
    assert pools["inference"].borrow_preempts
    assert pools["inference"].borrow_limit == Quota(gpus=16)
    assert pools["inference"].keep_idle_gpus == 8
    assert pools["training"].reclaim == "lower-priority"
