"""The retry index: which pools' waiting tasks may now decide otherwise (stale pools, and
the ones where nodes were ranked), and the backoffs and announcements that come due: what a
retry pass may skip, like kube-scheduler's per-cycle state."""

from __future__ import annotations

import heapq
from datetime import datetime

from crater.scheduler.domain.gpu_order import widen_due
from crater.scheduler.domain.plugins import Pipeline
from crater.scheduler.domain.state import (
    SchedulerState,
)


class RetryIndex:
    """Marks pools stale and says which to retry."""

    def __init__(self, state: SchedulerState) -> None:
        self.state = state
        # each lending pool's cohort mates (`SchedulerConfig.cohort_of`)
        self.cohorts = {
            pool: mates for pool in state.config.pools if (mates := state.config.cohort_of(pool))
        }

    def announcements_due(self, now: datetime) -> bool:
        """Pools with a waiting task whose new kind of reason may now be announced are
        retried: True if any."""
        due = False
        while self.state.announcements and self.state.announcements[0][0] <= now:
            _, _, task_id = heapq.heappop(self.state.announcements)
            task = self.state.pending.get(task_id)
            if task is not None and task.kind_since is not None:
                self.stale(task.request.pool)
                due = True
        return due

    def wakeups_due(self, now: datetime) -> bool:
        """Pools with a waiting task whose victims, kept from yielding (minimum run time,
        victim cooldown), may now go, or whose hold off scarce capacity is over, are retried:
        True if any."""
        due = False
        while self.state.wakeups and self.state.wakeups[0][0] <= now:
            _, _, task_id = heapq.heappop(self.state.wakeups)
            task = self.state.pending.get(task_id)
            if task is None:
                continue
            if task.preempt_wake is not None and task.preempt_wake <= now:
                task.preempt_wake = None
                self.stale(task.request.pool)
                due = True
            if task.scarce_hold_until is not None and task.scarce_hold_until <= now:
                task.scarce_hold_until = None
                self.stale(task.request.pool)
                due = True
        return due

    def preferences_due(self, now: datetime) -> bool:
        """Waiting tasks whose wait for their first GPU model is over take every listed
        model from now: their pools are retried. True if any."""
        pools = widen_due(self.state, now)
        for pool in pools:
            self.stale(pool)
        return bool(pools)

    def end_backoffs(self, now: datetime) -> bool:
        """Retried attempts whose backoff is over may be placed again: True if any."""
        woke = False
        while self.state.backoffs and self.state.backoffs[0][0] <= now:
            _, _, task_id = heapq.heappop(self.state.backoffs)
            task = self.state.pending.get(task_id)
            if task is not None and task.not_before is not None and task.not_before <= now:
                task.not_before = None
                self.stale(task.request.pool)
                woke = True
        return woke

    def pools_to_retry(self) -> set[str] | None:
        """The stale pools, with every pool where a tenant with a quota waits that also waits
        in one of them (a grant to it in one pool changes what it may take in the others);
        None: every pool."""
        if self.state.stale_pools is None or not self.state.pools_independent:
            return None
        pools = set(self.state.stale_pools)
        limited = [
            t for t in self.state.pending.values() if self.state.quotas.limited(t.request.tenant)
        ]
        grown = True
        while grown:
            tenants = {t.request.tenant for t in limited if t.request.pool in pools}
            if self.state.quotas.tenant_queues:  # tenants sharing a queue move together
                tenants = set().union(*(self.state.quotas.related(t) for t in tenants))
            linked = {t.request.pool for t in limited if t.request.tenant in tenants}
            grown = not linked <= pools
            pools |= linked
        return pools

    def stale(self, pool: str) -> None:
        """Something a waiting task of `pool` reads has changed: retry the pool."""
        if self.state.stale_pools is not None:
            self.state.stale_pools.add(pool)
            # its cohort's pools borrow its nodes, or lend theirs to it
            self.state.stale_pools.update(self.cohorts.get(pool, ()))

    def tenant_changed(self, tenant: str) -> None:
        """A tenant's holdings changed: with a quota, its tasks in every pool may now wait
        (or fit) otherwise, and so may those of the tenants sharing a queue with it."""
        quotas = self.state.quotas
        if quotas.limited(tenant) and self.state.stale_pools is not None:
            tenants = quotas.related(tenant)
            self.state.stale_pools.update(
                t.request.pool for t in self.state.pending.values() if t.request.tenant in tenants
            )


def pool_filtered_first(pipeline: Pipeline) -> bool:
    """Whether `pipeline` excludes other pools' nodes before any filter that reads free
    amounts (only readiness, and a node's cordon, may come first): its reasons for a task
    then change only with its own pool's nodes, readiness and the node count (a cordon's
    change retries every pool)."""
    names = [f.name for f in pipeline.filters]
    return "Pool" in names and set(names[: names.index("Pool")]) <= {"NodeReady", "NodeCordon"}
