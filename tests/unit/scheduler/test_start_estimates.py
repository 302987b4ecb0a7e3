"""Queue positions and start-time estimates (issue 27, item 3): the production core run
forward on a copy of its state (`crater.scheduler.sim.forecast`)."""

from __future__ import annotations

import heapq
from datetime import datetime
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crater.contracts import AllocationGranted, Event, TaskStatus
from crater.scheduler.domain.core import Scheduler, SchedulerConfig
from crater.scheduler.domain.pools import PoolPolicy
from crater.scheduler.sim.forecast import Estimate, Told, forecast, worth_telling
from tests.support.topologies import node
from tests.unit.scheduler.test_core import at, profiled, running
from tests.unit.scheduler.test_preemption_thrashing import core, stopped, tick


def succeeded(task_id: str, when: float) -> Any:
    return stopped(task_id, when).model_copy(update={"status": TaskStatus.SUCCEEDED})


def test_each_waiting_task_has_its_place_and_the_time_the_tasks_ahead_end() -> None:
    scheduler = core(SchedulerConfig(), node("a100-01", gpus=4))
    scheduler.handle(profiled("big", gpus=4, when=1, expected_run_seconds=600))
    scheduler.handle(running("big", 2))
    scheduler.handle(profiled("next", gpus=4, when=5, expected_run_seconds=300))
    scheduler.handle(profiled("small", gpus=2, when=6, max_run_seconds=100))
    scheduler.handle(tick(10))
    estimates = forecast(scheduler).estimates
    assert (estimates["next"].position, estimates["next"].start_at) == (1, at(601))
    # behind the head, which keeps the node (backfill): after it has run its 300 s
    assert (estimates["small"].position, estimates["small"].start_at) == (2, at(901))
    assert estimates["next"].note == "estimated to start in 591 s (position 1 in pool default)"


def test_a_pools_limit_stands_for_the_run_time_of_tasks_that_state_none() -> None:
    config = SchedulerConfig(pools={"default": PoolPolicy(max_run_seconds=1000)})
    scheduler = core(config, node("a100-01", gpus=4))
    scheduler.handle(profiled("big", gpus=4, when=1))
    scheduler.handle(profiled("next", gpus=4, when=5))
    assert forecast(scheduler).estimates["next"].start_at == at(1001)


def test_behind_a_task_with_no_run_time_there_is_no_estimate_and_the_note_says_why() -> None:
    scheduler = core(SchedulerConfig(), node("a100-01", gpus=4))
    scheduler.handle(profiled("big", gpus=4, when=1))  # states nothing, nor does its pool
    scheduler.handle(profiled("next", gpus=4, when=5))
    [estimate] = forecast(scheduler).estimates.values()
    assert estimate.start_at is None
    assert estimate.note.startswith("no estimate: 1 task holding pool default's nodes state")


def test_a_task_told_to_stop_frees_its_nodes_at_its_deadline_in_the_forecast() -> None:
    scheduler = core(SchedulerConfig(), node("a100-01", gpus=4))
    scheduler.handle(profiled("big", gpus=4, when=1, max_run_seconds=60))  # limit at 61
    scheduler.handle(profiled("next", gpus=4, when=5))
    scheduler.handle(tick(70))  # told to stop by 100
    assert forecast(scheduler).estimates["next"].start_at is not None
    start = forecast(scheduler).estimates["next"].start_at
    assert start is not None
    assert at(100) < start < at(101)  # released just past its deadline


# -- as properties -----------------------------------------------------------------------------

JOBS = st.lists(
    st.tuples(
        st.integers(min_value=1, max_value=4),  # GPUs
        st.integers(min_value=10, max_value=900),  # expected (and exact) run time
        st.sampled_from(["low", "medium", "high"]),
        st.sampled_from(["a", "b"]),  # tenant
    ),
    min_size=2,
    max_size=16,
)


KEYS = ("task_id", "node", "gpu_ids", "cpu_cores", "reason", "summary", "must_stop_by")


def replay(
    scheduler: Scheduler,
    queue: list[tuple[float, int, Event]],
    lengths: dict[str, int],
    estimate: bool = False,
    log: list[str] | None = None,
) -> dict[str, datetime]:
    """Run the queue through the core, each grant confirmed at once and ended after its
    length; returns each task's first grant time. `estimate`: a forecast before each event;
    `log`: every decision, as its kind, time and contents."""
    started: dict[str, datetime] = {}
    seq = 10_000
    while queue:
        when, _, event = heapq.heappop(queue)
        if estimate:
            forecast(scheduler)
        decisions = scheduler.handle(event)
        if log is not None:  # what was decided (ids aside: the test's inputs get random ids)
            log.extend(
                repr((type(d).__name__, d.occurred_at, *(getattr(d, k, None) for k in KEYS)))
                for d in decisions
            )
        for d in decisions:
            if isinstance(d, AllocationGranted) and d.gang_index == 0:
                started.setdefault(d.task_id, d.occurred_at)
                for moment, follow in (
                    (when, running(d.task_id, when)),
                    (when + lengths[d.task_id], succeeded(d.task_id, when + lengths[d.task_id])),
                ):
                    heapq.heappush(queue, (moment, seq, follow))
                    seq += 1
    return started


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs=JOBS)
def test_when_tasks_run_as_expected_and_none_arrive_the_estimate_is_the_start(
    jobs: list[tuple[int, int, str, str]],
) -> None:
    """The forecast is the core itself: with every task known, each running exactly its
    expected time and confirmed at once, the estimate made before any of them ends is the
    time it starts, to the event."""
    scheduler = core(SchedulerConfig(), node("a100-01", gpus=4), node("a100-02", gpus=4))
    lengths: dict[str, int] = {}
    first: dict[str, datetime] = {}
    # every task arrives before the first can end: then the estimate is taken
    for i, (gpus, length, priority, tenant) in enumerate(jobs):
        task, when = f"t{i}", 1 + i * 0.01
        lengths[task] = length
        arrival = profiled(
            task,
            gpus=gpus,
            when=when,
            priority=priority,
            tenant=tenant,
            expected_run_seconds=length,
        )
        for d in scheduler.handle(arrival):
            if isinstance(d, AllocationGranted) and d.gang_index == 0:
                first[d.task_id] = d.occurred_at
                scheduler.handle(running(d.task_id, when))
    estimates = forecast(scheduler).estimates
    assert set(estimates) == set(scheduler.pending)
    rest: list[tuple[float, int, Event]] = []
    for head in scheduler.allocations.values():
        end = (head.granted_at - at(0)).total_seconds() + lengths[head.task_id]
        heapq.heappush(rest, (end, len(rest), succeeded(head.task_id, end)))
    for k in range(sum(lengths.values()) // 10 + 2):  # the nodes' heartbeats
        for name in ("a100-01", "a100-02"):
            heapq.heappush(rest, (k * 10.0 + 0.5, len(rest), tick(k * 10.0 + 0.5, name)))
    actual = {**first, **replay(scheduler, rest, lengths)}
    for task_id, estimate in estimates.items():
        assert estimate.start_at == actual[task_id], task_id


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs=JOBS, limit=st.sampled_from([None, 120]))
def test_estimating_changes_nothing_the_live_core_decides(
    jobs: list[tuple[int, int, str, str]], limit: int | None
) -> None:
    def run(estimate: bool) -> list[str]:
        config = SchedulerConfig(pools={"default": PoolPolicy(max_run_seconds=limit)})
        scheduler = core(config, node("a100-01", gpus=4), node("a100-02", gpus=4))
        queue: list[tuple[float, int, Event]] = []
        lengths: dict[str, int] = {}
        for i, (gpus, length, priority, tenant) in enumerate(jobs):
            lengths[f"t{i}"] = length
            arrival = profiled(
                f"t{i}",
                gpus=gpus,
                when=1 + 40 * i,
                priority=priority,
                tenant=tenant,
                preemptible=True,
            )
            heapq.heappush(queue, (1 + 40 * i, i, arrival))
        for k in range(200):
            heapq.heappush(queue, (k * 13.0 + 0.5, 1000 + k, tick(k * 13.0 + 0.5)))
        log: list[str] = []
        started = replay(scheduler, queue, lengths, estimate, log)
        log.extend(f"{k}:{v.isoformat()}" for k, v in sorted(started.items()))
        return log

    assert run(estimate=True) == run(estimate=False)


def _estimate(start: float | None) -> Estimate:
    return Estimate("t", "default", 2, None if start is None else at(start), "words")


def test_an_estimate_is_told_when_new_gained_lost_or_moved_materially() -> None:
    told = Told(attempt=1, start_at=at(1_000), at=at(0))  # a wait of 1,000 s was told
    assert worth_telling(None, 1, _estimate(500))  # the first
    assert worth_telling(told, 2, _estimate(1_000))  # another attempt waits
    assert worth_telling(told, 1, _estimate(None))  # lost its start time
    assert worth_telling(Told(1, None, at(0)), 1, _estimate(900))  # gained one
    assert not worth_telling(Told(1, None, at(0)), 1, _estimate(None))
    # moved: more than 60 s and more than a quarter of the wait told (250 s here)
    assert not worth_telling(told, 1, _estimate(1_200))
    assert not worth_telling(told, 1, _estimate(760))
    assert worth_telling(told, 1, _estimate(1_251))
    assert worth_telling(told, 1, _estimate(749))
    short = Told(attempt=1, start_at=at(100), at=at(0))  # a short wait: 60 s is the floor
    assert not worth_telling(short, 1, _estimate(150))
    assert worth_telling(short, 1, _estimate(161))
