"""The chaos harness's rules (benchmarks/chaos/analysis.py), on hand-made records."""

from __future__ import annotations

import itertools
from collections import Counter

from benchmarks.chaos.analysis import (
    Action,
    Grant,
    Release,
    StatusReport,
    TaskEnd,
    Webhook,
    false_failures,
    order_violations,
    premature_node_lost,
    recovery,
    replay_allocations,
    reports_after_release,
    webhook_report,
)
from benchmarks.chaos.plan import ChaosConfig, make_plan, workload
from crater.contracts import TaskRequest


def grant(seq: int, allocation: str, node: str, gpus: tuple[int, ...], **extra: object) -> Grant:
    return Grant(seq, float(seq), allocation, f"task-{allocation}", node, gpus, **extra)  # type: ignore[arg-type]


def release(seq: int, allocation: str, node: str, reason: str = "succeeded") -> Release:
    return Release(seq, float(seq), allocation, f"task-{allocation}", node, reason)


def hook(task: str, status: str, attempt: int | None = 1, n: int = 0, **extra: object) -> Webhook:
    return Webhook(
        webhook_id=f"{task}-{status}-{attempt}-{n}",
        received_at=float(n),
        task_id=task,
        status=status,
        attempt=attempt,
        duplicate_submission=bool(extra.get("duplicate_submission", False)),
        release_reason=None,
    )


def test_a_card_held_twice_is_double_booked_a_released_one_is_not() -> None:
    records: list[Grant | Release] = [
        grant(1, "a", "n1", (0, 1)),
        release(2, "a", "n1"),
        grant(3, "b", "n1", (1,)),
        grant(4, "c", "n1", (1, 2)),
    ]
    found = replay_allocations(records)
    assert found["double_booked_events"] == 1
    assert found["double_booked_gpus"] == 1
    assert found["examples"][0]["gpu"] == 1
    assert found["held_at_end"] == 2


def test_shares_and_mig_slices_add_up_to_one_card() -> None:
    fits = [
        grant(1, "a", "n1", (0,), gpu_milli=500),
        grant(2, "b", "n1", (0,), gpu_milli=500),
        grant(3, "c", "n1", (1,), mig_profile="3g.40gb"),
        grant(4, "d", "n1", (1,), mig_profile="4g.40gb"),
        grant(5, "a", "n1", (0,), gpu_milli=500),  # a redelivered grant: not a new holder
    ]
    assert replay_allocations(fits)["double_booked_events"] == 0
    assert replay_allocations(fits)["repeated_grants"] == 1
    over = [*fits, grant(6, "e", "n1", (1,), mig_profile="1g.10gb")]
    assert replay_allocations(over)["double_booked_events"] == 1


def test_lifecycle_order_per_attempt_and_nothing_after_a_terminal() -> None:
    fine = [
        hook("t", "pending"),
        hook("t", "pending"),
        hook("t", "scheduled"),
        hook("t", "running"),
        hook("t", "preempted"),
        hook("t", "pending", attempt=2),
        hook("t", "scheduled", attempt=2),
        hook("t", "succeeded", attempt=2),
        hook("t", "rejected", attempt=2, duplicate_submission=True),
    ]
    assert order_violations(fine) == []
    late = [hook("t", "scheduled"), hook("t", "pending"), hook("t", "succeeded")]
    assert order_violations(late) == ["pending after scheduled"]
    after = [hook("t", "scheduled"), hook("t", "succeeded"), hook("t", "succeeded", n=1)]
    assert order_violations(after) == ["succeeded after terminal"]
    unsaid = [
        hook("t", "scheduled"),
        hook("t", "running", attempt=None),  # a node's report: no attempt, fine on the first
        hook("t", "scheduled", attempt=2),
        hook("t", "running", attempt=None, n=1),
        hook("t", "succeeded", attempt=2),
    ]
    assert order_violations(unsaid) == ["running without attempt during attempt 2"]


def test_lost_terminals_and_pending_are_counted_over_accepted_tasks() -> None:
    webhooks = [
        hook("a", "pending", n=1),
        hook("a", "pending", n=2),
        hook("a", "pending", n=3),
        hook("a", "pending", n=4),
        hook("a", "scheduled"),
        hook("a", "succeeded", n=1),
        hook("a", "succeeded", n=2),
        hook("b", "scheduled"),
    ]
    report = webhook_report(["a", "b"], webhooks, receiver_duplicates=3)
    assert report["lost"] == 1
    assert report["lost_examples"] == [{"task_id": "b", "received": ["scheduled"]}]
    assert report["lost_by_last_status"] == {"scheduled": 1}
    assert report["terminal_webhooks_per_task"] == {"0": 1, "2": 1}
    assert report["duplicates_distinct_ids"] == {"succeeded": 1}
    assert report["duplicate_deliveries_same_id"] == 3
    assert report["pending_per_task"]["max"] == 4
    assert report["pending_per_task"]["tasks_over_target"] == 1


def test_a_failure_after_the_node_said_running_is_false_unless_the_node_went_silent() -> None:
    grants = [
        grant(1, "a", "n1", (0,)),
        grant(2, "b", "n2", (0,)),
        grant(3, "c", "n1", (1,)),
        grant(4, "d", "n1", (2,)),
    ]
    releases = [
        release(4, "a", "n1", "expired"),
        release(5, "b", "n2", "node-lost"),
        release(6, "d", "n1", "preempted"),
    ]
    reports = [
        StatusReport(3, 3.0, "task-a", "a", "running"),
        StatusReport(3, 3.0, "task-b", "b", "running"),
        StatusReport(3, 3.0, "task-c", "c", "running"),
        StatusReport(6, 6.0, "task-c", "c", "failed"),
        StatusReport(3, 3.0, "task-d", "d", "running"),
    ]
    ends = [TaskEnd(7, 7.0, "task-a", "failed", "a", "expired")]
    webhooks = [hook(f"task-{t}", "failed") for t in "abcd"]
    found = false_failures(webhooks, grants, releases, reports, ends, silent_nodes={"n2"})
    assert found["false_failures"] == 1
    assert found["causes"] == {"expired": 1}
    assert found["failed_on_silent_nodes_excluded"] == 1
    assert found["failed_as_the_node_reported"] == 1
    assert found["failed_after_running_for_other_reasons"] == {"preempted": 1}


def test_recovery_is_the_time_to_the_next_allocation_after_each_kill() -> None:
    actions = [
        Action("kill", "scheduler", 10.0, 100.0, restart_seconds=3.0),
        Action("silent", "n1", 12.0, 102.0, for_seconds=30.0),
    ]
    rows = recovery(actions, [90.0, 104.5, 110.0])
    assert rows == [
        {
            "kind": "kill",
            "target": "scheduler",
            "at_seconds": 10.0,
            "restart_seconds": 3.0,
            "to_next_allocation_seconds": 4.5,
        }
    ]


def test_the_plan_and_workload_are_seeded_and_valid_requests() -> None:
    config = ChaosConfig(tasks=200, rate=4.0, silent_nodes=2, seed=3)
    nodes = ["a100-01", "a100-02", "rtx4090-01", "t4-01"]
    plan = make_plan(config, nodes)
    assert plan == make_plan(config, nodes)
    assert plan != make_plan(ChaosConfig(tasks=200, rate=4.0, silent_nodes=2, seed=4), nodes)
    kills = Counter(a.target for a in plan if a.kind == "kill")
    assert kills == {"scheduler": 5, "callback": 3, "predictor": 2, "gateway": 2}
    assert sum(a.kind == "nats-restart" for a in plan) == 1
    assert {a.target for a in plan if a.kind == "silent"} <= set(nodes)
    # one action per slot of the window: none overlaps the next
    timed = sorted(a.at_seconds for a in plan if a.kind != "silent")
    assert all(b - a > 1.0 for a, b in itertools.pairwise(timed))
    assert config.submit_seconds * 0.1 <= timed[0]
    assert timed[-1] <= config.submit_seconds * 0.9
    bodies = workload(config, {"training", "inference", "default"})
    assert bodies == workload(config, {"training", "inference", "default"})
    assert len({b["task_id"] for b in bodies}) == 200
    for body in bodies:
        TaskRequest.model_validate(body)


def test_a_node_still_reporting_a_released_allocation_is_counted() -> None:
    releases = [release(5, "a", "n1", "node-lost"), release(6, "b", "n1")]
    reports = [
        StatusReport(3, 3.0, "task-a", "a", "running"),
        StatusReport(9, 9.0, "task-a", "a", "succeeded"),
        StatusReport(4, 4.0, "task-b", "b", "succeeded"),
    ]
    found = reports_after_release(releases, reports)
    assert found["count"] == 1
    assert found["kinds"] == {"succeeded after node-lost": 1}


def test_node_lost_counts_only_when_the_node_was_reporting() -> None:
    releases = [
        release(100, "a", "n1", "node-lost"),  # n1 never silent
        release(150, "b", "n2", "node-lost"),  # n2 silent from 100: only 50 s
        release(200, "c", "n2", "node-lost"),  # 100 s: rightly lost
        release(210, "d", "n1", "expired"),
    ]
    found = premature_node_lost(releases, {"n2": (100.0, 220.0)}, lost_after=90.0)
    assert found["count"] == 2
    assert found["nodes"] == {"n1": 1, "n2": 1}
    assert found["at_seconds"] == {100: 1, 150: 1}
