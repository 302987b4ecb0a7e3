"""Time limits (issue 27, item 3): a task states its expected and maximum run time (its pool
may give the maximum); once it has held its grant for its maximum it is told to checkpoint and
stop (`task.preempted` with `time_limit_seconds`, the grace period) and goes back at the
deadline as `time-limit`, by event time only, across a restart too."""

from __future__ import annotations

import copy
import heapq
import json
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    Event,
    ReleaseReason,
    RestartOn,
    RestartPolicy,
    TaskEnded,
    TaskPending,
    TaskPreempted,
    TaskRequest,
    TaskStatus,
)
from crater.scheduler.adapters.pools_file import parse_pools
from crater.scheduler.domain.core import Scheduler, SchedulerConfig
from crater.scheduler.domain.pools import PoolPolicy
from crater.scheduler.domain.waitlist import due_free
from tests.support.topologies import node
from tests.unit.scheduler.test_core import at, profiled, running
from tests.unit.scheduler.test_preemption_thrashing import core, of, stopped, tick

BODY: dict[str, Any] = {"task_id": "t", "task_type": "training", "model_config": {"name": "m"}}


# -- the contract ------------------------------------------------------------------------------


def test_expected_above_the_limit_is_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError) as refused:
        TaskRequest.model_validate({**BODY, "max_run_seconds": 3600, "expected_run_seconds": 7200})
    [error] = refused.value.errors()
    assert error["loc"] == ("expected_run_seconds",)
    assert "7200 s is more than max_run_seconds (3600 s)" in error["msg"]


@pytest.mark.parametrize("field", ["max_run_seconds", "expected_run_seconds"])
@pytest.mark.parametrize("value", [0, -5, 400 * 86_400])
def test_a_run_time_must_be_positive_and_within_a_year(field: str, value: int) -> None:
    with pytest.raises(ValidationError) as refused:
        TaskRequest.model_validate({**BODY, field: value})
    assert refused.value.errors()[0]["loc"] == (field,)


def test_unset_run_times_are_left_out_of_the_json_so_old_records_replay_byte_for_byte() -> None:
    plain = TaskRequest.model_validate(BODY)
    assert "max_run_seconds" not in plain.model_dump_json()
    assert "expected_run_seconds" not in plain.model_dump_json()
    stated = TaskRequest.model_validate({**BODY, "max_run_seconds": 60, "expected_run_seconds": 30})
    assert json.loads(stated.model_dump_json())["max_run_seconds"] == 60
    preempted = TaskPreempted(
        occurred_at=at(0), task_id="t", allocation_id="a", node="n", grace_period_seconds=30
    )
    assert "time_limit_seconds" not in preempted.model_dump_json()


def test_the_pools_file_gives_a_default_limit() -> None:
    pools = parse_pools("pools:\n  training:\n    max_run_seconds: 86400\n")
    assert pools["training"].max_run_seconds == 86400
    config = SchedulerConfig(pools=pools)
    own = TaskRequest.model_validate({**BODY, "pool": "training", "max_run_seconds": 60})
    bare = TaskRequest.model_validate({**BODY, "pool": "training"})
    elsewhere = TaskRequest.model_validate(BODY)
    assert config.run_limit_for(own) == 60  # the task's own wins
    assert config.run_limit_for(bare) == 86400
    assert config.run_limit_for(elsewhere) is None
    assert config.expected_run_for(bare) == 86400  # the limit stands for the expectation
    expects = TaskRequest.model_validate({**BODY, "pool": "training", "expected_run_seconds": 9})
    assert config.expected_run_for(expects) == 9


# -- enforcement -------------------------------------------------------------------------------


def limited(limit: int = 3600, **config: Any) -> Scheduler:
    scheduler = core(SchedulerConfig(**config), node("a100-01", gpus=4))
    [granted] = scheduler.handle(profiled("job", gpus=2, when=1, max_run_seconds=limit))
    assert isinstance(granted, AllocationGranted)
    scheduler.handle(running("job", 2))
    return scheduler


def test_a_task_at_its_limit_is_told_to_checkpoint_and_stop_with_the_reason() -> None:
    scheduler = limited(3600)
    assert not scheduler.handle(tick(3600))  # granted at 1: its limit is at 3601
    [told] = scheduler.handle(tick(3601))
    assert isinstance(told, TaskPreempted)
    assert told.time_limit_seconds == 3600
    assert told.preempted_by is None
    assert told.grace_period_seconds == 30
    assert told.must_stop_by == at(3631)
    assert told.cause() == "reached its time limit of 3600 s"
    assert not scheduler.handle(tick(3620))  # told once
    assert not scheduler.handle(tick(3631))
    decisions = scheduler.handle(tick(3632))  # past its grace: released like a victim
    [released] = of(decisions, AllocationReleased)
    assert released.reason is ReleaseReason.TIME_LIMIT
    [ended] = of(decisions, TaskEnded)
    assert ended.status is TaskStatus.FAILED
    assert ended.release_reason == ReleaseReason.TIME_LIMIT
    assert ended.reason == "it reached its time limit of 3600 s and was stopped"


def test_a_task_that_stops_within_its_grace_ends_by_its_limit_and_frees_its_gpus() -> None:
    scheduler = limited(600)
    scheduler.handle(profiled("next", gpus=4, when=10))  # waits for the cards
    assert "next" in scheduler.pending
    scheduler.handle(tick(601))
    decisions = scheduler.handle(stopped("job", 610))  # checkpointed and stopped
    [released] = of(decisions, AllocationReleased)
    assert released.reason is ReleaseReason.TIME_LIMIT
    assert [g.task_id for g in of(decisions, AllocationGranted)] == ["next"]


def test_a_task_that_succeeds_before_its_limit_is_never_told() -> None:
    scheduler = limited(600)
    scheduler.handle(stopped("job", 100).model_copy(update={"status": TaskStatus.SUCCEEDED}))
    assert "job" not in scheduler.allocations
    assert not of(scheduler.handle(tick(700)), TaskPreempted)


def test_the_pools_limit_applies_to_tasks_that_state_none() -> None:
    config = SchedulerConfig(pools={"default": PoolPolicy(max_run_seconds=120)})
    scheduler = core(config, node("a100-01", gpus=4))
    scheduler.handle(profiled("bare", gpus=1, when=1))
    scheduler.handle(profiled("own", gpus=1, when=1, max_run_seconds=300))
    [told] = of(scheduler.handle(tick(125)), TaskPreempted)
    assert (told.task_id, told.time_limit_seconds) == ("bare", 120)
    [told] = of(scheduler.handle(tick(305)), TaskPreempted)
    assert (told.task_id, told.time_limit_seconds) == ("own", 300)


def test_a_time_limit_is_not_retried_as_a_preemption_nor_remembered_as_a_victim() -> None:
    retried = RestartPolicy(when=[RestartOn.PREEMPTION], max_attempts=3, backoff_seconds=0)
    config = SchedulerConfig(
        preemption_victim_cooldown_seconds=900, pools={"default": PoolPolicy(restart=retried)}
    )
    scheduler = core(config, node("a100-01", gpus=4))
    scheduler.handle(profiled("job", gpus=1, when=1, max_run_seconds=60))
    scheduler.handle(tick(61))
    assert "job" not in scheduler.victims
    decisions = scheduler.handle(stopped("job", 70))
    assert not of(decisions, TaskPending)  # no second attempt
    [ended] = of(decisions, TaskEnded)
    assert ended.release_reason == ReleaseReason.TIME_LIMIT


def test_a_gang_is_told_to_stop_whole_at_its_limit() -> None:
    scheduler = core(SchedulerConfig(), node("a100-01", gpus=4), node("a100-02", gpus=4))
    granted = scheduler.handle(profiled("gang", gpus=4, when=1, gang_size=2, max_run_seconds=60))
    assert len(of(granted, AllocationGranted)) == 2
    told = of(scheduler.handle(tick(61)), TaskPreempted)
    assert sorted(t.node for t in told) == ["a100-01", "a100-02"]
    assert {t.time_limit_seconds for t in told} == {60}


def test_a_restored_core_enforces_the_limit_from_the_stored_grant_time() -> None:
    """As the repository restores it: the live allocations with their grant times and their
    tasks' requests; the limit is derived, not stored."""
    live = limited(600)
    for when, told_too in ((300, False), (605, True)):
        source = copy.deepcopy(live)
        if told_too:
            source.handle(tick(when))  # told to stop before the restart
        held = [copy.copy(a) for a in source.allocations.values()]
        for allocation in held:
            allocation.peers, allocation.run_limit = [], None
        restored = Scheduler(config=live.config)
        restored.restore(
            nodes=[(n.topology, n.condition, n.last_heartbeat_at) for n in live.cluster.nodes],
            allocations=held,
            pending=[],
            next_seq=10,
        )
        if not told_too:
            assert not of(restored.handle(tick(600)), TaskPreempted)
            [told] = of(restored.handle(tick(601)), TaskPreempted)
            assert told.time_limit_seconds == 600
        else:
            assert not of(restored.handle(tick(620)), TaskPreempted)  # not told twice
        decisions = restored.handle(tick(700))  # its grace is over (the restart's hold aside)
        [released] = of(decisions, AllocationReleased)
        assert released.reason is ReleaseReason.TIME_LIMIT


# -- as a property -----------------------------------------------------------------------------

WORKLOAD = st.lists(
    st.tuples(
        st.integers(min_value=1, max_value=4),  # GPUs
        st.integers(min_value=1, max_value=90),  # seconds after the previous arrival
        st.one_of(st.none(), st.integers(min_value=5, max_value=400)),  # max_run_seconds
        st.integers(min_value=0, max_value=500),  # how long it would run (0: until told)
        st.booleans(),  # stops when told (else held to the end of its grace)
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=WORKLOAD, pool_limit=st.sampled_from([None, 150]))
def test_no_task_holds_its_grant_past_its_limit_and_grace_and_none_is_told_early(
    workload: list[tuple[int, int, int | None, int, bool]], pool_limit: int | None
) -> None:
    config = SchedulerConfig(pools={"default": PoolPolicy(max_run_seconds=pool_limit)})
    scheduler = core(config, node("a100-01", gpus=4), node("a100-02", gpus=4))
    queue: list[tuple[float, int, Event]] = []
    seq = 0

    def push(when: float, event: Event) -> None:
        nonlocal seq
        heapq.heappush(queue, (when, seq, event))
        seq += 1

    t = 0.0
    limits: dict[str, int | None] = {}
    lengths: dict[str, tuple[int, bool]] = {}
    for i, (gpus, gap, limit, length, obeys) in enumerate(workload):
        t += gap
        limits[f"t{i}"] = limit if limit is not None else pool_limit
        lengths[f"t{i}"] = (length, obeys)
        push(t, profiled(f"t{i}", gpus=gpus, when=t, max_run_seconds=limit))
    for k in range(int((t + 7_000) // 7)):  # past the last end, even with every task in turn
        push(k * 7.0 + 0.5, tick(k * 7.0 + 0.5))
    granted: dict[str, float] = {}
    while queue:
        when, _, event = heapq.heappop(queue)
        for d in scheduler.handle(event):
            if isinstance(d, AllocationGranted) and d.gang_index == 0:
                granted[d.task_id] = when
                push(when, running(d.task_id, when))
                length, _ = lengths[d.task_id]
                if length:
                    push(when + length, stopped(d.task_id, when + length))
            elif isinstance(d, TaskPreempted):
                limit = limits[d.task_id]
                assert limit is not None
                assert d.time_limit_seconds == limit
                assert when >= granted[d.task_id] + limit  # never before its limit
                assert when < granted[d.task_id] + limit + 7.5  # nor later than the next tick
                if lengths[d.task_id][1]:
                    push(when + 3, stopped(d.task_id, when + 3))
            elif isinstance(d, AllocationReleased):
                limit = limits[d.task_id]
                if limit is None:
                    assert d.reason is not ReleaseReason.TIME_LIMIT
                else:  # gone by its limit, its grace and one tick at the latest
                    assert when <= granted[d.task_id] + limit + 30 + 2 * 7.5
    assert not scheduler.allocations or all(limits[t] is None for t in scheduler.allocations)


# -- backfill by time limits -------------------------------------------------------------------


def blocked_head(holder_limit: int | None) -> Scheduler:
    """One 8-card node: 4 cards held since 1 s (limit `holder_limit`), and `big` (8 cards)
    heading the queue, keeping the node."""
    scheduler = core(SchedulerConfig(), node("a100-01", gpus=8))
    limit = {} if holder_limit is None else {"max_run_seconds": holder_limit}
    scheduler.handle(profiled("holder", gpus=4, when=1, **limit))
    scheduler.handle(running("holder", 2))
    scheduler.handle(profiled("big", gpus=8, when=5, max_run_seconds=100))
    assert scheduler.backfill["default"].task_id == "big"
    return scheduler


def test_a_task_whose_limit_ends_before_the_heads_nodes_are_due_free_backfills_there() -> None:
    scheduler = blocked_head(1000)  # due free by 1 + 1000 + 30 (grace) = 1031
    [granted] = of(
        scheduler.handle(profiled("short", gpus=2, when=10, max_run_seconds=990)), AllocationGranted
    )
    assert (granted.task_id, granted.node) == ("short", "a100-01")  # 10 + 990 + 30 <= 1031
    decisions = scheduler.handle(profiled("long", gpus=2, when=11, max_run_seconds=991))
    assert not of(decisions, AllocationGranted)
    [pending] = of(decisions, TaskPending)
    assert (
        "is kept for big, which waits ahead of it (due free by 2026-01-01T00:17:11Z: this "
        "task's limit of 991 s would run past that)"
    ) in pending.summary
    bare = of(scheduler.handle(profiled("bare", gpus=2, when=12)), TaskPending)
    assert "is kept for big, which waits ahead of it" in bare[0].summary
    assert "limit" not in bare[0].summary  # a task with no limit is told as before


def test_no_task_backfills_onto_nodes_held_by_a_task_with_no_limit() -> None:
    scheduler = blocked_head(None)
    [pending] = of(
        scheduler.handle(profiled("short", gpus=2, when=10, max_run_seconds=5)), TaskPending
    )
    assert "a task there states no time limit" in pending.summary


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    workload=st.lists(
        st.tuples(
            st.integers(min_value=1, max_value=8),  # GPUs
            st.integers(min_value=1, max_value=60),  # seconds after the previous arrival
            st.integers(min_value=20, max_value=600),  # max_run_seconds
            st.floats(min_value=0.05, max_value=1.5),  # runs this share of its limit
            st.booleans(),  # stops when told (else released at its deadline)
        ),
        min_size=2,
        max_size=14,
    )
)
def test_a_head_starts_by_the_time_its_nodes_were_due_free_whatever_backfilled(
    workload: list[tuple[int, int, int, float, bool]],
) -> None:
    """EASY's promise with limits: once a task heads the queue, with its nodes' holders all
    limited, it starts by the time they were due free then (a heartbeat or two later: the
    core decides on events), however many later tasks backfilled onto its nodes."""
    scheduler = core(SchedulerConfig(), node("a100-01", gpus=8))
    queue: list[tuple[float, int, Event]] = []
    seq = 0

    def push(when: float, event: Event) -> None:
        nonlocal seq
        heapq.heappush(queue, (when, seq, event))
        seq += 1

    t = 0.0
    plans: dict[str, tuple[float, bool]] = {}
    for i, (gpus, gap, limit, share, obeys) in enumerate(workload):
        t += gap
        plans[f"t{i}"] = (limit * share, obeys)
        push(t, profiled(f"t{i}", gpus=gpus, when=t, max_run_seconds=limit))
    for k in range(int((t + 2 * 600 * len(workload)) // 5)):
        push(k * 5.0 + 0.5, tick(k * 5.0 + 0.5))
    promised: dict[str, Any] = {}  # head -> when its nodes were due free as it became head

    while queue:
        when, _, event = heapq.heappop(queue)
        decisions = scheduler.handle(event)
        for d in decisions:
            if isinstance(d, AllocationGranted):
                push(when, running(d.task_id, when))
                length, _ = plans[d.task_id]
                push(when + length, stopped(d.task_id, when + length))
                if d.task_id in promised:
                    assert d.occurred_at <= promised.pop(d.task_id) + timedelta(seconds=10)
            elif isinstance(d, TaskPreempted) and plans[d.task_id][1]:
                push(when + 3, stopped(d.task_id, when + 3))
        head = scheduler.backfill.get("default")
        if head is not None and head.task_id in scheduler.pending and head.task_id not in promised:
            due = due_free(scheduler, head)
            if due is not None:
                promised[head.task_id] = due
    assert not scheduler.pending


def test_a_snapshot_of_the_core_enforces_limits_as_the_live_core_does() -> None:
    """The audit log's snapshots (pickled cores) carry the limits' heap and the stops ordered:
    a replay from one decides as the live core."""
    from crater.scheduler import audit_state

    live = limited(600)
    live.handle(profiled("next", gpus=4, when=5, max_run_seconds=50))
    copy_ = audit_state.load_core(audit_state.dump_core(live), live.config)
    for when in (601, 640, 700):
        beat = tick(when)  # one event for both: decisions take their ids from it
        mine, theirs = live.handle(beat), copy_.handle(beat)
        assert [d.model_dump_json() for d in mine] == [d.model_dump_json() for d in theirs]
    assert live.pending == copy_.pending == {}


def test_the_limits_of_tasks_that_ended_early_do_not_pile_up() -> None:
    scheduler = core(SchedulerConfig(), node("a100-01", gpus=4))
    for i in range(1_500):  # each ends long before its day-long limit
        scheduler.handle(tick(1 + i))  # the node's heartbeat
        [granted] = scheduler.handle(profiled(f"t{i}", gpus=1, when=1 + i, max_run_seconds=86_400))
        assert isinstance(granted, AllocationGranted)
        done = stopped(f"t{i}", 1.5 + i).model_copy(update={"status": TaskStatus.SUCCEEDED})
        scheduler.handle(done)
    assert len(scheduler.limits) <= 1024 + 2
    scheduler.handle(profiled("last", gpus=1, when=1_501, max_run_seconds=20))
    [told] = of(scheduler.handle(tick(1_521)), TaskPreempted)  # the live one still counts
    assert told.task_id == "last"
