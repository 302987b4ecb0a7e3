"""The fleet is what it is, not what reported lately: a replica that sends no samples is
idle, not gone. It stays counted, and can be drained, until its allocation is released."""

from __future__ import annotations

from crater.autoscaler.domain import Autoscaler, ScalingPolicy
from tests.unit.autoscaler.test_policy_features import sample, ts

FAST = [50.0] * 20
POLICY = ScalingPolicy(min_replicas=1, stabilisation_seconds=0, cooldown_seconds=0)


def test_a_silent_replica_with_a_live_allocation_stays_counted_and_is_drained() -> None:
    scaler = Autoscaler(POLICY)
    for i, name in enumerate(["a", "b", "c"]):
        scaler.allocation_granted(name, f"n{i}", [0], ts(0))
    scaler.adopt("chat", ["a", "b", "c"], ts(0))
    assert scaler.replicas("chat") == 3
    # Only "a" serves; "b" and "c" are idle for ten minutes (no samples).
    for t in range(0, 600, 10):
        scaler.observe(sample(t, FAST, 0.3, replica_id="a", task_id="a"))
        if scaler.draining("chat"):
            break
    # They were never forgotten: the scale-in named one of them (the newest), and the count
    # is what the fleet is.
    assert scaler.draining("chat") in (["c"], ["b", "c"])
    assert scaler.replicas("chat") == 3 - len(scaler.draining("chat"))


def test_a_released_replica_is_gone_and_one_never_placed_is_forgotten_after_the_window() -> None:
    scaler = Autoscaler(ScalingPolicy(strategy="rule", min_replicas=3))
    scaler.allocation_granted("a", "n0", [0], ts(0))
    scaler.observe(sample(0, FAST, 0.5, replica_id="a", task_id="a"))
    scaler.observe(sample(0, FAST, 0.5, replica_id="b", task_id="b"))  # no allocation seen
    scaler.observe(sample(0, FAST, 0.5, replica_id="c", task_id="c"))
    assert scaler.replicas("chat") == 3
    # Only "c" reports on: "a" (placed) stays, "b" (never seen placed) is forgotten.
    scaler.observe(sample(90, FAST, 0.5, replica_id="c", task_id="c"))
    assert scaler.replicas("chat") == 2
    scaler.allocation_released("a")
    assert scaler.replicas("chat") == 1
