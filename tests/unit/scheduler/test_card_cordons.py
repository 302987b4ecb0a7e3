"""Card faults in the core (docs/health.md): a heartbeat's faulty card is cordoned, not its
node; the task on it ends failed of kind node-fault and is retried elsewhere by its restart
policy, never on that card; the cordon lifts as the fault's action says (the card reported
healthy, or an operator); failure kinds (oom, node-fault, exit-code) key the restart policy;
live readings rank a card lower only where there are some."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    GpuCordonRequested,
    GpuFault,
    GpuProcess,
    NodeCondition,
    NodeHealthReported,
    NodeTopologyReported,
    RestartPolicy,
    TaskEnded,
    TaskPending,
    TaskProfiled,
    TaskStatus,
    TaskStatusReported,
)
from crater.scheduler.domain.core import Scheduler
from crater.scheduler.domain.pools import PoolPolicy
from tests.support.topologies import node
from tests.unit.scheduler.test_core import at, profiled
from tests.unit.scheduler.test_launcher_reports import health, launcher, placed
from tests.unit.scheduler.test_lifecycle_truth import of, report

SINCE = at(0.5)


def fault(gpu: int, action: str = "reset-card", since: datetime = SINCE, **kw: Any) -> GpuFault:
    body: dict[str, Any] = {"kind": "xid", "xid": 48} | kw
    return GpuFault(gpu=gpu, action=action, since=since, **body)


def beat(node_id: str, when: float, faults: list[GpuFault] | None, **kw: Any) -> NodeHealthReported:
    return NodeHealthReported(
        occurred_at=at(when),
        node_id=node_id,
        condition=kw.pop("condition", NodeCondition.READY),
        score=100,
        gpu_faults=faults,
        **kw,
    )


def fleet(*names: str, gpus: int = 2) -> Scheduler:
    scheduler = Scheduler()
    for name in names:
        scheduler.handle(NodeTopologyReported(occurred_at=at(0), node=node(name, gpus=gpus)))
    return scheduler


def submit(
    scheduler: Scheduler, task_id: str, at_s: float, gpus: int = 1, **policy: Any
) -> AllocationGranted | None:
    task = profiled(task_id, gpus=gpus, when=at_s)
    request = task.task
    if policy:
        restart = RestartPolicy(backoff_seconds=0, **policy)
        request = request.model_copy(update={"restart_policy": restart})
    decisions = scheduler.handle(
        TaskProfiled(occurred_at=at(at_s), task=request, prediction=task.prediction)
    )
    grants = of(AllocationGranted, decisions)
    return grants[0] if grants else None


def test_a_faulty_card_is_cordoned_its_task_retried_elsewhere_and_the_rest_stays_usable() -> None:
    scheduler = fleet("n1", "n2", gpus=2)
    grant = submit(scheduler, "r", 1, when=["failure"], max_attempts=3)
    assert grant is not None
    card = grant.gpu_ids[0]
    decisions = scheduler.handle(beat(grant.node, 2, [fault(card)]))
    [released] = of(AllocationReleased, decisions)
    assert released.reason.value == "failed"
    # Retried at once (no backoff) on the other node: the failed one is left while another
    # can hold it, and the faulty card is cordoned anyway.
    [again] = of(AllocationGranted, decisions)
    assert again.attempt == 2
    assert again.node != grant.node
    [pending] = of(TaskPending, decisions)
    assert f"GPU {card} of {grant.node} is cordoned: Xid 48" in pending.summary
    assert "node-fault" in pending.summary
    faulty = scheduler.cluster.get(grant.node)
    assert faulty is not None
    assert set(faulty.cordons) == {card}
    assert faulty.gpu_milli_free[card] == 0
    assert faulty.condition is NodeCondition.READY  # the node is not out
    # The node's other card still takes work; the cordoned one never does.
    placed = [submit(scheduler, f"o{i}", 3 + i / 10) for i in range(2)]
    cards = {(p.node, p.gpu_ids[0]) for p in placed if p is not None}
    assert (grant.node, 1 - card) in cards
    assert len(cards) == 2
    assert submit(scheduler, "w", 4) is None
    waiting = scheduler.pending["w"]
    assert "GpusCordoned" in {r.code for r in waiting.live_reasons}
    assert "only because cards are cordoned" in str(waiting.last_summary)


def test_the_cordon_lifts_when_the_card_reports_healthy_and_a_late_report_changes_nothing() -> None:
    scheduler = fleet("n1", gpus=2)
    scheduler.handle(beat("n1", 2, [fault(0)]))
    n1 = scheduler.cluster.get("n1")
    assert n1 is not None
    assert set(n1.cordons) == {0}
    scheduler.handle(beat("n1", 5, []))  # reset: healthy again
    assert n1.cordons == {}
    assert n1.gpu_milli_free == [1000, 1000]
    scheduler.handle(beat("n1", 4, [fault(0)]))  # an older report, delivered late
    assert n1.cordons == {}
    # A heartbeat that reads no faults at all (None) says no fault either.
    scheduler.handle(beat("n1", 6, [fault(1)]))
    scheduler.handle(beat("n1", 7, None))
    assert n1.cordons == {}


def test_an_operator_fault_waits_for_the_operator_and_the_same_occurrence_stays_lifted() -> None:
    scheduler = fleet("n1", gpus=2)
    remap = fault(1, "operator", kind="row-remap-failure", xid=None)
    scheduler.handle(beat("n1", 2, [remap]))
    n1 = scheduler.cluster.get("n1")
    assert n1 is not None
    scheduler.handle(beat("n1", 3, []))
    assert set(n1.cordons) == {1}  # healthy reports do not lift it
    assert "until an operator lifts it" in n1.cordons[1].reason
    lift = GpuCordonRequested(occurred_at=at(4), node_id="n1", gpu=1, cordon=False)
    _, changed = scheduler.cordons.on_request(lift)
    assert changed
    assert n1.cordons == {}
    assert n1.gpu_milli_free == [1000, 1000]
    scheduler.handle(beat("n1", 5, [remap]))  # the probe still reports that occurrence
    assert n1.cordons == {}
    later = fault(1, "operator", since=at(6), kind="row-remap-failure", xid=None)
    scheduler.handle(beat("n1", 7, [later]))  # a new occurrence cordons again
    assert set(n1.cordons) == {1}


def test_an_operator_cordons_a_card_and_what_runs_there_goes_on() -> None:
    scheduler = fleet("n1", gpus=2)
    grant = submit(scheduler, "t", 1)
    assert grant is not None
    card = grant.gpu_ids[0]
    decisions = scheduler.handle(
        GpuCordonRequested(
            occurred_at=at(2),
            node_id="n1",
            gpu=card,
            cordon=True,
            reason="fan noise",
            requested_by="ops",
        )
    )
    assert of(AllocationReleased, decisions) == []  # no fault: its task runs on
    n1 = scheduler.cluster.get("n1")
    assert n1 is not None
    assert n1.cordons[card].reason.startswith(f"GPU {card} of n1 is cordoned by ops: fan noise")
    scheduler.handle(beat("n1", 3, []))  # healthy reports leave an operator's cordon alone
    assert card in n1.cordons
    # Its task ends: the card stays out until the operator lifts the cordon.
    scheduler.handle(report("t", 4, TaskStatus.SUCCEEDED, allocation_id=grant.allocation_id))
    assert n1.gpu_milli_free[card] == 0
    scheduler.handle(GpuCordonRequested(occurred_at=at(5), node_id="n1", gpu=card, cordon=False))
    assert n1.gpu_milli_free[card] == 1000
    # A request naming no such card changes nothing.
    assert scheduler.cordons.on_request(
        GpuCordonRequested(occurred_at=at(6), node_id="n1", gpu=7, cordon=True)
    ) == ([], False)


def test_a_fault_that_needs_a_reboot_cordons_the_node() -> None:
    scheduler = fleet("n1", "n2", gpus=2)
    lost = fault(1, "reboot-node", kind="lost", xid=None)
    scheduler.handle(beat("n1", 2, [lost], condition=NodeCondition.NOT_READY))
    n1 = scheduler.cluster.get("n1")
    assert n1 is not None
    assert n1.node_cordon is not None
    # Even were the probe to say Ready, the cordon keeps new work off the node.
    scheduler.handle(beat("n1", 3, [lost]))
    placed = [submit(scheduler, f"t{i}", 4 + i) for i in range(3)]
    assert [p.node for p in placed if p is not None] == ["n2", "n2"]
    assert "NodeCordoned" in {r.code for r in scheduler.pending["t2"].live_reasons}
    scheduler.handle(beat("n1", 10, []))  # rebooted: healthy
    assert n1.node_cordon is None
    assert n1.cordons == {}


def test_a_task_whose_policy_does_not_retry_node_faults_ends_naming_the_card() -> None:
    scheduler = fleet("n1", gpus=1)
    grant = submit(scheduler, "t", 1, when=["failure"], on_failure_kinds=["oom"])
    assert grant is not None
    decisions = scheduler.handle(beat("n1", 2, [fault(0)]))
    [ended] = of(TaskEnded, decisions)
    assert ended.status is TaskStatus.FAILED
    assert "GPU 0 of n1 is cordoned: Xid 48" in ended.reason
    assert "does not retry failures of kind node-fault" in ended.reason


def test_oom_is_a_kind_the_restart_policy_keys_on() -> None:
    scheduler = fleet("n1", gpus=1)
    grant = submit(scheduler, "t", 1, when=["failure"], on_failure_kinds=["oom"], max_attempts=3)
    assert grant is not None
    oom = report("t", 2, TaskStatus.FAILED, allocation_id=grant.allocation_id, out_of_memory=True)
    decisions = scheduler.handle(oom)
    [again] = of(AllocationGranted, decisions)
    assert again.attempt == 2
    [pending] = of(TaskPending, decisions)
    assert "(oom)" in pending.summary
    # An ordinary failure is of kind exit-code: not retried by this policy.
    decisions = scheduler.handle(
        report("t", 3, TaskStatus.FAILED, allocation_id=again.allocation_id, exit_code=1)
    )
    [ended] = of(TaskEnded, decisions)
    assert "does not retry failures of kind exit-code" in ended.reason


def test_a_policy_without_kinds_retries_every_failure_as_before() -> None:
    scheduler = fleet("n1", gpus=1)
    grant = submit(scheduler, "t", 1, when=["failure"], max_attempts=2)
    assert grant is not None
    decisions = scheduler.handle(
        report("t", 2, TaskStatus.FAILED, allocation_id=grant.allocation_id, out_of_memory=True)
    )
    [pending] = of(TaskPending, decisions)
    assert pending.summary == "attempt 2 of 2 after the last ended failed"


def test_live_readings_rank_a_card_lower_and_only_where_there_are_some() -> None:
    scheduler = fleet("n1", "n2", gpus=1)
    first = submit(scheduler, "a", 1)
    assert first is not None
    # The same placement, with readings on the node it chose: it goes to the other one.
    again = fleet("n1", "n2", gpus=1)
    hot = GpuFault(gpu=0, kind="hot", action="none", since=SINCE, detail="90 C")
    again.handle(beat(first.node, 0.9, [hot]))
    moved = submit(again, "a", 1)
    assert moved is not None
    assert moved.node != first.node
    assert "LiveReadings" in {s.plugin for s in moved.scores}
    assert "LiveReadings" not in {s.plugin for s in first.scores}
    # Another process holding memory on a card ranks it lower too.
    third = fleet("n1", "n2", gpus=1)
    third.handle(
        beat(first.node, 0.9, None, gpu_processes=[GpuProcess(gpu=0, pid=7, memory_mb=30000)])
    )
    avoided = submit(third, "a", 1)
    assert avoided is not None
    assert avoided.node != first.node


def test_within_a_node_a_card_with_readings_is_taken_last() -> None:
    scheduler = fleet("n1", gpus=2)
    hot = GpuFault(gpu=0, kind="hot", action="none", since=SINCE, detail="92 C")
    scheduler.handle(beat("n1", 0.9, [hot]))
    first = submit(scheduler, "a", 1)
    assert first is not None
    assert first.gpu_ids == [1]  # card 0 is hot: without readings, card 0 comes first
    second = submit(scheduler, "b", 1.1)
    assert second is not None
    assert second.gpu_ids == [0]  # the hot card still takes work when it is all there is
    calm = fleet("n1", gpus=2)
    plain = submit(calm, "a", 1)
    assert plain is not None
    assert plain.gpu_ids == [0]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.sampled_from(["reset-card", "operator", None])),
        min_size=1,
        max_size=12,
    )
)
def test_a_cordoned_card_never_takes_a_task_and_lifts_give_everything_back(
    script: list[tuple[int, str | None]],
) -> None:
    scheduler = fleet("n1", gpus=3)
    n1 = scheduler.cluster.get("n1")
    assert n1 is not None
    for step, (card, action) in enumerate(script):
        when = 1 + step * 2
        faults = [] if action is None else [fault(card, action, since=at(when))]
        for decision in scheduler.handle(beat("n1", when, faults)):
            if isinstance(decision, AllocationGranted):
                assert not set(decision.gpu_ids) & set(n1.cordons)
        grant = submit(scheduler, f"t{step}", when + 0.5)
        if grant is not None:
            assert not set(grant.gpu_ids) & set(n1.cordons)
        for card_held in n1.cordons:
            assert n1.gpu_milli_free[card_held] <= 0
    # Every task ends and every cordon is lifted: the node is whole again. (The waiting
    # ones first: nothing is placed on what the others give back.)
    end = 1 + len(script) * 2
    for task_id in sorted(scheduler.pending):
        scheduler.handle(
            TaskStatusReported(occurred_at=at(end), task_id=task_id, status=TaskStatus.CANCELLED)
        )
    for task_id in sorted(scheduler.allocations):
        allocation = scheduler.allocations[task_id]
        scheduler.handle(
            TaskStatusReported(
                occurred_at=at(end),
                task_id=task_id,
                status=TaskStatus.SUCCEEDED,
                allocation_id=allocation.allocation_id,
            )
        )
    assert scheduler.allocations == {}
    for card in sorted(n1.cordons):
        scheduler.handle(
            GpuCordonRequested(occurred_at=at(end), node_id="n1", gpu=card, cordon=False)
        )
    scheduler.handle(beat("n1", end + 1, []))
    assert n1.cordons == {}
    assert n1.gpu_milli_free == [1000, 1000, 1000]


def test_an_attempt_ended_during_another_tasks_report_is_not_judged_by_that_report() -> None:
    """A silent launcher's task fails while another task's out-of-memory report is being
    taken: its kind is other (no report of its own), never that report's oom."""
    oom_only = RestartPolicy(when=["failure"], on_failure_kinds=["oom"], backoff_seconds=0)
    scheduler, granted = placed(grace=20, pools={"default": PoolPolicy(restart=oom_only)})
    for when in (5, 15, 25):
        scheduler.handle(launcher(granted, when))
    for when in range(30, 46, 5):
        scheduler.handle(health(when))
    other = TaskStatusReported(
        occurred_at=at(46), task_id="other", status=TaskStatus.FAILED, out_of_memory=True
    )
    [ended] = of(TaskEnded, scheduler.handle(other))
    assert ended.task_id == "t1"
    assert ended.reason.startswith("no heartbeat for 20 s")
    assert "does not retry failures of kind other" in ended.reason
