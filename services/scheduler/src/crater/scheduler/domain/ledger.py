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
        self.state.holdings_version += 1
        self.state.held_by[allocation.allocation_id] = allocation.task_id
        if self.state.expiry_floor is not None:
            self.state.expiry_floor = min(self.state.expiry_floor, allocation.expires_at)
        self.state.quotas.take(allocation.tenant, allocation.usage)
        self.state.quotas.take_user(allocation.tenant, allocation.user, allocation.usage.gpus)
        key = (allocation.pool, allocation.tenant)
        self.state.pool_usage[key] = self.state.pool_usage.get(key, Usage()) + allocation.usage
        node = self.state.cluster.get(allocation.node)
        if allocation.lent_by is not None:
            # On a card lent during a CPU phase: not a pool's loan (its lender takes it back).
            self.state.lent_cards[(allocation.node, allocation.gpu_ids[0])] = allocation.task_id
        elif node is not None and node.topology.pool in self.retries.cohorts.get(
            allocation.pool, ()
        ):
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

    def hand_over_lent_cards(self, lender: Allocation) -> tuple[int, ...]:
        """A lender going while replicas are on its cards: each such replica takes the
        lender's hold of its card over (so nothing else is placed there before it leaves).
        Returns the lender's cards that go back to the node."""
        back: list[int] = []
        for card in lender.gpu_ids:
            replica_task = self.state.lent_cards.get((lender.node, card))
            replica = self.state.allocations.get(replica_task) if replica_task else None
            if replica is None or replica.lent_by != lender.task_id or replica.gpu_milli:
                back.append(card)
                continue
            replica.gpu_milli = lender.gpu_milli
        return tuple(back)

    def release_member(
        self, allocation: Allocation, reason: ReleaseReason, cause: Event
    ) -> AllocationReleased:
        self.state.holdings_version += 1
        node = self.state.cluster.get(allocation.node)
        gpu_ids = allocation.gpu_ids
        if allocation.lent_by is not None:
            self.state.lent_cards.pop((allocation.node, gpu_ids[0]), None)
            self.state.stale_pools = None  # a lent card is free: any pool's replica may fit
        elif self.state.lent_cards:
            gpu_ids = self.hand_over_lent_cards(allocation)
        if node is not None:
            node.give_back(
                gpu_ids,
                allocation.gpu_milli,
                allocation.cpu_cores,
                allocation.memory_mb,
                allocation.group,
                allocation.carved,
                allocation.disk_hold,
            )
            self.state.cluster.refresh(node.name)
        self.state.quotas.give_back(allocation.tenant, allocation.usage)
        self.state.quotas.take_user(allocation.tenant, allocation.user, -allocation.usage.gpus)
        self.state.held_by.pop(allocation.allocation_id, None)
        key = (allocation.pool, allocation.tenant)
        self.state.pool_usage[key] = self.state.pool_usage.get(key, Usage()) - allocation.usage
        if allocation.borrowed_from is not None:
            loan = (allocation.borrowed_from, allocation.pool)
            left = self.state.lent.get(loan, Usage()) - allocation.usage
            if left.gpus < 1e-9 and not (
                left.gpu_memory_mb or left.cpu_cores or left.memory_mb or left.disk_gb
            ):
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
