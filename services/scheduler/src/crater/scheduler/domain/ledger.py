"""The ledger: what is held, taken and given back (nodes, tenant quotas, pool usage, the
possible victims)."""

from __future__ import annotations

from crater.contracts import (
    AllocationReleased,
    Event,
    ReleaseReason,
    derived_event_id,
)
from crater.scheduler.domain.events import member_key
from crater.scheduler.domain.quotas import Usage
from crater.scheduler.domain.retries import RetryIndex
from crater.scheduler.domain.state import (
    Allocation,
    SchedulerState,
)


class Ledger:
    """Takes and releases allocations against nodes, quotas and pool usage."""

    def __init__(self, state: SchedulerState, retries: RetryIndex) -> None:
        self.state = state
        self.retries = retries

    def take(self, allocation: Allocation) -> None:
        self.state.held_by[allocation.allocation_id] = allocation.task_id
        if self.state.expiry_floor is not None:
            self.state.expiry_floor = min(self.state.expiry_floor, allocation.expires_at)
        self.state.quotas.take(allocation.tenant, allocation.usage)
        key = (allocation.pool, allocation.tenant)
        self.state.pool_usage[key] = self.state.pool_usage.get(key, Usage()) + allocation.usage
        node = self.state.cluster.get(allocation.node)
        if node is not None and node.topology.pool in self.retries.cohorts.get(allocation.pool, ()):
            allocation.borrowed_from = node.topology.pool
            loan = (allocation.borrowed_from, allocation.pool)
            self.state.lent[loan] = self.state.lent.get(loan, Usage()) + allocation.usage
            self.retries.stale(allocation.borrowed_from)
        self.retries.stale(allocation.pool)
        self.retries.tenant_changed(allocation.tenant)

    def count_preemptible(self, head: Allocation, change: int) -> None:
        """`head` (a task's first member) joins (+1) or leaves (-1) the possible victims."""
        if not head.preemptible or head.yield_by is not None:
            return
        self.state.preemptible[head.priority] += change
        if not self.state.preemptible[head.priority]:
            del self.state.preemptible[head.priority]

    def release(
        self, allocation: Allocation, reason: ReleaseReason, cause: Event
    ) -> list[AllocationReleased]:
        """The task's resources go back: every member of a gang."""
        del self.state.allocations[allocation.task_id]
        self.count_preemptible(allocation, -1)
        return [self.release_member(m, reason, cause) for m in allocation.members()]

    def release_member(
        self, allocation: Allocation, reason: ReleaseReason, cause: Event
    ) -> AllocationReleased:
        node = self.state.cluster.get(allocation.node)
        if node is not None:
            node.give_back(
                allocation.gpu_ids,
                allocation.gpu_milli,
                allocation.cpu_cores,
                allocation.memory_mb,
                allocation.group,
                allocation.mig_profile,
            )
            self.state.cluster.refresh(node.name)
        self.state.quotas.give_back(allocation.tenant, allocation.usage)
        self.state.held_by.pop(allocation.allocation_id, None)
        key = (allocation.pool, allocation.tenant)
        self.state.pool_usage[key] = self.state.pool_usage.get(key, Usage()) - allocation.usage
        if allocation.borrowed_from is not None:
            loan = (allocation.borrowed_from, allocation.pool)
            left = self.state.lent.get(loan, Usage()) - allocation.usage
            if left.gpus < 1e-9 and not (left.gpu_memory_mb or left.cpu_cores or left.memory_mb):
                self.state.lent.pop(loan, None)  # no float residue: the loan is over
            else:
                self.state.lent[loan] = left
            self.retries.stale(allocation.borrowed_from)
        self.retries.stale(allocation.pool)
        self.retries.tenant_changed(allocation.tenant)
        return AllocationReleased(
            event_id=derived_event_id(cause.event_id, f"released:{member_key(allocation)}"),
            occurred_at=cause.occurred_at,
            allocation_id=allocation.allocation_id,
            task_id=allocation.task_id,
            node=allocation.node,
            gpu_ids=list(allocation.gpu_ids),
            cpu_cores=list(allocation.cpu_cores),
            reason=reason,
        )
