"""Fair share among borrowers (docs/pools.md): with a half-life set, a lender's idle capacity
goes first to the cohort mate that borrowed least lately; decided the same way every time."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from crater.contracts import (
    AllocationGranted,
    Event,
    NodeTopologyReported,
    TaskStatus,
    TaskStatusReported,
)
from crater.scheduler.domain.core import Scheduler, SchedulerConfig
from crater.scheduler.domain.pools import PoolPolicy
from tests.support.topologies import node
from tests.unit.scheduler.test_lending import T0, at, grants, submit

HALF_LIFE = 100.0


def three_pools(half_life: float | None) -> SchedulerConfig:
    return SchedulerConfig(
        grace_period_seconds=10,
        borrow_half_life_seconds=half_life,
        pools={
            "inference": PoolPolicy(cohort="shared"),
            "training": PoolPolicy(cohort="shared"),
            "research": PoolPolicy(cohort="shared"),
        },
    )


def topology() -> list[Event]:
    return [
        NodeTopologyReported(occurred_at=T0, node=node("inf-0", gpus=4, pool="inference")),
        NodeTopologyReported(occurred_at=T0, node=node("trn-0", gpus=4, pool="training")),
        NodeTopologyReported(occurred_at=T0, node=node("res-0", gpus=4, pool="research")),
    ]


def day(half_life: float | None) -> tuple[Scheduler, list[AllocationGranted]]:
    scheduler = Scheduler(config=three_pools(half_life))
    for event in topology():
        scheduler.handle(event)
    placed: list[AllocationGranted] = []
    for event in (
        submit("tr0", 0, "training", 4),
        submit("rs0", 0, "research", 4),
        submit("ta", 1, "training", 4),  # borrows the lender's 4 cards until t=50
        submit("tb", 40, "training", 4),  # first in the queue
        submit("rb", 41, "research", 4),
        TaskStatusReported(occurred_at=at(50), task_id="ta", status=TaskStatus.SUCCEEDED),
    ):
        placed += grants(scheduler.handle(event))
    return scheduler, placed


def test_without_a_half_life_borrowers_go_in_queue_order() -> None:
    _, placed = day(None)
    assert [g.task_id for g in placed][-1] == "tb"


def test_with_a_half_life_the_pool_that_borrowed_least_lately_goes_first() -> None:
    scheduler, placed = day(HALF_LIFE)
    last = placed[-1]
    assert (last.task_id, last.borrowed_from) == ("rb", "inference")
    # training held 4 of its mates' 8 cards (inference and research) for 49 s, decayed
    assert scheduler.lending.history["training"] > 0
    assert scheduler.lending.history.get("research", 0.0) < scheduler.lending.history["training"]


POOLS = ("training", "research")
Script = list[tuple[str, str, int, int]]  # (submit | end, borrower, GPUs | which, gap s)


def scripts(borrowers: Sequence[str]) -> st.SearchStrategy[Script]:
    """Random days of submissions and ends among `borrowers` (pools or tenants)."""
    return st.lists(
        st.tuples(
            st.sampled_from(("submit", "end")),
            st.sampled_from(borrowers),
            st.integers(1, 4),
            st.integers(1, 30),
        ),
        min_size=1,
        max_size=30,
    )


def scripted(
    script: Script, submitted: Callable[[str, float, str, int, int], Event]
) -> list[Event]:
    """The script's events: `submitted(task, when, borrower, count, step)` for a submission,
    the end of a running one (picked by its count) otherwise."""
    events: list[Event] = []
    clock, names = 0.0, list[str]()
    for i, (kind, borrower, count, gap) in enumerate(script):
        clock += gap
        if kind == "submit" or not names:
            names.append(f"{borrower}-{i}")
            events.append(submitted(names[-1], clock, borrower, count, i))
        else:
            done = names.pop(count % len(names))
            events.append(
                TaskStatusReported(occurred_at=at(clock), task_id=done, status=TaskStatus.SUCCEEDED)
            )
    return events


@settings(max_examples=40, deadline=None)
@given(scripts(POOLS), st.sampled_from((10.0, 100.0, 3600.0)))
def test_fair_share_is_decided_the_same_way_every_time_and_within_capacity(
    script: Script, half_life: float
) -> None:
    events: list[Event] = [
        *topology(),
        *scripted(
            script,
            lambda name, t, pool, gpus, i: submit(name, t, pool, min(gpus, 2) if i % 3 else gpus),
        ),
    ]
    runs = []
    for _ in range(2):
        scheduler = Scheduler(config=three_pools(half_life))
        decided = [d for e in events for d in scheduler.handle(e)]
        assert all(n.whole_gpus_free >= 0 for n in scheduler.cluster.nodes)
        runs.append((decided, dict(scheduler.lending.history)))
    assert runs[0] == runs[1]
    assert all(v >= 0 for v in runs[0][1].values())
