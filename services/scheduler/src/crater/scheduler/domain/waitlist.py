"""The wait list: the waiting tasks' queue order (priority raised by ageing, DRF share,
submission), each pool's blocked head and the nodes kept for it (backfill), and queue-time
SLA escalation."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator
from datetime import datetime, timedelta

import numpy as np

from crater.contracts import (
    Event,
    TaskEscalated,
    derived_event_id,
)
from crater.scheduler.domain.cluster import (
    WHOLE,
    BoolArray,
    Node,
)
from crater.scheduler.domain.demand import Demand
from crater.scheduler.domain.gpu_order import remember as remember_preference
from crater.scheduler.domain.placement import select
from crater.scheduler.domain.placer import Placer
from crater.scheduler.domain.plugins.filters import RESTRICTED_BELOW
from crater.scheduler.domain.queue import (
    Backfill,
    QueueKey,
    closest_to_fitting,
    dominant_share,
    node_mask,
    pool_capacity,
)
from crater.scheduler.domain.retries import RetryIndex
from crater.scheduler.domain.state import (
    PendingTask,
    SchedulerState,
    claimed_before,
    claimed_nodes,
    yielding_for,
    yielding_on,
)

# The most nodes a blocked head examines for the ones to keep (backfill), closest first.
HEAD_CANDIDATES = 64


class Waitlist:
    """Orders the waiting tasks and keeps each pool's blocked head."""

    def __init__(self, state: SchedulerState, retries: RetryIndex, placer: Placer) -> None:
        self.state = state
        self.retries = retries
        self.placer = placer

    def enqueue(self, task: PendingTask) -> None:
        self.state.pending[task.request.task_id] = task
        self.retries.stale(task.request.pool)
        limit = task.request.sla.max_queue_time_seconds
        if limit is not None and task.submitted_at is not None and not task.escalated:
            deadline = task.submitted_at + timedelta(seconds=limit)
            heapq.heappush(self.state.deadlines, (deadline, task.seq, task.request.task_id))
        if task.not_before is not None:
            heapq.heappush(self.state.backoffs, (task.not_before, task.seq, task.request.task_id))
        remember_preference(self.state, task)
        self.next_step(task)

    def next_step(self, task: PendingTask) -> None:
        """Ageing: when `task` next ranks a step higher for its wait, if it has steps left."""
        config = self.state.config
        interval = config.ageing_interval_seconds
        if interval <= 0 or task.submitted_at is None or config.ageing_step <= 0:
            return
        if task.aged * config.ageing_step >= config.ageing_max:
            return
        due = task.submitted_at + timedelta(seconds=interval * (task.aged + 1))
        heapq.heappush(self.state.ageing, (due, task.seq, task.request.task_id))

    def age(self, now: datetime) -> bool:
        """Waiting tasks whose wait reached their next ageing step rank that much higher in
        the queue (bounded by `ageing_max`): True if any did. Each step is one entry of a
        heap: no scan of the queue."""
        interval = self.state.config.ageing_interval_seconds
        aged = False
        while self.state.ageing and self.state.ageing[0][0] <= now:
            _, _, task_id = heapq.heappop(self.state.ageing)
            task = self.state.pending.get(task_id)
            if task is None or task.submitted_at is None or interval <= 0:
                continue  # placed, cancelled, or ageing turned off
            steps = int((now - task.submitted_at).total_seconds() // interval)
            if steps <= task.aged:
                continue
            task.aged = steps
            self.state.tally["ageing_steps"] += 1
            self.retries.stale(task.request.pool)
            aged = True
            self.next_step(task)
        return aged

    def escalate(self, now: datetime, cause: Event) -> list[Event]:
        """Tasks waiting past their queue-time SLA rank one class higher, once."""
        escalated: list[Event] = []
        while self.state.deadlines and self.state.deadlines[0][0] < now:
            _, _, task_id = heapq.heappop(self.state.deadlines)
            task = self.state.pending.get(task_id)
            if task is None or task.escalated or task.submitted_at is None:
                continue  # placed, cancelled, or escalated already
            before = task.priority
            task.escalated = True
            self.retries.stale(task.request.pool)
            limit = task.request.sla.max_queue_time_seconds or 0
            escalated.append(
                TaskEscalated(
                    event_id=derived_event_id(cause.event_id, f"escalated:{task_id}"),
                    occurred_at=cause.occurred_at,
                    task_id=task_id,
                    waited_seconds=(now - task.submitted_at).total_seconds(),
                    max_queue_time_seconds=limit,
                    priority=before,
                    escalated_priority=task.priority,
                )
            )
        return escalated

    def order(self, task: PendingTask) -> tuple[int, float, int]:
        """Queue order: priority (larger first, as aged: `queue_priority`), the tenant's
        dominant share of the pool (smaller first), submission order."""
        key = (task.request.pool, task.request.tenant)
        return -task.queue_priority(self.state.config), self.share(key), task.seq

    def share(self, key: QueueKey) -> float:
        """The tenant's dominant share of the pool."""
        used = self.state.pool_usage.get(key)
        if not used:
            return 0.0
        if self.state.capacity_version != self.state.cluster.topology_version:
            self.state.capacity, self.state.shares = {}, {}  # nodes came, went or changed: afresh
            self.state.capacity_version = self.state.cluster.topology_version
        known = self.state.shares.get(key)
        if known is not None and known[0] is used:  # holdings replaced on every change
            return known[1]
        pool = key[0]
        capacity = self.state.capacity.get(pool)
        if capacity is None:
            capacity = self.state.capacity[pool] = pool_capacity(self.state.cluster, pool)
        share = dominant_share(used, capacity)
        self.state.shares[key] = (used, share)
        return share

    def queue(self, pools: set[str] | None = None) -> Iterator[PendingTask]:
        """The waiting tasks (of `pools`; None: all) in queue order; shares are read afresh
        at every step, so a tenant granted a task falls behind the others of its priority at
        once (DRF). A pool's tasks come in the same order with or without the other pools:
        a share is one pool's."""
        bands: dict[int, dict[QueueKey, deque[PendingTask]]] = {}
        for task in sorted(self.state.pending.values(), key=lambda t: t.seq):
            key = (task.request.pool, task.request.tenant)
            if pools is None or key[0] in pools:
                bands.setdefault(task.queue_priority(self.state.config), {}).setdefault(
                    key, deque()
                ).append(task)
        for priority in sorted(bands, reverse=True):
            queues = bands[priority]
            while queues:
                key = min(queues, key=lambda k: (self.share(k), queues[k][0].seq))
                task = queues[key].popleft()
                if not queues[key]:
                    del queues[key]
                yield task

    def ripe_claims(self, pools: set[str] | None) -> list[PendingTask]:
        """The owners whose victims are all gone, in the order they claimed (of `pools`, or
        of every pool): each is tried before the queue, the room its victims left being its
        own (`claimed_ahead`)."""
        ripe = [
            task
            for task_id in self.state.claimants
            if (task := self.state.pending.get(task_id)) is not None
            and task.yielders
            and task.not_before is None
            and (pools is None or task.request.pool in pools)
            and not yielding_for(self.state, task)
        ]
        return sorted(ripe, key=lambda t: (t.reclaim_by, t.seq))

    def end_claim(self, task: PendingTask) -> None:
        """`task`'s victims are gone and it was tried: its claim ends (a new reclaim, if it
        makes one, starts another; its first deadline still holds)."""
        if not yielding_for(self.state, task):
            task.yielders = {}
            self.state.claimants.pop(task.request.task_id, None)

    def reserving_head(self, task: PendingTask) -> Backfill | None:
        """The blocked head of `task`'s pool whose nodes `task` must leave alone: when the
        head comes first in the queue."""
        head = self.state.backfill.get(task.request.pool)
        if head is None or head.task_id == task.request.task_id:
            return None
        waiting = self.state.pending.get(head.task_id)
        if waiting is None or claimed_before(task, waiting):
            return None  # an owner that claimed first is not kept from its victims' room
        # The head's order now, not as it was when it became the head: shares move as tasks
        # end, and ageing lifts it (a stale order would let a task it outranks take its nodes).
        if self.order(task) < self.order(waiting):
            return None
        if self.ends_before(task, head):
            return None  # its time limit ends it before the head's nodes are due free
        return head

    def ends_before(self, task: PendingTask, head: Backfill) -> bool:
        """Whether `task`, started now, is gone (its time limit and the grace to stop) by
        the time the head's nodes are due free (`due_free`): then it may run on them
        without delaying the head's start past that time (EASY backfill by limits)."""
        limit = self.state.config.run_limit_for(task.request)
        now = self.state.clock
        if limit is None or now is None:
            return False
        due = due_free(self.state, head)
        grace = timedelta(seconds=self.state.config.grace_period_seconds + limit)
        return due is not None and now + grace <= due

    def reserved_for(self, task: PendingTask) -> BoolArray | None:
        """The nodes `task` must leave alone: those kept for its pool's blocked head, when
        the head comes first in the queue, and those where owners that claimed before it
        wait for their victims (`claimed_ahead`), and those where its earlier attempts failed
        (`Placer.shunned`)."""
        head = self.reserving_head(task)
        avoid = None if head is None else head.mask(self.state.cluster)
        kept = (*self.claimed_nodes(task), *self.placer.shunned(task))
        return either(avoid, node_mask(self.state.cluster, kept) if kept else None)

    def claimed_nodes(self, task: PendingTask) -> tuple[str, ...]:
        """The nodes `task` must leave to owners that claimed capacity back before it."""
        return claimed_nodes(self.state, task)

    def make_head(self, task: PendingTask) -> None:
        """`task` heads its pool's queue and cannot start: keep the node(s) it waits on.
        Not a task that would borrow above its tenant's guarantee (docs/pools.md) with no
        victims yielding for it now: borrowed capacity is what is idle, and keeping nodes
        for it would keep them from the tasks of tenants within their guarantees."""
        if self.state.quotas.would_borrow(task.request.tenant, task.demand, task.gang_size) and (
            not task.nominated or not yielding_on(self.state, task.nominated)
        ):
            task.nominated = ()  # its victims are gone: it may choose again
            return
        if task.nominated:
            nodes: tuple[str, ...] = task.nominated
        else:
            could, _ = self.placer.diagnose(task.filter_demand, free=False)
            usable = could & self.state.cluster.ready
            if task.demand.high_priority:  # not a node restricted for its health now
                usable &= self.state.cluster.health >= RESTRICTED_BELOW
            if shunned := self.placer.shunned(task):  # nor one where it failed before
                usable &= ~node_mask(self.state.cluster, shunned)
            # nor one it is kept off for scarce work: it would keep that node from the very
            # work the node is held for
            held = self.placer.held_for_scarce(task, usable)
            if held is not None:
                usable &= ~held
            rows = np.flatnonzero(usable)
            wanted = 1 if task.same_node or task.gang_size == 1 else task.gang_size
            # A gang that requires one fabric domain keeps nodes of one domain: the first
            # to have enough (else the one with most); any other, one group.
            level = task.demand.fabric_required if wanted > 1 else None
            domain = None if level is None else self.state.cluster.fabric(level)
            groups: dict[int, list[str]] = {}
            names: list[str] = []
            # Only nodes whose devices could hold it once emptied (NUMA, NVLink), looking at
            # a bounded number: a head that fits nowhere keeps nothing.
            for i in closest_to_fitting(self.state.cluster, rows, HEAD_CANDIDATES):
                node = self.state.cluster.nodes[i]
                if could_hold(node, task.demand, task.gang_size if task.same_node else 1):
                    group = groups.setdefault(0 if domain is None else int(domain[i]), [])
                    group.append(node.name)
                    if len(group) == wanted:
                        names = group
                        break
            else:
                names = max(groups.values(), key=len, default=[])
            nodes = tuple(names)
        self.state.backfill[task.request.pool] = Backfill(
            task.request.task_id, self.order(task), nodes
        )


def due_free(state: SchedulerState, head: Backfill) -> datetime | None:
    """When every task holding one of the head's kept nodes is gone at the latest: its
    yield deadline, else its grant's time plus its time limit and the grace to stop.
    None: one of them has no time limit (or none is kept). Cached per holdings."""
    key = (head.task_id, head.nodes)
    known = state.due_free.get(key)
    if known is not None and known[0] == state.holdings_version:
        return known[1]
    due: datetime | None = None
    grace = timedelta(seconds=state.config.grace_period_seconds)
    names = set(head.nodes)
    for held in state.allocations.values():
        if not any(m.node in names for m in held.members()):
            continue
        if held.yield_by is not None:
            end = held.yield_by
        elif held.run_limit is None or held.granted_at is None:
            due = None
            break
        else:
            end = held.granted_at + timedelta(seconds=held.run_limit) + grace
        due = end if due is None else max(due, end)
    if len(state.due_free) > 64:
        state.due_free.clear()  # heads come and go: keep only the recent ones
    state.due_free[key] = (state.holdings_version, due)
    return due


def could_hold(node: Node, demand: Demand, members: int) -> bool:
    """Whether `node`, emptied, has the devices for `members` copies of `demand`."""
    empty = Node.empty(node.topology, node.overcommit)
    for _ in range(members):
        selection = select(empty, demand)
        if selection is None:
            return False
        empty.take(
            selection.gpu_ids,
            demand.gpu_milli or WHOLE,
            selection.cpu_cores,
            demand.memory_mb,
            None,
            selection.mig_profile,
            selection.disk_hold(demand),
        )
    return True


def either(one: BoolArray | None, other: BoolArray | None) -> BoolArray | None:
    """The nodes in either mask (None: in neither)."""
    if one is None:
        return other
    return one if other is None else one | other
