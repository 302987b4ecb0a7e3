"""Tenant guarantees: elastic tenants (`quotas.Share`) borrow what others leave idle and give
it back when an owner needs its guarantee (docs/pools.md, "Tenant guarantees").

The shape is the pools' (lending.py), applied to tenants: a tenant may always hold its
guarantee; above it, up to its borrowing limit, it borrows, and what it holds there is
reclaimable. A task of a tenant within its guarantee that does not fit preempts other
tenants' tasks held above their guarantees, whatever their priority, through the same
preemption machinery as a pool's reclaim (`Preemptor.preempt_for`: the grace period, the
fewest victims, then the least progressed, no grace started over), taking a tenant's tasks
only while it holds more than its guarantee (the last may take it below by part of one task).
Each reclaim lowers what is borrowed in all, so reclaims cannot chase each other for ever.
So that an owner never wins its capacity back twice, no tenant borrows in a pool while
another waits there for its own guarantee (`claimant`); and no tenant borrows what other
tenants' reserved amounts, unused, need free (`reserved_short`).

Fair share among borrowing tenants (`borrow_half_life_seconds` set, as for pools): when
capacity frees up, the waiting tasks that would take their tenant above its guarantee are
tried after every other, the tenants by their decayed usage (`standing`: what each held above
its guarantee as a dominant share of the ready cluster, integrated over time, halved every
half-life), least first, so that a tenant that borrowed much lately lets one that borrowed
little go first (Kueue's fair sharing, KAI's and Volcano's DRF over deserved quota).

A tenant with a hard limit only (`Quota`), or none, takes no part: its work is neither
reclaimable nor held back. Everything here reads the state (and the events' times) only, so
it decides the same on every replay.
"""

from __future__ import annotations

import itertools
from datetime import datetime

from crater.scheduler.domain.fairshare import DecayedUsage
from crater.scheduler.domain.quotas import CLAIMED, QUOTA_FIELDS, RESERVED, Over, Usage
from crater.scheduler.domain.state import Allocation, PendingTask, SchedulerState

# The resources free capacity is known for, cluster-wide, for the reserved amounts: GPUs,
# CPU cores, host memory (GPU memory and disk are judged per node, not held free).
RESERVABLE = ("gpus", "cpu_cores", "memory_mb")


class Guarantees:
    """Says whether an elastic tenant may borrow, and whose borrowing a task reclaims."""

    def __init__(self, state: SchedulerState) -> None:
        self.state = state
        # Per pool and elastic tenant: its earliest waiting task within its guarantee, as of
        # `stamp` (what the claims read: holdings, holds, backoffs, shares, the queue). Every
        # borrowing check reads it: scanning the queue each time made a retry pass, or a
        # burst of arrivals, over n waiting tasks cost n^2.
        self.claims: dict[str, dict[str, PendingTask]] = {}
        self.stamp: tuple[object, ...] | None = None
        self.counted = 0  # the queue's tasks `claims` has looked at
        # Per elastic tenant: its dominant share above its guarantee, decayed (fairshare.py).
        self.usage = DecayedUsage()

    @property
    def history(self) -> dict[str, float]:
        return self.usage.history

    @property
    def fair(self) -> bool:
        """Whether borrowing tenants are served by their decayed usage."""
        return self.state.config.borrow_half_life_seconds is not None and bool(
            self.state.quotas.shares
        )

    def age(self, now: datetime) -> None:
        """Fold the time since the last event into each elastic tenant's decayed usage."""
        half_life = self.state.config.borrow_half_life_seconds
        if half_life is not None and self.state.quotas.shares:
            self.usage.age(now, half_life, self.shares)

    def shares(self) -> dict[str, float]:
        """Per elastic tenant borrowing now: what it holds above its guarantee as its dominant
        share of the ready cluster (the largest of its GPU, CPU and memory shares)."""
        quotas, cluster = self.state.quotas, self.state.cluster
        ready = cluster.ready
        totals = (
            float(cluster.gpus_total[ready].sum()),
            float(cluster.cpu_total[ready].sum()),
            float(cluster.memory_total_mb[ready].sum()),
        )
        found: dict[str, float] = {}
        for tenant in sorted(quotas.shares):
            above = quotas.borrowing(tenant)
            if not above:
                continue
            amounts = (above.gpus, above.cpu_cores, above.memory_mb)
            found[tenant] = max(
                (float(a) / t for a, t in zip(amounts, totals, strict=True) if t > 0),
                default=0.0,
            )
        return found

    def standing(self, tenant: str) -> tuple[float, float]:
        """The order borrowing tenants are served in: least decayed usage, then least
        borrowed now."""
        return self.usage.standing(tenant, self.shares().get(tenant, 0.0))

    def refusal(self, tenant: str, pool: str, adding: Usage) -> list[Over]:
        """Why `tenant`, which would hold more than its guarantee with `adding`, may not take
        it now in `pool`: another tenant waits there for its guarantee, or it would take
        capacity reserved for others. [] when it may."""
        if self.claimant(tenant, pool) is not None:
            return [(CLAIMED, 0.0, 0.0)]
        return self.reserved_short(tenant, adding)

    def claimant(self, tenant: str, pool: str) -> PendingTask | None:
        """The earliest waiting task of `pool` of another elastic tenant that is within its
        guarantee with it (not held by its budget, not backing off): its owner claims the
        capacity borrowers would take. None when there is none."""
        found: PendingTask | None = None
        for other, task in self.claiming().get(pool, {}).items():
            if other != tenant and (found is None or task.seq < found.seq):
                found = task
        return found

    def claiming(self) -> dict[str, dict[str, PendingTask]]:
        """`claims`, kept up to date: built again when what it reads has changed (holdings,
        holds, backoffs, shares: `Quotas.version` and the rest of the stamp; a task taken off
        the queue: `dequeued`), else extended by the tasks queued since, which the queue
        holds last (a dict keeps its insertion order)."""
        state, quotas = self.state, self.state.quotas
        stamp = (
            id(state.pending),
            state.dequeued,
            len(state.backoffs),
            quotas.version,
            tuple(sorted(quotas.holds)),
            id(quotas.shares),
        )
        if stamp != self.stamp:
            self.claims, self.stamp, self.counted = {}, stamp, 0
        queued = len(state.pending) - self.counted
        if queued:
            for task in itertools.islice(reversed(state.pending.values()), queued):
                self.claim(task)
            self.counted = len(state.pending)
        return self.claims

    def claim(self, task: PendingTask) -> None:
        """`task` into `claims`, if it is within its elastic tenant's guarantee."""
        quotas = self.state.quotas
        tenant = task.request.tenant
        share = quotas.shares.get(tenant)
        if share is None or task.not_before is not None or tenant in quotas.holds:
            return
        if quotas.user_over(tenant, task.request.user, task.demand, task.gang_size):
            return  # its user's own limit holds it: no claim on others' borrowing
        if share.above(quotas.used.get(tenant, Usage()) + demand_of(task)):
            return
        earliest = self.claims.setdefault(task.request.pool, {})
        if tenant not in earliest or task.seq < earliest[tenant].seq:
            earliest[tenant] = task

    def reserved_short(self, tenant: str, adding: Usage) -> list[Over]:
        """(`reserved.<resource>`, free after `adding`, unused reserved of the others) for each
        resource where taking `adding` leaves less free than the other tenants' reserved
        amounts still unused."""
        quotas = self.state.quotas
        held = Usage()
        for other, share in sorted(quotas.shares.items()):
            if other != tenant:
                held = held + share.reserved.unused(quotas.used.get(other, Usage()))
        if not held:
            return []
        free = self.free()
        over: list[Over] = []
        for resource in RESERVABLE:
            need = float(getattr(held, resource))
            left = float(getattr(free, resource)) - float(getattr(adding, resource))
            if need > 0 and left < need:
                over.append((f"{RESERVED}.{resource}", left, need))
        return over

    def free(self) -> Usage:
        """What is free on the ready nodes now (GPUs by their shares)."""
        cluster = self.state.cluster
        ready = cluster.ready
        return Usage(
            gpus=float(cluster.gpu_milli_free[ready].sum()) / 1000,
            cpu_cores=int(cluster.cpu_free[ready].sum()),
            memory_mb=int(cluster.memory_free_mb[ready].sum()),
        )

    def reclaimable(self, task: PendingTask) -> dict[str, Usage]:
        """Per other elastic tenant: what it holds above its guarantee and is not yet yielding,
        that `task` may take back; {} unless `task` is of an elastic tenant and within its
        guarantee with it and with its tenant's other tasks that have victims yielding (it
        needs its own guarantee, not a loan)."""
        quotas = self.state.quotas
        tenant = task.request.tenant
        share = quotas.shares.get(tenant)
        if share is None or tenant in quotas.holds:
            return {}
        # What it holds, with what its other waiting tasks have victims yielding for: an
        # owner takes back its guarantee once, not once per task it has waiting.
        after = quotas.used.get(tenant, Usage()) + demand_of(task)
        if share.above(after):
            return {}
        for waiting in self.state.pending.values():
            if waiting.nominated and waiting is not task and waiting.request.tenant == tenant:
                after = after + demand_of(waiting)
        if share.above(after):
            return {}
        yielding: dict[str, Usage] = {}
        for head in self.state.allocations.values():
            if head.yield_by is not None and head.tenant in quotas.shares:
                yielding[head.tenant] = yielding.get(head.tenant, Usage()) + held(head)
        found: dict[str, Usage] = {}
        for other in sorted(quotas.shares):
            if other == tenant:
                continue
            above = quotas.shares[other].above(
                quotas.used.get(other, Usage()) - yielding.get(other, Usage())
            )
            if above:
                found[other] = above
        return found


def demand_of(task: PendingTask) -> Usage:
    """What a waiting task takes, every gang member's."""
    return Usage.of(task.demand).times(task.gang_size)


def held(head: Allocation) -> Usage:
    """What a task holds, every gang member's."""
    total = Usage()
    for member in head.members():
        total = total + member.usage
    return total


def gives_back(usage: Usage, borrowed: Usage) -> bool:
    """Whether `usage` (a task's) holds some of what its tenant holds above its guarantee
    (`borrowed`, per resource the guarantee sets): taking it gives borrowed capacity back."""
    return any(getattr(borrowed, r) > 0 and getattr(usage, r) > 0 for r in QUOTA_FIELDS)


def covers(taken: Usage, borrowed: Usage) -> bool:
    """Whether `taken` gives back all of `borrowed`, on every resource borrowed."""
    return all(
        getattr(taken, r) >= getattr(borrowed, r) - 1e-9
        for r in QUOTA_FIELDS
        if getattr(borrowed, r) > 0
    )
