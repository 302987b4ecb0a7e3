"""No preemption thrashing (issue 27, item 4): a pool's minimum run time before a task may be
preempted, a memory of recent victims, preemption only when the preemptor's whole placement
is proven on the nodes as its victims leave them, and ageing so large tasks are not starved;
each explained in the waiting task's reasons and counted for the metrics."""

from __future__ import annotations

import copy
import heapq
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crater.contracts import (
    AllocationGranted,
    Event,
    NodeCondition,
    NodeHealthReported,
    NodeTopologyReported,
    RestartOn,
    RestartPolicy,
    TaskPending,
    TaskPreempted,
    TaskStatus,
    TaskStatusReported,
)
from crater.scheduler import audit_state
from crater.scheduler.adapters.pools_file import parse_pools
from crater.scheduler.domain.core import Scheduler, SchedulerConfig
from crater.scheduler.domain.pools import PoolPolicy
from tests.support.topologies import node
from tests.unit.scheduler.test_core import at, profiled, running

LOW = {"priority": "low", "preemptible": True}
# a preempted attempt is followed by another at once
RETRIED = RestartPolicy(when=[RestartOn.PREEMPTION], max_attempts=10, backoff_seconds=0)


def core(config: SchedulerConfig, *topologies: Any) -> Scheduler:
    scheduler = Scheduler(config=config)
    for t in topologies:
        scheduler.handle(NodeTopologyReported(occurred_at=at(0), node=t))
    return scheduler


def tick(when: float, name: str = "a100-01") -> NodeHealthReported:
    return NodeHealthReported(
        occurred_at=at(when), node_id=name, condition=NodeCondition.READY, score=100
    )


def stopped(task_id: str, when: float) -> TaskStatusReported:
    return TaskStatusReported(occurred_at=at(when), task_id=task_id, status=TaskStatus.CANCELLED)


def of(decisions: list[Event], kind: type) -> list[Any]:
    return [d for d in decisions if isinstance(d, kind)]


def test_a_task_under_its_pools_minimum_run_time_is_not_preempted_and_the_reason_says_so() -> None:
    config = SchedulerConfig(preemption_min_run_seconds=600)
    scheduler = core(config, node("a100-01", gpus=4))
    for i in range(3):
        [granted] = scheduler.handle(profiled(f"low-{i}", gpus=1, when=1 + i, **LOW))
        assert isinstance(granted, AllocationGranted)
        scheduler.handle(running(f"low-{i}", 2 + i))
    decisions = scheduler.handle(profiled("urgent", gpus=4, when=10, priority="high"))
    assert not of(decisions, TaskPreempted)
    [pending] = of(decisions, TaskPending)
    assert "3 tasks could make room but have run under pool default's minimum of 600 s" in (
        pending.summary
    )
    [held] = [r for r in pending.reasons if r.filter == "Preemption"]
    assert held.code == "MinRunTime"
    assert scheduler.tally["min_run"] == 1
    # the pool is retried when the first of them has run its minimum: one yields then, and
    # the others when theirs are over (the fewest victims that make room, all of them here)
    assert not of(scheduler.handle(tick(500)), TaskPreempted)
    assert scheduler.tally["min_run"] == 1  # counted once while the same reason holds
    assert not of(scheduler.handle(tick(601)), TaskPreempted)  # 2 still protected
    preempted = of(scheduler.handle(tick(605)), TaskPreempted)
    assert sorted(p.task_id for p in preempted) == ["low-0", "low-1", "low-2"]
    assert {p.preempted_by for p in preempted} == {"urgent"}


def test_a_pools_own_minimum_wins_over_the_default() -> None:
    config = SchedulerConfig(
        preemption_min_run_seconds=600,
        pools={"default": PoolPolicy(min_run_seconds=0)},
    )
    scheduler = core(config, node("a100-01", gpus=2))
    scheduler.handle(profiled("low", gpus=2, when=1, **LOW))
    decisions = scheduler.handle(profiled("urgent", gpus=2, when=5, priority="high"))
    assert [p.task_id for p in of(decisions, TaskPreempted)] == ["low"]


def bounced(cooldown: float) -> list[str]:
    """Two low tasks, one per node; two urgent tasks in turn: whom the second one preempts,
    after the first one's victim came back (retried on preemption) and runs again."""
    config = SchedulerConfig(
        preemption_victim_cooldown_seconds=cooldown,
        pools={"default": PoolPolicy(restart=RETRIED)},
    )
    scheduler = core(config, node("a100-01", gpus=2), node("a100-02", gpus=2))
    scheduler.handle(profiled("low-a", gpus=2, when=1, **LOW))
    scheduler.handle(profiled("low-b", gpus=2, when=2, **LOW))
    decisions = scheduler.handle(profiled("urgent-1", gpus=2, when=3, priority="high"))
    [first] = of(decisions, TaskPreempted)
    assert first.task_id == "low-b"  # the least progressed
    if cooldown:
        assert scheduler.victims["low-b"] == first.must_stop_by + timedelta(seconds=cooldown)
    scheduler.handle(stopped("low-b", 5))  # urgent-1 takes its node, low-b waits again
    scheduler.handle(tick(6))
    regranted = of(scheduler.handle(stopped("urgent-1", 20)), AllocationGranted)
    assert [g.task_id for g in regranted] == ["low-b"]  # back, and least progressed again
    decisions = scheduler.handle(profiled("urgent-2", gpus=2, when=30, priority="high"))
    return [p.task_id for p in of(decisions, TaskPreempted)]


def test_a_recent_victim_is_not_preempted_again_within_its_cooldown() -> None:
    assert bounced(0) == ["low-b"]  # without the memory, the same task bounces again
    assert bounced(900) == ["low-a"]  # with it, the other one yields


def test_a_victim_held_back_by_its_cooldown_is_named_in_the_reason() -> None:
    config = SchedulerConfig(preemption_victim_cooldown_seconds=900)
    scheduler = core(config, node("a100-01", gpus=2))
    scheduler.handle(profiled("low", gpus=2, when=1, **LOW))
    scheduler.victims["low"] = at(1000)  # as if told to yield lately
    decisions = scheduler.handle(profiled("urgent", gpus=2, when=5, priority="high"))
    assert not of(decisions, TaskPreempted)
    [pending] = of(decisions, TaskPending)
    assert (
        "1 task could make room but was preempted within pool default's victim cooldown of 900 s"
        in pending.summary
    )
    assert scheduler.tally["victim_cooldown"] == 1
    assert of(scheduler.handle(tick(1001)), TaskPreempted)  # retried when the memory ends
    assert "low" in scheduler.victims  # remembered again, from its new deadline


def test_reclaims_are_not_held_back_by_the_minimum_run_time() -> None:
    pools = parse_pools(
        "pools:\n"
        "  train: {cohort: c, min_run_seconds: 600}\n"
        "  infer: {cohort: c, min_run_seconds: 600}\n"
    )
    assert pools["train"].min_run_seconds == 600
    config = SchedulerConfig(pools=pools)
    scheduler = core(
        config, node("trn-01", gpus=2, pool="train"), node("inf-01", gpus=2, pool="infer")
    )
    scheduler.handle(profiled("own", gpus=2, when=1, pool="infer"))
    [borrowed] = scheduler.handle(profiled("guest", gpus=2, when=2, pool="infer", **LOW))
    assert isinstance(borrowed, AllocationGranted)
    assert borrowed.node == "trn-01"
    # the owner's task, of a priority no higher: the borrower yields all the same, at once
    decisions = scheduler.handle(profiled("owner", gpus=2, when=5, pool="train", **LOW))
    assert [p.task_id for p in of(decisions, TaskPreempted)] == ["guest"]


def test_no_victim_yields_unless_the_whole_task_fits_once_they_are_gone() -> None:
    scheduler = core(SchedulerConfig(), node("a100-01", gpus=4), node("a100-02", gpus=4))
    scheduler.handle(profiled("low", gpus=2, when=1, **LOW))
    scheduler.handle(profiled("mine", gpus=2, when=2, priority="high"))
    scheduler.handle(profiled("other", gpus=4, when=3, priority="high"))
    # 8 GPUs wanted on one node: even with "low" gone a100-01 holds only 4
    decisions = scheduler.handle(profiled("big", gpus=8, when=4, priority="high"))
    assert not of(decisions, TaskPreempted)
    assert scheduler.tally["unproven"] == 0  # no node could ever hold it: no candidate node
    # 4 GPUs wanted: "low" going would leave 2 of a100-01 free, "mine" is not preemptible
    decisions = scheduler.handle(profiled("four", gpus=4, when=5, priority="high"))
    assert not of(decisions, TaskPreempted)
    assert scheduler.tally["unproven"] == 1


def test_ageing_raises_a_waiting_tasks_rank_bounded_and_says_so() -> None:
    config = SchedulerConfig(ageing_interval_seconds=100, ageing_step=100, ageing_max=200)
    scheduler = core(config, node("a100-01", gpus=2))
    scheduler.handle(profiled("busy", gpus=2, when=1))
    scheduler.handle(profiled("big", gpus=2, when=2, priority="low"))
    big = scheduler.pending["big"]
    assert big.queue_priority(config) == 100
    scheduler.handle(tick(150))
    assert big.aged == 1
    assert big.queue_priority(config) == 200
    scheduler.handle(tick(10_000))
    assert big.queue_priority(config) == 300  # at most +200
    assert big.priority == 100  # its rank to preempt by stays its own
    assert "ranks as priority 300 in the queue: 100 raised by 200" in (big.last_summary or "")
    assert not scheduler.ageing  # no step left to take: nothing more queued


def stream(config: SchedulerConfig, small_every: float, horizon: float) -> tuple[float | None, int]:
    """A 4-GPU node, a low-priority 4-GPU task behind a stream of medium 1-GPU tasks that each
    run 30 s: when the large one is placed (None: never), and how many small ones were."""
    scheduler = core(config, node("a100-01", gpus=4))
    ends: list[tuple[float, str]] = []
    for i in range(4):  # the node busy when the large one comes
        scheduler.handle(profiled(f"first-{i}", gpus=1, when=0.1, priority="medium"))
        ends.append((30.1 + i * small_every, f"first-{i}"))
    decisions = scheduler.handle(profiled("big", gpus=4, when=0.5, priority="low"))
    placed_at: float | None = None
    small = 0
    t = 1.0
    while t < horizon and placed_at is None:
        decisions += scheduler.handle(tick(t))  # the node stays ready
        for _, task_id in [e for e in ends if e[0] <= t]:
            decisions += scheduler.handle(stopped(task_id, t))
        ends = [e for e in ends if e[0] > t]
        decisions += scheduler.handle(profiled(f"s{small}", gpus=1, when=t, priority="medium"))
        small += 1
        for d in decisions:
            if isinstance(d, AllocationGranted):
                if d.task_id == "big":
                    placed_at = t
                else:
                    ends.append((t + 30, d.task_id))
                    scheduler.handle(running(d.task_id, t))
        decisions = []
        t += small_every
    return placed_at, small


def test_without_ageing_a_large_task_starves_behind_a_stream_of_small_ones() -> None:
    # one small task every 7.5 s, each 30 s on 1 of 4 GPUs: the node never has 4 free
    placed_at, small = stream(SchedulerConfig(), small_every=7.5, horizon=3_000)
    assert small > 390
    assert placed_at is None


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    small_every=st.sampled_from([7.5, 9.0, 12.0]),  # a stream the node keeps up with
    # longer than the small ones wait behind it while its node drains: a task the head keeps
    # waiting for a whole interval would rise past it in turn
    interval=st.sampled_from([120.0, 300.0]),
    step=st.sampled_from([100, 200, 400]),
)
def test_with_ageing_a_large_task_under_a_stream_of_small_ones_is_eventually_placed(
    small_every: float, interval: float, step: int
) -> None:
    config = SchedulerConfig(ageing_interval_seconds=interval, ageing_step=step, ageing_max=400)
    placed_at, _ = stream(config, small_every=small_every, horizon=5_000)
    # (ageing lifts every waiting task: under a stream the node cannot keep up with, the
    # small ones would wait and rise as well, and their own priorities decide again.)
    # it outranks the stream once it has gained a class (400 over medium's 500: 100 + 400
    # = 500, then the DRF share and submission order favour it), heads the pool, and the
    # nodes are kept for it until the small ones running there end (30 s)
    steps = -(-400 // step)
    assert placed_at is not None
    assert placed_at <= steps * interval + 30 + 2 * small_every + 1


# -- properties --------------------------------------------------------------------------------

ARRIVALS = st.lists(
    st.tuples(
        st.integers(min_value=1, max_value=4),  # GPUs
        st.sampled_from(["low", "medium", "high"]),
        st.booleans(),  # preemptible
        st.integers(min_value=1, max_value=120),  # seconds after the previous arrival
        st.integers(min_value=0, max_value=400),  # how long it runs once placed (0: until told)
    ),
    min_size=2,
    max_size=14,
)


Hook = Callable[[Scheduler, float, list[Event]], None]


def run_workload(
    config: SchedulerConfig,
    arrivals: list[tuple[int, str, bool, int, int]],
    hook: Hook | None = None,
    inputs: list[Event] | None = None,
) -> tuple[Scheduler, list[tuple[float, Event]]]:
    """Every decision with the time it was taken: tasks arrive, run, end (or stop when told
    to yield, 5 s later); heartbeats every 10 s keep time moving. `hook` sees the core after
    each event, with that event's decisions."""
    scheduler = core(config, node("a100-01", gpus=4), node("a100-02", gpus=4))
    log: list[tuple[float, Event]] = []
    lengths: dict[str, int] = {}
    t = 0.0
    queue: list[tuple[float, int, Event]] = []
    seq = 0
    for i, (gpus, priority, preemptible, gap, length) in enumerate(arrivals):
        t += gap
        lengths[f"t{i}"] = length
        arrival = profiled(f"t{i}", gpus=gpus, when=t, priority=priority, preemptible=preemptible)
        heapq.heappush(queue, (t, seq, arrival))
        seq += 1
    for k in range(int((t + 1_200) // 10)):
        heapq.heappush(queue, (k * 10.0 + 0.5, seq, tick(k * 10.0 + 0.5)))
        seq += 1
    while queue:
        when, _, event = heapq.heappop(queue)
        decisions = scheduler.handle(event)
        if inputs is not None:
            inputs.append(event)
        if hook is not None:
            hook(scheduler, when, decisions)
        for d in decisions:
            log.append((when, d))
            follows: list[tuple[float, Event]] = []
            if isinstance(d, AllocationGranted) and d.gang_index == 0:
                follows.append((when, running(d.task_id, when)))
                if lengths.get(d.task_id):
                    end = when + lengths[d.task_id]
                    follows.append((end, stopped(d.task_id, end)))
            elif isinstance(d, TaskPreempted):
                follows.append((when + 5, stopped(d.task_id, when + 5)))
            for moment, follow in follows:
                heapq.heappush(queue, (moment, seq, follow))
                seq += 1
    return scheduler, log


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arrivals=ARRIVALS, minimum=st.sampled_from([0, 30, 120, 600]))
def test_no_task_is_preempted_before_its_pools_minimum_run_time(
    arrivals: list[tuple[int, str, bool, int, int]], minimum: int
) -> None:
    config = SchedulerConfig(preemption_min_run_seconds=minimum)
    _, log = run_workload(config, arrivals)
    granted: dict[str, float] = {}
    for when, d in log:
        if isinstance(d, AllocationGranted) and d.gang_index == 0:
            granted[d.task_id] = when
        elif isinstance(d, TaskPreempted):
            assert when - granted[d.task_id] >= minimum, (d.task_id, when, granted[d.task_id])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arrivals=ARRIVALS, cooldown=st.sampled_from([60, 300, 900]))
def test_no_task_is_a_victim_twice_within_the_cooldown(
    arrivals: list[tuple[int, str, bool, int, int]], cooldown: int
) -> None:
    config = SchedulerConfig(
        preemption_victim_cooldown_seconds=cooldown,
        pools={"default": PoolPolicy(restart=RETRIED)},
    )
    _, log = run_workload(config, arrivals)
    told: dict[str, Any] = {}
    for _, d in log:
        if isinstance(d, TaskPreempted):
            last = told.get(d.task_id)
            if last is not None and last[0] != d.allocation_id:
                assert d.occurred_at >= last[1] + timedelta(seconds=cooldown)
            told[d.task_id] = (d.allocation_id, d.must_stop_by)


def placed_once_victims_leave(scheduler: Scheduler, when: float, decisions: list[Event]) -> None:
    """For each task that made others yield in `decisions`: on a copy of the core, with the
    other waiting tasks gone (they may rank first for the room), its victims stopping at once
    place it, whole, on nodes where they yielded."""
    told: dict[str, list[TaskPreempted]] = {}
    for d in decisions:
        if isinstance(d, TaskPreempted) and d.preempted_by is not None:
            told.setdefault(d.preempted_by, []).append(d)
    for task_id, victims in told.items():
        trial = copy.deepcopy(scheduler)
        trial.pending = {task_id: trial.pending[task_id]}
        trial.stale_pools = None
        granted: list[AllocationGranted] = []
        for victim in sorted({v.task_id for v in victims}):
            granted += of(trial.handle(stopped(victim, when)), AllocationGranted)
        mine = [g for g in granted if g.task_id == task_id]
        assert mine, (task_id, [v.task_id for v in victims])
        assert {g.node for g in mine} <= {v.node for v in victims}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arrivals=ARRIVALS)
def test_a_preemption_happens_only_when_the_preemptors_whole_placement_is_proven(
    arrivals: list[tuple[int, str, bool, int, int]],
) -> None:
    """Whenever victims are told to yield, their going is enough to place the whole task."""
    run_workload(SchedulerConfig(), arrivals, hook=placed_once_victims_leave)


# -- replay ------------------------------------------------------------------------------------

THRASH_FREE = SchedulerConfig(
    preemption_min_run_seconds=60,
    preemption_victim_cooldown_seconds=120,
    ageing_interval_seconds=90,
    pools={"default": PoolPolicy(restart=RETRIED, min_run_seconds=45)},
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arrivals=ARRIVALS)
def test_the_rules_decide_the_same_on_every_replay(
    arrivals: list[tuple[int, str, bool, int, int]],
) -> None:
    """Event times are all the rules read: the same events give the same decisions."""
    inputs: list[Event] = []
    _, first = run_workload(THRASH_FREE, arrivals, inputs=inputs)
    again = core(THRASH_FREE, node("a100-01", gpus=4), node("a100-02", gpus=4))
    second = [d.model_dump_json() for e in inputs for d in again.handle(e)]
    assert [d.model_dump_json() for _, d in first] == second


def test_the_settings_are_recorded_for_the_audit_and_a_snapshot_decides_on_the_same() -> None:
    text = audit_state.config_json(THRASH_FREE)
    rebuilt = audit_state.config_from_json(text, THRASH_FREE.token_secret)
    assert audit_state.config_json(rebuilt) == text
    assert rebuilt.min_run_for("default") == 45
    assert rebuilt.victim_cooldown_for("other") == 120
    assert rebuilt.ageing_interval_seconds == 90
    scheduler = core(THRASH_FREE, node("a100-01", gpus=2))
    scheduler.handle(profiled("low", gpus=2, when=1, **LOW))
    scheduler.handle(profiled("urgent", gpus=2, when=5, priority="high"))
    assert scheduler.pending["urgent"].preempt_held is not None
    copy_of = audit_state.load_core(audit_state.dump_core(scheduler), THRASH_FREE)
    later = [tick(20), tick(46), stopped("low", 50), tick(200)]
    live = [d.model_dump_json() for e in later for d in scheduler.handle(e)]
    restored = [d.model_dump_json() for e in later for d in copy_of.handle(e)]
    assert live == restored
    assert any('"preempted_by":"urgent"' in d for d in live)  # once its 45 s were run
