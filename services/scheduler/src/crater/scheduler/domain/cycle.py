"""The retry pass: the waiting tasks of the stale pools tried again in queue order, each
placed, or told why it waits, made its pool's head, and given victims to preempt."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime

from crater.contracts import (
    AllocationGranted,
    Event,
    FilterReason,
)
from crater.scheduler.domain.cluster import (
    BoolArray,
)
from crater.scheduler.domain.demand import Demand
from crater.scheduler.domain.gpu_order import one_model
from crater.scheduler.domain.guarantees import Guarantees
from crater.scheduler.domain.lending import Lending
from crater.scheduler.domain.phases import Phases
from crater.scheduler.domain.placer import Diagnosis, Placer
from crater.scheduler.domain.preemptor import Preemptor
from crater.scheduler.domain.queue import Backfill, node_mask
from crater.scheduler.domain.quotas import CLAIMED, Over
from crater.scheduler.domain.reasons import Reasons
from crater.scheduler.domain.retries import RetryIndex
from crater.scheduler.domain.state import (
    PendingTask,
    SchedulerState,
)
from crater.scheduler.domain.waitlist import Waitlist, either

# A task that did not fit its own pool, kept to borrow after the pass (fair share): its
# reserved nodes, the quota it is over, its filters' diagnosis.
Deferred = tuple[PendingTask, BoolArray | None, list[Over], Diagnosis | None]
Memo = tuple[Demand, Backfill | None, tuple[str, ...]]
Why = tuple[list[FilterReason], str]


@dataclass
class Pass:
    """What one retry pass remembers between its tasks."""

    # a (demand, head's reserved nodes, nodes claimed ahead or failed on) that found no
    # candidate node since the last grant
    no_candidates: dict[Memo, Diagnosis] = field(default_factory=dict)
    # ... and, for such a task, why it waits: a function of the same, of its gang, and of
    # the bound of its wait for its first GPU model (gpu_order.py)
    said: dict[tuple[Demand, Backfill | None, tuple[str, ...], int, bool, datetime | None], Why] = (
        field(default_factory=dict)
    )
    masks: dict[Backfill, BoolArray] = field(default_factory=dict)
    deferred: list[Deferred] = field(default_factory=list)
    # Under queues with guarantees: the tasks that waited for another's claim to its
    # guarantee, and whether something was placed since (the claimant, maybe): they are
    # tried once more at the end of the pass (docs/queues.md).
    claim_held: dict[str, PendingTask] = field(default_factory=dict)
    placed_since_held: bool = False

    def granted(self) -> None:
        """Something was placed: less is free, what found no node may find one now."""
        self.no_candidates.clear()
        self.said.clear()
        self.placed_since_held = bool(self.claim_held)


class Cycle:
    """Runs the retry pass."""

    def __init__(
        self,
        state: SchedulerState,
        retries: RetryIndex,
        placer: Placer,
        waitlist: Waitlist,
        reasons: Reasons,
        preemptor: Preemptor,
        lending: Lending | None = None,
        phasing: Phases | None = None,
        guarantees: Guarantees | None = None,
    ) -> None:
        self.state = state
        self.retries = retries
        self.placer = placer
        self.waitlist = waitlist
        self.reasons = reasons
        self.preemptor = preemptor
        self.lending = lending if lending is not None and lending.active else None
        self.phasing = phasing
        self.guarantees = guarantees

    def retry_pending(self, cause: Event) -> list[Event]:
        """Try the waiting tasks again, in queue order. Only those of stale pools: in any
        other, nothing a task's decision reads has changed since its last try. With fair
        share among tenants, the tasks that would borrow above their tenant's guarantee come
        last, the tenants by their standing (`Guarantees.standing`), least first.

        Within the pass, a task whose demand and reserved nodes equal those of one that found
        no candidate node since the last grant finds none either: it takes that diagnosis
        instead of running the filters again (nothing was ranked for it before either)."""
        decisions: list[Event] = []
        pools = self.retries.pools_to_retry()
        self.state.stale_pools, self.state.ranked_pools = set(), set()
        if pools is None:
            self.state.backfill = {}
        else:
            for pool in pools:
                self.state.backfill.pop(pool, None)
        if self.lending is not None:
            self.lending.begin_pass()
        run = Pass()
        borrowing: list[PendingTask] = []
        tenant_fair = self.guarantees is not None and self.guarantees.fair
        # Owners whose victims are all gone first, in the order they claimed: the room is
        # theirs (queue.py, "Claims"); one that does not fit now lets its claim go.
        ripe = self.waitlist.ripe_claims(pools)
        for task in ripe:
            decisions += self.try_task(task, cause, run)
            self.waitlist.end_claim(task)
        tried = {task.request.task_id for task in ripe}
        for task in self.waitlist.queue(pools):
            if task.request.task_id not in self.state.pending or task.not_before is not None:
                continue  # placed or cancelled in this pass, or waiting out a backoff
            if task.request.task_id in tried:
                continue
            if tenant_fair and self.state.quotas.would_borrow(
                task.request.tenant, task.demand, task.gang_size
            ):
                borrowing.append(task)
                continue
            decisions += self.try_task(task, cause, run)
        if borrowing and self.guarantees is not None:
            standing = {
                t: self.guarantees.standing(t) for t in {x.request.tenant for x in borrowing}
            }
            for task in sorted(borrowing, key=lambda t: standing[t.request.tenant]):
                if task.request.task_id in self.state.pending:
                    decisions += self.try_task(task, cause, run)
        if run.placed_since_held:
            # A claim that held a borrower may be gone (its task placed after it in this
            # pass: a ripe claim tried first waits for a sibling's claim to its own
            # guarantee): try the held ones again, in their order, once.
            for task in sorted(run.claim_held.values(), key=lambda t: t.seq):
                if task.request.task_id in self.state.pending and task.not_before is None:
                    decisions += self.try_task(task, cause, run)
        decisions += self.borrow_fairly(run.deferred, cause)
        # A pool where nodes were ranked would rank (and draw) again: retry it.
        if self.state.stale_pools is not None:
            self.state.stale_pools |= self.state.ranked_pools
        return decisions

    def try_task(self, task: PendingTask, cause: Event, run: Pass) -> list[Event]:
        """One waiting task of the pass: placed (on its pool, a cohort mate's idle nodes or
        a lent card), deferred to borrow fairly, or told why it waits, made its pool's head
        and given victims."""
        decisions: list[Event] = []
        head = self.waitlist.reserving_head(task)
        avoid = None if head is None else run.masks.get(head)
        if head is not None and avoid is None:
            avoid = run.masks[head] = head.mask(self.state.cluster)
        claimed = (*self.waitlist.claimed_nodes(task), *self.placer.shunned(task))
        if claimed:
            avoid = either(avoid, node_mask(self.state.cluster, claimed))
        over = self.state.quotas.blocking(
            task.request.tenant, task.demand, task.gang_size, task.request.user
        )
        found: Diagnosis | None = None
        why: tuple[list[FilterReason], str] | None = None
        if over and over[0][0] == CLAIMED and self.state.quotas.chains:
            run.claim_held.setdefault(task.request.task_id, task)
        if not over:
            memo = (task.filter_demand, head, claimed)
            found = run.no_candidates.get(memo)
            if found is not None:
                # the wait for a first GPU model is the task's own reason (its own bound)
                said = (*memo, task.gang_size, task.same_node, task.prefer_until)
                why = run.said.get(said)
                if why is None:
                    why = run.said[said] = self.reasons.why_waiting(task, avoid, over, found)
            else:
                found = self.placer.diagnose(task.filter_demand)
                if (found[0] if avoid is None else found[0] & ~avoid).any():
                    with self.first_model_only(task):
                        granted = self.placer.place(task, cause, found[0], avoid)
                    if granted:
                        self.state.dequeue(task.request.task_id)
                        run.granted()  # less is free now
                        return list(granted)
                else:
                    run.no_candidates[memo] = found
            if self.lending is not None and self.lending.fair:
                # fair share: borrowers are served after the pass, least usage first
                run.deferred.append((task, avoid, over, found))
                return decisions
            if self.lending is not None:
                # not on its own pool's nodes: on a cohort mate's idle ones?
                loaned, task.borrow_reason = self.borrow(task, cause, avoid)
                if loaned:
                    self.state.dequeue(task.request.task_id)
                    run.granted()
                    self.lending.begin_pass()
                    return list(loaned)
                why = None  # the reason to borrow is the task's own
            lent = self.on_lent_card(task, cause)
            if lent:
                self.state.dequeue(task.request.task_id)
                run.granted()
                return lent
        return decisions + self.wait(task, cause, avoid, over, found, why)

    def wait(
        self,
        task: PendingTask,
        cause: Event,
        avoid: BoolArray | None,
        over: list[Over],
        found: Diagnosis | None,
        why: Why | None = None,
    ) -> list[Event]:
        """`task` cannot start now: made its pool's head (if none), given victims, and told
        why it waits."""
        reasons, summary = why or self.reasons.why_waiting(task, avoid, over, found)
        if task.request.pool not in self.state.backfill and not over:
            self.waitlist.make_head(task)
        # Victims first, so that its reason says which it may not take yet (announced first).
        preempted = self.preemptor.preempt_for(task, cause)
        reasons, summary = self.reasons.after_preempting(
            task, preempted, (reasons, summary), avoid, over, found
        )
        return self.reasons.announce(task, cause, reasons, summary) + preempted

    def borrow_fairly(
        self,
        deferred: list[Deferred],
        cause: Event,
    ) -> list[Event]:
        """The tasks that did not fit their own pool, when borrowers share fairly: each pool's
        in queue order, the pools by their decayed usage (least first), each task then
        borrowing, or told why it waits, made its pool's head and given victims."""
        decisions: list[Event] = []
        if not deferred or self.lending is None:
            return decisions
        standing = {
            pool: self.lending.standing(pool) for pool in {t.request.pool for t, *_ in deferred}
        }
        for task, avoid, over, found in sorted(deferred, key=lambda d: standing[d[0].request.pool]):
            if task.request.task_id not in self.state.pending:
                continue
            loaned, task.borrow_reason = self.borrow(task, cause, avoid)
            if loaned:
                self.state.dequeue(task.request.task_id)
                decisions += loaned
                self.lending.begin_pass()
                continue
            lent = self.on_lent_card(task, cause)
            if lent:
                self.state.dequeue(task.request.task_id)
                decisions += lent
                continue
            decisions += self.wait(task, cause, avoid, over, found)
        return decisions

    def first_model_only(self, task: PendingTask) -> AbstractContextManager[None]:
        """With models_policy borrow, its own pool's nodes take its first model only here:
        it borrows that one before it takes the next at home (`borrow`)."""
        if self.lending is None or not self.lending.by_model(task):
            return nullcontext()
        return one_model(task, 0, [])

    def borrow(
        self, task: PendingTask, cause: Event, avoid: BoolArray | None
    ) -> tuple[list[AllocationGranted], str | None]:
        """`task` on a cohort mate's idle nodes, once it did not fit its own pool's (with
        models_policy borrow, its first model there): the grants, or why not."""
        assert self.lending is not None  # only a pass with lending borrows
        if self.lending.by_model(task):
            return self.lending.borrow_by_model(task, cause, avoid)
        return self.lending.borrow(task, cause)

    def on_lent_card(self, task: PendingTask, cause: Event) -> list[Event]:
        """`task` (an inference replica that fits nowhere else) on a card a training task
        lends during its CPU phase, if one fits (phases.py)."""
        if self.phasing is None or not self.state.phases:
            return []
        return list(self.phasing.place(task, cause))
