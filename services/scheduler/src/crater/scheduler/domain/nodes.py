"""The fleet as reported: topology, health, silence past the heartbeat timeout (NotReady) and
nodes lost long enough that what they held goes back."""

from __future__ import annotations

from datetime import datetime

from crater.contracts import (
    Event,
    NodeCondition,
    NodeHealthReported,
    NodeTopologyReported,
    ReleaseReason,
)
from crater.scheduler.domain.cluster import (
    Node,
)
from crater.scheduler.domain.lifecycle import Lifecycle
from crater.scheduler.domain.state import (
    SchedulerState,
    consumed_until,
    hold,
)

# The least event time between two scans for lost nodes.
NODE_LOST_SCAN_SECONDS = 1.0


class NodeWatch:
    """Keeps the nodes and their heartbeats, and releases what lost nodes held."""

    def __init__(self, state: SchedulerState, lifecycle: Lifecycle) -> None:
        self.state = state
        self.lifecycle = lifecycle

    def release_lost_nodes(self, now: datetime, cause: Event) -> list[Event]:
        """Allocations on nodes silent past their heartbeat timeout and the lost-node grace go
        back (`node-lost`); their tasks are retried or end failed. Looked for once a second of
        event time at most."""
        if self.state.lost_scan_at is not None and (
            now - self.state.lost_scan_at
        ).total_seconds() < (NODE_LOST_SCAN_SECONDS):
            return []
        self.state.lost_scan_at = now
        if not self.state.allocations:
            return []
        silence = self.state.config.heartbeat_timeout_seconds + self.state.config.node_lost_seconds
        deadline = self.heard_until(now).timestamp() - silence
        lost = {
            node.name
            for node in self.state.cluster.nodes
            if node.last_heartbeat_at is not None
            and node.last_heartbeat_at < deadline
            and node.condition is NodeCondition.NOT_READY
        }
        if not lost:
            return []
        heads = sorted(
            (
                a
                for a in self.state.allocations.values()
                if any(m.node in lost for m in a.members())
            ),
            key=lambda a: a.task_id,
        )
        released: list[Event] = []
        for head in heads:
            released += self.lifecycle.attempt_over(head, ReleaseReason.NODE_LOST, cause)
        return released

    def on_topology(self, event: NodeTopologyReported) -> None:
        existing = self.state.cluster.get(event.node.node_id)
        node = Node.empty(event.node, self.state.config.overcommit_for(event.node.pool))
        if existing is not None:
            node.condition = existing.condition
            node.last_heartbeat_at = existing.last_heartbeat_at
            # Cordons outlive a re-reported topology (cards gone from it hold none).
            cards = len(node.gpu_milli_free)
            node.cordons = {g: c for g, c in existing.cordons.items() if g < cards}
            node.cleared = set(existing.cleared)
            node.node_cordon, node.faults_at = existing.node_cordon, existing.faults_at
            node.readings = dict(existing.readings)
        node.last_heartbeat_at = node.last_heartbeat_at or event.occurred_at.timestamp()
        self.state.cluster.upsert(node)
        self.state.stale_pools = None  # a node more or changed: every summary counts it
        self.heard_from(node)
        for allocation in self.state.allocations.values():
            for member in allocation.members():
                if member.node == node.name:
                    hold(node, member)
        if existing is not None:  # cards an unknown task runs on stay blocked (reconcile.py)
            for gpu in sorted(existing.blocked):
                node.block(gpu)
        self.state.cluster.refresh(node.name)

    def on_health(self, event: NodeHealthReported) -> bool:
        node = self.state.cluster.get(event.node_id)
        if node is None:
            return False  # health before topology: wait for the topology
        node.last_heartbeat_at = event.occurred_at.timestamp()
        was, score = node.condition, node.health_score
        self.heard_from(node)
        if was is event.condition and score == event.score:
            return False  # the row holds nothing a heartbeat's time changes: no refresh
        node.condition, node.health_score = event.condition, event.score
        self.state.cluster.refresh(node.name)
        self.state.stale_pools = None  # readiness is judged first, for every pool's tasks
        return True

    def heard_until(self, now: datetime) -> datetime:
        """The time up to which nodes' heartbeats have been consumed: silence is measured to
        it, so a lagging stream never makes a live node look silent, and a quiet one still
        lets a dead fleet be found."""
        return consumed_until(self.state.health_clock, now, self.state.config.heartbeat_lag_seconds)

    def expire_heartbeats(self, now: datetime) -> bool:
        deadline = now.timestamp() - self.state.config.heartbeat_timeout_seconds
        if self.state.heartbeat_floor is not None and self.state.heartbeat_floor >= deadline:
            return False  # no Ready node has been silent that long
        changed = False
        floor = float("inf")
        for node in self.state.cluster.nodes:
            silent = node.last_heartbeat_at is not None and node.last_heartbeat_at < deadline
            if silent and node.condition is not NodeCondition.NOT_READY:
                node.condition = NodeCondition.NOT_READY
                self.state.cluster.refresh(node.name)
                self.state.stale_pools = None
                changed = True
            elif (
                node.last_heartbeat_at is not None and node.condition is not NodeCondition.NOT_READY
            ):
                floor = min(floor, node.last_heartbeat_at)
        self.state.heartbeat_floor = floor
        return changed

    def heard_from(self, node: Node) -> None:
        """A node's heartbeat (or condition) changed: it may now be the oldest Ready one."""
        if self.state.heartbeat_floor is not None and node.last_heartbeat_at is not None:
            self.state.heartbeat_floor = min(self.state.heartbeat_floor, node.last_heartbeat_at)
