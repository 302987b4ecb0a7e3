"""Lending by phase (docs/pools.md): a running training task that enters a CPU phase lends
its whole cards to inference replicas, isolated, and gets them back when it asks, within a
bounded time.

- `cpu` (begin): the task's cards become lendable until it asks them back or its phase
  passes the maximum (`phase_max_seconds`, or the task's own `expected_seconds` if shorter).
- A waiting inference replica that fits neither its own pool nor a cohort mate's idle nodes
  may take one lent card on a node of its pool or its cohort: one replica per card, its GPU
  memory capped to what the lender does not keep resident there. The lender keeps holding
  the card (the replica holds 0 of it), so nothing else can be placed there.
- `gpu` (end), the maximum passed, or the lender told to yield: the replicas on its cards are
  told to be gone within `phase_reclaim_grace_seconds` (the lender's own deadline, if
  earlier), and are released then at the latest; once none is left the task is told its
  cards are its own (`returned`).
- The lender ending while replicas are on its cards: each replica takes the lender's hold of
  its card over (`Ledger.hand_over_lent_cards`) and is told to go with the same grace.

Isolation, chosen per card by its capabilities, and said in the grant: a MIG-capable card on
which the lender reported keeping nothing resident (0 MiB: its GPU processes are gone for the
phase) is empty, so it is cut like any free card (mig.py): the replica gets the smallest MIG
slice that holds its memory, isolated by the hardware. Any other card (no MIG, or the lender's
memory still resident: a card is cut only while nothing runs on it) is shared with a memory
limit, the card less what the lender keeps and a headroom.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

import numpy as np

from crater.contracts import (
    AllocationGranted,
    Event,
    GpuPhase,
    LendingState,
    NodeCondition,
    TaskGpusLending,
    TaskPhaseReported,
    TaskType,
    derived_event_id,
)
from crater.scheduler.domain.cluster import WHOLE, Node
from crater.scheduler.domain.mig import MigProfile, card_geometry
from crater.scheduler.domain.placement import select
from crater.scheduler.domain.placer import Placer
from crater.scheduler.domain.preemptor import Preemptor
from crater.scheduler.domain.state import (
    Allocation,
    LendingPhase,
    PendingTask,
    SchedulerState,
)

# Left free on a lent card beyond what the lender keeps resident: the CUDA context and the
# allocator's slack of the lender, which grow when it resumes.
LEND_HEADROOM_MB = 1024


class Phases:
    """Begins and ends CPU phases, places replicas on lent cards and takes them back."""

    def __init__(self, state: SchedulerState, placer: Placer, preemptor: Preemptor) -> None:
        self.state = state
        self.placer = placer
        self.preemptor = preemptor

    # -- the task's reports -------------------------------------------------------------------

    def on_phase(self, event: TaskPhaseReported) -> list[Event]:
        if event.phase is GpuPhase.CPU:
            return self.begin(event)
        phase = self.state.phases.get(event.task_id)
        if phase is None or phase.allocation_id != event.allocation_id:
            # an end before any begin, a duplicate end after the cards came back, or a phase
            # a restart forgot with nothing lent: the cards are the task's already
            return [self._said(event, event.task_id, LendingState.RETURNED, "nothing was lent")]
        return self.reclaim(phase, event, "it asked for them back")

    def begin(self, event: TaskPhaseReported) -> list[Event]:
        lender = self.state.allocations.get(event.task_id)
        refusal = self.refuse_begin(event, lender)
        if refusal is not None or lender is None:
            return [self._said(event, event.task_id, LendingState.REFUSED, refusal or "")]
        phase = self.state.phases.get(event.task_id)
        if phase is not None and phase.must_be_free_by is not None:
            why = "its cards are being taken back; begin again once they are returned"
            return [self._said(event, event.task_id, LendingState.REFUSED, why, phase)]
        if phase is not None:  # a second begin: the phase goes on as it was
            return [self._said(event, event.task_id, LendingState.LENT, "lending already", phase)]
        now = self.now(event)
        longest = self.state.config.phase_max_seconds
        seconds = min(longest, event.expected_seconds or longest)
        phase = LendingPhase(
            task_id=event.task_id,
            allocation_id=lender.allocation_id,
            node=lender.node,
            gpu_ids=lender.gpu_ids,
            resident_mb={g.gpu_id: g.memory_used_mb for g in event.gpus},
            lent_until=now + timedelta(seconds=seconds),
        )
        self.state.phases[event.task_id] = phase
        self.state.stale_pools = None  # a waiting replica of any pool may fit now
        why = f"its GPUs may be lent to inference replicas for at most {seconds:g} s"
        return [self._said(event, event.task_id, LendingState.LENT, why, phase)]

    def refuse_begin(self, event: TaskPhaseReported, lender: Allocation | None) -> str | None:
        """Why `event` cannot begin a phase (None: it can)."""
        if lender is None:
            return f"task {event.task_id} is not running (it holds no allocation)"
        if event.allocation_id != lender.allocation_id:
            return f"allocation {event.allocation_id} is not the task's ({lender.allocation_id})"
        if not lender.running:
            return "its allocation is not confirmed running yet"
        if lender.yield_by is not None:
            return "it is being preempted"
        if lender.peers:
            return "a gang's GPUs are not lent (one node's task only)"
        if lender.lent_by is not None or not lender.gpu_ids:
            return "it holds no card of its own to lend"
        if lender.mig_profile is not None or lender.gpu_milli < WHOLE:
            return "it holds a share of a card, not whole cards"
        return None

    # -- placing replicas on lent cards -------------------------------------------------------

    def open_phases(self) -> list[LendingPhase]:
        """The phases that lend now: not being taken back, the lender holding its cards."""
        found = []
        for task_id in sorted(self.state.phases):
            phase = self.state.phases[task_id]
            lender = self.state.allocations.get(task_id)
            if (
                phase.must_be_free_by is None
                and lender is not None
                and lender.allocation_id == phase.allocation_id
                and lender.yield_by is None
            ):
                found.append(phase)
        return found

    def place(self, task: PendingTask, cause: Event) -> list[AllocationGranted]:
        """`task` on a lent card, when it is an inference replica of one card that fits one
        (its memory within the card's cap; its cores, memory, labels and taints through the
        node's pool's filters); else nothing."""
        demand = task.demand
        request = task.request
        if (
            request.task_type is not TaskType.INFERENCE
            or task.gang_size != 1
            or demand.gpus != 1
            or demand.mig_profile is not None
        ):
            return []
        for phase in self.open_phases():
            node = self.state.cluster.get(phase.node)
            if node is None or node.condition is not NodeCondition.READY:
                continue
            pool = node.topology.pool
            if pool != request.pool and pool not in self.state.config.cohort_of(request.pool):
                continue
            host = replace(demand, pool=pool, gpus=0, gpu_milli=0, gpu_memory_mb=0)
            among = np.zeros(len(self.state.cluster), np.bool_)
            among[self.state.cluster.index[node.name]] = True
            fits, _ = self.placer.diagnose(host, among=among)
            if not fits.any():
                continue
            for card in phase.gpu_ids:
                if (node.name, card) in self.state.lent_cards:
                    continue  # one replica per lent card
                mig = self.mig_slice(node, phase, card, demand.gpu_memory_mb)
                cap = self.lendable_mb(node, phase, card) if mig is None else mig.memory_gb * 1024
                if cap <= 0 or demand.gpu_memory_mb > cap:
                    continue
                selection = select(node, host)
                if selection is None:
                    break  # no cores or memory for it on this node
                on_card = replace(
                    selection, gpu_ids=(card,), mig_profile=None if mig is None else mig.name
                )
                grant = self.placer.grant(task, node, on_card, 0.0, [], cause, 0, phase.task_id)
                return [self._lent_grant(grant, node, phase, card, cap, mig)]
        return []

    def mig_slice(
        self, node: Node, phase: LendingPhase, card: int, memory_mb: int
    ) -> MigProfile | None:
        """The MIG slice a replica needing `memory_mb` gets on lent `card`: the smallest of the
        card's profiles (fewest compute slices, then memory) that holds it, when the card
        cuts into MIG and the lender keeps nothing resident there; else None (shared)."""
        if phase.resident_mb.get(card) != 0:
            return None  # the lender's memory (or, unreported, its request) stays on the card
        gpu = next((g for g in node.topology.gpus if g.index == card), None)
        if gpu is None or not gpu.mig_capable:
            return None
        shape = card_geometry(gpu.mig_profiles)
        if shape is None:
            return None
        fitting = [
            MigProfile.parse(name)
            for name in shape.profiles
            if MigProfile.parse(name).memory_gb * 1024 >= memory_mb
        ]
        return min(fitting, key=lambda p: (p.compute, p.memory_gb, p.name), default=None)

    def lendable_mb(self, node: Node, phase: LendingPhase, card: int) -> int:
        """GPU memory a replica may use on `card`: the card's, less what the lender keeps
        resident (as it reported at the phase's begin, else what it asked for per card) and
        the headroom."""
        size = next((g.memory_mb for g in node.topology.gpus if g.index == card), 0)
        lender = self.state.allocations.get(phase.task_id)
        asked = lender.task.demand.gpu_memory_mb if lender and lender.task else size
        resident = phase.resident_mb.get(card, asked)
        return size - resident - LEND_HEADROOM_MB

    def isolation(self, node: Node, card: int, cap: int, mig: MigProfile | None = None) -> str:
        """How a replica on a lent card is kept off the lender's memory, chosen by the card's
        capabilities, in words."""
        if mig is not None:
            return f"a MIG slice {mig.name} (the lender keeps nothing resident on the card)"
        gpu = next((g for g in node.topology.gpus if g.index == card), None)
        limit = f"memory-limited sharing ({cap} MiB)"
        if gpu is not None and (gpu.mig_capable or gpu.mig_profiles):
            return f"{limit}; not MIG: a card is cut only while empty, the lender's memory stays"
        return f"{limit}; the card has no MIG"

    def _lent_grant(
        self,
        grant: AllocationGranted,
        node: Node,
        phase: LendingPhase,
        card: int,
        cap: int,
        mig: MigProfile | None = None,
    ) -> AllocationGranted:
        """The grant as the replica is told of it: the card lent, its cap, why."""
        where = (
            f"on GPU {card} of {node.name}, lent by task {phase.task_id} during its CPU "
            f"phase, isolated by {self.isolation(node, card, cap, mig)}"
        )
        environment = grant.environment | {
            "CRATER_LENT_BY": phase.task_id,
            "CRATER_GPU_MEMORY_LIMIT_MB": str(cap),
        }
        return grant.model_copy(
            update={
                "explanation": f"{where}; {grant.explanation}",
                "environment": environment,
            }
        )

    # -- taking the cards back ----------------------------------------------------------------

    def replicas(self, phase: LendingPhase) -> list[Allocation]:
        """The replicas on `phase`'s cards now."""
        found = []
        for card in phase.gpu_ids:
            task_id = self.state.lent_cards.get((phase.node, card))
            replica = self.state.allocations.get(task_id) if task_id else None
            if replica is not None and replica.lent_by == phase.task_id:
                found.append(replica)
        return found

    def reclaim(
        self, phase: LendingPhase, cause: Event, why: str, by: datetime | None = None
    ) -> list[Event]:
        """The replicas on `phase`'s cards are told to be gone within the grace (by `by` if
        earlier); with none there the cards are the task's at once."""
        now = self.now(cause)
        deadline = now + timedelta(seconds=self.state.config.phase_reclaim_grace_seconds)
        if by is not None:
            deadline = max(now, min(deadline, by))
        if phase.must_be_free_by is not None and phase.must_be_free_by <= deadline:
            # asked again: the deadline already set stands
            why = phase.why_back
            return [self._said(cause, phase.task_id, LendingState.RECLAIMING, why, phase)]
        phase.must_be_free_by, phase.why_back = deadline, why
        decisions: list[Event] = []
        replicas = self.replicas(phase)
        for replica in replicas:
            if replica.yield_by is None or replica.yield_by > deadline:
                decisions += self.preemptor.order_yield(
                    replica, deadline, cause, None, None, lent_by=phase.task_id
                )
        if not replicas:
            del self.state.phases[phase.task_id]
            said = f"{why}; no replica was on them"
            return [self._said(cause, phase.task_id, LendingState.RETURNED, said, phase)]
        decisions.append(self._said(cause, phase.task_id, LendingState.RECLAIMING, why, phase))
        return decisions

    def settle(self, cause: Event) -> list[Event]:
        """After each event: a phase past its maximum, or whose lender is told to yield, is
        taken back; one whose lender went lets its replicas go; one taken back whose cards
        are empty now is over (`returned`)."""
        decisions: list[Event] = []
        now = self.now(cause)
        for task_id in sorted(self.state.phases):
            phase = self.state.phases[task_id]
            lender = self.state.allocations.get(task_id)
            if lender is None or lender.allocation_id != phase.allocation_id:
                decisions += self._lender_gone(phase, cause, now)
                continue
            if phase.lent_until is None:  # restored: the maximum counts from the restart
                phase.lent_until = now + timedelta(seconds=self.state.config.phase_max_seconds)
            if lender.yield_by is not None and (
                phase.must_be_free_by is None or phase.must_be_free_by > lender.yield_by
            ):
                decisions += self.reclaim(phase, cause, "it is preempted", lender.yield_by)
            elif phase.must_be_free_by is None and now >= phase.lent_until:
                decisions += self.reclaim(phase, cause, "its phase reached its maximum")
            elif phase.must_be_free_by is not None and not self.replicas(phase):
                del self.state.phases[task_id]
                why = f"{phase.why_back}; the replicas on them have left"
                decisions.append(self._said(cause, task_id, LendingState.RETURNED, why, phase))
        return decisions

    def _lender_gone(self, phase: LendingPhase, cause: Event, now: datetime) -> list[Event]:
        """The lender ended (or lost its node): its replicas hold its cards now and go within
        the grace; the phase is over (the task is gone: nothing is said to it)."""
        del self.state.phases[phase.task_id]
        deadline = now + timedelta(seconds=self.state.config.phase_reclaim_grace_seconds)
        decisions: list[Event] = []
        for replica in self.replicas(phase):
            if replica.yield_by is None or replica.yield_by > deadline:
                decisions += self.preemptor.order_yield(
                    replica, deadline, cause, None, None, lent_by=phase.task_id
                )
        return decisions

    def restore(self) -> None:
        """After loading (`Scheduler.restore`): a lender with a replica on its cards is in
        its phase still (its maximum counted from the first event; taken back already when
        the replica was yielding). A phase with no replica on its cards is not stored: a
        restart forgets it, and its end is answered `returned`."""
        for head in sorted(self.state.allocations.values(), key=lambda a: a.task_id):
            lender = self.state.allocations.get(head.lent_by) if head.lent_by else None
            if lender is None or head.gpu_milli:
                continue  # not on a lent card, or holding it itself (its lender went)
            phase = self.state.phases.get(lender.task_id)
            if phase is None:
                phase = self.state.phases[lender.task_id] = LendingPhase(
                    task_id=lender.task_id,
                    allocation_id=lender.allocation_id,
                    node=lender.node,
                    gpu_ids=lender.gpu_ids,
                    resident_mb={},
                    lent_until=None,
                )
            if head.yield_by is not None:
                phase.why_back = "taken back before a restart"
                phase.must_be_free_by = max(phase.must_be_free_by or head.yield_by, head.yield_by)

    # -- helpers ------------------------------------------------------------------------------

    def now(self, cause: Event) -> datetime:
        return self.state.clock or cause.occurred_at

    def _said(
        self,
        cause: Event,
        task_id: str,
        state: LendingState,
        reason: str,
        phase: LendingPhase | None = None,
    ) -> TaskGpusLending:
        allocation_id = getattr(cause, "allocation_id", None)
        if phase is not None:
            allocation_id = phase.allocation_id
        return TaskGpusLending(
            event_id=derived_event_id(cause.event_id, f"lending:{task_id}:{state.value}"),
            occurred_at=cause.occurred_at,
            task_id=task_id,
            allocation_id=allocation_id,
            node=None if phase is None else phase.node,
            state=state,
            gpu_ids=[] if phase is None else list(phase.gpu_ids),
            must_be_free_by=None if phase is None else phase.must_be_free_by,
            lent_until=phase.lent_until if phase and state is LendingState.LENT else None,
            reason=reason,
        )


def phase_state(phase: LendingPhase) -> LendingState:
    """Where a phase stands: lending, or its cards being taken back."""
    return LendingState.LENT if phase.must_be_free_by is None else LendingState.RECLAIMING


def restored_lent_milli(allocations: list[Allocation]) -> None:
    """Before loaded allocations are held: a replica on a lent card holds none of it while
    its lender (whoever else holds that card) is there, else the whole card itself."""
    held = {(a.node, card) for a in allocations if a.lent_by is None for card in a.gpu_ids}
    for a in allocations:
        if a.lent_by is not None:
            a.gpu_milli = 0 if (a.node, a.gpu_ids[0]) in held else WHOLE
