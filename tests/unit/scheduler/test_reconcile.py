"""Reconciling against reality (domain/reconcile.py, issue 27 item 7): the core's periodic
check of its ledger against itself and against what nodes report running. An allocation its
node has not run past the grace is released; one a node runs that the core does not hold
blocks its cards until it goes; a node held past capacity is reported; running figures off
their allocations' sum are corrected. Normal lag (a reservation not yet confirmed, a release
the node has not acted on yet) is left alone, and an honest fleet never drifts."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from crater.contracts import (
    AllocationDriftFound,
    AllocationGranted,
    AllocationReleased,
    DriftAction,
    DriftKind,
    Event,
    GpuProcess,
    NodeCondition,
    NodeHealthReported,
    NodeTopologyReported,
    RestartOn,
    RestartPolicy,
    RunningAllocation,
    TaskEnded,
    TaskPending,
    TaskStatus,
    TaskStatusReported,
)
from crater.scheduler.domain.cluster import Node
from crater.scheduler.domain.core import Scheduler, SchedulerConfig
from crater.scheduler.domain.mig import MigProfile
from crater.scheduler.domain.quotas import Usage
from crater.scheduler.domain.reconcile import figure_differences
from tests.support.topologies import node
from tests.unit.scheduler.test_core import profiled
from tests.unit.scheduler.test_retry_fast_path import config as random_config
from tests.unit.scheduler.test_retry_fast_path import events as random_events
from tests.unit.scheduler.test_retry_fast_path import steps

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def core(interval: float = 10.0, grace: float = 30.0, **config: object) -> Scheduler:
    scheduler = Scheduler(
        config=SchedulerConfig(
            reconcile_interval_seconds=interval,
            reconcile_grace_seconds=grace,
            **config,  # type: ignore[arg-type]
        )
    )
    for topology in (node("a", gpus=4), node("b", gpus=4)):
        scheduler.handle(NodeTopologyReported(occurred_at=at(0), node=topology))
    return scheduler


def heartbeat(
    name: str, when: float, running: list[RunningAllocation] | None
) -> NodeHealthReported:
    return NodeHealthReported(
        occurred_at=at(when),
        node_id=name,
        condition=NodeCondition.READY,
        score=100,
        running=running,
    )


def inventory(*grants: AllocationGranted) -> list[RunningAllocation]:
    return [
        RunningAllocation(allocation_id=g.allocation_id, task_id=g.task_id, gpu_ids=g.gpu_ids)
        for g in grants
    ]


def drifts(decisions: list[Event]) -> list[AllocationDriftFound]:
    return [d for d in decisions if isinstance(d, AllocationDriftFound)]


def place(scheduler: Scheduler, task_id: str, when: float, **needs: object) -> AllocationGranted:
    decisions = scheduler.handle(profiled(task_id, when=when, **needs))
    [grant] = [d for d in decisions if isinstance(d, AllocationGranted)]
    return grant


def confirm(scheduler: Scheduler, grant: AllocationGranted, when: float) -> None:
    report = TaskStatusReported(
        occurred_at=at(when),
        task_id=grant.task_id,
        allocation_id=grant.allocation_id,
        status=TaskStatus.RUNNING,
    )
    assert scheduler.handle(report) == []


def beat_both(scheduler: Scheduler, when: float, a: list[RunningAllocation]) -> list[Event]:
    """A heartbeat of each node (b runs nothing): the clock moves, passes fall due."""
    return scheduler.handle(heartbeat("a", when, a)) + scheduler.handle(heartbeat("b", when, []))


def test_an_allocation_its_node_stopped_running_is_released_after_the_grace() -> None:
    scheduler = core()
    grant = place(scheduler, "lost-run", 1, gpus=2)
    confirm(scheduler, grant, 2)
    seen: list[Event] = []
    for second in range(3, 36):  # it runs: the node reports it, nothing is found
        seen += beat_both(scheduler, second, inventory(grant))
    assert drifts(seen) == []
    # the agent restarted and forgot it: from 36 on the node reports nothing
    for second in range(36, 65):
        seen += beat_both(scheduler, second, [])
    assert drifts(seen) == [], "within the grace (30 s) of the first report without it"
    for second in range(65, 90):
        seen += beat_both(scheduler, second, [])
    [drift] = drifts(seen)
    assert (drift.kind, drift.action) == (DriftKind.ORPHANED_ALLOCATION, DriftAction.RELEASED)
    assert (drift.node, drift.allocation_id, drift.task_id) == (
        "a",
        grant.allocation_id,
        "lost-run",
    )
    assert "has not reported it running" in drift.reason
    assert "grace 30 s" in drift.reason
    [released] = [d for d in seen if isinstance(d, AllocationReleased)]
    assert released.reason == "failed"
    [ended] = [d for d in seen if isinstance(d, TaskEnded)]
    assert ended.status == "failed"
    assert "orphaned allocation" in ended.reason
    assert "lost-run" not in scheduler.allocations
    assert scheduler.cluster.get("a").whole_gpus_free == 4  # type: ignore[union-attr]
    assert scheduler.tally["drift:orphaned-allocation:released"] == 1


def test_an_orphaned_allocation_is_retried_by_its_restart_policy() -> None:
    scheduler = core()
    event = profiled("retried", when=1, gpus=1)
    policy = RestartPolicy(when=[RestartOn.FAILURE], max_attempts=2)
    event = event.model_copy(
        update={"task": event.task.model_copy(update={"restart_policy": policy})}
    )
    [grant] = [d for d in scheduler.handle(event) if isinstance(d, AllocationGranted)]
    confirm(scheduler, grant, 2)
    seen: list[Event] = []
    for second in range(3, 80):
        seen += beat_both(scheduler, second, [])
    [drift] = drifts(seen)
    assert drift.allocation_id == grant.allocation_id
    [retry] = [d for d in seen if isinstance(d, TaskPending)]
    assert retry.attempt == 2
    [again] = [d for d in seen if isinstance(d, AllocationGranted)]
    assert again.attempt == 2
    assert again.node == "b", "away from the node that lost it"
    assert not [d for d in seen if isinstance(d, TaskEnded)]


def test_a_reservation_not_yet_confirmed_is_not_reconciled_away() -> None:
    """The node has not started it yet: the reservation's own expiry decides, not the pass."""
    scheduler = core(reservation_timeout_ms=3_600_000)
    place(scheduler, "slow-start", 1, gpus=1)
    seen: list[Event] = []
    for second in range(2, 300):
        seen += beat_both(scheduler, second, [])
    assert drifts(seen) == []
    assert "slow-start" in scheduler.allocations


def test_an_end_lagging_in_the_report_stream_is_waited_for() -> None:
    """The node dropped the allocation because the task ended; its `succeeded` lags in the
    task reports' own stream while heartbeats flow. The pass waits for the reports of that
    time, so the task ends as it did, not as an orphan."""
    scheduler = core(confirmation_lag_seconds=300)
    grant = place(scheduler, "done", 1, gpus=1)
    confirm(scheduler, grant, 2)
    seen: list[Event] = []
    for second in range(3, 36):
        seen += beat_both(scheduler, second, inventory(grant))
    for second in range(36, 150):  # gone from the node, its end not consumed yet
        seen += beat_both(scheduler, second, [])
    assert drifts(seen) == []
    late = TaskStatusReported(
        occurred_at=at(35), task_id="done", allocation_id=grant.allocation_id, status="succeeded"
    )
    decisions = scheduler.handle(late)
    [ended] = [d for d in decisions if isinstance(d, TaskEnded)]
    assert ended.status == "succeeded"
    for second in range(150, 200):
        seen += beat_both(scheduler, second, [])
    assert drifts(seen) == []


def test_a_node_without_an_inventory_is_not_judged() -> None:
    scheduler = core()
    grant = place(scheduler, "launcher-run", 1, gpus=1)
    confirm(scheduler, grant, 2)
    seen: list[Event] = []
    for second in range(3, 200):
        seen += scheduler.handle(heartbeat("a", second, None))
        seen += scheduler.handle(heartbeat("b", second, None))
    assert drifts(seen) == []
    assert "launcher-run" in scheduler.allocations


def test_a_task_the_core_does_not_hold_blocks_its_cards_until_it_goes() -> None:
    scheduler = core()
    stranger = RunningAllocation(allocation_id="ghost-a1", task_id="ghost", gpu_ids=[0, 1])
    seen: list[Event] = []
    for second in range(1, 25):  # within the grace: maybe a release the node is acting on
        seen += beat_both(scheduler, second, [stranger])
    assert drifts(seen) == []
    node_a = scheduler.cluster.get("a")
    assert node_a is not None
    assert node_a.whole_gpus_free == 4
    for second in range(25, 45):
        seen += beat_both(scheduler, second, [stranger])
    [held] = drifts(seen)
    assert (held.kind, held.action, held.gpu_ids) == (
        DriftKind.UNKNOWN_ALLOCATION,
        DriftAction.HELD,
        [0, 1],
    )
    assert "does not hold there" in held.reason
    assert "GPUs 0,1 count busy" in held.reason
    assert node_a.whole_gpus_free == 2
    assert node_a.blocked == {0: 1000, 1: 1000}
    # a 4-GPU task cannot go on a; a 2-GPU one goes on the free cards only
    decisions = scheduler.handle(profiled("four", when=46, gpus=4))
    [four] = [d for d in decisions if isinstance(d, AllocationGranted)]
    assert four.node == "b"
    two = place(scheduler, "two", 47, gpus=2)
    assert two.node == "a"
    assert set(two.gpu_ids) == {2, 3}
    confirm(scheduler, two, 48)
    # the stranger goes: its cards are free again at the next pass
    seen = []
    for second in range(48, 70):
        seen += scheduler.handle(heartbeat("a", second, inventory(two)))
        seen += scheduler.handle(heartbeat("b", second, inventory(four)))
    [freed] = drifts(seen)
    assert (freed.kind, freed.action, freed.gpu_ids) == (
        DriftKind.UNKNOWN_ALLOCATION,
        DriftAction.FREED,
        [0, 1],
    )
    assert node_a.blocked == {}
    assert node_a.whole_gpus_free == 2


def test_a_blocked_card_stays_blocked_when_the_cores_own_allocation_there_ends() -> None:
    scheduler = core()
    grant = place(scheduler, "mine", 1, gpus=1)
    confirm(scheduler, grant, 2)
    card = grant.gpu_ids[0]
    intruder = RunningAllocation(allocation_id="x-1", task_id="x", gpu_ids=[card])
    seen: list[Event] = []
    for second in range(3, 50):
        seen += beat_both(scheduler, second, [*inventory(grant), intruder])
    assert [d.action for d in drifts(seen)] == [DriftAction.HELD]
    node_a = scheduler.cluster.get("a")
    assert node_a is not None
    done = TaskStatusReported(
        occurred_at=at(50), task_id="mine", allocation_id=grant.allocation_id, status="succeeded"
    )
    scheduler.handle(done)
    assert node_a.gpu_milli_free[card] == 0, "the intruder still runs there"
    for second in range(51, 70):
        seen += beat_both(scheduler, second, [])
    assert node_a.gpu_milli_free[card] == 1000
    assert not node_a.blocked


def test_processes_on_a_card_held_free_block_it_until_they_go() -> None:
    """A node whose probe runs no tasks still lists the processes on its cards (NVML): one
    on a card the scheduler holds free (a job started by hand) blocks it; one on a card a
    placed task holds is that task's business."""
    scheduler = core()
    grant = place(scheduler, "placed", 1, gpus=1)
    confirm(scheduler, grant, 2)
    mine = grant.gpu_ids[0]
    other = 3 if mine != 3 else 2

    def beat(when: float, processes: list[GpuProcess]) -> list[Event]:
        report = heartbeat("a", when, None).model_copy(update={"gpu_processes": processes})
        return scheduler.handle(report)

    squatters = [
        GpuProcess(gpu=mine, pid=100, memory_mb=30000),  # the placed task's own
        GpuProcess(gpu=other, pid=4242, memory_mb=2048),
        GpuProcess(gpu=other, pid=4243, memory_mb=0),
    ]
    seen: list[Event] = []
    for second in range(3, 50):
        seen += beat(second, squatters)
    [held] = drifts(seen)
    assert (held.kind, held.action, held.gpu_ids) == (
        DriftKind.UNKNOWN_PROCESS,
        DriftAction.HELD,
        [other],
    )
    assert held.allocation_id is None
    assert f"processes 4242 (2048 MiB), 4243 on GPU {other}" in held.reason
    assert "a card the scheduler holds free" in held.reason
    node_a = scheduler.cluster.get("a")
    assert node_a is not None
    assert node_a.whole_gpus_free == 2
    assert "placed" in scheduler.allocations, "no inventory of allocations: no orphan judged"
    seen = []
    for second in range(50, 80):
        seen += beat(second, squatters[:1])
    [freed] = drifts(seen)
    assert (freed.kind, freed.action, freed.gpu_ids) == (
        DriftKind.UNKNOWN_PROCESS,
        DriftAction.FREED,
        [other],
    )
    assert node_a.whole_gpus_free == 3


def test_running_figures_off_their_allocations_sum_are_corrected() -> None:
    scheduler = core()
    grant = place(scheduler, "held", 1, gpus=2, cores=4, mem=16000)
    confirm(scheduler, grant, 2)
    node_a = scheduler.cluster.get("a")
    assert node_a is not None
    # a bug gave one card back twice and lost track of memory (the class of bug that forces
    # restarts elsewhere): nothing else would ever notice
    node_a.gpu_milli_free[grant.gpu_ids[0]] = 1000
    node_a.memory_free_mb += 5000
    scheduler.cluster.refresh("a")
    scheduler.quotas.used["default"] = Usage(gpus=7)
    seen: list[Event] = []
    for second in range(3, 15):
        seen += beat_both(scheduler, second, inventory(grant))
    corrected = drifts(seen)
    assert [(d.kind, d.action, d.node) for d in corrected] == [
        (DriftKind.LEDGER_MISMATCH, DriftAction.CORRECTED, "a"),
        (DriftKind.LEDGER_MISMATCH, DriftAction.CORRECTED, None),
    ]
    assert f"GPU {grant.gpu_ids[0]} 1000 thousandths free, recomputed 0" in corrected[0].reason
    assert "memory_free_mb" in corrected[0].reason
    assert "tenant default holds 7 GPUs" in corrected[1].reason
    assert node_a.gpu_milli_free[grant.gpu_ids[0]] == 0
    assert scheduler.quotas.used["default"].gpus == 2
    # a third card is not offered: the 3-GPU task goes to b
    three = place(scheduler, "three", 16, gpus=3)
    assert three.node == "b"
    assert scheduler.tally["drift:ledger-mismatch:corrected"] == 2


def test_a_node_held_past_its_capacity_is_reported_once() -> None:
    scheduler = core()
    grant = place(scheduler, "big", 1, gpus=4)
    confirm(scheduler, grant, 2)
    # the node comes back with two cards fewer (fallen off the bus): what it holds is more
    shrunk = node("a", gpus=2)
    assert scheduler.handle(NodeTopologyReported(occurred_at=at(3), node=shrunk)) == []
    seen: list[Event] = []
    for second in range(4, 60):
        seen += beat_both(scheduler, second, inventory(grant))
    [over] = drifts(seen)
    assert (over.kind, over.action, over.node) == (
        DriftKind.OVER_CAPACITY,
        DriftAction.REPORTED,
        "a",
    )
    assert "holds GPUs 2,3, which the node no longer reports" in over.reason
    assert "big" in scheduler.allocations  # no task is stopped for it


def test_nothing_is_reconciled_when_switched_off() -> None:
    scheduler = core(interval=0)
    grant = place(scheduler, "kept", 1, gpus=1)
    confirm(scheduler, grant, 2)
    seen: list[Event] = []
    for second in range(3, 300):
        seen += beat_both(scheduler, second, [])
    assert drifts(seen) == []
    assert "kept" in scheduler.allocations


def test_an_old_heartbeat_is_no_fresher_inventory() -> None:
    scheduler = core()
    scheduler.handle(heartbeat("a", 10, []))
    scheduler.handle(heartbeat("a", 5, [RunningAllocation(allocation_id="z", task_id="z")]))
    assert scheduler.inventories["a"].running == {}


# -- properties -------------------------------------------------------------------------------


@settings(max_examples=120, deadline=None)
@given(steps, st.booleans())
def test_a_correct_ledger_never_drifts_and_decides_as_without_the_check(
    script: list[tuple[str, object]], random_lab: bool
) -> None:
    """Random workloads (gangs, shares, quotas, preemption, escalation, cancels, nodes going
    NotReady): a pass after every event finds nothing, and every decision is the one the core
    makes with the check off."""
    checked = Scheduler(config=replace(random_config(random_lab), reconcile_interval_seconds=0.5))
    plain = Scheduler(config=replace(random_config(random_lab), reconcile_interval_seconds=0))
    for event in random_events(script):
        expected = [d.model_dump() for d in plain.handle(event)]
        assert [d.model_dump() for d in checked.handle(event)] == expected, event
    assert checked.tally == plain.tally


def honest_run(seed: int, steps_count: int = 250) -> tuple[Scheduler, list[Event]]:
    """A fleet whose agents report exactly what they run: a grant starts a few seconds later
    (if not released first), runs a while, ends; releases take effect a few seconds late;
    the agents' heartbeats list what runs at their time."""
    rng = random.Random(seed)
    scheduler = core(interval=5, grace=20, reservation_timeout_ms=30_000)
    runs: dict[str, dict[str, tuple[AllocationGranted, float]]] = {"a": {}, "b": {}}
    starting: list[tuple[float, AllocationGranted]] = []
    stopping: list[tuple[float, str, str]] = []
    ending: list[tuple[float, AllocationGranted]] = []
    seen: list[Event] = []
    clock = 1.0

    def take(decisions: list[Event]) -> None:
        seen.extend(decisions)
        for d in decisions:
            if isinstance(d, AllocationGranted):
                starting.append((clock + rng.uniform(0.5, 8), d))
            elif isinstance(d, AllocationReleased):
                stopping.append((clock + rng.uniform(0, 10), d.node, d.allocation_id))

    for i in range(steps_count):
        clock += rng.uniform(0.2, 2.0)
        if rng.random() < 0.3:
            take(
                scheduler.handle(profiled(f"t{i}", when=clock, gpus=rng.choice([1, 1, 2]), cores=2))
            )
        for due, grant in [s for s in starting if s[0] <= clock]:
            starting.remove((due, grant))
            if grant.allocation_id in scheduler.held_by:
                runs[grant.node][grant.allocation_id] = (grant, due)
                ending.append((due + rng.uniform(5, 60), grant))
                report = TaskStatusReported(
                    occurred_at=at(clock),
                    task_id=grant.task_id,
                    allocation_id=grant.allocation_id,
                    status=TaskStatus.RUNNING,
                )
                take(scheduler.handle(report))
        for due, grant in [e for e in ending if e[0] <= clock]:
            ending.remove((due, grant))
            if runs[grant.node].pop(grant.allocation_id, None) is not None:
                status = rng.choice([TaskStatus.SUCCEEDED, TaskStatus.FAILED])
                report = TaskStatusReported(
                    occurred_at=at(clock),
                    task_id=grant.task_id,
                    allocation_id=grant.allocation_id,
                    status=status,
                )
                take(scheduler.handle(report))
        for due, name, allocation_id in [s for s in stopping if s[0] <= clock]:
            stopping.remove((due, name, allocation_id))
            runs[name].pop(allocation_id, None)
        for name in ("a", "b"):
            take(
                scheduler.handle(
                    heartbeat(name, clock, inventory(*[g for g, _ in runs[name].values()]))
                )
            )
    return scheduler, seen


def test_an_honest_fleet_never_drifts() -> None:
    for seed in range(8):
        _, seen = honest_run(seed)
        assert drifts(seen) == [], seed
        assert sum(isinstance(d, AllocationGranted) for d in seen) > 10
        assert any(isinstance(d, AllocationReleased) for d in seen)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(0, 3))
def test_a_forgotten_allocation_is_always_found_and_nothing_else(seed: int, victim: int) -> None:
    """An honest fleet whose agent forgets one running allocation (a restart that lost it):
    that allocation, and only it, is released as orphaned, within the grace and a pass."""
    scheduler, _ = honest_run(seed, steps_count=80)
    running = [
        m
        for head in scheduler.allocations.values()
        for m in head.members()
        if m.running and m.node == "a"
    ]
    clock = (scheduler.clock or T0) - T0
    base = clock.total_seconds() + 1
    if not running:
        return
    lost = sorted(running, key=lambda m: m.allocation_id)[victim % len(running)]
    kept = [
        RunningAllocation(allocation_id=m.allocation_id, task_id=m.task_id, gpu_ids=list(m.gpu_ids))
        for m in running
        if m is not lost
    ]
    seen: list[Event] = []
    for second in range(40):  # 20 s grace + a 5 s pass, with room
        seen += scheduler.handle(heartbeat("a", base + second, kept))
        seen += scheduler.handle(
            heartbeat(
                "b",
                base + second,
                [
                    RunningAllocation(allocation_id=m.allocation_id, task_id=m.task_id)
                    for h in scheduler.allocations.values()
                    for m in h.members()
                    if m.node == "b"
                ],
            )
        )
    found = drifts(seen)
    assert [(d.kind, d.allocation_id) for d in found] == [
        (DriftKind.ORPHANED_ALLOCATION, lost.allocation_id)
    ]
    assert lost.task_id not in scheduler.allocations


A100_MIG = ["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"]
node_ops = st.lists(
    st.one_of(
        st.tuples(st.just("take"), st.integers(0, 3), st.sampled_from(["whole", "share", "mig"])),
        st.tuples(st.just("give"), st.integers(0, 20), st.just("")),
        st.tuples(st.just("block"), st.integers(0, 3), st.just("")),
        st.tuples(st.just("unblock"), st.integers(0, 3), st.just("")),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(node_ops)
def test_blocked_cards_read_as_recomputed_whatever_is_taken_and_given_back(
    ops: list[tuple[str, int, str]],
) -> None:
    """Cards blocked for an unknown task, under whole cards, shares and MIG slices taken and
    given back in any order: the node's figures always equal a fresh node holding what is
    held and blocking what is blocked (what the pass recomputes), a blocked card is never
    offered, and with everything gone the node is whole again."""
    topology = node("m", gpus=4)
    cards = [
        g.model_copy(update={"mig_capable": True, "mig_profiles": A100_MIG}) for g in topology.gpus
    ]
    live = Node.empty(topology.model_copy(update={"gpus": cards}))
    held: list[tuple[tuple[int, ...], int, str | None]] = []
    for op, arg, kind in ops:
        if op == "take":
            card, free = arg, live.gpu_milli_free[arg]
            if kind == "whole" and free == 1000 and card not in live.mig_used:
                held.append(((card,), 1000, None))
            elif kind == "share" and free >= 250 and card not in live.mig_used:
                held.append(((card,), 250, None))
            elif kind == "mig" and live.mig_fits(MigProfile.parse("1g.10gb"), card):
                held.append(((card,), 1000, "1g.10gb"))
            else:
                continue
            live.take(held[-1][0], held[-1][1], (), 0, None, held[-1][2])
        elif op == "give" and held:
            gpus, milli, mig = held.pop(arg % len(held))
            live.give_back(gpus, milli, (), 0, None, mig)
        elif op == "block":
            live.block(arg)
        elif op == "unblock":
            live.unblock(arg)
        fresh = live.emptied()
        for gpus, milli, mig in held:
            fresh.take(gpus, milli, (), 0, None, mig)
        for card in sorted(live.blocked):
            fresh.block(card)
        assert figure_differences(live, fresh) == [], (op, arg, kind)
        assert all(live.gpu_milli_free[c] == 0 for c in live.blocked)
    for gpus, milli, mig in held:
        live.give_back(gpus, milli, (), 0, None, mig)
    for card in list(live.blocked):
        live.unblock(card)
    assert live.gpu_milli_free == [1000] * 4
    assert live.mig_used == {}
