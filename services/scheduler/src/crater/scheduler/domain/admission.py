"""A task arrives: refused (quota, or no node could ever hold it), placed, or queued with
its reasons; and the dry run of a submission, decided the same way."""

from __future__ import annotations

import heapq
from contextlib import nullcontext
from typing import Literal

import numpy as np

from crater.contracts import (
    Event,
    FieldError,
    FilterReason,
    MemberPlacement,
    ResourcePrediction,
    TaskEnded,
    TaskPlacementAnswer,
    TaskProfiled,
    TaskRequest,
    TaskStatus,
)
from crater.scheduler.domain.cluster import BoolArray
from crater.scheduler.domain.demand import Demand
from crater.scheduler.domain.events import (
    ended,
    rejected,
)
from crater.scheduler.domain.fabric import never_in_one
from crater.scheduler.domain.gpu_order import one_model
from crater.scheduler.domain.lending import Lending
from crater.scheduler.domain.phases import Phases
from crater.scheduler.domain.placer import Pick, Placer
from crater.scheduler.domain.plugins import judged_field
from crater.scheduler.domain.preemptor import Preemptor
from crater.scheduler.domain.queue import (
    gang_demand,
    members_per_node,
)
from crater.scheduler.domain.quotas import QUEUE, QUEUE_BORROW, QUOTA_FIELDS, USER_GPUS
from crater.scheduler.domain.reasons import Reasons, sentence
from crater.scheduler.domain.state import (
    PendingTask,
    SchedulerState,
)
from crater.scheduler.domain.waitlist import Waitlist


def named_field(request: TaskRequest, filter_name: str) -> str:
    """The request field a rejection by `filter_name` names: the one the task wrote (its
    ordered `gpu.models` where it lists them, for the GPU model filter)."""
    field = judged_field(filter_name)
    if field == "resource_requirements.gpu.type" and request.resource_requirements.gpu.models:
        return "resource_requirements.gpu.models"
    return field


class Admission:
    """Admits, refuses or queues an arriving task."""

    def __init__(
        self,
        state: SchedulerState,
        placer: Placer,
        waitlist: Waitlist,
        reasons: Reasons,
        preemptor: Preemptor,
        lending: Lending | None = None,
        phasing: Phases | None = None,
    ) -> None:
        self.lending = lending if lending is not None and lending.active else None
        self.phasing = phasing
        self.state = state
        self.placer = placer
        self.waitlist = waitlist
        self.reasons = reasons
        self.preemptor = preemptor

    def on_profiled(self, event: TaskProfiled) -> list[Event]:
        request = event.task
        cancel = self.state.early_cancels.get(request.task_id)
        if (
            request.task_id in self.state.pending
            or request.task_id in self.state.allocations
            or cancel
        ):
            return []  # already known (or ended cancelled on arrival): a redelivery
        seq = self.state.next_seq
        self.state.next_seq += 1
        if cancel is False:
            return [self.cancelled_on_arrival(event)]
        demand = Demand.of(request, event.prediction, self.state.config.prediction_margin)
        task = PendingTask(request, event.prediction, demand, seq, submitted_at=event.occurred_at)
        members = task.gang_size
        errors = self.refusals(task)
        if errors:
            return [rejected(event, request.task_id, errors)]
        self.state.cluster.workload.observe(demand)
        avoid = self.waitlist.reserved_for(task)
        by_model = self.lending is not None and self.lending.by_model(task)
        # models_policy borrow: its first model only here, the rest with borrowing below
        with one_model(task, 0, []) if by_model else nullcontext():
            granted = self.placer.try_place(task, event, avoid)
        if granted:
            return list(granted)
        over = self.state.quotas.blocking(request.tenant, demand, members, request.user)
        if self.lending is not None and not over:
            self.lending.begin_pass()
            loaned, task.borrow_reason = (
                self.lending.borrow_by_model(task, event, avoid)
                if by_model
                else self.lending.borrow(task, event)
            )
            if loaned:
                return list(loaned)
        if self.phasing is not None and self.state.phases and not over:
            lent = self.phasing.place(task, event)  # a card lent during a CPU phase
            if lent:
                return list(lent)
        self.waitlist.enqueue(task)
        self.wake_when_hold_ends(task)
        found = None if over else self.placer.diagnose(task.filter_demand)
        reasons, summary = self.reasons.why_waiting(task, avoid, over, found)
        head = self.state.backfill.get(request.pool)
        if not over and (
            head is None
            or head.task_id not in self.state.pending
            or self.waitlist.order(task) < head.order
        ):
            self.waitlist.make_head(task)
        # Victims first, so that its reason says which it may not take yet (announced first).
        preempted = self.preemptor.preempt_for(task, event)
        reasons, summary = self.reasons.after_preempting(
            task, preempted, (reasons, summary), avoid, over, found
        )
        return self.reasons.announce(task, event, reasons, summary) + preempted

    def wake_when_hold_ends(self, task: PendingTask) -> None:
        """A waiting task that may be kept off capacity held for scarce work gets its pool
        retried when that hold ends, whatever else happens meanwhile (a quiet cluster
        changes nothing that would retry it)."""
        until = self.placer.hold_ends(task)
        if until is None or task.scarce_hold_until is not None:
            return
        task.scarce_hold_until = until
        heapq.heappush(self.state.wakeups, (until, task.seq, task.request.task_id))

    def dry_borrow(
        self, task: PendingTask, avoid: BoolArray | None, by_model: bool
    ) -> tuple[list[Pick] | None, str | None]:
        """Where `task` would borrow a cohort mate's capacity now (a dry run: nothing is
        granted), or None and why not."""
        assert self.lending is not None  # only a cohort borrows

        def choose(fits: BoolArray, off: BoolArray | None) -> list[Pick] | None:
            return self.placer.choose(task, fits, off)

        if by_model:
            return self.lending.look_by_model(task, avoid, choose)
        return self.lending.look_abroad(task, choose)

    def refusals(self, task: PendingTask) -> list[FieldError]:
        """Why `task` is refused: it can never be placed (its tenant's quota or its user's,
        or no node of its pool could ever hold it), or its user has as many tasks waiting
        or notebooks as it may; [] when it is not."""
        request, members = task.request, task.gang_size
        gang = f" ({members} gang members)" if members > 1 else ""
        errors: list[FieldError] = []
        for resource, wanted, limit in self.state.quotas.never(
            request.tenant, task.demand, members, request.user
        ):
            if resource.startswith(f"{QUEUE}."):
                _, queue, quota = resource.split(".")
                reason = (
                    f"queue {queue!r} above tenant {request.tenant!r} may hold {limit:g} "
                    f"{quota} for all its tenants; the task alone: {wanted:g}{gang}"
                )
                errors.append(FieldError(field=QUOTA_FIELDS[quota], reason=reason))
            elif resource.startswith(f"{QUEUE_BORROW}."):
                _, queue, quota = resource.split(".")
                reason = (
                    f"queue {queue!r} above tenant {request.tenant!r} may hold {limit:g} "
                    f"{quota} for all its tenants (its guarantee and borrowing limit); the "
                    f"task alone: {wanted:g}{gang}"
                )
                errors.append(FieldError(field=QUOTA_FIELDS[quota], reason=reason))
            elif resource == USER_GPUS:
                source = self.state.quotas.users[request.tenant].source(
                    request.tenant, str(request.user), "running_gpus"
                )
                reason = (
                    f"user {request.user!r} of tenant {request.tenant!r} may hold {limit:g} "
                    f"running GPUs ({source}); the task alone: {wanted:g}{gang}"
                )
                errors.append(FieldError(field=QUOTA_FIELDS["gpus"], reason=reason))
            else:
                reason = f"tenant {request.tenant!r} quota is {limit}; the task alone: {wanted:g}"
                errors.append(FieldError(field=QUOTA_FIELDS[resource], reason=reason + gang))
        return errors or self.over_user_counts(task) or self.never_fits(task)

    def over_user_counts(self, task: PendingTask) -> list[FieldError]:
        """Why the task's user may add no task now (quotas file, per-user limits): it has
        as many tasks waiting as it may (Slurm's MaxSubmitJobs, waiting ones), or, the task
        a notebook, as many notebooks waiting or placed. [] when it may."""
        request = task.request
        user, tenant = request.user, request.tenant
        limits = self.state.quotas.users.get(tenant)
        if user is None or limits is None:
            return []
        limit = limits.of(user)

        def mine(other: PendingTask | None) -> bool:
            return (
                other is not None and other.request.tenant == tenant and other.request.user == user
            )

        if limit.queued_tasks is not None:
            waiting = sum(1 for t in self.state.pending.values() if mine(t))
            if waiting >= limit.queued_tasks:
                source = limits.source(tenant, user, "queued_tasks")
                return [
                    FieldError(
                        field="user",
                        reason=f"user {user!r} of tenant {tenant!r} has {waiting} tasks "
                        f"waiting, as many as it may ({source}: {limit.queued_tasks}); submit "
                        "again once one has started or ended",
                    )
                ]
        if request.interactive and limit.notebooks is not None:
            live: list[PendingTask | None] = [t for t in self.state.pending.values() if mine(t)]
            live += [a.task for a in self.state.allocations.values() if mine(a.task)]
            notebooks = sum(1 for t in live if t is not None and t.request.interactive)
            if notebooks >= limit.notebooks:
                source = limits.source(tenant, user, "notebooks")
                return [
                    FieldError(
                        field="interactive",
                        reason=f"user {user!r} of tenant {tenant!r} has {notebooks} notebooks "
                        f"(waiting or placed), as many as it may ({source}: "
                        f"{limit.notebooks}); end one first",
                    )
                ]
        return []

    def cancelled_on_arrival(self, event: TaskProfiled) -> TaskEnded:
        """A task cancelled while it was being profiled ends cancelled as it arrives: never
        queued, never placed."""
        task_id = event.task.task_id
        self.state.early_cancels[task_id] = True
        return ended(
            task_id,
            TaskStatus.CANCELLED,
            "cancelled before the scheduler received it: never placed",
            event,
        )

    def never_fits(self, task: PendingTask) -> list[FieldError]:
        """Why no node of the task's pool could hold it even empty; [] when one could (or
        when there are no nodes yet: they may still come). A gang: every member at once. Every
        GPU model it lists counts, whether or not it waits for its first."""
        demand = task.full_demand
        if not len(self.state.cluster):
            return []
        in_pool = self.state.cluster.in_pool(demand.pool)
        if not in_pool.any():
            pools = ", ".join(sorted(set(self.state.cluster.pool.tolist())))
            return [FieldError(field="pool", reason=f"no node in pool {demand.pool!r} ({pools})")]
        fits, reasons = self.placer.diagnose(demand, free=False, among=in_pool)
        if not fits.any():
            return [
                FieldError(
                    field=named_field(task.request, r.filter),
                    reason=f"no node in pool {demand.pool!r} can ever fit: {sentence(r)}",
                )
                for r in reasons
            ]
        members = task.gang_size
        if members == 1:
            return []
        if task.same_node:
            together, reasons = self.placer.diagnose(
                gang_demand(demand, members), free=False, among=in_pool
            )
            if together.any():
                return []
            detail = "; ".join(sentence(r) for r in reasons)
            return [
                FieldError(
                    field="gang_size",
                    reason=f"no node in pool {demand.pool!r} can ever hold all {members} members "
                    f"together (affinity.gpu same-node): {detail}",
                )
            ]
        room = int(members_per_node(self.state.cluster, demand, np.flatnonzero(fits)).sum())
        if room >= members:
            return never_in_one(self.state.cluster, demand, fits, members)
        return [
            FieldError(
                field="gang_size",
                reason=f"the nodes of pool {demand.pool!r} could hold at most {room} of the "
                f"{members} members even empty",
            )
        ]

    def dry_run_task(
        self, request: TaskRequest, prediction: ResourcePrediction | None
    ) -> TaskPlacementAnswer:
        """What submitting `request` with `prediction` would do now, decided as
        `on_profiled` decides it (refusals, quota, the pool's reserved head, every gang
        member), without queueing, reserving or announcing anything."""
        demand = Demand.of(request, prediction, self.state.config.prediction_margin)
        # submitted now, as the submission would be (a wait for its first GPU model counts)
        task = PendingTask(
            request, prediction, demand, self.state.next_seq, submitted_at=self.state.clock
        )
        nodes = self.placer.dry_run(task.filter_demand)
        errors = self.refusals(task)
        picks: list[Pick] | None = None
        reasons: list[FilterReason] = []
        summary = nodes.summary
        if not errors:
            over = self.state.quotas.blocking(request.tenant, demand, task.gang_size, request.user)
            avoid = self.waitlist.reserved_for(task)
            found = None if over else self.placer.diagnose(task.filter_demand)
            by_model = self.lending is not None and self.lending.by_model(task)
            if found is not None:
                with one_model(task, 0, []) if by_model else nullcontext():
                    picks = self.placer.choose(task, found[0], avoid)
            if picks is None and found is not None and self.lending is not None:
                # where it would borrow, as `on_profiled` does
                self.lending.begin_pass()
                picks, task.borrow_reason = self.dry_borrow(task, avoid, by_model)
                if picks is not None:
                    lenders = sorted({n.topology.pool for n, *_ in picks})
                    summary = f"{summary}; would borrow from pool {', '.join(lenders)}"
            if picks is None:
                reasons, summary = self.reasons.why_waiting(task, avoid, over, found)
        outcome: Literal["placed", "waiting", "rejected"] = (
            "rejected" if errors else "waiting" if picks is None else "placed"
        )
        if errors:
            summary = "would be rejected: " + "; ".join(f"{e.field}: {e.reason}" for e in errors)
        return TaskPlacementAnswer(
            fits=nodes.fits,
            misfits=nodes.misfits,
            summary=summary,
            outcome=outcome,
            would_wait=outcome == "waiting",
            members=[
                MemberPlacement(
                    member=member,
                    node_id=node.name,
                    score=round(score, 4),
                    gpu_ids=list(selection.gpu_ids),
                    cpu_cores=list(selection.cpu_cores),
                    numa_node=selection.numa_node,
                    mig_profile=selection.mig_profile,
                    disk=selection.disk,
                )
                for member, (node, selection, score, _) in enumerate(picks or [])
            ],
            reasons=reasons,
            errors=errors,
            gpu_memory_per_gpu_mb=demand.gpu_memory_mb,
            gpu_memory_source=demand.gpu_memory_source,
        )
