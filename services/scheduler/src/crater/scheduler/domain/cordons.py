"""Cordons: cards (or a whole node) that take no new work because of a fault the probe
reported, or because an operator said so (docs/health.md, Card faults).

Each heartbeat's `gpu_faults` is the node's faults now. A card with a fault whose action is
`reset-card` is cordoned while the probe reports it, `operator` until an operator lifts the
cordon, and `reboot-node` cordons the card and keeps the whole node from new work while the
probe reports it. The tasks running on a card when it is cordoned for a fault end, failed of
kind node-fault, and their restart policies decide what follows (never that card again: it is
cordoned; their node last, as for any failure). A heartbeat without faults lifts the cordons
that wait for the card to be healthy; an operator's uncordon lifts any, and the fault behind
it stays lifted while the probe reports that same occurrence.

A cordoned card keeps its free share blocked (`Node.block`), so every filter, score and the
ledger see it busy; what its tasks give back stays blocked until the cordon lifts. Readings
(action `none`: heat, a degraded link) cordon nothing: they only lower the card's rank
(`Node.readings`, the LiveReadings score).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from crater.contracts import (
    AttemptFailure,
    Event,
    GpuCordonRequested,
    GpuFault,
    GpuFaultAction,
    GpuFaultKind,
    NodeHealthReported,
    ReleaseReason,
)
from crater.scheduler.domain.cluster import CardCordon, FaultKey, Node
from crater.scheduler.domain.lifecycle import Lifecycle
from crater.scheduler.domain.state import SchedulerState

# A card's penalty for each reading (LiveReadings): another process's memory on it counts by
# the share of the card it holds, at least this much.
READING_PENALTY: dict[GpuFaultKind, float] = {
    GpuFaultKind.HOT: 0.5,
    GpuFaultKind.PCIE_DEGRADED: 0.5,
    GpuFaultKind.NVLINK_DEGRADED: 0.5,
}
FOREIGN_PROCESS_PENALTY = 0.5


def fault_text(fault: GpuFault) -> str:
    what = f"Xid {fault.xid}" if fault.kind is GpuFaultKind.XID else fault.kind.value
    return what + (
        f" ({fault.detail})" if fault.detail and fault.kind is not GpuFaultKind.XID else ""
    )


class Cordons:
    """Cordons cards and nodes on the probe's faults and an operator's word."""

    def __init__(self, state: SchedulerState, lifecycle: Lifecycle) -> None:
        self.state = state
        self.lifecycle = lifecycle

    def on_health(self, event: NodeHealthReported) -> tuple[list[Event], bool]:
        """The node's cordons follow its faults now; the tasks on a card newly cordoned for
        a fault end. Returns the decisions and whether what is free changed."""
        node = self.state.cluster.get(event.node_id)
        if node is None:
            return [], False
        at = event.occurred_at.timestamp()
        if node.faults_at is not None and at < node.faults_at:
            return [], False  # an older report, delivered late: the newer one stands
        node.faults_at = at
        faults = [f for f in event.gpu_faults or () if f.gpu < len(node.gpu_milli_free)]
        readings = self.readings(node, event, faults)
        node.readings = readings  # ranks only: no waiting task becomes placeable by it
        self.state.cluster.note_readings(node)
        if not faults and not node.cordons and node.node_cordon is None and not node.cleared:
            return [], False  # the common case: nothing to do
        reported = {f.key for f in faults}
        node.cleared &= reported  # a lifted fault no longer reported is forgotten
        wanted: dict[int, CardCordon] = {}
        for fault in faults:
            if fault.action is GpuFaultAction.NONE or fault.key in node.cleared:
                continue
            until: Literal["healthy", "operator"] = (
                "operator" if fault.action is GpuFaultAction.OPERATOR else "healthy"
            )
            lifts = "an operator lifts it" if until == "operator" else "reported healthy"
            reason = (
                f"GPU {fault.gpu} of {node.name} is cordoned: {fault_text(fault)}, until {lifts}"
            )
            known = wanted.get(fault.gpu)
            if known is None or (known.until == "healthy" and until == "operator"):
                wanted[fault.gpu] = CardCordon(reason, until, fault.key)
        reboot = next((f for f in faults if f.action is GpuFaultAction.REBOOT_NODE), None)
        node_cordon = (
            None
            if reboot is None
            else f"{node.name} is cordoned: GPU {reboot.gpu} {fault_text(reboot)} needs a reboot"
        )
        changed = node_cordon != node.node_cordon
        node.node_cordon = node_cordon
        for gpu, cordon in sorted(node.cordons.items()):
            if cordon.until == "healthy" and gpu not in wanted:
                self.lift(node, gpu)
                changed = True
        newly: dict[int, CardCordon] = {}
        for gpu, cordon in sorted(wanted.items()):
            held = node.cordons.get(gpu)
            if held is None:
                newly[gpu] = cordon
            elif held.until == "operator" and held.fault is None:
                continue  # an operator's own cordon stands as it is
            elif held != cordon and not (held.until == "operator" and cordon.until == "healthy"):
                node.cordons[gpu] = cordon  # the same card, now for another (or worse) fault
        decisions: list[Event] = []
        for gpu, cordon in newly.items():
            self.cordon(node, gpu, cordon)
            changed = True
        if newly:
            decisions += self.end_tasks_on(node, newly, event)
        if changed:
            self.state.cluster.refresh(node.name)
            self.state.stale_pools = None
        return decisions, changed

    def on_request(self, event: GpuCordonRequested) -> tuple[list[Event], bool]:
        """An operator cordons a card (what runs there goes on), or lifts its cordon,
        whatever put it there. A request naming no such node or card changes nothing."""
        node = self.state.cluster.get(event.node_id)
        if node is None or event.gpu >= len(node.gpu_milli_free):
            return [], False
        held = node.cordons.get(event.gpu)
        if event.cordon:
            if held is not None:
                return [], False
            who = f" by {event.requested_by}" if event.requested_by else ""
            why = f": {event.reason}" if event.reason else ""
            reason = (
                f"GPU {event.gpu} of {node.name} is cordoned{who}{why}, until an operator lifts it"
            )
            self.cordon(node, event.gpu, CardCordon(reason, "operator"))
        else:
            if held is None:
                return [], False
            if held.fault is not None:
                node.cleared.add(held.fault)
            self.lift(node, event.gpu)
        self.state.cluster.refresh(node.name)
        self.state.stale_pools = None
        return [], True

    def cordon(self, node: Node, gpu: int, cordon: CardCordon) -> None:
        node.cordons[gpu] = cordon
        node.block(gpu)  # already blocked for an unknown task: it stays so

    def lift(self, node: Node, gpu: int) -> None:
        """The card takes work again, unless a task the core does not hold still runs on it
        (reconcile.py keeps that card blocked until it goes)."""
        node.cordons.pop(gpu, None)
        runs = self.state.unknown.get(node.name, {})
        if not any(gpu in run.held for run in runs.values()):
            node.unblock(gpu)

    def end_tasks_on(
        self, node: Node, cordoned: dict[int, CardCordon], cause: NodeHealthReported
    ) -> list[Event]:
        """Every attempt with a member on a newly cordoned card ends, failed of kind
        node-fault; its restart policy decides whether it runs again (elsewhere)."""
        heads = sorted(
            (
                head
                for head in self.state.allocations.values()
                if any(
                    m.node == node.name and set(m.gpu_ids) & cordoned.keys() for m in head.members()
                )
            ),
            key=lambda head: head.task_id,
        )
        decisions: list[Event] = []
        for head in heads:
            cards = sorted(
                {g for m in head.members() if m.node == node.name for g in m.gpu_ids}
                & cordoned.keys()
            )
            why = "; ".join(cordoned[g].reason for g in cards)
            decisions += self.lifecycle.attempt_over(
                head, ReleaseReason.FAILED, cause, why=why, kind=AttemptFailure.NODE_FAULT
            )
        return decisions

    def readings(
        self, node: Node, event: NodeHealthReported, faults: list[GpuFault]
    ) -> dict[int, float]:
        """Each card's penalty from the heartbeat's live readings: heat, a degraded link,
        another process holding memory on a card the core holds wholly free. O(faults +
        processes): every heartbeat comes through here."""
        penalty: dict[int, float] = {}
        for fault in faults:
            weight = READING_PENALTY.get(fault.kind)
            if weight is not None:
                penalty[fault.gpu] = min(1.0, penalty.get(fault.gpu, 0.0) + weight)
        if event.gpu_processes:
            whole = node.gpu_capacity_milli
            for process in event.gpu_processes:
                gpu = process.gpu
                # A card the core holds (part of) is its tasks': whose process it is is not
                # asked (reconcile.py judges that); one it holds wholly free is another's.
                if gpu >= len(node.gpu_milli_free) or node.gpu_milli_free[gpu] < whole:
                    continue
                total = node.topology.gpus[gpu].memory_mb or 1
                share = max(FOREIGN_PROCESS_PENALTY, process.memory_mb / total)
                penalty[gpu] = min(1.0, penalty.get(gpu, 0.0) + share)
        return penalty


def _key_out(key: FaultKey) -> list[Any]:
    gpu, kind, xid, since = key
    return [gpu, kind, xid, since.isoformat()]


def _key_in(data: list[Any]) -> FaultKey:
    gpu, kind, xid, since = data
    return (int(gpu), str(kind), None if xid is None else int(xid), datetime.fromisoformat(since))


def stored(node: Node) -> dict[str, Any] | None:
    """A node's cordons as the database keeps them (JSON); None: nothing to keep."""
    if not node.cordons and not node.cleared and node.node_cordon is None:
        return None
    return {
        "cards": {
            str(gpu): {
                "reason": c.reason,
                "until": c.until,
                "fault": None if c.fault is None else _key_out(c.fault),
            }
            for gpu, c in sorted(node.cordons.items())
        },
        "cleared": sorted(_key_out(k) for k in node.cleared),
        "node": node.node_cordon,
        "faults_at": node.faults_at,
    }


def restore(node: Node, data: dict[str, Any]) -> None:
    """A node's stored cordons back, after its allocations are held (a cordoned card's free
    share is blocked on top of them)."""
    cards = len(node.gpu_milli_free)
    for gpu, entry in sorted(data.get("cards", {}).items(), key=lambda item: int(item[0])):
        if int(gpu) >= cards:
            continue  # a card gone from the topology since
        fault = entry.get("fault")
        node.cordons[int(gpu)] = CardCordon(
            entry["reason"], entry["until"], None if fault is None else _key_in(fault)
        )
        node.block(int(gpu))
    node.cleared = {_key_in(k) for k in data.get("cleared", [])}
    node.node_cordon = data.get("node")
    node.faults_at = data.get("faults_at")
