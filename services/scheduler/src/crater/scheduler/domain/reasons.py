"""Why a task waits, per filter, and telling AllData (`task.pending`) when the kind of
reason changes."""

from __future__ import annotations

import heapq
from datetime import timedelta

import numpy as np

from crater.contracts import (
    Event,
    FilterReason,
    TaskPending,
    derived_event_id,
)
from crater.scheduler.domain.cluster import (
    BoolArray,
)
from crater.scheduler.domain.events import (
    attempt_key,
)
from crater.scheduler.domain.fabric import too_small
from crater.scheduler.domain.gpu_order import waiting_for_first
from crater.scheduler.domain.guarantees import Guarantees, demand_of
from crater.scheduler.domain.placer import Diagnosis, Placer
from crater.scheduler.domain.queue import node_mask
from crater.scheduler.domain.quotas import (
    BUDGET,
    CLAIMED,
    QUEUE,
    QUEUE_BORROW,
    RESERVED,
    USER_GPUS,
    Over,
    Quotas,
    Usage,
)
from crater.scheduler.domain.waitlist import due_free
from crater.scheduler.domain.wording import for_nodes, sentence

__all__ = ["Reasons", "for_nodes", "kind_of", "sentence"]
from crater.scheduler.domain.state import (
    PendingTask,
    SchedulerState,
    claimed_abroad,
    claimed_ahead,
    claimed_nodes,
)

# Filters whose verdict is only where the task may go now, not what it needs: a change among
# them alone is not a new kind of reason to wait (backfill comes and goes with the queue; a
# claim on a node lasts until its owner's victims are gone). Ageing only moves it up the
# queue: not a reason of a new kind either.
TRANSIENT_FILTERS = frozenset({"Backfill", "Reclaim", "Ageing"})


class Reasons:
    """Builds the pending reasons of a task and announces them."""

    def __init__(self, state: SchedulerState, placer: Placer, guarantees: Guarantees) -> None:
        self.state = state
        self.placer = placer
        self.guarantees = guarantees

    def kept_for_scarce(self, task: PendingTask, usable: BoolArray) -> FilterReason | None:
        """Why `task` (asking no GPU) does not take the nodes held for scarce work among
        `usable`; None: none held from it."""
        held = self.placer.held_for_scarce(task, usable)
        until = self.placer.hold_ends(task)
        if held is None or until is None:
            return None
        kept = self.state.config.scarce_holders_kept
        return FilterReason(
            filter="ScarceCapacity",
            code="HeldForScarceWork",
            nodes=int(np.count_nonzero(held)),
            message=(
                f"is kept for scarce work (among the last {kept} able to hold a multi-card "
                "shape the workload asks for, which other nodes cannot) until "
                f"{until.isoformat(timespec='seconds')}"
            ),
        )

    def why_waiting(
        self,
        task: PendingTask,
        avoid: BoolArray | None,
        over: list[Over],
        found: Diagnosis | None,
    ) -> tuple[list[FilterReason], str]:
        """Why `task` waits, per filter, and the one-line summary. `over`: the quota limits
        it passes; `found`: the filters' verdict on `task.filter_demand` (None when `over`:
        the quota is the reason then)."""
        total = len(self.state.cluster)
        fits: BoolArray | None = None
        hold = self.state.quotas.holds.get(task.request.tenant)
        if over and over[0][0] == BUDGET and hold is not None:
            reasons = [
                FilterReason(
                    filter="TenantBudget",
                    code="BudgetExceeded",
                    nodes=total,
                    message=hold.reason,
                )
            ]
        elif over:
            reasons = [self.over_quota(task, over, total)]
        else:
            fits, reasons = found or self.placer.diagnose(task.filter_demand)
        if fits is not None and avoid is not None:
            reasons = [*reasons, *self.kept_from(task, fits & avoid)]
        if fits is not None and not task.same_node:
            usable = fits if avoid is None else fits & ~avoid
            split = too_small(self.state.cluster, task.demand, usable, task.gang_size)
            reasons = reasons if split is None else [*reasons, split]
        if fits is not None:
            kept = self.kept_for_scarce(task, fits if avoid is None else fits & ~avoid)
            reasons = reasons if kept is None else [*reasons, kept]
        if task.borrow_reason is not None and not over:
            reasons = [
                *reasons,
                FilterReason(
                    filter="Borrow",
                    code="NoLendableCapacity",
                    nodes=0,
                    message=task.borrow_reason,
                ),
            ]
        first = waiting_for_first(task)
        if first is not None and not over:
            reasons = [
                *reasons,
                FilterReason(
                    filter="GpuPreference",
                    code="WaitingForPreferredModel",
                    nodes=0,
                    message=first,
                ),
            ]
        members = task.gang_size
        if reasons:
            detail = "; ".join(sentence(r) for r in reasons)
        elif total and members > 1:
            detail = f"fewer than the {members} gang members fit at once"
        elif total and task.demand.wants_ssd:
            detail = (
                "no node has the GPUs, CPU cores and one SSD with the space and speed asked "
                "together (NUMA)"
            )
        elif total:
            detail = "no node has the GPUs and CPU cores together on one NUMA node"
        else:
            detail = "no nodes yet"
        if members > 1 and not task.same_node and fits is not None:
            room = int(np.count_nonzero(fits if avoid is None else fits & ~avoid))
            summary = f"{room}/{total} nodes can take a member, {members} needed at once: {detail}"
        else:
            summary = f"0/{total} nodes available: {detail}"
        return reasons, summary

    def kept_from(self, task: PendingTask, kept: BoolArray) -> list[FilterReason]:
        """Why `task` leaves alone the `kept` nodes it would fit: owners that claimed them
        back first wait there for their victims, its earlier attempts failed there, or its
        pool's blocked head waits there."""
        reasons: list[FilterReason] = []
        ahead = claimed_ahead(self.state, task)
        names = claimed_nodes(self.state, task, ahead)
        if names:
            claimed = node_mask(self.state.cluster, names)
            if count := int(np.count_nonzero(kept & claimed)):
                owners = ", ".join(t.request.task_id for t in ahead[:3])
                more = f" and {len(ahead) - 3} more" if len(ahead) > 3 else ""
                reasons.append(
                    FilterReason(
                        filter="Reclaim",
                        code="ClaimedByOwner",
                        nodes=count,
                        message=f"is being reclaimed for {owners}{more}, which claimed it first",
                    )
                )
            kept = kept & ~claimed
        if shunned := self.placer.shunned(task):
            failed = node_mask(self.state.cluster, shunned)
            if count := int(np.count_nonzero(kept & failed)):
                reasons.append(
                    FilterReason(
                        filter="FailedBefore",
                        code="AttemptFailedHere",
                        nodes=count,
                        message="is where an earlier attempt failed (retried elsewhere)",
                    )
                )
                kept = kept & ~failed
        if count := int(np.count_nonzero(kept)):
            blocked = self.state.backfill[task.request.pool]
            message = f"is kept for {blocked.task_id}, which waits ahead of it"
            limit = self.state.config.run_limit_for(task.request)
            if limit is not None:  # why its time limit does not let it backfill there
                due = due_free(self.state, blocked)
                message += (
                    f" (due free by {due:%Y-%m-%dT%H:%M:%SZ}: this task's limit of {limit} s "
                    "would run past that)"
                    if due is not None
                    else " (a task there states no time limit: backfill by limit cannot "
                    "prove this task would be gone in time)"
                )
            reasons.append(
                FilterReason(
                    filter="Backfill",
                    code="ReservedForWaitingTask",
                    nodes=count,
                    message=message,
                )
            )
        return reasons

    def after_preempting(
        self,
        task: PendingTask,
        preempted: list[Event],
        why: tuple[list[FilterReason], str],
        avoid: BoolArray | None,
        over: list[Over],
        found: Diagnosis | None,
    ) -> tuple[list[FilterReason], str]:
        """`why` `task` waits, once `Preemptor.preempt_for` ran for it: afresh when it
        preempted to borrow (its reason to borrow is that now), with what was held back
        (`with_holds`)."""
        if preempted and claimed_abroad(self.state, task):
            why = self.why_waiting(task, avoid, over, found)
        return self.with_holds(task, *why)

    def with_holds(
        self, task: PendingTask, reasons: list[FilterReason], summary: str
    ) -> tuple[list[FilterReason], str]:
        """`reasons` and `summary` with what `Preemptor.preempt_for` found for `task`: the
        victims it may not take yet (minimum run time, victim cooldown); and how far ageing
        has raised it in the queue."""
        extra: list[FilterReason] = []
        if task.preempt_held is not None:
            extra.append(task.preempt_held)
        config = self.state.config
        if task.aged and config.ageing_interval_seconds > 0:
            rank = task.queue_priority(config)
            waited = task.aged * config.ageing_interval_seconds
            extra.append(
                FilterReason(
                    filter="Ageing",
                    code="AgedPriority",
                    nodes=0,
                    message=(
                        f"ranks as priority {rank} in the queue: {task.priority} raised by "
                        f"{rank - task.priority} for waiting {waited:g} s or more "
                        f"(+{config.ageing_step} every {config.ageing_interval_seconds:g} s, "
                        f"at most +{config.ageing_max})"
                    ),
                )
            )
        if not extra:
            return reasons, summary
        return [*reasons, *extra], "; ".join([summary, *(r.message for r in extra)])

    def over_quota(self, task: PendingTask, over: list[Over], total: int) -> FilterReason:
        """Why a tenant's quota holds `task`: its hard limit; or, elastic, its borrowing
        limit, another tenant waiting for its guarantee, or capacity reserved for others."""
        tenant = task.request.tenant
        quotas = self.state.quotas
        share = quotas.shares.get(tenant)
        kind = over[0][0]
        if kind == USER_GPUS and task.request.user is not None:
            return self.over_user_limit(task, task.request.user, over[0], total)
        if kind.startswith(f"{QUEUE}."):
            return FilterReason(
                filter="QueueLimit",
                code="QueueLimitReached",
                nodes=total,
                message=queue_full(quotas, tenant, over),
            )
        if kind.startswith(f"{QUEUE_BORROW}."):
            return FilterReason(
                filter="QueueLimit",
                code="QueueBorrowingLimit",
                nodes=total,
                message=queue_borrowing_full(quotas, tenant, over),
            )
        if kind == CLAIMED:
            owner, claimant = self.guarantees.claim_of(tenant, task.request.pool, demand_of(task))
            who = "another tenant" if claimant is None else f"tenant {claimant.request.tenant}"
            code = "GuaranteeClaimed"
            if owner is not None and owner != (claimant and claimant.request.tenant):
                # a queue's guarantee, claimed by a task of a tenant under it
                message = (
                    f"tenant {tenant} borrows no more while {quotas.holder_name(owner)} waits "
                    f"for its guarantee ({who}'s task {claimant and claimant.request.task_id}) "
                    f"in pool {task.request.pool}"
                )
            else:
                at = (
                    "has no guarantee of its own"
                    if tenant in quotas.unguaranteed
                    else "is at its guarantee"
                )
                message = (
                    f"tenant {tenant} {at} and borrows no more while {who} "
                    f"waits for its own guarantee in pool {task.request.pool}"
                )
        elif kind.startswith(RESERVED):
            code = "ReservedForTenants"
            message = f"tenant {tenant} would borrow capacity reserved for other tenants: " + (
                ", ".join(
                    f"{resource.split('.', 1)[1]} {max(left, 0):g} free after it, {need:g} reserved"
                    for resource, left, need in over
                )
            )
        elif share is not None:
            code = "BorrowingLimit"
            used = quotas.used.get(tenant, Usage())
            message = f"tenant {tenant} at its borrowing limit: " + ", ".join(
                f"{getattr(used, resource):g} of {limit:g} {resource} held "
                f"(guarantee {getattr(share.guarantee, resource)} + borrowing "
                f"{limit - getattr(share.guarantee, resource):g}), "
                f"the task would take it to {wanted:g}"
                for resource, wanted, limit in over
            )
        else:
            code = "QuotaExceeded"
            message = f"tenant {tenant!r} is over its quota: " + ", ".join(
                f"{resource} would reach {wanted:g}, over its limit of {limit}"
                for resource, wanted, limit in over
            )
        return FilterReason(filter="TenantQuota", code=code, nodes=total, message=message)

    def over_user_limit(self, task: PendingTask, user: str, over: Over, total: int) -> FilterReason:
        """Why `user`'s own limit of running GPUs holds `task` (quotas file)."""
        tenant = task.request.tenant
        _, wanted, cap = over
        held = self.state.quotas.user_gpus.get((tenant, user), 0.0)
        limits = self.state.quotas.users[tenant]
        return FilterReason(
            filter="UserLimit",
            code="UserGpuLimit",
            nodes=total,
            message=(
                f"user {user} of tenant {tenant} holds {held:g} of its {cap:g} running GPUs "
                f"({limits.source(tenant, user, 'running_gpus')}); the task would take it to "
                f"{wanted:g}"
            ),
        )

    def announce(
        self, task: PendingTask, cause: Event, reasons: list[FilterReason], summary: str
    ) -> list[Event]:
        """Keep why `task` waits (queryable at any time), and tell AllData (task.pending) when
        it starts waiting, or when the kind of reason (which filters hold it) has changed and
        the new kind has held for the pending interval, no oftener than that interval. Node
        counts moving inside one kind are not news: announcing them sent hundreds a second."""
        task.live_reasons = reasons
        task.last_summary = summary
        now = self.state.clock or cause.occurred_at
        kind = kind_of(reasons)
        if task.told_kinds and task.announced_at is not None:
            if kind in task.told_kinds:  # as announced, or back to a kind told before
                task.seen_kind = task.kind_since = None
                return []
            interval = timedelta(seconds=self.state.config.pending_interval_seconds)
            if kind != task.seen_kind or task.kind_since is None:
                task.seen_kind, task.kind_since = kind, now
                due = max(task.kind_since, task.announced_at) + interval
                heapq.heappush(self.state.announcements, (due, task.seq, task.request.task_id))
            if now - task.kind_since < interval or now - task.announced_at < interval:
                return []
        task.told_kinds, task.announced_at = (*task.told_kinds, kind), now
        task.seen_kind = task.kind_since = None
        return [
            TaskPending(
                event_id=derived_event_id(
                    cause.event_id, f"pending:{task.request.task_id}{attempt_key(task.attempt)}"
                ),
                occurred_at=cause.occurred_at,
                task_id=task.request.task_id,
                nodes_total=len(self.state.cluster),
                reasons=reasons,
                summary=summary,
                attempt=task.attempt,
            )
        ]


def queue_full(quotas: Quotas, tenant: str, over: list[Over]) -> str:
    """`queue research (in acme) at its limit: its tenants hold 32 of 32 gpus, ...`."""
    queue = over[0][0].split(".")[1]
    parent = quotas.queues[queue].parent
    place = f" (in {parent})" if parent is not None else ""
    used = quotas.queue_used.get(queue, Usage())
    held = ", ".join(
        f"{getattr(used, kind.split('.')[2]):g} of {limit:g} {kind.split('.')[2]}, the task "
        f"would take it to {wanted:g}"
        for kind, wanted, limit in over
    )
    return f"queue {queue}{place} of tenant {tenant} at its limit: its tenants hold {held}"


def queue_borrowing_full(quotas: Quotas, tenant: str, over: list[Over]) -> str:
    """`queue research (in acme) of tenant nlp at its borrowing limit: its tenants hold 24 of
    24 gpus (guarantee 16 + borrowing 8), the task would take it to 26`."""
    queue = over[0][0].split(".")[1]
    share = quotas.queues[queue].share
    used = quotas.queue_used.get(queue, Usage())
    held = ", ".join(
        f"{getattr(used, kind.split('.')[2]):g} of {limit:g} {kind.split('.')[2]} (guarantee "
        f"{getattr(share.guarantee, kind.split('.')[2]) if share else 0} + borrowing "
        f"{limit - (getattr(share.guarantee, kind.split('.')[2]) if share else 0):g}), the task "
        f"would take it to {wanted:g}"
        for kind, wanted, limit in over
    )
    name = quotas.holder_name(f"queue/{queue}")
    return f"{name} of tenant {tenant} at its borrowing limit: its tenants hold {held}"


def kind_of(reasons: list[FilterReason]) -> frozenset[str]:
    """The kind of a wait: which filters hold the task, whatever their node counts."""
    return frozenset(r.filter for r in reasons if r.filter not in TRANSIENT_FILTERS)
