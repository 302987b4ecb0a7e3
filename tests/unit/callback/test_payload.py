from __future__ import annotations

import json
from datetime import timedelta
from typing import cast

import pytest

from crater.callback.adapters.store import DeliveryLog
from crater.callback.app import Recorder
from crater.callback.delivery import Dispatcher
from crater.callback.domain.payload import WebhookFormat, has_webhook, render, webhook_body
from crater.contracts import (
    TaskEscalated,
    TaskSequence,
    TaskStartEstimated,
    TaskStatus,
    WebhookStatus,
)
from tests.support.lifecycle import (
    OCCURRED,
    ended,
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
            "environment": {"CRATER_GPU_IDS": "0,1"},
        },
        "allocation_id": event.allocation_id,
        "reservation_token": event.reservation_token,
        "reservation_expires_at": event.reservation_expires_at.isoformat().replace("+00:00", "Z"),
        "event_id": str(event.event_id),
        "occurred_at": "2025-05-01T12:00:00Z",
        "reason": event.explanation,
        "release_reason": None,
        "sequence": None,
        "gang_index": None,
        "gang_size": None,
        "escalated_priority": None,
        "attempt": 1,
        "duplicate_submission": None,
        "gpu_utilization_percent": None,
        "min_gpu_utilization_percent": None,
    }


def test_pending_task_says_why_it_waits() -> None:
    body = webhook_body(pending())
    assert body.status is WebhookStatus.PENDING
    assert body.reason == "0/40 nodes: 32 InsufficientGpus, 8 GpuMemoryPerCard"
    assert body.allocated_resources is None
    # null, not absent: AllData's schema has the key on every status
    assert json.loads(body.encode())["allocated_resources"] is None


def test_rejected_task_is_rejected_with_every_field_error_as_reason() -> None:
    body = webhook_body(rejected())
    assert body.status is WebhookStatus.REJECTED
    assert body.reason == (
        "resource_requirements.gpu.count: no node has 64 GPUs; pool: unknown pool 'x'"
    )
    assert body.duplicate_submission is False


def test_a_refused_duplicate_submission_says_so() -> None:
    body = webhook_body(rejected("known-1", duplicate=True))
    assert (body.status, body.duplicate_submission) == (WebhookStatus.REJECTED, True)
    assert body.reason == "task_id: task known-1 is already known"


def test_preempted_task_names_the_preemptor_and_grace_period() -> None:
    body = webhook_body(preempted())
    assert body.status is WebhookStatus.PREEMPTED
    assert body.reason is not None
    assert "urgent-9" in body.reason
    assert "30 s" in body.reason


def test_a_running_report_passes_through() -> None:
    event = status(value=TaskStatus.RUNNING)
    assert has_webhook(event)
    body = webhook_body(event)
    assert (body.status, body.reason) == (WebhookStatus.RUNNING, "running on gpu-01")
    assert body.occurred_at == OCCURRED
    assert (body.sequence, body.attempt) == (None, None)


@pytest.mark.parametrize(
    "reported", [TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.CANCELLED]
)
def test_no_other_report_is_a_webhook(reported: TaskStatus) -> None:
    """A node's `succeeded` is what one node saw; the scheduler's task.ended tells the end."""
    assert not has_webhook(status(value=reported))


def test_same_event_gives_the_same_bytes() -> None:
    event = granted()
    assert webhook_body(event).encode() == webhook_body(event.model_copy()).encode()
    assert webhook_body(event).event_id == event.event_id


@pytest.mark.parametrize(
    ("reported", "release_reason"),
    [
        (TaskStatus.SUCCEEDED, "succeeded"),
        (TaskStatus.FAILED, "expired"),
        (TaskStatus.FAILED, "node-lost"),
        (TaskStatus.CANCELLED, "cancelled"),
    ],
)
def test_the_end_tells_its_status_release_reason_and_attempt(
    reported: TaskStatus, release_reason: str
) -> None:
    event = ended("train-1", reported, release_reason, attempt=3).model_copy(
        update={"task_sequence": TaskSequence(number=9, previous=7)}
    )
    assert has_webhook(event)
    body = json.loads(webhook_body(event).encode())
    assert (body["status"], body["release_reason"], body["attempt"], body["sequence"]) == (
        reported.value,
        release_reason,
        3,
        9,
    )
    assert body["reason"] == event.reason
    assert body["allocated_resources"] is None
    assert body["duplicate_submission"] is None


def test_pending_and_grants_say_which_attempt() -> None:
    again = pending().model_copy(update={"attempt": 2})
    assert webhook_body(again).attempt == 2
    assert webhook_body(granted(attempt=2)).attempt == 2
    assert webhook_body(preempted()).attempt is None


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


async def test_the_recorder_records_nothing_for_a_report_that_is_no_webhook() -> None:
    # Neither the log nor the loop is touched: a None in their place would fail loudly.
    recorder = Recorder(cast(DeliveryLog, None), [], cast(Dispatcher, None))
    assert await recorder.record(status(value=TaskStatus.SUCCEEDED)) == 0


def test_a_launchers_heartbeat_is_no_webhook_but_its_confirmation_is() -> None:
    confirmed = status().model_copy(
        update={"allocation_id": "alloc-1", "reservation_token": "v1.alloc-1.1.ab"}
    )
    assert has_webhook(confirmed)
    assert not has_webhook(confirmed.model_copy(update={"heartbeat": True}))


def estimate(start: bool = True) -> TaskStartEstimated:
    return TaskStartEstimated(
        task_id="waits",
        attempt=2,
        pool="training",
        queue_position=3,
        estimated_start_at=OCCURRED + timedelta(seconds=420) if start else None,
        estimate="estimated to start in 420 s (position 3 in pool training)"
        if start
        else "no estimate within the forecast's bounds",
        task_sequence=TaskSequence(number=9, previous=4),
        occurred_at=OCCURRED,
    )


def test_a_start_estimate_is_a_pending_with_its_place_and_time_in_both_formats() -> None:
    body = webhook_body(estimate())
    assert (body.status, body.queue_position, body.sequence, body.attempt) == (
        WebhookStatus.PENDING,
        3,
        9,
        2,
    )
    assert body.estimated_start_at == OCCURRED + timedelta(seconds=420)
    assert body.reason == "estimated to start in 420 s (position 3 in pool training)"
    crater = render(body.encode().decode(), WebhookFormat.CRATER)
    assert json.loads(crater.body)["queue_position"] == 3
    alldata = render(body.encode().decode(), WebhookFormat.ALLDATA)
    assert json.loads(alldata.body) == {
        "task_id": "waits",
        "status": "pending",
        "reason": "estimated to start in 420 s (position 3 in pool training)",
    }
    assert alldata.headers["crater-queue-position"] == "3"
    assert alldata.headers["crater-estimated-start-at"] == "2025-05-01T12:07:00Z"


def test_no_estimate_says_why_and_other_bodies_carry_no_estimate_fields() -> None:
    body = webhook_body(estimate(start=False))
    assert body.estimated_start_at is None
    assert "estimated_start_at" not in json.loads(body.encode())
    assert "crater-estimated-start-at" not in render(body.encode().decode(), "alldata").headers
    assert body.reason == "no estimate within the forecast's bounds"
    plain = json.loads(webhook_body(pending()).encode())
    assert "queue_position" not in plain
    assert "estimated_start_at" not in plain
