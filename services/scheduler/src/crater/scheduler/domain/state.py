"""The cluster state the core's collaborators share: the waiting tasks, the allocations held,
the clocks, the queue's and the retries' bookkeeping; what one waiting task and one held
allocation are."""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from crater.contracts import (
    PRIORITY_MAX,
    FilterReason,
    GpuModelsPolicy,
    GpuProcess,
    ResourcePrediction,
    RunningAllocation,
    TaskRequest,
    priority_value,
)
from crater.scheduler.domain.cluster import (
    WHOLE,
    ClusterArrays,
    Node,
)
from crater.scheduler.domain.config import SchedulerConfig
from crater.scheduler.domain.demand import Demand
from crater.scheduler.domain.queue import (
    Backfill,
    QueueKey,
    escalated_priority,
    gang_demand,
)
from crater.scheduler.domain.quotas import Quotas, Usage


@dataclass
class PendingTask:
    request: TaskRequest
    prediction: ResourcePrediction | None
    demand: Demand  # what each gang member needs (the task itself when not a gang)
    seq: int
    last_summary: str | None = None
    # where victims are yielding for it (a gang's: every node where some yield), by name
    nominated: tuple[str, ...] = ()
    submitted_at: datetime | None = None  # the queue-time SLA counts from here
    escalated: bool = False  # waited past sla.max_queue_time_seconds
    attempt: int = 1  # restart policy: which attempt waits
    not_before: datetime | None = None  # a retried attempt waits out its backoff until then
    # The kinds of reason (filters) AllData was told of this wait, the latest last, and when
    # the latest was; and a new kind seen since `kind_since`, announced once it has held for
    # the interval. A kind told before is no news when the wait goes back to it.
    told_kinds: tuple[frozenset[str], ...] = ()
    announced_at: datetime | None = None
    seen_kind: frozenset[str] | None = None
    kind_since: datetime | None = None
    live_reasons: list[FilterReason] = field(default_factory=list)
    # why it could not borrow a cohort mate's idle nodes either (None: its pool does not lend)
    borrow_reason: str | None = None
    # When the borrowers it first reclaimed from had to be gone by: victims it picks again
    # (others took the room) must go by then too, so no grace period starts over for it.
    reclaim_by: datetime | None = None
    # Ageing: how many of the configured steps it ranks higher in the queue for its wait.
    aged: int = 0
    # Why no victim was asked to yield for it although some could make room (they ran under
    # their pool's minimum, or yielded lately), and when the first of them is free to go.
    preempt_held: FilterReason | None = None
    preempt_wake: datetime | None = None
    # Asking no GPU, it may be kept off capacity held for scarce work until then; its pool
    # is retried at that time (`Placer.held_for_scarce`).
    scarce_hold_until: datetime | None = None
    # Victims were there, but no set of them would make room for all of it (counted once).
    unproven: bool = False
    # The nodes where an earlier attempt failed (ended failed, never confirmed, or its node
    # lost): a retry goes elsewhere while another node could hold it (`Placer.shunned`).
    failed_on: tuple[str, ...] = ()
    # A reclaim of its tenant's guarantee: each allocation told to yield for it, by id, with
    # its node and the whole cards it frees there (`claimed_nodes`).
    yielders: dict[str, tuple[str, int]] = field(default_factory=dict)
    # Ordered GPU models with models_policy wait (gpu_order.py): until `prefer_until` its
    # `demand` names its first model only; `wide_demand` names every listed one.
    prefer_until: datetime | None = None
    wide_demand: Demand | None = None
    # Which listed model the placer took for it and why, for its grant's explanation.
    model_choice: str | None = None
    # With models_policy borrow, while one step of its model order is tried (gpu_order.py,
    # `one_model`): the rank of the only listed model placement may take, and why each
    # earlier one was not taken (at home, borrowed). None outside such a step.
    model_step: tuple[int, tuple[str, ...]] | None = None

    def __post_init__(self) -> None:
        gpu = self.request.resource_requirements.gpu
        order = self.demand.gpu_model_order
        if gpu.models_policy is GpuModelsPolicy.WAIT and order and self.submitted_at is not None:
            self.wide_demand = self.demand
            self.prefer_until = self.submitted_at + timedelta(seconds=gpu.models_wait_seconds or 0)
            self.demand = replace(self.demand, gpu_model=order[0], gpu_model_order=())

    @property
    def full_demand(self) -> Demand:
        """Its demand over every listed GPU model, whether or not it waits for its first."""
        return self.wide_demand or self.demand

    def widen(self) -> None:
        """Its wait for its first model is over: every listed model from now."""
        if self.wide_demand is not None:
            self.demand = self.wide_demand
        self.prefer_until = self.wide_demand = None

    @property
    def announced_kind(self) -> frozenset[str] | None:
        """The kind of reason AllData heard last; None before the first `task.pending`."""
        return self.told_kinds[-1] if self.told_kinds else None

    @property
    def priority(self) -> int:
        """On the 0..1000 scale, larger first; an escalated task ranks one class higher."""
        base = priority_value(self.request.priority)
        return escalated_priority(base) if self.escalated else base

    def queue_priority(self, config: SchedulerConfig) -> int:
        """Its rank in the queue: its priority, raised for its wait (ageing), bounded."""
        if not self.aged:
            return self.priority
        boost = min(self.aged * config.ageing_step, config.ageing_max)
        return min(PRIORITY_MAX, self.priority + boost)

    @property
    def gang_size(self) -> int:
        return self.request.gang_size

    @property
    def nominated_node(self) -> str | None:
        """The first node victims are yielding on for it, if any."""
        return self.nominated[0] if self.nominated else None

    @property
    def same_node(self) -> bool:
        """A gang asked to sit on one node (`affinity.gpu: same-node`)."""
        return self.request.gang_size > 1 and self.request.affinity.gpu == "same-node"

    @property
    def filter_demand(self) -> Demand:
        """What one node must offer: a same-node gang's members together, else one member."""
        return gang_demand(self.demand, self.gang_size) if self.same_node else self.demand


@dataclass
class Allocation:
    allocation_id: str
    task_id: str
    node: str
    gpu_ids: tuple[int, ...]
    cpu_cores: tuple[int, ...]
    memory_mb: int
    expires_at: datetime
    gpu_milli: int = WHOLE
    running: bool = False
    tenant: str = "default"
    usage: Usage = field(default_factory=Usage)  # this member's own
    user: str | None = None  # its request's, whose per-user limits it counts against
    priority: int = 500  # 0..1000, larger first
    preemptible: bool = False
    granted_seq: int = 0
    yield_by: datetime | None = None  # preempted: released at this time at the latest
    group: str | None = None  # anti-affinity group
    pool: str = "default"
    # The pool whose node this is, when not its own pool's (borrowed, so reclaimable):
    # derived from the node's pool when the ledger takes it.
    borrowed_from: str | None = None
    mig_profile: str | None = None  # a MIG slice of gpu_ids[0]
    gang_index: int = 0
    # A gang's members after the first; the first (held in `Scheduler.allocations`) owns them.
    peers: list[Allocation] = field(default_factory=list)
    # The scheduler has read its own grant back from the stream: the reservation counts.
    armed: bool = True
    attempt: int = 1
    # Confirmed by its launcher with the token: failed when its heartbeats (the launcher's
    # `running` reports) stop for this many seconds. None: not held to heartbeats.
    heartbeat_grace: float | None = None
    # The latest heartbeat's time (not stored: a restart counts every one as heard then).
    heard_at: datetime | None = field(default=None, compare=False)
    # The task as it waited (request, prediction): a retried attempt queues it again.
    task: PendingTask | None = field(default=None, compare=False, repr=False)
    # An inference replica on a card lent by this task during its CPU phase (phases.py):
    # the lender holds the card (this holds 0 of it) until the lender goes, when this one
    # takes the lender's hold over until it leaves too.
    lent_by: str | None = None
    # When it was granted: the pool's minimum run time before it may be preempted counts
    # from here (None: unknown, never held back by it).
    granted_at: datetime | None = None
    # The SSD chosen for it and the space it holds there (ssd.capacity_gb); None: none.
    disk: str | None = None
    disk_gb: int = 0
    # Its time limit in seconds, counted from `granted_at` (the task's max_run_seconds, else
    # its pool's; None: none), and whether it was told to stop for it (then `yield_by` is
    # that stop's deadline and it goes back as `time-limit`, not as a preemption).
    run_limit: int | None = None
    time_limited: bool = False

    @property
    def disk_hold(self) -> tuple[str, int] | None:
        """(SSD, GB) it holds, for `Node.take`; None: no disk chosen."""
        return None if self.disk is None else (self.disk, self.disk_gb)

    @property
    def carved(self) -> str | None:
        """The MIG slice this allocation cuts on its node's card: its own, except a replica's
        on a lent card, which the lender keeps holding whole (its slice is the node's doing
        for the phase, not the core's accounting)."""
        return self.mig_profile if self.lent_by is None else None

    def members(self) -> list[Allocation]:
        return [self, *self.peers]


@dataclass
class LendingPhase:
    """A running task's CPU phase: its whole cards may be lent to inference replicas."""

    task_id: str
    allocation_id: str
    node: str
    gpu_ids: tuple[int, ...]
    # What the task keeps resident on each card (MiB): a replica is capped to the rest.
    resident_mb: dict[int, int]
    # When the phase ends by itself; None: restored, set from the first event after.
    lent_until: datetime | None
    # Asked back (or the phase over): the replicas are gone by then. None: lending.
    must_be_free_by: datetime | None = None
    why_back: str = ""


@dataclass
class Inventory:
    """A node's latest report of what runs on it: when; each allocation its agent runs, by
    id (None: the agent keeps no inventory); the processes on each card (None: not read)."""

    at: datetime
    running: dict[str, RunningAllocation] | None
    processes: dict[int, tuple[GpuProcess, ...]] | None = None


# What an unknown run is: an allocation the core does not hold there, or processes on a card
# the core holds free; keyed (kind, allocation id or card index).
UnknownKey = tuple[str, str]


@dataclass
class UnknownRun:
    """Work a node runs that the core does not hold there: since when it has been reported,
    and the cards blocked for it (none until it outlasts the grace)."""

    task_id: str  # "" for processes
    gpu_ids: tuple[int, ...]
    first_seen: datetime
    what: str = ""  # in words, for the reason
    reported: bool = False  # past the grace: said, and its cards blocked
    held: tuple[int, ...] = ()


@dataclass
class SchedulerState:
    """Everything the core knows, shared by its collaborators (`core.Scheduler` is one)."""

    config: SchedulerConfig = field(default_factory=SchedulerConfig)
    cluster: ClusterArrays = field(default_factory=ClusterArrays)
    pending: dict[str, PendingTask] = field(default_factory=dict)
    allocations: dict[str, Allocation] = field(default_factory=dict)
    next_seq: int = 0
    # The core's clock: the latest `occurred_at` it has seen. Events arrive from many
    # producers, a little out of order; time never runs backwards inside the core.
    clock: datetime | None = None
    # The latest `occurred_at` of the task reports (task.status) consumed: a reservation
    # expires only once the reports of its time are in, so a report that lags in its own
    # consumer still confirms it.
    reports_clock: datetime | None = None
    # The latest `occurred_at` of the heartbeats (node.health) consumed: a node is silent
    # against the heartbeats of its time, not against events of other streams that ran ahead.
    health_clock: datetime | None = None
    # (time, seq, task id) of retried attempts waiting out their backoff, earliest first.
    backoffs: list[tuple[datetime, int, str]] = field(default_factory=list)
    # (time, seq, task id): a waiting task's new kind of reason may be announced from then;
    # its pool is retried at that time, so the announcement does not wait for other news.
    announcements: list[tuple[datetime, int, str]] = field(default_factory=list)
    # The event time of the last scan for lost nodes (they are looked for once a second).
    lost_scan_at: datetime | None = field(default=None, compare=False, repr=False)
    # Restored from storage and no event seen since: the first one starts the grace below.
    restored: bool = field(default=False, compare=False, repr=False)
    # Until then no reservation expires: reports delivered to the process before the restart
    # and never acknowledged are on their way again.
    expiries_held_until: datetime | None = field(default=None, compare=False, repr=False)
    quotas: Quotas = field(default_factory=Quotas)
    # What each tenant holds in each pool: its dominant share orders a priority class (DRF).
    pool_usage: dict[QueueKey, Usage] = field(default_factory=dict)
    # Per pool, the blocked head of the queue and the nodes it waits on: backfill avoids them.
    backfill: dict[str, Backfill] = field(default_factory=dict)
    # (deadline, seq, task id) of waiting tasks with a queue-time SLA, earliest first.
    deadlines: list[tuple[datetime, int, str]] = field(default_factory=list)
    # Lower bounds on the next reservation expiry and the oldest heartbeat of a Ready node, so
    # that most events skip the scans over every allocation and node. None: unknown, scan.
    expiry_floor: datetime | None = field(default=None, compare=False, repr=False)
    heartbeat_floor: float | None = field(default=None, compare=False, repr=False)
    # Pools whose waiting tasks may decide otherwise than at their last retry (None: every
    # pool): a retry skips the others, whose tasks would fail again, unseen and unchanged.
    stale_pools: set[str] | None = field(default=None, compare=False, repr=False)
    # Allocations (a gang's head) that may be preempted and are not yielding, by priority:
    # a waiting task looks for victims only when one ranks below it.
    preemptible: Counter[int] = field(default_factory=Counter, compare=False, repr=False)
    # Pools where a retry ranked nodes: a score may keep state across calls (a seeded
    # policy draws), so such a pool is retried again as a naive retry would.
    ranked_pools: set[str] = field(default_factory=set, compare=False, repr=False)
    # Each pool's totals (the DRF denominator), for the cluster's topology version.
    capacity: dict[str, Usage] = field(default_factory=dict, compare=False, repr=False)
    capacity_version: int = field(default=-1, compare=False, repr=False)
    # Each (pool, tenant)'s dominant share, with the holdings it was computed from.
    shares: dict[QueueKey, tuple[Usage, float]] = field(
        default_factory=dict, compare=False, repr=False
    )
    # Whether every pipeline filters on readiness and pool before any free amount, so that a
    # pool's waiting tasks are judged on that pool's nodes alone (see `RetryIndex.pools_to_retry`).
    pools_independent: bool = field(default=False, compare=False, repr=False)
    # Cancels of tasks not yet profiled (the gateway accepted them; the predictor still has
    # them), by task id: True once the task arrived and ended cancelled (its own cancel
    # report, echoed back, must not start another wait).
    early_cancels: dict[str, bool] = field(default_factory=dict)
    # Tasks with a member held to heartbeats (`Allocation.heartbeat_grace`): the only ones
    # the silence scan reads.
    heartbeating: set[str] = field(default_factory=set, compare=False, repr=False)
    # What each pool has lent to each other pool of its cohort now: (lender, borrower).
    lent: dict[QueueKey, Usage] = field(default_factory=dict)
    # Each allocation held (a gang's every member) by id: the task it belongs to.
    held_by: dict[str, str] = field(default_factory=dict, compare=False, repr=False)
    # Lending by phase: the tasks in a CPU phase, by task id, and each lent card that a
    # replica holds now, (node, card) -> the replica's task id.
    phases: dict[str, LendingPhase] = field(default_factory=dict)
    lent_cards: dict[tuple[str, int], str] = field(default_factory=dict)
    # Waiting tasks taken off the queue so far (placed, cancelled): with the queue's length
    # and `next_seq`, it says whether the queue only grew since (`Guarantees.claiming`).
    dequeued: int = field(default=0, compare=False, repr=False)
    # No preemption thrashing: each task told to yield lately, by id, until when it is not
    # chosen again (its pool's cooldown after the time it had to be gone by); and the same
    # as (until, task id), earliest first, so that they are forgotten in time.
    victims: dict[str, datetime] = field(default_factory=dict)
    victims_due: list[tuple[datetime, str]] = field(default_factory=list)
    # Ageing: (time, seq, task id) of a waiting task's next step up the queue, earliest first.
    ageing: list[tuple[datetime, int, str]] = field(default_factory=list)
    # (time, seq, task id): victims held back for a waiting task may go from then, or its
    # hold off scarce capacity ends: its pool is retried at that time.
    wakeups: list[tuple[datetime, int, str]] = field(default_factory=list)
    # (time, seq, task id): a waiting task's wait for its first GPU model ends then.
    preferences: list[tuple[datetime, int, str]] = field(default_factory=list)
    # Grows whenever what is held, or when it must be gone by, changes (a grant, a release,
    # a yield ordered): what is derived from the holdings is cached against it.
    holdings_version: int = field(default=0, compare=False, repr=False)
    # Backfill by time limits: each blocked head's nodes, and when they are due free (None:
    # a task holding them has no limit), for the holdings version it was computed at.
    due_free: dict[tuple[str, tuple[str, ...]], tuple[int, datetime | None]] = field(
        default_factory=dict, compare=False, repr=False
    )
    # Time limits: (when, allocation id, task id) of each running task's limit (its grant's
    # time plus its max_run_seconds), earliest first: no per-event scan of the allocations.
    limits: list[tuple[datetime, str, str]] = field(default_factory=list)
    # Tasks reclaiming their tenant's guarantee, by task id, each with the holder whose
    # guarantee it claims (its tenant, or a queue above it; None for a task preempting a
    # cohort mate's tasks to borrow): the room their victims leave is that holder's first
    # (`claimed_ahead`). Not stored: a restart forgets the claims.
    claimants: dict[str, str | None] = field(default_factory=dict, compare=False, repr=False)
    # Preemptions held back, by rule (min_run, victim_cooldown, unproven), and ageing steps
    # taken, since the service last read them (its metrics).
    tally: Counter[str] = field(default_factory=Counter, compare=False, repr=False)
    # Reconciling against reality (reconcile.py), none of it stored (a restart starts every
    # grace again): each node's latest inventory (what its agent runs); since when each
    # confirmed allocation has been missing from its node's inventory; the allocations each
    # node runs that the core does not hold there; the over-capacity last reported per node;
    # when the next pass is due.
    inventories: dict[str, Inventory] = field(default_factory=dict, compare=False, repr=False)
    missing_since: dict[str, datetime] = field(default_factory=dict, compare=False, repr=False)
    unknown: dict[str, dict[UnknownKey, UnknownRun]] = field(
        default_factory=dict, compare=False, repr=False
    )
    over_reported: dict[str, str] = field(default_factory=dict, compare=False, repr=False)
    reconcile_at: datetime | None = field(default=None, compare=False, repr=False)

    def dequeue(self, task_id: str) -> None:
        """`task_id` leaves the queue (placed, or cancelled while waiting)."""
        del self.pending[task_id]
        self.claimants.pop(task_id, None)
        self.dequeued += 1


def consumed_until(stream_clock: datetime | None, now: datetime, allowance: float) -> datetime:
    """How far one stream's events have been consumed, to judge an absence on (no heartbeat,
    no `running`): the latest `occurred_at` consumed from it, or, when it lags the core's clock
    by more than `allowance` seconds (its consumer behind, NATS back after an outage, or
    nothing to say), the clock less the allowance."""
    floor = now - timedelta(seconds=allowance)
    return floor if stream_clock is None else max(stream_clock, floor)


def hold(node: Node, allocation: Allocation) -> None:
    node.take(
        allocation.gpu_ids,
        allocation.gpu_milli,
        allocation.cpu_cores,
        allocation.memory_mb,
        allocation.group,
        allocation.carved,
        allocation.disk_hold,
    )


def arm_limit(state: SchedulerState, head: Allocation) -> None:
    """`head` (a task's first member) is told to stop when it has held its grant for its time
    limit: its limit joins the heap `TimeLimits.enforce` reads."""
    if head.run_limit is not None and head.granted_at is not None and head.yield_by is None:
        when = head.granted_at + timedelta(seconds=head.run_limit)
        heapq.heappush(state.limits, (when, head.allocation_id, head.task_id))


def yielding_on(state: SchedulerState, nodes: tuple[str, ...]) -> bool:
    """Whether some allocation on `nodes` is yielding now."""
    return any(
        a.yield_by is not None and a.node in nodes
        for head in state.allocations.values()
        for a in head.members()
    )


def claimed_ahead(state: SchedulerState, task: PendingTask) -> list[PendingTask]:
    """The tasks of other tenants that claimed their tenant's guarantee back before `task`
    did (or at all, when it claims nothing) and still wait on the nodes their victims yield
    on: those nodes are theirs first. Else a later claimant (a lower share, a higher
    priority) or a newcomer could take the room a victim left for an earlier owner, who would
    then need new victims and wait a second grace period for its guarantee. Not one its own
    tenant's quota holds back now (its tenant took a card meanwhile through another task):
    it could not take the room. The owner is the tenant: its own tasks are not kept off."""
    ahead: list[PendingTask] = []
    mine = state.quotas.chain(task.request.tenant)
    for task_id, owner in state.claimants.items():
        other = state.pending.get(task_id)
        if (
            other is not None
            # a claim abroad (preempting to borrow) is the task's, not its tenant's
            and (other.request.tenant != task.request.tenant or claimed_abroad(state, other))
            and owner not in mine  # a queue's claim: its tenants may take the room
            and claimed_before(other, task)
            and yielding_for(state, other)
            and not state.quotas.blocking(
                other.request.tenant, other.demand, other.gang_size, other.request.user
            )
        ):
            ahead.append(other)
    return ahead


def claimed_abroad(state: SchedulerState, task: PendingTask) -> tuple[str, ...]:
    """The nodes of other pools where `task` had victims yield to borrow their room
    (`Preemptor.preempt_to_borrow`): its nominated nodes outside its own pool."""
    own = task.request.pool
    return tuple(n for n in task.nominated if state.cluster.pool_of(n) not in (own, None))


def yielding_for(state: SchedulerState, owner: PendingTask) -> bool:
    """Whether some victim told to yield for `owner`'s reclaim still holds its room. Once
    none does, the owner is tried first in the next pass, and its claim ends there."""
    return any(allocation_id in state.held_by for allocation_id in owner.yielders)


def claimed_before(task: PendingTask, other: PendingTask) -> bool:
    """Whether `task` waits for victims it claimed capacity back from (`reclaim_by`,
    `yielders`) on its nominated nodes, and claimed before `other` did (or `other` claims
    nothing)."""
    if task.reclaim_by is None or not task.nominated or not task.yielders:
        return False
    return other.reclaim_by is None or (task.reclaim_by, task.seq) < (other.reclaim_by, other.seq)


def claimed_nodes(
    state: SchedulerState, task: PendingTask, ahead: list[PendingTask] | None = None
) -> tuple[str, ...]:
    """The nodes `task` must leave to owners that claimed before it (`claimed_ahead`), by
    name, sorted: a node where placing it would leave fewer whole free cards than those
    owners still need there beyond what their victims free; every node of a gang's, a shared
    card's or a MIG slice's claim (their room is not counted in whole cards). `ahead`:
    `claimed_ahead(state, task)` when the caller has it."""
    if ahead is None:
        ahead = claimed_ahead(state, task)
    if not ahead:
        return ()
    kept: set[str] = set()
    need: Counter[str] = Counter()
    for owner in ahead:
        demand = owner.demand
        if owner.gang_size > 1 or demand.gpu_milli < WHOLE or demand.mig_profile is not None:
            kept.update(owner.nominated)
            continue
        for node in owner.nominated:
            coming = sum(
                cards
                for allocation_id, (where, cards) in owner.yielders.items()
                if where == node and allocation_id in state.held_by
            )
            need[node] += demand.gpus - coming
    takes = task.filter_demand.gpus  # a share of a card counts one: it may take a free one
    for node, short in need.items():
        row = state.cluster.index.get(node)
        if short > 0 and row is not None and state.cluster.gpus_free[row] - takes < short:
            kept.add(node)
    return tuple(sorted(kept))
