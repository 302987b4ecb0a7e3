"""The preemptor: lower-priority preemptible tasks asked to yield so a waiting task fits
(the victims chosen by `preemption.plan`)."""

from __future__ import annotations

import heapq
from dataclasses import replace
from datetime import datetime, timedelta

import numpy as np

from crater.contracts import (
    PRIORITY_MAX,
    Event,
    FabricLevel,
    FilterReason,
    TaskPreempted,
    derived_event_id,
)
from crater.scheduler.domain.cluster import WHOLE, Node
from crater.scheduler.domain.config import SchedulerConfig
from crater.scheduler.domain.events import (
    member_key,
)
from crater.scheduler.domain.guarantees import Guarantees, covers, gives_back, held
from crater.scheduler.domain.ledger import Ledger
from crater.scheduler.domain.lending import Lending, borrowed, lendable, lent
from crater.scheduler.domain.placer import Placer
from crater.scheduler.domain.pools import DEFAULT_POLICY
from crater.scheduler.domain.preemption import Candidate, Plan, plan, plan_gang
from crater.scheduler.domain.queue import node_mask
from crater.scheduler.domain.quotas import Usage, queue_of_key
from crater.scheduler.domain.retries import RetryIndex
from crater.scheduler.domain.state import (
    Allocation,
    PendingTask,
    SchedulerState,
    claimed_abroad,
    yielding_on,
)

# The rules that keep a victim from yielding (no thrashing), and a preemption refused because
# no set of victims would make room for the whole task: their names in metrics.
MIN_RUN, VICTIM_COOLDOWN, UNPROVEN = "min_run", "victim_cooldown", "unproven"

# A borrower on the pool's nodes ranks below every priority: reclaimed first.
RECLAIM_RANK = PRIORITY_MAX + 1


class Preemptor:
    """Chooses victims for a waiting task and tells them to yield."""

    def __init__(
        self,
        state: SchedulerState,
        retries: RetryIndex,
        ledger: Ledger,
        placer: Placer,
        guarantees: Guarantees,
    ) -> None:
        self.state = state
        self.retries = retries
        self.ledger = ledger
        self.placer = placer
        self.guarantees = guarantees

    def preempt_for(self, task: PendingTask, cause: Event) -> list[Event]:
        """Ask lower-priority preemptible tasks to yield so `task` fits; they get a grace
        period to checkpoint, then their resources go back (see `Reservations.expire_reservations`).
        A gang preempts all or nothing: only victims that make room for every member."""
        mine = task.priority
        pool = task.request.pool
        policy = self.state.config.pools.get(pool, DEFAULT_POLICY)
        # Its pool's capacity lent out: the borrowers there yield to it, by its pool's
        # `reclaim` (by default whatever their priority), before any task of its own pool.
        lent = any(lender == pool for lender, _ in self.state.lent)
        # Within its tenant's guarantee: other tenants' work above theirs yields to it too.
        borrowing = self.guarantees.reclaimable(task)
        reclaims = lent or bool(borrowing)
        held_before = task.preempt_held
        task.preempt_held = None
        abroad = claimed_abroad(self.state, task)
        if task.nominated and (reclaims or abroad) and not self.yielding_on(task.nominated):
            # Its victims are gone and others took the room: an owner chooses again, so it
            # never waits past a grace period for its pool's capacity.
            task.nominated = ()
        if (
            task.nominated
            or not (reclaims or any(p < mine for p in self.state.preemptible))
            or self.state.quotas.blocking(
                task.request.tenant, task.demand, task.gang_size, task.request.user
            )
        ):
            return []
        now = self.state.clock or cause.occurred_at
        owners: dict[str, Allocation] = {}
        candidates: list[Candidate] = []
        # outranked only, yet kept from yielding (no thrashing): (candidate, rule, free from)
        kept: list[tuple[Candidate, str, datetime]] = []
        guarded: list[Candidate] = []
        # tasks that are victims only as their tenant's borrowing: taken from a tenant only
        # while it holds more than its guarantee (the last may take it below by part of one
        # task: else a guarantee held in tasks larger than the borrowed part never comes back)
        above: dict[str, str] = {}
        for head in self.state.allocations.values():
            if head.yield_by is not None or head.lent_by is not None:
                continue  # yielding already; or on lent cards, which only their lender takes
            borrower = (
                lent
                and head.borrowed_from == pool
                and policy.takes_back(head.priority, head.preemptible, mine)
            )
            outranked = head.preemptible and head.priority < mine
            # its tenant's, or a queue's above it, borrowing (the nearest holding more than
            # its guarantee): what taking it gives back
            lender = self.guarantees.lender_of(head.tenant, borrowing) if borrowing else None
            room = None if lender is None else borrowing[lender]
            over_guarantee = room is not None and gives_back(held(head), room)
            if not (borrower or outranked or over_guarantee):
                continue
            if over_guarantee and not (borrower or outranked) and lender is not None:
                above[head.task_id] = lender
            guard = None if borrower or over_guarantee else self.guard(head, now)
            borrower = borrower or over_guarantee
            for a in head.members():
                owners[a.allocation_id] = head
                rank = RECLAIM_RANK if borrower else PRIORITY_MAX - a.priority
                (candidates if guard is None else guarded).append(_candidate(a, rank))
            if guard is not None:
                kept += [(c, *guard) for c in guarded]
                guarded.clear()
        if not candidates and not kept:
            return self.preempt_to_borrow(task, cause, now)
        # Nodes the task could use if they were emptier: every filter but free amounts.
        fits_empty, _ = self.placer.diagnose(task.filter_demand, free=False)
        ready = fits_empty & self.state.cluster.ready
        if shunned := self.placer.shunned(task):
            ready &= ~node_mask(self.state.cluster, shunned)  # victims where it will go
        nodes = [self.state.cluster.nodes[i] for i in np.flatnonzero(ready)]
        roomy: set[str] | None = None
        if task.gang_size > 1 and not task.same_node:
            fits_now, _ = self.placer.diagnose(task.demand)
            roomy = {self.state.cluster.nodes[i].name for i in np.flatnonzero(fits_now & ready)}
        while True:
            chosen = self._plan(task, nodes, candidates, roomy) if candidates else None
            if chosen is None:
                borrowing_room = self.preempt_to_borrow(task, cause, now)
                if borrowing_room:
                    return borrowing_room
                self._held(task, held_before, nodes, candidates, kept, roomy)
                return []
            # A plan taking victims of a tenant no longer above its guarantee: without them,
            # again (each round leaves out at least one; bounded).
            excess = self._past_borrowing(chosen.victims, owners, above, borrowing)
            if not excess:
                break
            candidates = [c for c in candidates if c.task_id not in excess]
        task.nominated = chosen.nodes
        self.retries.stale(task.request.pool)
        full = now + timedelta(seconds=self.state.config.grace_period_seconds)
        decisions: list[Event] = []
        victims = {owners[v.allocation_id].task_id: owners[v.allocation_id] for v in chosen.victims}
        if any(task_id in above for task_id in victims):
            # Its tenant's guarantee: the room these victims leave is the tenant's first
            # (`state.claimed_ahead`). A pool's reclaim is its pool's, whichever of its
            # tasks its own queue serves first.
            self.state.claimants[task.request.task_id] = self.guarantees.owner(task)
            task.yielders = {
                m.allocation_id: (m.node, whole_cards(m))
                for victim in victims.values()
                for m in victim.members()
            }
        owner = self.guarantees.owner(task) if above else None
        by_queue = queue_of_key(owner) if owner is not None else None
        for victim in victims.values():
            reclaim = victim.borrowed_from if victim.borrowed_from == pool else None
            tenant = task.request.tenant if victim.task_id in above else None
            queue = by_queue if victim.task_id in above else None
            must_stop_by = full
            if reclaim is not None or tenant is not None:
                # A grace never starts over for an owner: borrowers it picks again (others
                # of its pool took the room the first ones left) go by its first deadline,
                # at once when that has passed.
                if task.reclaim_by is None:
                    task.reclaim_by = full
                must_stop_by = max(now, min(full, task.reclaim_by))
            by = task.request.task_id
            decisions += self.order_yield(
                victim, must_stop_by, cause, by, reclaim, tenant=tenant, queue=queue
            )
        return decisions

    def preempt_to_borrow(self, task: PendingTask, cause: Event, now: datetime) -> list[Event]:
        """Its own pool has no room for `task` even by preemption: when its pool may preempt
        to borrow (`PoolPolicy.borrow_preempts`, Kueue's borrowWithinCohort), cohort mates'
        preemptible tasks of lower priority yield (the fewest, least progressed) so that it
        borrows the room they leave, within its pool's borrowing limit and the lender's
        lending limit and reserved amount. The room is its own (`claimed_ahead`): the
        lender's queue does not take it meanwhile. Not a gang spread over nodes (it borrows
        nothing)."""
        pool = task.request.pool
        policy = self.state.config.pools.get(pool)
        mates = self.retries.cohorts.get(pool, ())
        if (
            policy is None
            or not policy.borrow_preempts
            or not mates
            or (task.gang_size > 1 and not task.same_node)
        ):
            return []
        usage = Usage.of(task.demand).times(task.gang_size)
        if policy.borrow_limit.excess(borrowed(self.state, pool) + usage):
            return []
        cluster = self.state.cluster
        shunned = self.placer.shunned(task)
        nodes: list[Node] = []
        for lender in mates:
            mate = self.state.config.pools[lender]
            after = lent(self.state, lender) + usage
            if mate.lend_limit.excess(after) or lendable(self.state, lender).excess(after):
                continue
            could, _ = self.placer.diagnose(replace(task.filter_demand, pool=lender), free=False)
            rows = could & cluster.ready
            if shunned:
                rows &= ~node_mask(cluster, shunned)
            nodes += [cluster.nodes[i] for i in np.flatnonzero(rows)]
        names = {node.name for node in nodes}
        owners: dict[str, Allocation] = {}
        candidates: list[Candidate] = []
        for head in self.state.allocations.values():
            if (
                head.yield_by is not None
                or head.lent_by is not None
                or not policy.may_preempt_to_borrow(head.priority, head.preemptible, task.priority)
                or not any(m.node in names for m in head.members())
                or self.guard(head, now) is not None
            ):
                continue
            for a in head.members():
                owners[a.allocation_id] = head
                candidates.append(_candidate(a, PRIORITY_MAX - a.priority))
        chosen = plan(nodes, task.demand, candidates, task.gang_size) if candidates else None
        if chosen is None:
            return []
        task.nominated = chosen.nodes
        self.retries.stale(pool)
        victims = {owners[v.allocation_id].task_id: owners[v.allocation_id] for v in chosen.victims}
        self.state.claimants[task.request.task_id] = None
        task.yielders = {
            m.allocation_id: (m.node, whole_cards(m))
            for victim in victims.values()
            for m in victim.members()
        }
        full = now + timedelta(seconds=self.state.config.grace_period_seconds)
        if task.reclaim_by is None:
            task.reclaim_by = full
        must_stop_by = max(now, min(full, task.reclaim_by))
        lenders = sorted({v.pool for v in victims.values()})
        count = f"{len(victims)} task" + ("s" if len(victims) > 1 else "")
        task.borrow_reason = (
            f"preempting to borrow: {count} of lower priority of pool {', '.join(lenders)} "
            f"yield their room to it by {must_stop_by.isoformat()}"
        )
        decisions: list[Event] = []
        for victim in victims.values():
            decisions += self.order_yield(victim, must_stop_by, cause, task.request.task_id, None)
        return decisions

    def guard(self, head: Allocation, now: datetime) -> tuple[str, datetime] | None:
        """Why `head`, outranked, may not be asked to yield now, and from when it may: it has
        held its grant less than its pool's minimum run time, or it had to yield lately (its
        pool's victim cooldown). None: it may."""
        until = self.state.victims.get(head.task_id)
        if until is not None and until > now:
            return VICTIM_COOLDOWN, until
        minimum = self.state.config.min_run_for(head.pool)
        if minimum > 0 and head.granted_at is not None:
            free_at = head.granted_at + timedelta(seconds=minimum)
            if free_at > now:
                return MIN_RUN, free_at
        return None

    def _plan(
        self,
        task: PendingTask,
        nodes: list[Node],
        candidates: list[Candidate],
        roomy: set[str] | None,
    ) -> Plan | None:
        """The victims that make room for every member of `task` on the nodes as they would
        be once those victims are gone (`preemption`), or None: nobody yields."""
        if roomy is not None and task.demand.fabric_required is not None:
            return self._plan_within(task, nodes, candidates, roomy, task.demand.fabric_required)
        if roomy is not None:
            return plan_gang(nodes, task.demand, candidates, task.gang_size, roomy)
        return plan(nodes, task.demand, candidates, task.gang_size)

    def _plan_within(
        self,
        task: PendingTask,
        nodes: list[Node],
        candidates: list[Candidate],
        roomy: set[str],
        level: FabricLevel,
    ) -> Plan | None:
        """A spread gang that requires one domain of `level`: the plan of one domain, the one
        with the fewest victims (then the first by name), so that the room they leave holds
        every member together (victims spread over two leaves would free room it cannot use)."""
        cluster = self.state.cluster
        column = cluster.fabric(level)
        domains: dict[int, list[Node]] = {}
        for node in nodes:
            domain = int(column[cluster.index[node.name]])
            if domain:
                domains.setdefault(domain, []).append(node)
        best: Plan | None = None
        for domain in sorted(domains, key=lambda d: cluster.fabric_domains[d][1]):
            inside = domains[domain]
            names = {n.name for n in inside}
            found = plan_gang(inside, task.demand, candidates, task.gang_size, roomy & names)
            if found is not None and (best is None or len(found.victims) < len(best.victims)):
                best = found
        return best

    def _held(
        self,
        task: PendingTask,
        held_before: FilterReason | None,
        nodes: list[Node],
        candidates: list[Candidate],
        kept: list[tuple[Candidate, str, datetime]],
        roomy: set[str] | None,
    ) -> None:
        """No plan makes room for `task`: when one would with the victims kept from yielding
        (no thrashing), say so in its reasons (`preempt_held`), count the rule, and retry its
        pool when the first of them may go. Else, with candidates, count it unproven."""
        if kept and self._plan(task, nodes, [*candidates, *(c for c, *_ in kept)], roomy):
            tasks: dict[str, tuple[str, datetime, str]] = {}
            for c, rule, free_at in kept:
                owner = self.state.allocations.get(c.task_id)
                tasks[c.task_id] = (rule, free_at, owner.pool if owner else task.request.pool)
            clauses: list[str] = []
            for rule in (MIN_RUN, VICTIM_COOLDOWN):
                by_pool = sorted({p for r, _, p in tasks.values() if r == rule})
                for pool in by_pool:
                    count = sum(1 for r, _, p in tasks.values() if r == rule and p == pool)
                    clauses.append(_held_clause(rule, count, pool, self.state.config))
            task.preempt_held = FilterReason(
                filter="Preemption",
                code="MinRunTime"
                if any(r == MIN_RUN for r, *_ in tasks.values())
                else "RecentVictim",
                nodes=0,
                message="; ".join(clauses),
            )
            if held_before is None or held_before.message != task.preempt_held.message:
                for rule in sorted({r for r, _, _ in tasks.values()}):
                    self.state.tally[rule] += 1
            wake = min(free_at for _, free_at, _ in tasks.values())
            if task.preempt_wake != wake:
                task.preempt_wake = wake
                heapq.heappush(self.state.wakeups, (wake, task.seq, task.request.task_id))
        elif candidates and not task.unproven:
            self.state.tally[UNPROVEN] += 1  # once a wait: not on every retry of it
        task.unproven = bool(candidates) and task.preempt_held is None

    def _past_borrowing(
        self,
        victims: tuple[Candidate, ...],
        owners: dict[str, Allocation],
        above: dict[str, str],
        borrowing: dict[str, Usage],
    ) -> set[str]:
        """The victims (task ids) chosen only as their tenant's borrowing that come after
        those before them (in the plan's order) gave back all it holds above its guarantee."""
        taken: dict[str, Usage] = {}
        counted: set[str] = set()  # a gang's members are one victim
        past: set[str] = set()
        for victim in victims:
            tenant = above.get(victim.task_id)
            if tenant is None or victim.task_id in counted:
                continue
            counted.add(victim.task_id)
            before = taken.get(tenant, Usage())
            if covers(before, borrowing[tenant]):
                past.add(victim.task_id)
            else:
                taken[tenant] = before + held(owners[victim.allocation_id])
        return past

    def reclaim_ahead(self, lending: Lending, cause: Event) -> list[Event]:
        """Borrowers on a pre-warming pool's nodes are told to yield (with the grace period)
        until the pool has, idle or on its way back, the growth it expects within its lead
        (`Lending.expected_growth`; the static `keep_idle` only stops new loans). Victims:
        the fewest, then the least progressed: the smallest borrower that covers what is
        missing, else the largest and go on."""
        decisions: list[Event] = []
        for lender in sorted(lending.forecasts):
            if not any(owner == lender for owner, _ in self.state.lent):
                continue
            policy = self.state.config.pools[lender]
            borrowers = [
                h
                for h in self.state.allocations.values()
                if h.borrowed_from == lender and policy.takes_back(h.priority, h.preemptible, None)
            ]
            yielding = sum(_gpus(h) for h in borrowers if h.yield_by is not None)
            missing = lending.expected_growth(lender) - lending.idle_gpus(lender) - yielding
            standing = [h for h in borrowers if h.yield_by is None and _gpus(h)]
            if missing <= 0 or not standing:
                continue
            now = self.state.clock or cause.occurred_at
            must_stop_by = now + timedelta(seconds=self.state.config.grace_period_seconds)
            while missing > 0 and standing:
                covering = [h for h in standing if _gpus(h) >= missing]
                if covering:
                    victim = min(covering, key=lambda h: (_gpus(h), -h.granted_seq, h.task_id))
                else:
                    victim = max(standing, key=lambda h: (_gpus(h), h.granted_seq, h.task_id))
                standing.remove(victim)
                missing -= _gpus(victim)
                decisions += self.order_yield(victim, must_stop_by, cause, None, lender)
        return decisions

    def order_yield(
        self,
        victim: Allocation,
        must_stop_by: datetime,
        cause: Event,
        preempted_by: str | None,
        reclaim: str | None,
        lent_by: str | None = None,
        tenant: str | None = None,
        time_limit: int | None = None,
        queue: str | None = None,
    ) -> list[Event]:
        """`victim` (a whole gang) is told to be gone by `must_stop_by`. `time_limit`: it has
        held its grant for its time limit (not a victim of anyone: no cooldown)."""
        now = self.state.clock or cause.occurred_at
        cooldown = self.state.config.victim_cooldown_for(victim.pool)
        if cooldown > 0 and time_limit is None:
            until = must_stop_by + timedelta(seconds=cooldown)
            self.state.victims[victim.task_id] = until
            heapq.heappush(self.state.victims_due, (until, victim.task_id))
        self.ledger.count_preemptible(victim, -1)
        self.retries.stale(victim.pool)
        self.state.holdings_version += 1  # it is due to go by its deadline now
        decisions: list[Event] = []
        for member in victim.members():
            member.yield_by = must_stop_by
            member.time_limited = time_limit is not None
            if self.state.expiry_floor is not None:
                self.state.expiry_floor = min(self.state.expiry_floor, must_stop_by)
            decisions.append(
                TaskPreempted(
                    event_id=derived_event_id(cause.event_id, f"preempted:{member_key(member)}"),
                    occurred_at=cause.occurred_at,
                    task_id=member.task_id,
                    allocation_id=member.allocation_id,
                    node=member.node,
                    preempted_by=preempted_by,
                    grace_period_seconds=max(0, int((must_stop_by - now).total_seconds())),
                    must_stop_by=must_stop_by,
                    reclaimed_by_pool=reclaim,
                    lent_by=lent_by,
                    reclaimed_by_tenant=tenant,
                    reclaimed_by_queue=queue,
                    time_limit_seconds=time_limit,
                )
            )
        return decisions

    def yielding_on(self, nodes: tuple[str, ...]) -> bool:
        """Whether some allocation on `nodes` is yielding now."""
        return yielding_on(self.state, nodes)


def forget_victims(state: SchedulerState, now: datetime) -> None:
    """Victims whose cooldown is over are forgotten (each once: bounded by the preemptions)."""
    while state.victims_due and state.victims_due[0][0] <= now:
        until, task_id = heapq.heappop(state.victims_due)
        if state.victims.get(task_id) == until:
            del state.victims[task_id]


def _held_clause(rule: str, count: int, pool: str, config: SchedulerConfig) -> str:
    tasks = "1 task" if count == 1 else f"{count} tasks"
    if rule == MIN_RUN:
        verb = "has" if count == 1 else "have"
        return (
            f"{tasks} could make room but {verb} run under pool {pool}'s minimum of "
            f"{config.min_run_for(pool):g} s"
        )
    verb = "was" if count == 1 else "were"
    return (
        f"{tasks} could make room but {verb} preempted within pool {pool}'s victim cooldown "
        f"of {config.victim_cooldown_for(pool):g} s"
    )


def _candidate(allocation: Allocation, rank: int) -> Candidate:
    a = allocation
    return Candidate(
        a.allocation_id,
        a.node,
        a.gpu_ids,
        a.gpu_milli,
        a.cpu_cores,
        a.memory_mb,
        rank,
        a.granted_seq,
        a.carved,
        a.task_id,
        a.disk_hold,
    )


def _gpus(head: Allocation) -> int:
    """Whole cards a task holds, every gang member's."""
    return sum(len(m.gpu_ids) for m in head.members())


def whole_cards(allocation: Allocation) -> int:
    """The whole cards `allocation` frees when it goes (none for a share or a MIG slice)."""
    whole = allocation.gpu_milli >= WHOLE and allocation.carved is None
    return len(allocation.gpu_ids) if whole else 0
