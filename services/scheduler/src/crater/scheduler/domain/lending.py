"""Lending: the pools of one cohort lend each other their idle nodes (docs/pools.md).

A task first fits on its own pool's nodes, as always. When it cannot, and its pool is in a
cohort, it may borrow a lending pool's idle nodes (cohort mates by name), within the
borrower's `borrow_limit` and the lender's `lend_limit`. Its allocation records the pool it
borrowed from (`Allocation.borrowed_from`, derived by the ledger from the node's pool) and is
reclaimable: the lender's own task that does not fit on its pool's nodes preempts borrowers
there, whatever their priority, with the grace period (`Preemptor.preempt_for`).

So that an owner never has to win its capacity back twice, a pool lends nothing new while a
task of its own waits (one its tenant's quota lets in), nor on the nodes kept for its blocked
head; and a pool that has lent capacity out takes it back before it borrows.

A task whose GPU models are ordered with `models_policy: borrow` borrows its first model
before it takes its second on its own pool (`borrow_by_model`, Kueue's `whenCanBorrow:
Borrow`); every rule above holds for each of its models as for any borrower.

Without a cohort nothing here runs: placement is exactly as without lending.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from crater.contracts import AllocationGranted, Event, GpuModelsPolicy
from crater.scheduler.domain.cluster import BoolArray
from crater.scheduler.domain.fairshare import DecayedUsage
from crater.scheduler.domain.gpu_order import missed_at_home, one_model
from crater.scheduler.domain.placer import Placer
from crater.scheduler.domain.prewarm import Forecast
from crater.scheduler.domain.queue import node_mask
from crater.scheduler.domain.quotas import QUOTA_FIELDS, Over, Quota, Usage
from crater.scheduler.domain.retries import RetryIndex
from crater.scheduler.domain.state import (
    PendingTask,
    SchedulerState,
    claimed_abroad,
    yielding_for,
)

NO_LIMIT = Quota()
T = TypeVar("T")
# One try of a task on some nodes (those that pass, those to keep off): what it got (the
# grants; or, in a dry run, where it would go), None when it did not fit.
Attempt = Callable[[BoolArray, BoolArray | None], T | None]


def limits_text(over: list[Over]) -> str:
    return ", ".join(f"{resource} {wanted:g} > {limit:g}" for resource, wanted, limit in over)


class Lending:
    """Places a task on a cohort mate's idle nodes, and says why it cannot."""

    def __init__(self, state: SchedulerState, retries: RetryIndex, placer: Placer) -> None:
        self.state = state
        self.retries = retries
        self.placer = placer
        # Pools with a task of their own waiting, for the current retry pass (None: unknown).
        self.waiting: set[str] | None = None
        # Per borrower pool: its dominant share of its mates' capacity, decayed (fairshare.py).
        self.usage = DecayedUsage()
        # Per lending pool with pre-warm: its learned demand (prewarm.py); not stored.
        self.forecasts: dict[str, Forecast] = {}

    @property
    def fair(self) -> bool:
        """Whether borrowers are served by their decayed usage (a half-life is set)."""
        return self.active and self.state.config.borrow_half_life_seconds is not None

    @property
    def history(self) -> dict[str, float]:
        return self.usage.history

    def age(self, now: datetime) -> None:
        """Fold the time since the last event into each borrower pool's decayed usage."""
        half_life = self.state.config.borrow_half_life_seconds
        if half_life is not None and self.active:
            self.usage.age(now, half_life, self.shares)

    def observe(self, now: datetime) -> None:
        """Each pre-warming pool's demand now, into its forecast."""
        policies = self.state.config.pools
        if not policies and not self.forecasts:
            return  # no pool, no forecast: nothing to observe (every event asks)
        for pool in sorted(self.forecasts.keys() - policies.keys()):
            del self.forecasts[pool]  # a reload took its pre-warm away
        for pool, policy in sorted(policies.items()):
            if policy.prewarm is None or policy.cohort is None:
                self.forecasts.pop(pool, None)
                continue
            forecast = self.forecasts.get(pool)
            if forecast is None or forecast.settings != policy.prewarm:
                forecast = self.forecasts[pool] = Forecast(policy.prewarm)
            forecast.observe(now.timestamp(), self.wanted_gpus(pool))

    def wanted_gpus(self, pool: str) -> float:
        """GPUs `pool`'s own tasks hold (wherever) or wait for now."""
        held = sum(u.gpus for (p, _), u in self.state.pool_usage.items() if p == pool)
        waiting = sum(
            Usage.of(t.demand).times(t.gang_size).gpus
            for t in self.state.pending.values()
            if t.request.pool == pool and t.not_before is None
        )
        return float(held + waiting)

    def expected_growth(self, pool: str, ahead: float | None = None) -> int:
        """Whole GPUs beyond what they want now that `pool`'s own tasks are expected to want
        within `ahead` seconds (its pre-warm lead by default); 0 without pre-warm."""
        forecast = self.forecasts.get(pool)
        if forecast is None or self.state.clock is None:
            return 0
        growth = forecast.growth(self.state.clock.timestamp(), self.wanted_gpus(pool), ahead)
        return math.ceil(growth - 1e-9)

    def keep_idle(self, pool: str) -> int:
        """Whole GPUs `pool` lends nothing from: its static `keep_idle`, or with pre-warm the
        growth it expects within `lend_ahead_seconds`, if larger (a loan made now should not
        be needed back soon: it would be taken back at a cost)."""
        keep = self.state.config.pools[pool].keep_idle_gpus
        forecast = self.forecasts.get(pool)
        if forecast is None:
            return keep
        return max(keep, self.expected_growth(pool, forecast.settings.lend_ahead_seconds))

    def shares(self) -> dict[str, float]:
        """Per borrower pool: what it holds of its mates' capacity now, as its dominant share
        (the largest of its GPU, CPU and memory shares)."""
        cluster = self.state.cluster
        found: dict[str, float] = {}
        for pool in sorted({borrower for _, borrower in self.state.lent}):
            mates = np.isin(cluster.pool, list(self.retries.cohorts.get(pool, ())))
            held = self.borrowed(pool)
            share = 0.0
            for amount, total in (
                (held.gpus, cluster.gpus_total[mates].sum()),
                (held.cpu_cores, cluster.cpu_total[mates].sum()),
                (held.memory_mb, cluster.memory_total_mb[mates].sum()),
            ):
                if total > 0:
                    share = max(share, float(amount) / float(total))
            found[pool] = share
        return found

    def standing(self, pool: str) -> tuple[float, float]:
        """The order borrowers are served in: least decayed usage, then least held now."""
        return self.usage.standing(pool, self.shares().get(pool, 0.0))

    @property
    def active(self) -> bool:
        """Whether any pool lends at all."""
        return bool(self.retries.cohorts)

    def begin_pass(self) -> None:
        self.waiting = None

    def borrowed(self, pool: str) -> Usage:
        """What `pool` holds of its cohort mates' capacity now."""
        return borrowed(self.state, pool)

    def lent(self, pool: str) -> Usage:
        """What of `pool`'s own capacity its cohort mates hold now."""
        return lent(self.state, pool)

    def takes_back_first(self, task: PendingTask) -> bool:
        """Whether `task`'s pool has lent capacity that `task` would take back (its pool's
        `reclaim`): then it reclaims rather than borrows."""
        pool = task.request.pool
        policy = self.state.config.pools[pool]
        if policy.reclaim == "any":
            return bool(self.lent(pool))
        return any(
            head.borrowed_from == pool
            and policy.takes_back(head.priority, head.preemptible, task.priority)
            for head in self.state.allocations.values()
        )

    def lendable(self, pool: str) -> Quota:
        """The most of `pool`'s capacity (its ready nodes') it lends."""
        return lendable(self.state, pool)

    def idle_gpus(self, pool: str) -> int:
        """Whole GPUs free on `pool`'s ready nodes now."""
        cluster = self.state.cluster
        rows = cluster.in_pool(pool) & cluster.ready
        return int(cluster.gpus_free[rows].sum())

    def owner_gpus(self, pool: str) -> npt.NDArray[np.int64]:
        """Per node row: the GPUs held there by tasks of `pool`'s own (not borrowers)."""
        cluster = self.state.cluster
        owned = cluster.gpus_total - cluster.gpus_free
        for head in self.state.allocations.values():
            for a in head.members():
                if a.borrowed_from == pool and a.gpu_ids:
                    row = cluster.index.get(a.node)
                    if row is not None:
                        owned[row] -= len(a.gpu_ids)
        return owned

    def has_waiting(self, pool: str) -> bool:
        if self.waiting is None:
            self.waiting = {
                t.request.pool
                for t in self.state.pending.values()
                if t.not_before is None
                and not self.state.quotas.blocking(
                    t.request.tenant, t.demand, t.gang_size, t.request.user
                )
            }
        return pool in self.waiting

    def borrow(self, task: PendingTask, cause: Event) -> tuple[list[AllocationGranted], str | None]:
        """Place `task` on a cohort mate's idle nodes: the grants, or none and why not (None
        when its pool does not borrow at all)."""
        granted, why = self.look_abroad(task, self.placing(task, cause))
        return granted or [], why

    def placing(self, task: PendingTask, cause: Event) -> Attempt[list[AllocationGranted]]:
        """An attempt that grants `task` where it fits (None: it did not)."""
        return lambda fits, avoid: self.placer.place(task, cause, fits, avoid) or None

    def look_abroad(self, task: PendingTask, attempt: Attempt[T]) -> tuple[T | None, str | None]:
        """Where `task` may borrow, in order, each tried with `attempt` (a grant, or a dry
        run's choice): its first success, or None and why not (None: its pool does not
        borrow at all)."""
        pool = task.request.pool
        mates = self.retries.cohorts.get(pool, ())
        if not mates:
            return None, None
        if task.gang_size > 1 and not task.same_node:
            return None, "a gang spread over nodes borrows no capacity"
        # The room its victims left on a mate's nodes (preempting to borrow): its own.
        claim = claimed_abroad(self.state, task)
        if not claim and self.takes_back_first(task):
            return None, f"pool {pool} has capacity lent out: it reclaims that first"
        usage = Usage.of(task.demand).times(task.gang_size)
        policies = self.state.config.pools
        over = policies[pool].borrow_limit.excess(self.borrowed(pool) + usage)
        if over:
            return None, f"pool {pool} may borrow no more ({limits_text(over)})"
        why: list[str] = []
        for lender in mates:
            mine = [n for n in claim if self.state.cluster.pool_of(n) == lender]
            if not claim and self.has_waiting(lender):
                why.append(f"pool {lender} has tasks of its own waiting")
                continue
            over = policies[lender].lend_limit.excess(self.lent(lender) + usage)
            if over:
                why.append(f"pool {lender} lends no more ({limits_text(over)})")
                continue
            reserved = policies[lender].reserved
            if reserved != NO_LIMIT:
                over = self.lendable(lender).excess(self.lent(lender) + usage)
                if over:
                    why.append(f"pool {lender} keeps its reserved capacity ({limits_text(over)})")
                    continue
            if claim:
                if mine:
                    fits, _ = self.placer.diagnose(replace(task.filter_demand, pool=lender))
                    found = attempt(fits & node_mask(self.state.cluster, tuple(mine)), None)
                    if found is not None:
                        return found, None
                    why.append(
                        f"its victims on pool {lender} are yielding"
                        if yielding_for(self.state, task)
                        else f"the room its victims left on pool {lender} was taken"
                    )
                continue
            keep = self.keep_idle(lender)
            if keep and self.idle_gpus(lender) - usage.gpus < keep:
                static = policies[lender].keep_idle_gpus
                ahead = f" ({keep - static} ahead of its expected demand)" if keep > static else ""
                why.append(f"pool {lender} keeps {keep} GPUs idle{ahead}")
                continue
            fits, _ = self.placer.diagnose(replace(task.filter_demand, pool=lender))
            head = self.state.backfill.get(lender)
            avoid = None if head is None else head.mask(self.state.cluster)
            # Pack borrowers where the owner is least likely to want its cards back: on the
            # nodes where it holds the fewest GPUs itself (idle nodes, then those with
            # borrowers), so that a reclaim frees room in one piece.
            owned = self.owner_gpus(lender)
            for tier in np.unique(owned[fits]):
                found = attempt(fits & (owned == tier), avoid)
                if found is not None:
                    return found, None
            why.append(f"no idle node of pool {lender} fits")
        return None, "cannot borrow: " + "; ".join(why)

    def by_model(self, task: PendingTask) -> bool:
        """Whether `task` borrows each of its GPU models before it takes the next on its own
        pool (models_policy borrow); without cohort mates it borrows nothing: as next."""
        return (
            task.request.resource_requirements.gpu.models_policy is GpuModelsPolicy.BORROW
            and bool(task.full_demand.gpu_model_order)
            and bool(self.retries.cohorts.get(task.request.pool))
        )

    def borrow_by_model(
        self, task: PendingTask, cause: Event, avoid: BoolArray | None
    ) -> tuple[list[AllocationGranted], str | None]:
        """`borrow` for models_policy borrow (`look_by_model`): the grants, or none and why."""
        granted, why = self.look_by_model(task, avoid, self.placing(task, cause))
        return granted or [], why

    def look_by_model(
        self, task: PendingTask, avoid: BoolArray | None, attempt: Attempt[T]
    ) -> tuple[T | None, str | None]:
        """models_policy borrow, once `task` did not fit its first model on its own pool:
        that model on a cohort mate's idle nodes, then each next model on its own pool's nodes
        (off `avoid`) and then on a mate's, in its order, each tried with `attempt`. Its
        first success, or None and why it borrowed none (each distinct reason once, in model
        order)."""
        fits, _ = self.placer.diagnose(task.filter_demand)
        missed = [missed_at_home(self.state, task, 0)]
        reasons: list[str] = []
        for rank, model in enumerate(task.full_demand.gpu_model_order):
            if rank:
                with one_model(task, rank, missed):
                    found = attempt(fits, avoid)
                if found is not None:
                    return found, None
                missed.append(missed_at_home(self.state, task, rank))
            with one_model(task, rank, missed):
                found, why = self.look_abroad(task, attempt)
            if found is not None:
                return found, None
            if why is not None:
                missed.append(f"{model} not borrowed ({why})")
                reasons.append(why)
        return None, "; ".join(dict.fromkeys(reasons)) or None


def borrowed(state: SchedulerState, pool: str) -> Usage:
    """What `pool` holds of its cohort mates' capacity now."""
    total = Usage()
    for (_, borrower), usage in state.lent.items():
        if borrower == pool:
            total = total + usage
    return total


def lent(state: SchedulerState, pool: str) -> Usage:
    """What of `pool`'s own capacity its cohort mates hold now."""
    total = Usage()
    for (lender, _), usage in state.lent.items():
        if lender == pool:
            total = total + usage
    return total


def lendable(state: SchedulerState, pool: str) -> Quota:
    """The most of `pool`'s capacity (its ready nodes') it lends: the rest of its
    `reserved` amount, per resource it reserves."""
    cluster = state.cluster
    rows = cluster.in_pool(pool) & cluster.ready
    capacity = {
        "gpus": int(cluster.gpus_total[rows].sum()),
        "gpu_memory_mb": int((cluster.gpus_total[rows] * cluster.gpu_memory_mb[rows]).sum()),
        "cpu_cores": int(cluster.cpu_total[rows].sum()),
        "memory_mb": int(cluster.memory_total_mb[rows].sum()),
        "disk_gb": int(cluster.disk_gb[rows].sum()),
    }
    reserved = state.config.pools[pool].reserved
    return Quota(
        **{
            r: max(0, capacity[r] - kept)
            for r in QUOTA_FIELDS
            if (kept := getattr(reserved, r)) is not None
        }
    )
