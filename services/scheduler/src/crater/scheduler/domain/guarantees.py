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
from crater.scheduler.domain.quotas import (
    CLAIMED,
    QUOTA_FIELDS,
    RESERVED,
    Over,
    Usage,
    ancestors,
    queue_key,
    queue_of_key,
)
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
        quotas = self.state.quotas
        return self.state.config.borrow_half_life_seconds is not None and bool(
            quotas.shares or quotas.chains
        )

    def age(self, now: datetime) -> None:
        """Fold the time since the last event into each elastic tenant's decayed usage."""
        half_life = self.state.config.borrow_half_life_seconds
        if half_life is not None and (self.state.quotas.shares or self.state.quotas.chains):
            self.usage.age(now, half_life, self.shares)

    def shares(self) -> dict[str, float]:
        """Per holder of a guarantee borrowing now (an elastic tenant, a queue with a
        guarantee: "queue/<name>"): what it holds above its guarantee as its dominant share of
        the ready cluster (the largest of its GPU, CPU and memory shares)."""
        quotas, cluster = self.state.quotas, self.state.cluster
        ready = cluster.ready
        totals = (
            float(cluster.gpus_total[ready].sum()),
            float(cluster.cpu_total[ready].sum()),
            float(cluster.memory_total_mb[ready].sum()),
        )
        found: dict[str, float] = {}
        for key in quotas.holders():
            above = quotas.share_of(key).above(quotas.used_by(key))
            if not above:
                continue
            amounts = (above.gpus, above.cpu_cores, above.memory_mb)
            found[key] = max(
                (float(a) / t for a, t in zip(amounts, totals, strict=True) if t > 0),
                default=0.0,
            )
        return found

    def standing(self, tenant: str) -> tuple[tuple[float, float], ...]:
        """The order borrowing tenants are served in: least decayed usage, then least
        borrowed now; under queues with guarantees, compared from the top of the tree down
        (the organisations', then the departments', then the tenants' own: siblings share
        what is borrowed by their dominant resource share, recursively)."""
        shares = self.shares()
        chain = self.state.quotas.chain(tenant) or (tenant,)
        return tuple(self.usage.standing(key, shares.get(key, 0.0)) for key in reversed(chain))

    def refusal(self, tenant: str, pool: str, adding: Usage) -> list[Over]:
        """Why `tenant`, which would hold more than its guarantee with `adding`, may not take
        it now in `pool`: another tenant waits there for its guarantee, or it would take
        capacity reserved for others. [] when it may."""
        if self.claimant(tenant, pool, adding) is not None:
            return [(CLAIMED, 0.0, 0.0)]
        return self.reserved_short(tenant, adding)

    def claimant(self, tenant: str, pool: str, adding: Usage | None = None) -> PendingTask | None:
        """The earliest waiting task of `pool` within the guarantee of a holder `tenant` is
        not under (another elastic tenant, a queue it is not part of; not held by its budget,
        not backing off): its owner claims the capacity borrowers would take. None when there
        is none. With `adding` within a queue's guarantee (that queue owns it), only the
        claims of holders under that queue count: it borrows only from them."""
        return self.claim_of(tenant, pool, adding)[1]

    def claim_of(
        self, tenant: str, pool: str, adding: Usage | None = None
    ) -> tuple[str | None, PendingTask | None]:
        """`claimant`, with the holder whose guarantee it claims."""
        quotas = self.state.quotas
        mine = quotas.chain(tenant)
        owner = None if adding is None or not quotas.chains else quotas.within_at(tenant, adding)
        found: PendingTask | None = None
        claimed: str | None = None
        for other, task in self.claiming().get(pool, {}).items():
            if other == tenant or other in mine:
                continue
            if owner is not None and not self.below(other, owner):
                continue  # a claim outside the guarantee it takes from
            if found is None or task.seq < found.seq:
                found, claimed = task, other
        return claimed, found

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
        if not quotas.chain(tenant) or task.not_before is not None or tenant in quotas.holds:
            return
        if quotas.user_over(tenant, task.request.user, task.demand, task.gang_size):
            return  # its user's own limit holds it: no claim on others' borrowing
        owner = quotas.within_at(tenant, demand_of(task))
        if owner is None:
            return
        earliest = self.claims.setdefault(task.request.pool, {})
        if owner not in earliest or task.seq < earliest[owner].seq:
            earliest[owner] = task

    def reserved_short(self, tenant: str, adding: Usage) -> list[Over]:
        """(`reserved.<resource>`, free after `adding`, unused reserved of the others) for each
        resource where taking `adding` leaves less free than the other tenants' reserved
        amounts still unused."""
        quotas = self.state.quotas
        mine = quotas.chain(tenant)
        held = Usage()
        for other in quotas.holders():
            if other != tenant and other not in mine:
                held = held + quotas.share_of(other).reserved.unused(quotas.used_by(other))
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

    def owner(self, task: PendingTask) -> str | None:
        """The holder whose guarantee `task` claims: the nearest in its tenant's chain (the
        elastic tenant itself, then the queues above it with a guarantee) that it keeps within
        its guarantee, with the tasks under that holder that have victims yielding for them
        (an owner takes back its guarantee once, not once per task it has waiting). None:
        not within any (it would borrow), or its tenant's budget holds it."""
        quotas = self.state.quotas
        tenant = task.request.tenant
        chain = quotas.chain(tenant)
        if not chain or tenant in quotas.holds:
            return None
        mine = demand_of(task)
        for key in chain:
            share = quotas.share_of(key)
            after = quotas.used_by(key) + mine
            if share.above(after):
                continue
            for waiting in self.state.pending.values():
                if (
                    waiting.nominated
                    and waiting is not task
                    and self.under(waiting.request.tenant, key)
                ):
                    after = after + demand_of(waiting)
            if not share.above(after):
                return key
        return None

    def under(self, tenant: str, key: str) -> bool:
        """Whether `tenant` is under holder `key` (is it, or is in that queue)."""
        return tenant == key or key in self.state.quotas.chain(tenant)

    def reclaimable(self, task: PendingTask) -> dict[str, Usage]:
        """Per holder of a guarantee apart from `task`'s owner (another elastic tenant, a queue
        neither above nor below it): what it holds above its guarantee and is not yet
        yielding, that `task` may take back; {} unless `task` is within a guarantee
        (`owner`: it needs its own guarantee, not a loan)."""
        quotas = self.state.quotas
        owner = self.owner(task)
        if owner is None:
            return {}
        yielding: dict[str, Usage] = {}
        for head in self.state.allocations.values():
            if head.yield_by is not None:
                for key in quotas.chain(head.tenant):
                    yielding[key] = yielding.get(key, Usage()) - held(head)
        if quotas.chains:
            # Under queues with guarantees: what the holder's other owners will hold once
            # their victims are gone counts too (an owner inside a department taking a card
            # back from its sibling leaves the department as far above its guarantee as it
            # was: another department's owner may take that back meanwhile).
            for waiting in self.state.pending.values():
                if waiting.nominated and waiting is not task and waiting.yielders:
                    for key in quotas.chain(waiting.request.tenant):
                        yielding[key] = yielding.get(key, Usage()) + demand_of(waiting)
        mine = quotas.chain(task.request.tenant)
        found: dict[str, Usage] = {}
        for other in quotas.holders():
            if other in mine or owner in quotas.chain(other) or self.below(other, owner):
                continue  # itself, a queue above it, or a holder under its owner
            above = quotas.share_of(other).above(
                quotas.used_by(other) + yielding.get(other, Usage())
            )
            if above:
                found[other] = above
        # A holder borrows from `task`'s side only when the queues above it that are not
        # above `task` too hold more than their guarantees as well: a tenant above its own
        # guarantee inside a department within its own borrows from its siblings, not from
        # `task`'s owner.
        # What is taken back from a holder is at most what each of those queues holds above
        # its guarantee, too.
        taken: dict[str, Usage] = {}
        for other, above in found.items():
            between = [key for key in self.above_holder(other) if key not in mine]
            if all(key in found for key in between):
                for key in between:
                    above = least(above, found[key])
                taken[other] = above
        return taken

    def above_holder(self, holder: str) -> tuple[str, ...]:
        """The queues with a guarantee above `holder` (a tenant or a queue), nearest first."""
        queue = queue_of_key(holder)
        if queue is None:
            return tuple(k for k in self.state.quotas.chain(holder) if k != holder)
        return tuple(
            queue_key(q)
            for q in ancestors(self.state.quotas.queues, queue)[1:]
            if self.state.quotas.queues[q].share is not None
        )

    def below(self, holder: str, owner: str) -> bool:
        """Whether `holder` (a tenant or a queue) is under queue holder `owner`."""
        queue, parent = queue_of_key(owner), queue_of_key(holder)
        if queue is None:
            return False
        if parent is None:
            return queue_key(queue) in self.state.quotas.chain(holder)
        return queue in ancestors(self.state.quotas.queues, parent) and parent != queue

    def lender_of(self, tenant: str, borrowing: dict[str, Usage]) -> str | None:
        """The holder among `borrowing`'s that a task of `tenant` is taken back from: the
        nearest in its chain (the tenant when elastic, else its nearest queue with a
        guarantee), when that holds more than its guarantee; None when that is within its
        own (a guarantee below protects the task)."""
        chain = self.state.quotas.chain(tenant)
        return chain[0] if chain and chain[0] in borrowing else None


def least(one: Usage, other: Usage) -> Usage:
    """Per resource, the smaller of the two."""
    return Usage(**{r: min(getattr(one, r), getattr(other, r)) for r in QUOTA_FIELDS})


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
