from __future__ import annotations

import json

import pytest

from crater.callback.domain.payload import RELEASE_STATUS, webhook_body
from crater.contracts import (
    AllocationReleased,
    ReleaseReason,
    TaskEscalated,
    TaskSequence,
    TaskStatus,
    WebhookStatus,
)
from tests.support.lifecycle import (
    OCCURRED,
    granted,
    pending,
    preempted,
    rejected,
    status,
)


def test_granted_allocation_is_scheduled_with_its_resources() -> None:
    event = granted("train-1", numa_node=1, checkpoint_path=None)
    body = json.loads(webhook_body(event).encode())
    assert body == {
        "task_id": "train-1",
        "status": "scheduled",
        "allocated_resources": {
            "node": "gpu-01",
            "gpu_ids": [0, 1],
            "cpu_cores": [0, 1, 2, 3, 4, 5, 6, 7],
            "numa_node": 1,
            "checkpoint_path": None,
        },
        "event_id": str(event.event_id),
        "occurred_at": "2025-05-01T12:00:00Z",
        "reason": event.explanation,
        "release_reason": None,
        "sequence": None,
        "gang_index": None,
        "gang_size": None,
        "escalated_priority": None,
    }


def test_pending_task_says_why_it_waits() -> None:
    body = webhook_body(pending())
    assert body.status is WebhookStatus.PENDING
    assert body.reason == "0/40 nodes: 32 InsufficientGpus, 8 GpuMemoryPerCard"
    assert body.allocated_resources is None
    # null, not absent: AllData's schema has the key on every status
    assert json.loads(body.encode())["allocated_resources"] is None


def test_rejected_task_has_failed_with_every_field_error_as_reason() -> None:
    body = webhook_body(rejected())
    assert body.status is WebhookStatus.FAILED
    assert body.reason == (
        "resource_requirements.gpu.count: no node has 64 GPUs; pool: unknown pool 'x'"
    )


def test_preempted_task_names_the_preemptor_and_grace_period() -> None:
    body = webhook_body(preempted())
    assert body.status is WebhookStatus.PREEMPTED
    assert body.reason is not None
    assert "urgent-9" in body.reason
    assert "30 s" in body.reason


@pytest.mark.parametrize(
    ("reported", "expected"),
    [
        (TaskStatus.RUNNING, "running"),
        (TaskStatus.SUCCEEDED, "succeeded"),
        (TaskStatus.FAILED, "failed"),
        (TaskStatus.CANCELLED, "cancelled"),
    ],
)
def test_reported_status_passes_through(reported: TaskStatus, expected: str) -> None:
    body = webhook_body(status(value=reported))
    assert body.status.value == expected
    assert body.reason == f"{expected} on gpu-01"
    assert body.occurred_at == OCCURRED


def test_same_event_gives_the_same_bytes() -> None:
    event = granted()
    assert webhook_body(event).encode() == webhook_body(event.model_copy()).encode()
    assert webhook_body(event).event_id == event.event_id


def released(reason: ReleaseReason) -> AllocationReleased:
    return AllocationReleased(
        allocation_id="alloc-train-1",
        task_id="train-1",
        node="gpu-01",
        gpu_ids=[0, 1],
        cpu_cores=[0, 1],
        reason=reason,
        occurred_at=OCCURRED,
        task_sequence=TaskSequence(number=7, previous=3),
    )


def test_an_expired_reservation_tells_alldata_the_task_failed_and_why() -> None:
    body = json.loads(webhook_body(released(ReleaseReason.EXPIRED)).encode())
    assert (body["status"], body["release_reason"], body["sequence"]) == ("failed", "expired", 7)
    assert body["reason"] == (
        "alloc-train-1 released on gpu-01 (GPUs 0,1): expired, "
        "the task never reported running within its reservation"
    )
    assert body["allocated_resources"] is None


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        (ReleaseReason.SUCCEEDED, "succeeded"),
        (ReleaseReason.FAILED, "failed"),
        (ReleaseReason.CANCELLED, "cancelled"),
        (ReleaseReason.PREEMPTED, "preempted"),
        (ReleaseReason.NODE_LOST, "failed"),
        (ReleaseReason.SCALED_IN, "cancelled"),
    ],
)
def test_every_release_reason_maps_to_a_status_alldata_knows(
    reason: ReleaseReason, expected: str
) -> None:
    body = webhook_body(released(reason))
    assert (body.status.value, body.release_reason) == (expected, reason.value)


def test_no_release_reason_is_left_unmapped() -> None:
    assert set(RELEASE_STATUS) == set(ReleaseReason)


def test_each_gang_member_says_which_member_it_is() -> None:
    members = [
        webhook_body(granted("ddp", node=f"gpu-0{i}", gang_index=i, gang_size=2)) for i in (0, 1)
    ]
    assert [(b.status, b.gang_index, b.gang_size) for b in members] == [
        (WebhookStatus.SCHEDULED, 0, 2),
        (WebhookStatus.SCHEDULED, 1, 2),
    ]
    assert [b.allocated_resources.node for b in members if b.allocated_resources] == [
        "gpu-00",
        "gpu-01",
    ]
    alone = webhook_body(granted("single"))
    assert (alone.gang_index, alone.gang_size) == (None, None)


def test_an_escalated_task_is_still_pending_and_says_it_escalated() -> None:
    event = TaskEscalated(
        task_id="late",
        waited_seconds=90.0,
        max_queue_time_seconds=60,
        priority=100,
        escalated_priority=500,
        task_sequence=TaskSequence(number=7, previous=3),
        occurred_at=OCCURRED,
    )
    body = webhook_body(event)
    assert body.status is WebhookStatus.PENDING
    assert body.escalated_priority == 500
    assert body.sequence == 7
    assert body.reason == (
        "escalated: waited 90 s, past its max_queue_time_seconds 60; priority 100 -> 500"
    )
