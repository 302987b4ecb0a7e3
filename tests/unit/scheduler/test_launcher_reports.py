"""A launcher runs the task: it confirms the allocation with its reservation token, heartbeats
with `running`, and reports the end with the token. The token is checked by the function that
made it; a task whose heartbeats stop fails after its grace, never on a stream's lag or a
restart; a report without the token or with a wrong one changes nothing."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    NodeCondition,
    NodeHealthReported,
    NodeTopologyReported,
    TaskEnded,
    TaskStatus,
    TaskStatusReported,
)
from crater.scheduler.domain.core import Allocation, Scheduler, SchedulerConfig
from crater.scheduler.domain.inputs import ReservationArmed
from crater.scheduler.domain.tokens import sign_token, token_allocation, token_refusal
from tests.support.topologies import node
from tests.unit.scheduler.test_core import at, profiled

SECRET = b"launcher-test-secret"


def forge(token: str) -> str:
    """The token with its signature's last digit changed (never the same digit)."""
    return token[:-1] + ("0" if token[-1] != "0" else "1")


def test_a_token_is_its_allocations_own() -> None:
    token = sign_token(SECRET, "alloc-1", "t1", "n1", at(30))
    assert token_allocation(token) == "alloc-1"
    assert token_refusal(SECRET, token, "alloc-1", "t1", "n1") is None


@pytest.mark.parametrize(
    ("token", "allocation", "task", "node_name", "said"),
    [
        ("v1.alloc-1.1767225630.00", "alloc-1", "t1", "n1", "forged"),  # altered signature
        ("garbage", "alloc-1", "t1", "n1", "malformed"),
        ("v1.alloc-1.soon.abc", "alloc-1", "t1", "n1", "malformed"),
        (None, "alloc-2", "t1", "n1", "token of allocation 'alloc-1', not of 'alloc-2'"),
        (None, "alloc-1", "t2", "n1", "forged"),  # another task's claim
        (None, "alloc-1", "t1", "n2", "forged"),  # another node's
    ],
)
def test_wrong_tokens_are_refused_with_the_reason(
    token: str | None, allocation: str, task: str, node_name: str, said: str
) -> None:
    real = sign_token(SECRET, "alloc-1", "t1", "n1", at(30))
    why = token_refusal(SECRET, token or real, allocation, task, node_name)
    assert why is not None
    assert said in why


def test_another_secret_signs_another_token() -> None:
    token = sign_token(b"other", "alloc-1", "t1", "n1", at(30))
    why = token_refusal(SECRET, token, "alloc-1", "t1", "n1")
    assert why is not None
    assert why.startswith("forged")


# -- the core ---------------------------------------------------------------------------------


def placed(grace: float = 60.0, **config: Any) -> tuple[Scheduler, AllocationGranted]:
    """One node, one task granted at 1 and armed at 2 (reservation: 30 s, to 32)."""
    scheduler = Scheduler(
        config=SchedulerConfig(token_secret=SECRET, task_heartbeat_grace_seconds=grace, **config)
    )
    scheduler.handle(NodeTopologyReported(occurred_at=at(0), node=node("n1", gpus=1)))
    [granted] = scheduler.handle(profiled("t1", gpus=1, when=1))
    assert isinstance(granted, AllocationGranted)
    scheduler.handle(ReservationArmed.of(granted, at(2)))
    return scheduler, granted


def launcher(
    granted: AllocationGranted, when: float, status: TaskStatus = TaskStatus.RUNNING, **fields: Any
) -> TaskStatusReported:
    return TaskStatusReported(
        occurred_at=at(when),
        task_id=granted.task_id,
        status=status,
        allocation_id=granted.allocation_id,
        reservation_token=fields.pop("token", granted.reservation_token),
        **fields,
    )


def health(when: float) -> NodeHealthReported:
    return NodeHealthReported(
        occurred_at=at(when), node_id="n1", condition=NodeCondition.READY, score=100
    )


def test_the_grant_hands_the_task_its_token() -> None:
    _, granted = placed()
    assert granted.environment["CRATER_RESERVATION_TOKEN"] == granted.reservation_token
    assert token_allocation(granted.reservation_token) == granted.allocation_id


def test_a_launcher_confirms_with_the_token_and_ends_the_task_with_its_exit_code() -> None:
    scheduler, granted = placed()
    assert scheduler.report_refusal(launcher(granted, 5)) is None
    assert scheduler.handle(launcher(granted, 5)) == []
    member = scheduler.allocations["t1"]
    assert member.running
    assert member.heartbeat_grace == 60.0
    end = launcher(granted, 50, TaskStatus.FAILED, exit_code=3, message="CUDA error")
    released, ended = scheduler.handle(end)
    assert isinstance(released, AllocationReleased)
    assert released.reason == "failed"
    assert isinstance(ended, TaskEnded)
    assert ended.status is TaskStatus.FAILED
    assert ended.reason == "failed as its launcher reported (exit code 3): CUDA error"


@pytest.mark.parametrize(
    ("token", "said"),
    [
        ("v1.alloc-0000000000000000.1767225632.deadbeef", "not of"),
        ("not-a-token", "malformed"),
    ],
)
def test_a_report_with_a_wrong_token_is_refused_and_changes_nothing(token: str, said: str) -> None:
    scheduler, granted = placed()
    forged = launcher(granted, 5, TaskStatus.SUCCEEDED, token=token)
    refusal = scheduler.report_refusal(forged)
    assert refusal is not None
    assert refusal.field == "reservation_token"
    assert said in refusal.reason
    clock = scheduler.clock
    assert scheduler.handle(forged) == []
    assert "t1" in scheduler.allocations
    assert not scheduler.allocations["t1"].running
    assert scheduler.clock == clock
    assert scheduler.reports_clock is None


def test_a_forged_signature_is_refused() -> None:
    scheduler, granted = placed()
    head, _, _ = granted.reservation_token.rpartition(".")
    forged = launcher(granted, 5, token=f"{head}.{'0' * 64}")
    refusal = scheduler.report_refusal(forged)
    assert refusal is not None
    assert refusal.reason.startswith("forged")
    assert scheduler.handle(forged) == []
    assert not scheduler.allocations["t1"].running


@pytest.mark.parametrize("status", [TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.RUNNING])
def test_a_report_on_an_allocation_the_task_does_not_hold_is_refused(status: TaskStatus) -> None:
    """The attack: a forged `succeeded` naming a made-up allocation released a running task."""
    scheduler, granted = placed()
    scheduler.handle(
        TaskStatusReported(
            occurred_at=at(5),
            task_id="t1",
            status=TaskStatus.RUNNING,
            allocation_id=granted.allocation_id,
        )
    )
    forged = TaskStatusReported(
        occurred_at=at(6), task_id="t1", status=status, allocation_id="alloc-made-up"
    )
    refusal = scheduler.report_refusal(forged)
    assert refusal is not None
    assert refusal.field == "allocation_id"
    assert "does not hold allocation 'alloc-made-up'" in refusal.reason
    assert granted.allocation_id in refusal.reason
    assert scheduler.handle(forged) == []
    assert scheduler.allocations["t1"].running


def test_once_a_launcher_confirmed_reports_without_the_token_are_refused() -> None:
    scheduler, granted = placed()
    scheduler.handle(launcher(granted, 5))
    tokenless = TaskStatusReported(
        occurred_at=at(6), task_id="t1", status=TaskStatus.FAILED, message="forged"
    )
    refusal = scheduler.report_refusal(tokenless)
    assert refusal is not None
    assert refusal.reason.startswith("missing")
    assert scheduler.handle(tokenless) == []
    assert "t1" in scheduler.allocations
    # a cancel (the gateway's) needs none
    cancel = TaskStatusReported(occurred_at=at(7), task_id="t1", status=TaskStatus.CANCELLED)
    assert scheduler.report_refusal(cancel) is None


def test_node_reports_without_tokens_still_confirm_unless_tokens_are_required() -> None:
    scheduler, _ = placed()
    node_report = TaskStatusReported(occurred_at=at(5), task_id="t1", status=TaskStatus.RUNNING)
    assert scheduler.handle(node_report) == []
    assert scheduler.allocations["t1"].running
    assert scheduler.allocations["t1"].heartbeat_grace is None  # not held to heartbeats
    strict, _ = placed(require_report_tokens=True)
    refusal = strict.report_refusal(node_report)
    assert refusal is not None
    assert "REQUIRE_REPORT_TOKENS" in refusal.reason


def test_a_confirmation_after_the_real_deadline_is_refused_as_expired() -> None:
    scheduler, granted = placed()  # armed at 2: the real deadline is 32, the token's 31
    assert scheduler.report_refusal(launcher(granted, 31.5)) is None  # before the real one
    late = launcher(granted, 33)
    refusal = scheduler.report_refusal(late)
    assert refusal is not None
    assert refusal.reason.startswith("expired")
    assert scheduler.handle(late) == []
    assert not scheduler.allocations["t1"].running


def test_a_confirmation_before_the_grant_is_read_back_is_never_late() -> None:
    scheduler = Scheduler(config=SchedulerConfig(token_secret=SECRET))
    scheduler.handle(NodeTopologyReported(occurred_at=at(0), node=node("n1", gpus=1)))
    [granted] = scheduler.handle(profiled("t1", gpus=1, when=1))
    assert isinstance(granted, AllocationGranted)
    # the relay was down: the grant is not armed, its decided deadline (31) does not count
    assert scheduler.report_refusal(launcher(granted, 40)) is None


def test_a_silent_launcher_fails_the_task_after_its_grace_saying_so() -> None:
    scheduler, granted = placed(grace=20)
    for when in (5, 15, 25):  # heartbeats
        assert scheduler.handle(launcher(granted, when)) == []
    for when in range(30, 46, 5):  # node heartbeats and other reports run the clock
        assert scheduler.handle(health(when)) == []
        assert (
            scheduler.handle(
                TaskStatusReported(occurred_at=at(when), task_id="other", status=TaskStatus.RUNNING)
            )
            == []
        )
    assert scheduler.handle(health(46)) == []  # reports are in up to 45 only: 25 + 20
    decisions = scheduler.handle(  # reports of 46 are in: 25 + 20 < 46
        TaskStatusReported(occurred_at=at(46), task_id="other", status=TaskStatus.RUNNING)
    )
    released, ended = decisions
    assert isinstance(released, AllocationReleased)
    assert released.reason == "failed"
    assert isinstance(ended, TaskEnded)
    assert ended.status is TaskStatus.FAILED
    assert ended.reason.startswith("no heartbeat for 20 s")
    assert granted.allocation_id in ended.reason


def test_the_launchers_own_grace_wins() -> None:
    scheduler, granted = placed(grace=20)
    scheduler.handle(launcher(granted, 5, heartbeat_grace_seconds=100))
    for when in range(10, 101, 10):
        scheduler.handle(
            TaskStatusReported(occurred_at=at(when), task_id="other", status=TaskStatus.RUNNING)
        )
    assert "t1" in scheduler.allocations
    assert scheduler.handle(
        TaskStatusReported(occurred_at=at(106), task_id="other", status=TaskStatus.RUNNING)
    )


def test_heartbeats_lagging_in_their_stream_never_fail_the_task() -> None:
    """The task.status consumer is behind: node heartbeats run the clock 25 s past the grace,
    within the reports' lag allowance (30 s): nothing fails, and the lagging heartbeats come."""
    scheduler, granted = placed(grace=20)
    scheduler.handle(launcher(granted, 5))
    for when in range(10, 56, 5):
        assert scheduler.handle(health(when)) == []
    for when in (15, 25, 35, 45, 55):
        assert scheduler.handle(launcher(granted, when)) == []
    assert scheduler.allocations["t1"].running


def test_a_restart_does_not_fail_a_task_for_the_silence_it_did_not_hear() -> None:
    scheduler, granted = placed(grace=20)
    scheduler.handle(launcher(granted, 5))
    member = scheduler.allocations["t1"]
    # the process stops; what it stored comes back (the grace is stored, heard_at is not)
    restored = Scheduler(config=scheduler.config)
    copy = Allocation(
        member.allocation_id,
        "t1",
        "n1",
        member.gpu_ids,
        member.cpu_cores,
        member.memory_mb,
        member.expires_at,
        running=True,
        heartbeat_grace=20,
        task=member.task,
    )
    restored.restore(
        [(n.topology, n.condition, n.last_heartbeat_at) for n in scheduler.cluster.nodes],
        [copy],
        [],
        scheduler.next_seq,
    )
    # back 300 s later: the first event is long past 5 + 20, and nothing fails on it
    assert restored.handle(health(300)) == []
    # the launcher's heartbeats redelivered and new ones keep it
    assert restored.handle(launcher(granted, 310)) == []
    assert restored.handle(health(336)) == []
    assert "t1" in restored.allocations


def test_a_restored_task_is_still_held_to_heartbeats() -> None:
    scheduler, granted = placed(grace=20)
    scheduler.handle(launcher(granted, 5))
    member = scheduler.allocations["t1"]
    restored = Scheduler(config=scheduler.config)
    copy = Allocation(
        member.allocation_id,
        "t1",
        "n1",
        member.gpu_ids,
        member.cpu_cores,
        member.memory_mb,
        member.expires_at,
        running=True,
        heartbeat_grace=20,
        task=member.task,
    )
    restored.restore(
        [(n.topology, n.condition, n.last_heartbeat_at) for n in scheduler.cluster.nodes],
        [copy],
        [],
        scheduler.next_seq,
    )
    restored.handle(health(300))  # heard as of 300
    quiet = [restored.handle(health(300 + s)) for s in range(5, 61, 5)]
    ends = [d for ds in quiet for d in ds if isinstance(d, TaskEnded)]
    assert len(ends) == 1
    assert ends[0].reason.startswith("no heartbeat for 20 s")


def test_the_contract_names_the_field_that_is_wrong() -> None:
    with pytest.raises(ValidationError) as error:
        TaskStatusReported(task_id="t1", status=TaskStatus.RUNNING, reservation_token="v1.a.1.b")
    assert error.value.errors()[0]["loc"] == ("reservation_token",)
    with pytest.raises(ValidationError) as error:
        TaskStatusReported(task_id="t1", status=TaskStatus.RUNNING, exit_code=0)
    assert error.value.errors()[0]["loc"] == ("exit_code",)
    with pytest.raises(ValidationError) as error:
        TaskStatusReported(task_id="t1", status=TaskStatus.RUNNING, heartbeat_grace_seconds=30)
    assert error.value.errors()[0]["loc"] == ("heartbeat_grace_seconds",)


def test_the_gateway_is_answered_by_the_same_judgement() -> None:
    scheduler, granted = placed()
    allocation, token = granted.allocation_id, granted.reservation_token
    found = scheduler.allocation_check(allocation, token, at(5))
    assert found is not None
    member, refusal = found
    assert (member.task_id, refusal) == ("t1", None)
    wrong = scheduler.allocation_check(allocation, forge(token), at(5))
    assert wrong is not None
    assert wrong[1] is not None
    assert wrong[1].reason.startswith("forged")
    late = scheduler.allocation_check(allocation, token, at(40))
    assert late is not None
    assert late[1] is not None
    assert late[1].reason.startswith("expired")
    scheduler.handle(launcher(granted, 6, TaskStatus.SUCCEEDED))
    assert scheduler.allocation_check(allocation, token, at(7)) is None  # no longer held
    assert scheduler.held_by == {}
