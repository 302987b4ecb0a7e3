"""TaskPreempted.cause(): the phrase webhooks, the audit log and the demo give for a
preemption names who takes the capacity and why, for every kind of preemption."""

from __future__ import annotations

from datetime import timedelta

import pytest

from crater.contracts import TaskPreempted, utc_now


def preempted(**why: str | None) -> TaskPreempted:
    return TaskPreempted(
        task_id="tune-1",
        allocation_id="a-1",
        node="rtx4090-01",
        grace_period_seconds=30,
        must_stop_by=utc_now() + timedelta(seconds=30),
        **why,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("why", "said"),
    [
        ({"preempted_by": "t-9"}, "preempted by t-9"),
        (
            {"preempted_by": "chat-replica-1", "reclaimed_by_pool": "inference"},
            "preempted by chat-replica-1: pool inference takes back the capacity it lent",
        ),
        (
            {"preempted_by": "t-2", "reclaimed_by_tenant": "beta"},
            "preempted by t-2: tenant beta takes back its guarantee",
        ),
        (
            {"preempted_by": "n1", "reclaimed_by_tenant": "nlp", "reclaimed_by_queue": "research"},
            "preempted by n1: queue research takes back its guarantee",
        ),
        (
            {"reclaimed_by_pool": "inference"},
            "taken back by pool inference ahead of its expected demand",
        ),
        ({"lent_by": "train-1"}, "the GPUs lent by train-1 taken back"),
    ],
)
def test_each_preemption_says_who_takes_the_capacity_and_why(
    why: dict[str, str], said: str
) -> None:
    assert preempted(**why).cause() == said


def test_a_preemption_not_a_queues_leaves_reclaimed_by_queue_out_of_the_json() -> None:
    assert "reclaimed_by_queue" not in preempted(preempted_by="t-2").model_dump(mode="json")
