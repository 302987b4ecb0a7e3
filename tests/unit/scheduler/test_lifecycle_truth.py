"""What the core tells of each task is what happened: one end per task, nothing after it,
reservations that expire only when the node truly did not confirm them, waits announced
when their kind changes (not on every node count), lost nodes given back, retried attempts."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    Event,
    NodeCondition,
    NodeHealthReported,
    NodeTopologyReported,
    OnExitCodes,
    RestartPolicy,
    TaskEnded,
    TaskEvent,
    TaskPending,
    TaskPreempted,
    TaskProfiled,
    TaskRejected,
    TaskStatus,
    TaskStatusReported,
)
from crater.scheduler.adapters.pools_file import PoolsFileError, parse_pools
from crater.scheduler.domain.core import Scheduler, SchedulerConfig
from crater.scheduler.domain.inputs import ReservationArmed
from crater.scheduler.domain.pools import PoolPolicy
from tests.support.topologies import node
from tests.unit.scheduler.test_core import at, cluster, profiled
from tests.unit.scheduler.test_retry_fast_path import config, events, steps


def report(task_id: str, when: float, status: TaskStatus, **fields: Any) -> TaskStatusReported:
    return TaskStatusReported(occurred_at=at(when), task_id=task_id, status=status, **fields)


def heartbeat(node_id: str, when: float) -> NodeHealthReported:
    return NodeHealthReported(
        occurred_at=at(when), node_id=node_id, condition=NodeCondition.READY, score=100
    )


def of(kind: type[Event], decisions: list[Event]) -> list[Any]:
    return [d for d in decisions if isinstance(d, kind)]


# -- one end per task, whatever happens -------------------------------------------------------


def with_restarts(random_lab: bool) -> SchedulerConfig:
    """The fast-path test's configuration, with the batch pool retrying every kind of end."""
    base = config(random_lab)
    retry = RestartPolicy(
        when=["failure", "preemption", "node-lost"], max_attempts=3, backoff_seconds=5
    )
    pools = dict(base.pools)
    pools["batch"] = PoolPolicy(restart=retry)
    return SchedulerConfig(
        quotas=base.quotas,
        pools=pools,
        reservation_timeout_ms=base.reservation_timeout_ms,
        grace_period_seconds=base.grace_period_seconds,
        pending_interval_seconds=20,
        node_lost_seconds=15,
        confirmation_lag_seconds=10,
    )


def run(script: list[tuple[str, object]], random_lab: bool, arm_every: int) -> list[Event]:
    """The script through the core; every `arm_every`-th grant is read back (armed) when it
    is made, the others never (a relay that is down)."""
    scheduler = Scheduler(config=with_restarts(random_lab))
    emitted: list[Event] = []
    grants = 0
    for event in events(script):
        decisions = scheduler.handle(event)
        ids = [d.event_id for d in decisions]
        assert len(ids) == len(set(ids)), f"one event id twice in one decision: {decisions}"
        emitted += decisions
        for grant in of(AllocationGranted, decisions):
            grants += 1
            if grants % arm_every == 0:
                emitted += scheduler.handle(ReservationArmed.of(grant, event.occurred_at))
    return emitted


@settings(max_examples=150, deadline=None)
@given(steps, st.booleans(), st.integers(1, 3))
def test_every_task_ends_at_most_once_and_nothing_follows_its_end(
    script: list[tuple[str, object]], random_lab: bool, arm_every: int
) -> None:
    emitted = run(script, random_lab, arm_every)
    ids = [e.event_id for e in emitted]
    assert len(ids) == len(set(ids)), "an event id was derived twice (the outbox would refuse it)"
    ended: dict[str, Event] = {}
    attempts: dict[str, int] = defaultdict(lambda: 1)
    for event in emitted:
        if not isinstance(event, TaskEvent) or isinstance(event, AllocationReleased):
            continue  # a release is bookkeeping; what AllData hears follows it
        task_id = str(getattr(event, "task_id"))  # noqa: B009
        assert task_id not in ended, f"{type(event).__name__} after {ended.get(task_id)}"
        attempt = getattr(event, "attempt", None)
        if attempt is not None:
            assert attempt >= attempts[task_id], "an attempt number went back"
            attempts[task_id] = attempt
        if isinstance(event, TaskEnded) or (
            isinstance(event, TaskRejected) and not event.duplicate
        ):
            ended[task_id] = event


# -- reservations: expired only when the node truly did not confirm ---------------------------


def test_a_grant_still_in_the_outbox_never_expires() -> None:
    scheduler, _ = cluster(node("n1", gpus=1))
    [granted] = scheduler.handle(profiled("late", gpus=1, when=1))
    assert isinstance(granted, AllocationGranted)
    for when in (40, 80, 120):  # heartbeats and other tasks' reports go on; no grant read back
        scheduler.handle(heartbeat("n1", when))
        scheduler.handle(report("elsewhere", when + 1, TaskStatus.RUNNING))
    assert "late" in scheduler.allocations
    # read back at 125: its node could know from then, and confirms in time
    scheduler.handle(ReservationArmed.of(granted, at(125)))
    assert scheduler.handle(report("late", 140, TaskStatus.RUNNING)) == []
    assert scheduler.handle(heartbeat("n1", 200)) == []
    assert scheduler.allocations["late"].running


def test_a_confirmation_that_lags_in_its_stream_still_wins() -> None:
    """The node confirmed at 20; the status consumer is behind while heartbeats (another
    consumer) run the clock past the expiry: nothing expires until reports of that time
    are in, and the lagging report confirms."""
    scheduler, _ = cluster(node("n1", gpus=1))
    [granted] = scheduler.handle(profiled("busy", gpus=1, when=1))
    scheduler.handle(ReservationArmed.of(granted, at(1)))  # expires at 31
    for when in range(32, 41, 2):
        assert scheduler.handle(heartbeat("n1", when)) == []
    assert scheduler.handle(report("busy", 20, TaskStatus.RUNNING)) == []  # at last
    assert scheduler.handle(report("other", 45, TaskStatus.RUNNING)) == []
    assert scheduler.allocations["busy"].running


def test_a_confirmation_dated_after_the_expiry_wins_over_expiring_on_it() -> None:
    scheduler, _ = cluster(node("n1", gpus=1))
    [granted] = scheduler.handle(profiled("slow", gpus=1, when=1))
    scheduler.handle(ReservationArmed.of(granted, at(1)))
    assert scheduler.handle(report("slow", 33, TaskStatus.RUNNING)) == []
    assert scheduler.allocations["slow"].running


def test_an_unconfirmed_reservation_expires_once_later_reports_are_in_or_after_the_lag() -> None:
    scheduler, _ = cluster(node("n1", gpus=1), node("n2", gpus=1))
    [first] = scheduler.handle(profiled("a", gpus=1, when=1))
    [second] = scheduler.handle(profiled("b", gpus=1, when=1))
    scheduler.handle(ReservationArmed.of(first, at(1)))
    scheduler.handle(ReservationArmed.of(second, at(1)))
    scheduler.handle(report("a", 2, TaskStatus.RUNNING))  # a confirms; b never does
    assert scheduler.handle(heartbeat("n1", 35)) == []  # reports of 31 are not in yet
    # the status stream is quiet: 30 s of lag allowance later, b expires
    released, ended = scheduler.handle(heartbeat("n1", 62))
    assert isinstance(released, AllocationReleased)
    assert (released.task_id, released.reason) == ("b", "expired")
    assert isinstance(ended, TaskEnded)
    assert (ended.task_id, ended.status, ended.release_reason) == ("b", "failed", "expired")
    assert "a" in scheduler.allocations


# -- waiting: announced when the kind of reason changes, rate-limited -------------------------


def waiting_storm(interval: float) -> tuple[Scheduler, Counter[str]]:
    """A full cluster; 300 tasks wait ten minutes while nodes come, heartbeats flow, one node
    blinks out for seconds now and then and is out for two minutes once: node counts in the
    reasons move all the time, their kind changes for good twice. The pendings per task."""
    scheduler = Scheduler(config=SchedulerConfig(pending_interval_seconds=interval))
    nodes = [f"n{n}" for n in range(10)]
    for name in nodes:
        scheduler.handle(NodeTopologyReported(occurred_at=at(0), node=node(name, gpus=4)))
    for n in range(10):  # fill it: one 4-GPU task per node, running
        [grant] = scheduler.handle(profiled(f"full-{n}", gpus=4, when=1))
        scheduler.handle(ReservationArmed.of(grant, at(1)))
        scheduler.handle(report(f"full-{n}", 2, TaskStatus.RUNNING))
    emitted: list[Event] = []
    for n in range(300):
        emitted += scheduler.handle(
            profiled(f"w-{n}", gpus=2 + n % 3, gpu_mb=40000 + 1000 * (n % 2), when=3)
        )
    for minute in range(10):
        for second in range(0, 60, 5):
            clock = 3 + minute * 60 + second
            out = 5 <= minute < 7 or (minute in (1, 3) and second == 45)
            for name in nodes:
                if name != "n0" or not out:
                    emitted += scheduler.handle(heartbeat(name, clock))
            if out:
                emitted += scheduler.handle(
                    NodeHealthReported(
                        occurred_at=at(clock),
                        node_id="n0",
                        condition=NodeCondition.NOT_READY,
                        score=0,
                    )
                )
            if second == 30:  # a node too small for any of them comes: more nodes to count
                nodes.append(f"small-{minute}")
                topology = node(nodes[-1], gpus=1)
                emitted += scheduler.handle(
                    NodeTopologyReported(occurred_at=at(clock), node=topology)
                )
        for n in range(10):
            emitted += scheduler.handle(report(f"full-{n}", clock, TaskStatus.RUNNING))
    assert all(f"w-{n}" in scheduler.pending for n in range(300))
    return scheduler, Counter(p.task_id for p in of(TaskPending, emitted))


def test_three_hundred_tasks_waiting_ten_minutes_hear_at_most_three_pendings_each() -> None:
    scheduler, pendings = waiting_storm(interval=60)
    waiting = [f"w-{n}" for n in range(300)]
    assert all(pendings[task] >= 1 for task in waiting)  # each heard it waits
    assert max(pendings[task] for task in waiting) <= 3, pendings.most_common(3)
    # waits; the two-minute outage is a new kind; back to the first kind is no news
    assert pendings["w-0"] == 2
    # the live reason is current all the same
    summary = scheduler.pending["w-0"].last_summary
    assert (
        summary
        == f"0/{len(scheduler.cluster)} nodes available: 20 nodes have fewer than 2 free GPUs"
    )


def flapping(interval: float) -> int:
    """A waiting task whose only node blinks NotReady for 10 s every 20 s, ten minutes long:
    how many `task.pending` it is sent."""
    scheduler = Scheduler(config=SchedulerConfig(pending_interval_seconds=interval))
    scheduler.handle(NodeTopologyReported(occurred_at=at(0), node=node("n1", gpus=1)))
    [holder] = scheduler.handle(profiled("holder", gpus=1, when=1))
    scheduler.handle(report("holder", 2, TaskStatus.RUNNING))
    emitted = scheduler.handle(profiled("waits", gpus=1, when=3))
    for when in range(5, 600, 10):
        down = (when // 10) % 2 == 0
        condition = NodeCondition.NOT_READY if down else NodeCondition.READY
        emitted += scheduler.handle(
            NodeHealthReported(occurred_at=at(when), node_id="n1", condition=condition, score=0)
        )
    assert holder.task_id in scheduler.allocations
    return len(of(TaskPending, emitted))


def test_a_kind_that_never_holds_for_the_interval_is_never_announced() -> None:
    assert flapping(interval=60) == 1  # it waits; the blinks are no news
    assert flapping(interval=0) == 2  # without the interval the first blink would be


def test_a_new_kind_of_reason_is_announced_once_it_has_held_for_the_interval() -> None:
    scheduler = Scheduler(config=SchedulerConfig(pending_interval_seconds=60))
    scheduler.handle(NodeTopologyReported(occurred_at=at(0), node=node("n1", gpus=2)))
    [holder] = scheduler.handle(profiled("holder", gpus=2, when=1))
    scheduler.handle(ReservationArmed.of(holder, at(1)))
    scheduler.handle(report("holder", 2, TaskStatus.RUNNING))
    [first] = of(TaskPending, scheduler.handle(profiled("waits", gpus=2, when=3)))
    assert [r.filter for r in first.reasons] == ["GpuCount"]
    # the node goes NotReady: a new kind of reason, announced only once it has held 60 s
    down = NodeHealthReported(
        occurred_at=at(10), node_id="n1", condition=NodeCondition.NOT_READY, score=0
    )
    assert of(TaskPending, scheduler.handle(down)) == []
    assert scheduler.pending["waits"].last_summary == "0/1 nodes available: 1 node is not ready"
    still = down.model_copy(update={"occurred_at": at(40)})
    assert of(TaskPending, scheduler.handle(still)) == []
    [news] = of(TaskPending, scheduler.handle(still.model_copy(update={"occurred_at": at(71)})))
    assert [r.filter for r in news.reasons] == ["NodeReady"]
    # back to a kind AllData was told before: no news, however long it holds
    for when in (80, 150, 300):
        assert of(TaskPending, scheduler.handle(heartbeat("n1", when))) == []
    assert (
        scheduler.pending["waits"].last_summary
        == "0/1 nodes available: 1 node has fewer than 2 free GPUs"
    )


# -- lost nodes and restart policies ----------------------------------------------------------


def test_a_silent_node_loses_its_allocations_and_their_tasks_end_failed() -> None:
    scheduler = Scheduler(config=SchedulerConfig(node_lost_seconds=60))
    for name in ("n1", "n2"):
        scheduler.handle(NodeTopologyReported(occurred_at=at(0), node=node(name, gpus=1)))
    [grant] = scheduler.handle(profiled("on-n1", gpus=1, when=1))
    assert isinstance(grant, AllocationGranted)
    lost_node = grant.node
    alive = "n2" if lost_node == "n1" else "n1"
    scheduler.handle(ReservationArmed.of(grant, at(1)))
    scheduler.handle(report("on-n1", 2, TaskStatus.RUNNING, allocation_id=grant.allocation_id))
    for when in range(5, 90, 5):  # the other node keeps reporting; this one is silent
        assert of(AllocationReleased, scheduler.handle(heartbeat(alive, when))) == []
    decisions = scheduler.handle(heartbeat(alive, 92))  # 30 s timeout + 60 s grace
    [released] = of(AllocationReleased, decisions)
    assert (released.task_id, released.reason) == ("on-n1", "node-lost")
    [ended] = of(TaskEnded, decisions)
    assert (ended.status, ended.release_reason, ended.attempt) == ("failed", "node-lost", 1)
    # the node comes back still reporting the task: the old allocation is over, nothing moves
    assert scheduler.handle(heartbeat(lost_node, 95)) == []
    late = report("on-n1", 96, TaskStatus.SUCCEEDED, allocation_id=grant.allocation_id)
    assert scheduler.handle(late) == []
    assert scheduler.cluster.get(lost_node).whole_gpus_free == 1  # type: ignore[union-attr]


def test_a_task_with_a_restart_policy_is_retried_after_its_backoff_then_ends() -> None:
    policy = {"when": ["failure", "node-lost"], "max_attempts": 2, "backoff_seconds": 10}
    scheduler = Scheduler(config=SchedulerConfig(node_lost_seconds=0))
    for name in ("n1", "n2"):
        scheduler.handle(NodeTopologyReported(occurred_at=at(0), node=node(name, gpus=1)))
    task = profiled("retry-me", gpus=1, when=1)
    request = task.task.model_copy(update={"restart_policy": RestartPolicy(**policy)})
    [first] = scheduler.handle(
        TaskProfiled(occurred_at=at(1), task=request, prediction=task.prediction)
    )
    assert isinstance(first, AllocationGranted)
    assert first.attempt == 1
    scheduler.handle(ReservationArmed.of(first, at(1)))
    failed = report("retry-me", 5, TaskStatus.FAILED, allocation_id=first.allocation_id)
    released, retried = scheduler.handle(failed)
    assert isinstance(released, AllocationReleased)
    assert released.reason == "failed"
    assert isinstance(retried, TaskPending)
    assert (retried.attempt, retried.reasons[0].code) == (2, "Retrying")
    assert "backoff of 10 s" in retried.summary
    # within the backoff nothing is placed, though both nodes are free
    assert of(AllocationGranted, scheduler.handle(heartbeat("n1", 10))) == []
    [second] = of(AllocationGranted, scheduler.handle(heartbeat("n1", 16)))
    assert (second.task_id, second.attempt) == ("retry-me", 2)
    assert second.allocation_id != first.allocation_id
    # a late report of the first attempt changes nothing
    assert (
        scheduler.handle(
            report("retry-me", 17, TaskStatus.RUNNING, allocation_id=first.allocation_id)
        )
        == []
    )
    assert not scheduler.allocations["retry-me"].running
    scheduler.handle(ReservationArmed.of(second, at(16)))
    again = report("retry-me", 20, TaskStatus.FAILED, allocation_id=second.allocation_id)
    released, ended = scheduler.handle(again)
    assert isinstance(ended, TaskEnded)
    assert (ended.status, ended.attempt, ended.release_reason) == ("failed", 2, "failed")
    assert "retry-me" not in scheduler.pending


def retrying(scheduler: Scheduler, task_id: str, when: float, **policy: Any) -> AllocationGranted:
    """`task_id`, one GPU, retried on failure without a backoff: its first grant."""
    task = profiled(task_id, gpus=1, when=when)
    restart = RestartPolicy(when=["failure", "node-lost"], backoff_seconds=0, **policy)
    request = task.task.model_copy(update={"restart_policy": restart})
    [grant] = scheduler.handle(
        TaskProfiled(occurred_at=at(when), task=request, prediction=task.prediction)
    )
    assert isinstance(grant, AllocationGranted)
    return grant


def test_a_failed_attempt_is_retried_on_another_node_and_the_reason_says_so() -> None:
    scheduler = Scheduler()
    for name in ("n1", "n2"):
        scheduler.handle(NodeTopologyReported(occurred_at=at(0), node=node(name, gpus=1)))
    first = retrying(scheduler, "r", 1, max_attempts=3)
    other = "n2" if first.node == "n1" else "n1"
    # another task takes the other node: the retry waits rather than go back where it failed
    [blocker] = of(AllocationGranted, scheduler.handle(profiled("b", gpus=1, when=2)))
    assert blocker.node == other
    decisions = scheduler.handle(
        report("r", 3, TaskStatus.FAILED, allocation_id=first.allocation_id)
    )
    assert of(AllocationGranted, decisions) == []
    assert scheduler.pending["r"].failed_on == (first.node,)
    for name in ("n1", "n2"):
        assert of(AllocationGranted, scheduler.handle(heartbeat(name, 20))) == []
    waiting = scheduler.pending["r"]
    assert "1 node is where an earlier attempt failed (retried elsewhere)" in str(
        waiting.last_summary
    )
    assert "AttemptFailedHere" in {r.code for r in waiting.live_reasons}
    # the other node frees: the second attempt goes there
    done = report("b", 21, TaskStatus.SUCCEEDED, allocation_id=blocker.allocation_id)
    decisions = scheduler.handle(done)
    [second] = of(AllocationGranted, decisions)
    assert (second.task_id, second.node, second.attempt) == ("r", other, 2)
    # it fails there too: no node is left that it has not failed on, so it may go back
    decisions = scheduler.handle(
        report("r", 42, TaskStatus.FAILED, allocation_id=second.allocation_id)
    )
    [third] = of(AllocationGranted, decisions)
    assert third.attempt == 3


def test_a_gang_that_loses_a_member_with_its_node_is_placed_again_whole_elsewhere() -> None:
    scheduler = Scheduler(config=SchedulerConfig(node_lost_seconds=0))
    names = ("n1", "n2", "n3")
    for name in names:
        scheduler.handle(NodeTopologyReported(occurred_at=at(0), node=node(name, gpus=1)))
    task = profiled("gang", gpus=1, when=1, gang_size=2)
    policy = RestartPolicy(when=["node-lost"], backoff_seconds=0)
    request = task.task.model_copy(update={"restart_policy": policy})
    first = of(
        AllocationGranted,
        scheduler.handle(TaskProfiled(occurred_at=at(1), task=request, prediction=task.prediction)),
    )
    held = sorted(g.node for g in first)
    assert len(held) == 2
    lost = held[1]
    for grant in first:
        scheduler.handle(ReservationArmed.of(grant, at(1)))
    # every node but one keeps reporting: its member's node is lost, the gang goes whole
    decisions: list[Any] = []
    for when in range(5, 60, 5):
        for name in names:
            if name != lost:
                decisions += scheduler.handle(heartbeat(name, when))
    released = of(AllocationReleased, decisions)
    assert sorted(r.node for r in released) == held
    assert {r.reason for r in released} == {"node-lost"}
    again = of(AllocationGranted, decisions)
    assert len(again) == 2
    assert {g.attempt for g in again} == {2}
    assert lost not in {g.node for g in again}
    assert scheduler.allocations["gang"].members()[0].task is not None
    assert scheduler.allocations["gang"].task.failed_on == (lost,)  # type: ignore[union-attr]


def test_a_task_that_fits_only_where_it_failed_is_retried_there() -> None:
    scheduler = Scheduler()
    scheduler.handle(NodeTopologyReported(occurred_at=at(0), node=node("n1", gpus=1)))
    scheduler.handle(NodeTopologyReported(occurred_at=at(0), node=node("small", gpus=0)))
    first = retrying(scheduler, "r", 1, max_attempts=2)
    decisions = scheduler.handle(
        report("r", 3, TaskStatus.FAILED, allocation_id=first.allocation_id)
    )
    [second] = of(AllocationGranted, decisions)
    assert (second.node, second.attempt) == ("n1", 2)


def test_only_the_exit_codes_the_policy_names_are_retried() -> None:
    scheduler = Scheduler()
    scheduler.handle(NodeTopologyReported(occurred_at=at(0), node=node("n1", gpus=2)))
    # NotIn: a usage error (exit code 2) is not worth a retry; a crash (139) is
    rule = OnExitCodes(operator="NotIn", values=[2])
    crash = retrying(scheduler, "crash", 1, max_attempts=3, on_exit_codes=rule)
    usage = retrying(scheduler, "usage", 1, max_attempts=3, on_exit_codes=rule)
    failed = report("crash", 2, TaskStatus.FAILED, allocation_id=crash.allocation_id, exit_code=139)
    [again] = of(AllocationGranted, scheduler.handle(failed))
    assert (again.task_id, again.attempt) == ("crash", 2)
    failed = report("usage", 3, TaskStatus.FAILED, allocation_id=usage.allocation_id, exit_code=2)
    [ended] = of(TaskEnded, scheduler.handle(failed))
    assert (ended.status, ended.attempt) == ("failed", 1)
    assert ended.reason.endswith(
        "(exit code 2); its restart policy does not retry that exit code"
    ), ended.reason
    # In: only the codes listed; a failure that names no code is retried as `when` says
    only = OnExitCodes(operator="In", values=[75])
    other = retrying(scheduler, "other", 4, max_attempts=3, on_exit_codes=only)
    failed = report("other", 5, TaskStatus.FAILED, allocation_id=other.allocation_id, exit_code=1)
    assert of(TaskEnded, scheduler.handle(failed))
    silent = retrying(scheduler, "silent", 6, max_attempts=3, on_exit_codes=only)
    failed = report("silent", 7, TaskStatus.FAILED, allocation_id=silent.allocation_id)
    assert [g.attempt for g in of(AllocationGranted, scheduler.handle(failed))] == [2]


def test_an_exit_code_rule_is_checked_naming_the_field() -> None:
    body = {"when": ["failure"], "on_exit_codes": {"operator": "Maybe", "values": []}}
    with pytest.raises(ValidationError) as refused:
        RestartPolicy.model_validate(body)
    fields = {".".join(str(p) for p in e["loc"]) for e in refused.value.errors()}
    assert fields == {"on_exit_codes.operator", "on_exit_codes.values"}


def test_a_cancel_between_attempts_ends_the_task_cancelled() -> None:
    scheduler = Scheduler()
    scheduler.handle(NodeTopologyReported(occurred_at=at(0), node=node("n1", gpus=1)))
    task = profiled("c", gpus=1, when=1)
    request = task.task.model_copy(
        update={"restart_policy": RestartPolicy(when=["failure"], backoff_seconds=60)}
    )
    [grant] = scheduler.handle(
        TaskProfiled(occurred_at=at(1), task=request, prediction=task.prediction)
    )
    scheduler.handle(report("c", 2, TaskStatus.FAILED, allocation_id=grant.allocation_id))
    [ended] = scheduler.handle(report("c", 3, TaskStatus.CANCELLED))
    assert isinstance(ended, TaskEnded)
    assert (ended.status, ended.attempt) == ("cancelled", 2)
    assert "c" not in scheduler.pending
    assert scheduler.handle(heartbeat("n1", 100)) == []  # its backoff's end finds nothing


def test_the_same_event_handled_twice_repeats_no_event_id_in_one_answer() -> None:
    """Two victims preempted for one 8-GPU task, then the victims' grace ends on a
    heartbeat: the decisions of one event never share an id (the outbox's unique key)."""
    scheduler, _ = cluster(node("n1", gpus=8))
    low = {"priority": "low", "preemptible": True}
    for i in range(2):
        [grant] = scheduler.handle(profiled(f"low-{i}", gpus=4, when=1 + i, **low))
        scheduler.handle(ReservationArmed.of(grant, at(1 + i)))
        scheduler.handle(report(f"low-{i}", 3 + i, TaskStatus.RUNNING))
    decisions = scheduler.handle(profiled("big", gpus=8, when=5, priority="high"))
    assert len(of(TaskEvent, decisions)) == 3  # pending + two preempted
    tick = heartbeat("n1", 40)
    after = scheduler.handle(tick)
    ids = [d.event_id for d in after]
    assert len(ids) == len(set(ids))
    assert [d.task_id for d in of(AllocationGranted, after)] == ["big"]
    assert len(of(TaskEnded, after)) == 2
    assert scheduler.handle(tick) == []  # the heartbeat again: nothing more to decide


def test_a_pools_file_restart_policy_is_refused_naming_the_field() -> None:
    text = "pools:\n  training:\n    restart_policy: {when: [sometimes], max_attempts: 0}\n"
    with pytest.raises(PoolsFileError) as refused:
        parse_pools(text)
    assert "pools.training.restart_policy.when.0" in str(refused.value)
    assert "pools.training.restart_policy.max_attempts" in str(refused.value)


def test_heartbeats_lagging_in_their_consumer_never_make_a_live_node_lost() -> None:
    """NATS comes back after an outage, or the health consumer is behind: task events dated
    90 s after the last heartbeat consumed arrive first. No node looks silent, nothing is
    released; the heartbeats of that time then arrive and all is well."""
    scheduler = Scheduler(config=SchedulerConfig(node_lost_seconds=10))
    scheduler.handle(NodeTopologyReported(occurred_at=at(0), node=node("n1", gpus=2)))
    [grant] = scheduler.handle(profiled("runs", gpus=1, when=1))
    scheduler.handle(ReservationArmed.of(grant, at(1)))
    scheduler.handle(report("runs", 2, TaskStatus.RUNNING))
    scheduler.handle(heartbeat("n1", 5))
    # 55 s later than the last heartbeat consumed: within the lag allowed the heartbeats
    assert scheduler.handle(profiled("more", gpus=1, when=60)) != []
    assert scheduler.handle(report("runs", 62, TaskStatus.RUNNING)) == []
    assert scheduler.cluster.get("n1").condition is NodeCondition.READY  # type: ignore[union-attr]
    assert "runs" in scheduler.allocations
    for when in range(10, 65, 5):  # the heartbeats come in, late
        assert of(AllocationReleased, scheduler.handle(heartbeat("n1", when))) == []
    assert "runs" in scheduler.allocations


def test_a_fleet_that_stops_reporting_altogether_is_still_found_lost() -> None:
    scheduler = Scheduler(config=SchedulerConfig(node_lost_seconds=10, heartbeat_lag_seconds=60))
    scheduler.handle(NodeTopologyReported(occurred_at=at(0), node=node("n1", gpus=2)))
    [grant] = scheduler.handle(profiled("runs", gpus=1, when=1))
    scheduler.handle(ReservationArmed.of(grant, at(1)))
    scheduler.handle(report("runs", 2, TaskStatus.RUNNING))
    scheduler.handle(heartbeat("n1", 5))
    # no heartbeat at all after 5; other events go on: silent for 30 + 10 s counted from
    # 60 s behind the clock, so lost once the clock passes 105
    assert of(AllocationReleased, scheduler.handle(report("other", 100, TaskStatus.RUNNING))) == []
    decisions = scheduler.handle(report("other", 106, TaskStatus.RUNNING))
    [released] = of(AllocationReleased, decisions)
    assert released.reason == "node-lost"


def restarted(scheduler: Scheduler) -> Scheduler:
    """The core as a restarted service rebuilds it: nodes with their stored heartbeats, the
    live allocations, the queue."""
    again = Scheduler(config=scheduler.config)
    again.restore(
        [(n.topology, n.condition, n.last_heartbeat_at) for n in scheduler.cluster.nodes],
        [m for head in scheduler.allocations.values() for m in head.members()],
        list(scheduler.pending.values()),
        scheduler.next_seq,
    )
    return again


def test_after_a_restart_nodes_are_not_lost_for_heartbeats_that_were_never_stored() -> None:
    """Heartbeats that change nothing are not stored: after a restart the stored times are
    old. The nodes count as heard when the restored core sees its first event."""
    before = Scheduler(config=SchedulerConfig(node_lost_seconds=10))
    before.handle(NodeTopologyReported(occurred_at=at(0), node=node("n1", gpus=2)))
    [grant] = before.handle(profiled("runs", gpus=1, when=1))
    before.handle(ReservationArmed.of(grant, at(1)))
    before.handle(report("runs", 2, TaskStatus.RUNNING))
    stored = before.cluster.get("n1")
    assert stored is not None
    stored.last_heartbeat_at = at(0).timestamp()  # what the database holds: the topology's
    core = restarted(before)
    # the first events after the restart are dated 5 minutes on (the node reported all along)
    assert of(AllocationReleased, core.handle(profiled("next", gpus=1, when=300))) == []
    assert core.cluster.get("n1").condition is NodeCondition.READY  # type: ignore[union-attr]
    assert "runs" in core.allocations
    # a node that truly stopped is still found: silent 30 + 10 s after the restart, judged
    # 60 s behind the clock as no heartbeat comes at all
    assert of(AllocationReleased, core.handle(report("other", 399, TaskStatus.RUNNING))) == []
    decisions = core.handle(report("other", 401, TaskStatus.RUNNING))
    assert [r.reason for r in of(AllocationReleased, decisions)] == ["node-lost", "node-lost"]


def test_after_a_restart_a_running_report_delivered_again_late_still_confirms() -> None:
    """The node confirmed just before the scheduler was killed; the report was never
    acknowledged and comes again after JetStream's ack wait, behind newer reports."""
    before = Scheduler()
    before.handle(NodeTopologyReported(occurred_at=at(0), node=node("n1", gpus=2)))
    [grant] = before.handle(profiled("confirmed", gpus=1, when=1))
    before.handle(ReservationArmed.of(grant, at(1)))  # expires at 31
    core = restarted(before)
    core.handle(heartbeat("n1", 5))
    assert core.handle(report("elsewhere", 33, TaskStatus.RUNNING)) == []  # newer, first
    assert core.handle(heartbeat("n1", 38)) == []  # past the expiry: held, not expired
    assert core.handle(report("confirmed", 2, TaskStatus.RUNNING)) == []  # the old one, again
    assert core.handle(heartbeat("n1", 90)) == []
    assert core.allocations["confirmed"].running


def test_a_task_preempted_before_it_confirmed_yields_it_does_not_expire() -> None:
    """Its node stops it on the preemption, before it reported running: the end says it
    yielded, not that its node never confirmed."""
    scheduler, _ = cluster(node("n1", gpus=2))
    [low] = scheduler.handle(profiled("low", gpus=2, when=1, priority="low", preemptible=True))
    scheduler.handle(ReservationArmed.of(low, at(1)))  # expires at 31, never confirmed
    decisions = scheduler.handle(profiled("urgent", gpus=2, when=2, priority="high"))
    assert [p.task_id for p in of(TaskPreempted, decisions)] == ["low"]  # must stop by 32
    assert scheduler.handle(report("other", 31.5, TaskStatus.RUNNING)) == []
    decisions = scheduler.handle(report("other", 33, TaskStatus.RUNNING))
    [released] = of(AllocationReleased, decisions)
    [ended] = of(TaskEnded, decisions)
    assert released.reason == "preempted"
    assert (ended.status, ended.release_reason) == ("failed", "preempted")
    assert [g.task_id for g in of(AllocationGranted, decisions)] == ["urgent"]


def test_a_grant_read_back_twice_or_forged_arms_nothing_more() -> None:
    """The first read-back arms the reservation; a redelivery, or a grant someone else put
    on the stream (an allocation the core does not hold, or one armed already), changes
    nothing."""
    scheduler, _ = cluster(node("n1", gpus=1))
    [grant] = scheduler.handle(profiled("t", gpus=1, when=1))
    assert scheduler.handle(ReservationArmed.of(grant, at(2))) == []
    expires = scheduler.allocations["t"].expires_at
    assert expires == at(32)
    assert scheduler.handle(ReservationArmed.of(grant, at(20))) == []  # again, later
    forged = grant.model_copy(update={"allocation_id": "alloc-forged", "task_id": "nobody"})
    assert scheduler.handle(ReservationArmed.of(forged, at(21))) == []
    other = grant.model_copy(update={"allocation_id": "alloc-forged"})
    assert scheduler.handle(ReservationArmed.of(other, at(22))) == []
    assert scheduler.allocations["t"].expires_at == expires
    assert scheduler.allocations["t"].allocation_id == grant.allocation_id
