"""A node-scoped message must name, in its body, the node its subject names: the subject is
what a node's NATS credential is bound to, so the body is bound with it."""

from __future__ import annotations

from crater.contracts import Subjects
from crater.runtime.bus import node_mismatch


def test_a_body_naming_its_subjects_node_passes() -> None:
    subject = Subjects.NODE_HEALTH.for_node("node-a")
    assert node_mismatch(subject, {"node_id": "node-a"}) is None
    topology = Subjects.NODE_TOPOLOGY.for_node("node-a")
    assert node_mismatch(topology, {"node": {"node_id": "node-a"}}) is None


def test_a_body_naming_another_node_is_refused_with_both_named() -> None:
    wrong = node_mismatch(Subjects.NODE_METRICS.for_node("node-a"), {"node_id": "node-b"})
    assert wrong is not None
    assert wrong.field == "node_id"
    assert "'node-b'" in wrong.reason
    assert "'node-a'" in wrong.reason
    topology = node_mismatch(
        Subjects.NODE_TOPOLOGY.for_node("node-a"), {"node": {"node_id": "node-b"}}
    )
    assert topology is not None
    assert topology.field == "node.node_id"


def test_other_subjects_and_bodies_without_a_node_id_are_left_to_the_schema() -> None:
    assert node_mismatch(Subjects.TASK_STATUS.subject, {"node_id": "x"}) is None
    assert node_mismatch(Subjects.NODE_HEALTH.for_node("node-a"), {}) is None
    assert node_mismatch(Subjects.NODE_HEALTH.for_node("node-a"), [1, 2]) is None
    assert node_mismatch(Subjects.NODE_TOPOLOGY.for_node("node-a"), {"node": "x"}) is None
