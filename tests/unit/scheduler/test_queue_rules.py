"""The queue's rules in the pure core: gangs, backfill, dominant-resource fair share, numeric
priorities, queue-time escalation, cancellation, and pending reasons kept current."""

from __future__ import annotations

from dataclasses import replace

import pytest
from pydantic import ValidationError

from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    Event,
    NodeCondition,
    NodeHealthReported,
    NodeTopologyReported,
    Sla,
    TaskEnded,
    TaskEscalated,
    TaskPending,
    TaskPreempted,
    TaskRejected,
    TaskRequest,
    TaskStatus,
    TaskStatusReported,
)
from crater.scheduler.domain.core import Scheduler
from crater.scheduler.domain.inputs import ReservationArmed
from tests.support.topologies import node
from tests.unit.scheduler.test_core import at, cluster, profiled, running


def grants(decisions: list[Event]) -> list[AllocationGranted]:
    return [d for d in decisions if isinstance(d, AllocationGranted)]


def status(task_id: str, when: float, state: TaskStatus, **extra: str) -> TaskStatusReported:
    return TaskStatusReported(occurred_at=at(when), task_id=task_id, status=state, **extra)


# -- gangs -----------------------------------------------------------------------------------


def test_a_gang_spreads_its_members_across_nodes_one_grant_each() -> None:
    scheduler, _ = cluster(node("a100-01", gpus=4), node("a100-02", gpus=4))
    decisions = scheduler.handle(profiled("ddp", gpus=4, cores=4, gang_size=2))
    members = grants(decisions)
    assert len(members) == 2 == len(decisions)
    assert [(g.gang_index, g.gang_size) for g in members] == [(0, 2), (1, 2)]
    assert {g.node for g in members} == {"a100-01", "a100-02"}
    assert len({g.allocation_id for g in members}) == 2
    assert all(g.gpu_ids == [0, 1, 2, 3] for g in members)
    assert members[1].environment["CRATER_GANG_RANK"] == "1"
    assert members[1].environment["CRATER_GANG_LEADER_NODE"] == members[0].node


def test_a_same_node_gang_puts_every_member_on_one_node_with_its_own_devices() -> None:
    scheduler, _ = cluster(node("a100-4", gpus=4), node("a100-8", gpus=8))
    same = {"gpu": "same-node"}
    members = grants(scheduler.handle(profiled("tp", gpus=4, cores=4, gang_size=2, affinity=same)))
    assert [g.node for g in members] == ["a100-8", "a100-8"]
    assert set(members[0].gpu_ids).isdisjoint(members[1].gpu_ids)
    assert set(members[0].cpu_cores).isdisjoint(members[1].cpu_cores)


def test_a_gang_that_could_never_be_held_is_rejected_naming_gang_size() -> None:
    scheduler, _ = cluster(node("a100-01", gpus=8), node("a100-02", gpus=8))
    same = {"gpu": "same-node"}
    [together] = scheduler.handle(profiled("too-wide", gpus=4, gang_size=3, affinity=same))
    assert isinstance(together, TaskRejected)
    assert together.errors[0].field == "gang_size"
    assert "all 3 members together" in together.errors[0].reason
    [spread] = scheduler.handle(profiled("too-many", gpus=8, gang_size=3))
    assert isinstance(spread, TaskRejected)
    assert spread.errors[0].field == "gang_size"
    assert "at most 2 of the 3 members" in spread.errors[0].reason


def test_a_gang_is_placed_all_or_nothing_and_released_whole() -> None:
    scheduler, _ = cluster(node("n1", gpus=4), node("n2", gpus=4), node("n3", gpus=4))
    [busy] = scheduler.handle(profiled("busy", gpus=2, when=1))
    assert isinstance(busy, AllocationGranted)
    [waits] = scheduler.handle(profiled("gang", gpus=4, when=2, gang_size=3))
    assert isinstance(waits, TaskPending)  # two members would fit now: none is granted
    assert waits.summary == (
        "2/3 nodes can take a member, 3 needed at once: 1 node has fewer than 4 free GPUs"
    )
    assert "gang" not in scheduler.allocations
    released, *members = scheduler.handle(status("busy", 3, TaskStatus.SUCCEEDED))
    assert isinstance(released, AllocationReleased)
    assert [g.node for g in grants(members)] == ["n1", "n2", "n3"]
    scheduler.handle(running("gang", 4))
    # one member's end ends the task: every member goes back
    ended = scheduler.handle(status("gang", 5, TaskStatus.FAILED))
    assert [(r.node, r.reason) for r in ended if isinstance(r, AllocationReleased)] == [
        ("n1", "failed"),
        ("n2", "failed"),
        ("n3", "failed"),
    ]
    assert all(n.whole_gpus_free == 4 for n in scheduler.cluster.nodes)


def test_a_gang_member_that_never_confirms_expires_the_whole_gang() -> None:
    scheduler, _ = cluster(node("n1", gpus=2), node("n2", gpus=2))
    first, second = scheduler.handle(profiled("gang", gpus=2, when=1, gang_size=2))
    assert isinstance(first, AllocationGranted)
    assert isinstance(second, AllocationGranted)
    for grant in (first, second):  # both grants left the outbox at 1
        scheduler.handle(ReservationArmed.of(grant, at(1)))
    scheduler.handle(status("gang", 2, TaskStatus.RUNNING, allocation_id=first.allocation_id))
    # a report dated after the expiry (31) is in: the missing confirmation is not coming
    later = status("other", 40, TaskStatus.RUNNING)
    expired = [d for d in scheduler.handle(later) if isinstance(d, AllocationReleased)]
    assert sorted(r.allocation_id for r in expired) == sorted(
        [first.allocation_id, second.allocation_id]
    )
    assert {r.reason for r in expired} == {"expired"}


# -- backfill --------------------------------------------------------------------------------


def test_backfill_keeps_the_blocked_heads_node_and_uses_the_others() -> None:
    scheduler, _ = cluster(node("a", gpus=8), node("b", gpus=8))
    scheduler.handle(profiled("fill-a", gpus=6, when=1))
    scheduler.handle(profiled("fill-b", gpus=6, when=1.5))
    fills = {a.node for a in scheduler.allocations.values()}
    assert fills == {"a", "b"}
    [big] = scheduler.handle(profiled("big", gpus=4, when=2))
    assert isinstance(big, TaskPending)
    assert scheduler.backfill["default"].nodes == ("a",)  # 2 free on each: the first name
    [small] = scheduler.handle(profiled("small-1", gpus=2, when=3))
    assert isinstance(small, AllocationGranted)
    assert small.node == "b"  # not "a": it could delay "big"
    [waits] = scheduler.handle(profiled("small-2", gpus=2, when=4))
    assert isinstance(waits, TaskPending)
    assert "1 node is kept for big, which waits ahead of it" in waits.summary
    assert {r.code for r in waits.reasons} >= {"ReservedForWaitingTask"}
    [urgent] = scheduler.handle(profiled("urgent", gpus=2, when=5, priority="high"))
    assert isinstance(urgent, AllocationGranted)  # ahead of the head: nothing is kept from it
    assert urgent.node == "a"


def test_the_head_is_placed_first_when_its_node_frees() -> None:
    scheduler, _ = cluster(node("a", gpus=8))
    scheduler.handle(profiled("fill", gpus=6, when=1))
    scheduler.handle(profiled("big", gpus=4, when=2))
    scheduler.handle(profiled("small", gpus=2, when=3))  # would fit now, but delays "big"
    assert set(scheduler.pending) == {"big", "small"}
    decisions = scheduler.handle(status("fill", 4, TaskStatus.SUCCEEDED))
    assert [g.task_id for g in grants(decisions)] == ["big", "small"]


# -- order: priorities, fair share, FIFO ------------------------------------------------------


def test_numeric_priorities_order_the_queue_fifo_within_equal_priority() -> None:
    scheduler, _ = cluster(node("a", gpus=1))
    scheduler.handle(profiled("holder", gpus=1, when=1))
    for i, (task_id, priority) in enumerate(
        [("medium", "medium"), ("p700-a", 700), ("p700-b", 700), ("high", "high"), ("p950", 950)]
    ):
        [waits] = scheduler.handle(profiled(task_id, gpus=1, when=2 + i, priority=priority))
        assert isinstance(waits, TaskPending)
    order = []
    holder = "holder"
    for step in range(5):
        placed = grants(scheduler.handle(status(holder, 10 + step, TaskStatus.SUCCEEDED)))
        holder = placed[0].task_id
        order.append(holder)
    assert order == ["p950", "high", "p700-a", "p700-b", "medium"]


def test_priority_is_named_or_numeric_in_range() -> None:
    body = {"task_id": "t", "task_type": "training", "model_config": {"name": "m"}}
    assert TaskRequest.model_validate({**body, "priority": 0}).priority == 0
    for bad in (1001, -1, "urgent", True):
        with pytest.raises(ValidationError) as error:
            TaskRequest.model_validate({**body, "priority": bad})
        [problem] = error.value.errors()
        assert problem["loc"] == ("priority",)
        assert "0..1000" in problem["msg"]


def test_inside_a_priority_the_tenant_with_the_smallest_dominant_share_goes_first() -> None:
    scheduler, _ = cluster(node("a", gpus=8))
    scheduler.handle(profiled("heavy-1", gpus=6, when=1, tenant="heavy"))
    scheduler.handle(profiled("heavy-2", gpus=2, when=2, tenant="heavy"))
    scheduler.handle(profiled("heavy-3", gpus=2, when=3, tenant="heavy"))  # first in FIFO
    scheduler.handle(profiled("light-1", gpus=2, when=4, tenant="light"))
    decisions = scheduler.handle(status("heavy-2", 5, TaskStatus.SUCCEEDED))
    # heavy holds 6/8 of the pool's GPUs, light nothing: light goes first
    assert [g.task_id for g in grants(decisions)] == ["light-1"]
    assert "heavy-3" in scheduler.pending


# -- escalation ------------------------------------------------------------------------------


def test_a_task_waiting_past_its_queue_time_escalates_once_and_may_preempt() -> None:
    scheduler, _ = cluster(node("a", gpus=2))
    scheduler.handle(profiled("victim", gpus=2, when=1, priority="low", preemptible=True))
    scheduler.handle(running("victim", 2))
    late = profiled("late", gpus=2, when=3, priority="low")
    sla = Sla(max_queue_time_seconds=60)
    late = late.model_copy(update={"task": late.task.model_copy(update={"sla": sla})})
    [waits] = scheduler.handle(late)
    assert isinstance(waits, TaskPending)  # the same priority: no preemption yet
    tick = NodeHealthReported(
        occurred_at=at(64), node_id="a", condition=NodeCondition.READY, score=100
    )
    decisions = scheduler.handle(tick)
    [escalated] = [d for d in decisions if isinstance(d, TaskEscalated)]
    assert (escalated.task_id, escalated.priority, escalated.escalated_priority) == (
        "late",
        100,
        500,
    )
    assert escalated.waited_seconds == 61
    [preempted] = [d for d in decisions if isinstance(d, TaskPreempted)]
    assert (preempted.task_id, preempted.preempted_by) == ("victim", "late")
    assert preempted.must_stop_by == at(94)
    again = scheduler.handle(tick.model_copy(update={"occurred_at": at(70)}))
    assert not [d for d in again if isinstance(d, TaskEscalated)]


# -- cancellation ----------------------------------------------------------------------------


def test_cancelling_takes_a_waiting_task_off_the_queue_and_frees_a_placed_one() -> None:
    scheduler, _ = cluster(node("a", gpus=2))
    scheduler.handle(profiled("placed", gpus=2, when=1))
    scheduler.handle(profiled("head", gpus=2, when=2))
    assert scheduler.backfill["default"].task_id == "head"
    [gone] = scheduler.handle(status("head", 3, TaskStatus.CANCELLED))
    assert isinstance(gone, TaskEnded)
    assert (gone.task_id, gone.status, gone.allocation_id) == ("head", "cancelled", None)
    assert "head" not in scheduler.pending
    released, ended = scheduler.handle(status("placed", 4, TaskStatus.CANCELLED))
    assert isinstance(released, AllocationReleased)
    assert released.reason == "cancelled"
    assert isinstance(ended, TaskEnded)
    assert (ended.status, ended.allocation_id) == ("cancelled", released.allocation_id)
    assert scheduler.handle(status("nobody", 5, TaskStatus.CANCELLED)) == []
    [placed] = scheduler.handle(profiled("next", gpus=2, when=6))
    assert isinstance(placed, AllocationGranted)  # the cancelled head keeps nothing


# -- pending reasons -------------------------------------------------------------------------


def test_pending_reasons_follow_the_cluster_and_are_sent_only_when_their_kind_changes() -> None:
    scheduler, _ = cluster(node("a", gpus=2))
    scheduler.handle(profiled("holder", gpus=2, when=1))
    [first] = scheduler.handle(profiled("waits", gpus=2, when=2))
    assert isinstance(first, TaskPending)
    assert first.summary == "0/1 nodes available: 1 node has fewer than 2 free GPUs"
    heartbeat = NodeHealthReported(
        occurred_at=at(3), node_id="a", condition=NodeCondition.READY, score=100
    )
    scheduler.handle(heartbeat)
    small = node("small", gpus=1, gpu_memory_mb=16384)
    changed = scheduler.handle(NodeTopologyReported(occurred_at=at(4), node=small))
    # the same kind of reason (too few GPUs) on more nodes: not news for AllData, but the
    # live reason follows
    assert [d for d in changed if isinstance(d, TaskPending)] == []
    assert (
        scheduler.pending["waits"].last_summary
        == "0/2 nodes available: 2 nodes have fewer than 2 free GPUs"
    )
    same = NodeTopologyReported(occurred_at=at(5), node=small)
    assert [d for d in scheduler.handle(same) if isinstance(d, TaskPending)] == []


def test_replay_with_gangs_backfill_and_cancels_is_identical() -> None:
    _, log = cluster(node("a", gpus=8), node("b", gpus=4), node("c", gpus=4))
    log = list(log)
    for i in range(24):
        extra = {"gang_size": 2} if i % 5 == 0 else {}
        priority = [100, "medium", 700, "high"][i % 4]
        log.append(
            profiled(
                f"t{i}", when=i, gpus=1 + i % 4, priority=priority, tenant="ab"[i % 2], **extra
            )
        )
        if i % 3 == 0:
            log.append(status(f"t{i // 2}", i + 0.5, TaskStatus.CANCELLED))
    log += [status(f"t{i}", 40 + i, TaskStatus.SUCCEEDED) for i in range(0, 24, 2)]

    def replay() -> list[str]:
        scheduler = Scheduler()
        return [d.model_dump_json() for e in log for d in scheduler.handle(e)]

    first = replay()
    assert first == replay()
    assert any('"gang_index":1' in d for d in first)


def test_restore_keeps_gangs_heads_escalations_and_preemptions() -> None:
    scheduler, _ = cluster(node("a", gpus=4), node("b", gpus=4))
    scheduler.handle(profiled("victim", gpus=4, when=1, priority="low", preemptible=True))
    scheduler.handle(running("victim", 2))
    scheduler.handle(profiled("gang", gpus=2, when=3, gang_size=2, priority="low"))
    late = profiled("late", gpus=4, when=4, priority="low")
    late = late.model_copy(
        update={"task": late.task.model_copy(update={"sla": Sla(max_queue_time_seconds=10)})}
    )
    scheduler.handle(late)
    tick = NodeHealthReported(
        occurred_at=at(20), node_id="a", condition=NodeCondition.READY, score=100
    )
    decisions = scheduler.handle(tick)
    assert [d.task_id for d in decisions if isinstance(d, TaskEscalated)] == ["late"]
    assert [d.task_id for d in decisions if isinstance(d, TaskPreempted)] == ["victim"]

    restored = Scheduler()
    restored.restore(
        nodes=[(n.topology, n.condition, n.last_heartbeat_at) for n in scheduler.cluster.nodes],
        allocations=[
            replace(m, peers=[])
            for a in scheduler.allocations.values()
            for m in reversed(a.members())  # any order: restore sorts the members
        ],
        pending=[replace(t) for t in scheduler.pending.values()],
        next_seq=scheduler.next_seq,
    )
    assert [m.node for m in restored.allocations["gang"].members()] == ["b", "b"]
    assert restored.allocations["victim"].yield_by == at(50)
    assert restored.pending["late"].escalated
    assert restored.backfill == scheduler.backfill
    for n, m in zip(restored.cluster.nodes, scheduler.cluster.nodes, strict=True):
        assert (n.gpu_milli_free, n.cpu_free, n.memory_free_mb) == (
            m.gpu_milli_free,
            m.cpu_free,
            m.memory_free_mb,
        )
    later = restored.handle(tick.model_copy(update={"occurred_at": at(30)}))
    assert not [d for d in later if isinstance(d, TaskEscalated | TaskPreempted)]
