"""Gangs preempt all or nothing, and a task cancelled before the scheduler received it ends
cancelled when it arrives, never placed."""

from __future__ import annotations

from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    Event,
    TaskEnded,
    TaskPending,
    TaskPreempted,
    TaskStatus,
    TaskStatusReported,
)
from crater.scheduler.domain.core import Scheduler
from tests.support.topologies import node
from tests.unit.scheduler.test_core import cluster, profiled, running
from tests.unit.scheduler.test_queue_rules import grants, status

LOW = {"priority": "low", "preemptible": True}


def preempted(decisions: list[Event]) -> list[tuple[str, str]]:
    return sorted((d.task_id, d.node) for d in decisions if isinstance(d, TaskPreempted))


def busy(scheduler: Scheduler, task_id: str, gpus: int, when: float, **extra: object) -> None:
    [granted] = scheduler.handle(profiled(task_id, gpus=gpus, when=when, **extra))
    assert isinstance(granted, AllocationGranted), granted
    scheduler.handle(running(task_id, when + 0.5))


# -- gangs preempt -----------------------------------------------------------------------------


def test_a_spread_gang_preempts_on_every_node_it_needs_and_starts_when_they_yield() -> None:
    scheduler, _ = cluster(node("n1", gpus=4), node("n2", gpus=4))
    busy(scheduler, "low-a", 4, 1, **LOW)
    busy(scheduler, "low-b", 4, 2, **LOW)
    decisions = scheduler.handle(profiled("ddp", gpus=4, when=3, gang_size=2, priority="high"))
    assert isinstance(decisions[0], TaskPending)
    assert preempted(decisions) == [("low-a", "n1"), ("low-b", "n2")]
    assert scheduler.pending["ddp"].nominated == ("n1", "n2")
    assert all(
        d.preempted_by == "ddp" and d.grace_period_seconds == 30
        for d in decisions
        if isinstance(d, TaskPreempted)
    )
    scheduler.handle(status("low-a", 4, TaskStatus.CANCELLED))
    assert "ddp" in scheduler.pending  # one member's room is not enough: all or nothing
    after = scheduler.handle(status("low-b", 5, TaskStatus.CANCELLED))
    assert [(g.task_id, g.node, g.gang_index) for g in grants(after)] == [
        ("ddp", "n1", 0),
        ("ddp", "n2", 1),
    ]


def test_a_gang_preempts_nobody_unless_every_member_would_fit() -> None:
    scheduler, _ = cluster(node("n1", gpus=4), node("n2", gpus=4))
    busy(scheduler, "low", 4, 1, **LOW)
    busy(scheduler, "kept", 4, 2, priority="low")  # not preemptible
    decisions = scheduler.handle(profiled("ddp", gpus=4, when=3, gang_size=2, priority="high"))
    assert [type(d) for d in decisions] == [TaskPending]
    assert scheduler.pending["ddp"].nominated == ()
    assert all(a.yield_by is None for a in scheduler.allocations.values())


def test_a_spread_gang_chooses_the_fewest_victims() -> None:
    # one victim frees room for both members on n1; on n2 it would take two
    scheduler, _ = cluster(node("n1", gpus=4), node("n2", gpus=4))
    busy(scheduler, "whole", 4, 1, **LOW)
    busy(scheduler, "half-1", 2, 2, **LOW)
    busy(scheduler, "half-2", 2, 3, **LOW)
    decisions = scheduler.handle(profiled("ddp", gpus=2, when=4, gang_size=2, priority="high"))
    assert preempted(decisions) == [("whole", "n1")]
    assert scheduler.pending["ddp"].nominated == ("n1",)


def test_a_same_node_gang_preempts_on_one_node_only() -> None:
    scheduler, _ = cluster(node("big", gpus=8), node("small", gpus=4))
    busy(scheduler, "small-low", 4, 1, **LOW)
    busy(scheduler, "big-low-1", 4, 2, **LOW)
    busy(scheduler, "big-low-2", 4, 3, **LOW)
    same = {"gpu": "same-node"}
    decisions = scheduler.handle(
        profiled("tp", gpus=4, when=4, gang_size=2, affinity=same, priority="high")
    )
    assert preempted(decisions) == [("big-low-1", "big"), ("big-low-2", "big")]
    released = scheduler.handle(status("big-low-1", 5, TaskStatus.CANCELLED))
    assert not grants(released)
    placed = grants(scheduler.handle(status("big-low-2", 6, TaskStatus.CANCELLED)))
    assert [(g.node, g.gang_index) for g in placed] == [("big", 0), ("big", 1)]


def test_a_victim_gang_yields_whole_for_a_preempting_gang() -> None:
    scheduler, _ = cluster(node("n1", gpus=4), node("n2", gpus=4), node("n3", gpus=4))
    scheduler.handle(profiled("low-gang", gpus=4, when=1, gang_size=2, **LOW))
    scheduler.handle(running("low-gang", 1.5))
    busy(scheduler, "other", 4, 2, priority="low")
    decisions = scheduler.handle(profiled("ddp", gpus=4, when=3, gang_size=2, priority="high"))
    assert [task for task, _ in preempted(decisions)] == ["low-gang", "low-gang"]


def test_gang_preemption_replays_identically() -> None:
    fleet = (node("n1", gpus=4), node("n2", gpus=4), node("n3", gpus=4))
    events: list[Event] = []
    for i, gpus in enumerate((2, 2, 4, 2)):
        events += [profiled(f"low-{i}", gpus=gpus, when=i, **LOW), running(f"low-{i}", i + 0.5)]
    events += [
        profiled("ddp", gpus=4, when=9, gang_size=2, priority="high"),
        status("low-2", 10, TaskStatus.CANCELLED),
        status("low-0", 11, TaskStatus.CANCELLED),
        status("low-1", 12, TaskStatus.CANCELLED),
    ]

    def run() -> list[Event]:
        scheduler, _ = cluster(*fleet)
        return [d for e in events for d in scheduler.handle(e)]

    first, second = run(), run()
    assert first == second
    assert preempted(first)
    assert {g.task_id for g in grants(first)} >= {"ddp"}


# -- cancelled before the scheduler knew it -----------------------------------------------------


def cancel(task_id: str, when: float) -> TaskStatusReported:
    return status(task_id, when, TaskStatus.CANCELLED)


def test_a_task_cancelled_before_it_arrives_ends_cancelled_and_is_never_placed() -> None:
    scheduler, _ = cluster(node("n1", gpus=4))
    assert scheduler.handle(cancel("early", 1)) == []
    arrival = profiled("early", gpus=1, when=2)
    [ended] = scheduler.handle(arrival)
    assert isinstance(ended, TaskEnded)
    assert (ended.task_id, ended.status) == ("early", TaskStatus.CANCELLED)
    assert ended.allocation_id is None
    assert "early" not in scheduler.pending
    assert "early" not in scheduler.allocations
    assert scheduler.cluster.nodes[0].whole_gpus_free == 4
    # the cancel delivered again, and the profile redelivered, change nothing
    assert scheduler.handle(cancel("early", 2.5)) == []
    assert scheduler.handle(arrival) == []
    [placed] = scheduler.handle(profiled("later", gpus=4, when=3))
    assert isinstance(placed, AllocationGranted)


def test_an_early_cancel_survives_a_restart_and_touches_only_its_task() -> None:
    scheduler, _ = cluster(node("n1", gpus=4))
    scheduler.handle(cancel("early", 1))
    restored = Scheduler()
    restored.restore(
        [(n.topology, n.condition, n.last_heartbeat_at) for n in scheduler.cluster.nodes],
        [],
        [],
        scheduler.next_seq,
        early_cancels=["early"],
    )
    [other] = restored.handle(profiled("other", gpus=1, when=2))
    assert isinstance(other, AllocationGranted)
    [ended] = restored.handle(profiled("early", gpus=1, when=3))
    assert isinstance(ended, TaskEnded)
    assert ended.status is TaskStatus.CANCELLED


def test_a_cancel_of_a_waiting_or_placed_task_is_no_early_cancel() -> None:
    scheduler, _ = cluster(node("n1", gpus=2))
    scheduler.handle(profiled("placed", gpus=2, when=1))
    scheduler.handle(profiled("waits", gpus=2, when=2))
    released = scheduler.handle(cancel("placed", 3))
    assert isinstance(released[0], AllocationReleased)
    scheduler.handle(cancel("waits", 4))
    assert scheduler.early_cancels == {}


def test_a_late_report_about_an_ended_allocation_is_no_early_cancel() -> None:
    scheduler, _ = cluster(node("n1", gpus=2))
    [granted] = scheduler.handle(profiled("done", gpus=2, when=1))
    assert isinstance(granted, AllocationGranted)
    scheduler.handle(status("done", 2, TaskStatus.SUCCEEDED))
    late = status("done", 3, TaskStatus.CANCELLED, allocation_id=granted.allocation_id)
    assert scheduler.handle(late) == []
    assert scheduler.early_cancels == {}
