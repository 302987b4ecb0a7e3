"""Every scale-out names a request to copy while the fleet exists: a live placed replica, else
the fleet's remembered template (placed once, ended perhaps), else a task a replica reports;
only a fleet never seen placed nor reporting a task names none, and says so in words."""

from __future__ import annotations

from dataclasses import replace

from crater.autoscaler.domain import Autoscaler, ScalingPolicy
from crater.contracts import ReplicasRequested
from tests.unit.autoscaler.test_policy_features import requested, sample, ts

POLICY = ScalingPolicy(strategy="rule", panic_p95_ms=None, cooldown_seconds=15)
SLOW = [250.0] * 20


def scale_out(
    scaler: Autoscaler, at: float, replicas: int = 1, **reporter: str
) -> ReplicasRequested:
    assessment = scaler.observe(sample(at, SLOW, 0.9, replicas=replicas, **reporter))
    assert assessment.decision is not None, f"no scale-out at {at}"
    [cold] = requested(assessment)
    return cold


def test_the_second_scale_out_copies_a_live_replica_after_the_first_one_ended() -> None:
    """The demo's failure: the replica the first scale-out copied had ended by the second."""
    # A replica that never reports is not counted as starting after 20 s.
    scaler = Autoscaler(replace(POLICY, replica_start_timeout_seconds=20))
    scaler.observe(sample(0, [50.0] * 20, 0.5, replica_id="chat-0", task_id="chat-0"))
    scaler.allocation_granted("chat-0", "n1", [0], ts(0))
    first = scale_out(scaler, 1, replica_id="chat-0", task_id="chat-0")
    assert first.template_task_id == "chat-0"
    [new] = first.task_ids
    scaler.allocation_granted(new, "n2", [0], ts(2))  # placed; it reports no latencies
    scaler.allocation_released("chat-0")  # the template replica ended
    # Its simulated service goes on reporting under the old task (as `make up` does).
    second = scale_out(scaler, 30, replicas=2, replica_id="chat-0", task_id="chat-0")
    assert second.template_task_id == new  # a live placed replica
    assert "copying " + new in second.reason


def test_a_fleet_whose_replicas_all_ended_keeps_its_template() -> None:
    scaler = Autoscaler(POLICY)
    scaler.observe(sample(0, [50.0] * 20, 0.5, replica_id="r0", task_id="chat-0"))
    scaler.allocation_granted("chat-0", "n1", [0], ts(0))
    scaler.allocation_released("chat-0")
    # Samples from a replica that reports no task: only the memory of the fleet is left.
    out = scale_out(scaler, 30)
    assert out.template_task_id == "chat-0"


def test_after_a_restart_a_reported_task_is_the_template_before_any_grant() -> None:
    scaler = Autoscaler(POLICY)  # a fresh process: no grant seen yet
    out = scale_out(scaler, 0, replica_id="chat-0", task_id="chat-0")
    assert out.template_task_id == "chat-0"


def test_a_fleet_never_seen_names_no_template_and_says_so_in_words() -> None:
    scaler = Autoscaler(POLICY)
    out = scale_out(scaler, 0)
    assert out.template_task_id is None
    assert "no replica of chat known here" in out.reason
    assert "None" not in out.reason
    # Warm-pool requests say the same.
    pooled = Autoscaler(ScalingPolicy(strategy="rule", warm_pool_size=1, panic_p95_ms=None))
    [fill] = requested(pooled.observe(sample(0, [50.0] * 20, 0.5)))
    assert fill.template_task_id is None
    assert "None" not in fill.reason
