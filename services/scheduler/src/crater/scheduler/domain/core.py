"""`Scheduler.handle(event) -> decisions`: the one scheduling core.

The service, tests and any replay feed it the same events in the same order and get the same
decisions back, bit for bit: every emitted event takes its id from the event that caused it
and its time from that event's `occurred_at`.
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal

import numpy as np
import numpy.typing as npt

from crater.contracts import (
    PRIORITY_MAX,
    RESERVATION_TIMEOUT_MS_DEFAULT,
    AllocationGranted,
    AllocationReleased,
    Disk,
    Event,
    FieldError,
    FilterReason,
    MemberPlacement,
    NodeCondition,
    NodeFit,
    NodeHealthReported,
    NodeMisfit,
    NodeTopology,
    NodeTopologyReported,
    PlacementAnswer,
    ReleaseReason,
    ReplicaReleaseRequested,
    ResourcePrediction,
    RestartOn,
    RestartPolicy,
    ScoreDetail,
    TaskEnded,
    TaskEscalated,
    TaskPending,
    TaskPlacementAnswer,
    TaskPreempted,
    TaskProfiled,
    TaskRejected,
    TaskRequest,
    TaskStatus,
    TaskStatusReported,
    derived_event_id,
    priority_value,
)
from crater.contracts.dataloader import dataloader_for_node
from crater.scheduler.domain.cluster import (
    NO_OVERCOMMIT,
    WHOLE,
    BoolArray,
    ClusterArrays,
    Node,
    Overcommit,
)
from crater.scheduler.domain.demand import PREDICTION_MARGIN, Demand
from crater.scheduler.domain.inputs import ReservationArmed
from crater.scheduler.domain.placement import Selection, select
from crater.scheduler.domain.plugins import DEFAULT_PIPELINE, Pipeline, judged_field
from crater.scheduler.domain.pools import NEVER_RESTART, PoolPolicy
from crater.scheduler.domain.preemption import Candidate, plan, plan_gang
from crater.scheduler.domain.queue import (
    Backfill,
    QueueKey,
    closest_to_fitting,
    dominant_share,
    escalated_priority,
    gang_demand,
    members_per_node,
    pool_capacity,
)
from crater.scheduler.domain.quotas import QUOTA_FIELDS, Quota, Quotas, Usage
from crater.scheduler.domain.tokens import sign_token, token_refusal

# (node row, total score, per-plugin scores)
Ranked = tuple[int, float, list[ScoreDetail]]
# (nodes that pass every filter, why the others do not)
Diagnosis = tuple[BoolArray, list[FilterReason]]
# One member's node, devices, score and per-plugin scores.
Pick = tuple[Node, Selection, float, list[ScoreDetail]]

# The most nodes a blocked head examines for the ones to keep (backfill), closest first.
HEAD_CANDIDATES = 64

# A time after every expiry: the floor when nothing can expire.
NEVER = datetime.max.replace(tzinfo=UTC)

# How long a node may stay silent past its heartbeat timeout before what it holds is given
# back (`node-lost`); and the least event time between two scans for such nodes.
NODE_LOST_SECONDS = 60.0
NODE_LOST_SCAN_SECONDS = 1.0

# After a restart, what was delivered to the old process and not acknowledged comes again
# only once JetStream's ack wait (30 s) has passed: a `running` among it must still count.
REDELIVERY_SECONDS = 35.0

# Which attempt endings a restart policy can retry, by how the attempt's resources went back.
RESTART_ON = {
    ReleaseReason.FAILED: RestartOn.FAILURE,
    ReleaseReason.EXPIRED: RestartOn.FAILURE,
    ReleaseReason.PREEMPTED: RestartOn.PREEMPTION,
    ReleaseReason.NODE_LOST: RestartOn.NODE_LOST,
}
# What a task's end says when its last attempt ended so.
END_STATUS = {
    ReleaseReason.SUCCEEDED: TaskStatus.SUCCEEDED,
    ReleaseReason.FAILED: TaskStatus.FAILED,
    ReleaseReason.CANCELLED: TaskStatus.CANCELLED,
    ReleaseReason.PREEMPTED: TaskStatus.FAILED,
    ReleaseReason.EXPIRED: TaskStatus.FAILED,
    ReleaseReason.NODE_LOST: TaskStatus.FAILED,
    ReleaseReason.SCALED_IN: TaskStatus.CANCELLED,
}
END_REASON = {
    ReleaseReason.EXPIRED: "its node never confirmed the reservation",
    ReleaseReason.NODE_LOST: "its node stopped answering",
    ReleaseReason.SCALED_IN: "the autoscaler removed this replica",
}
# Filters whose verdict is only where the task may go now, not what it needs: a change among
# them alone is not a new kind of reason to wait (backfill comes and goes with the queue).
TRANSIENT_FILTERS = frozenset({"Backfill"})


@dataclass(frozen=True)
class SchedulerConfig:
    pipeline: Pipeline = DEFAULT_PIPELINE
    # how long a placement waits for its node's `running`, unless the task or its pool says
    reservation_timeout_ms: int = RESERVATION_TIMEOUT_MS_DEFAULT
    heartbeat_timeout_seconds: float = 30.0
    token_secret: bytes = b"crater-development-only"
    checkpoint_root: str = "/var/lib/crater/checkpoints"
    quotas: dict[str, Quota] = field(default_factory=dict)
    grace_period_seconds: int = 30
    prediction_margin: float = PREDICTION_MARGIN
    # per pool: its pipeline and over-commit; a pool not named uses `pipeline`, no over-commit
    pools: dict[str, PoolPolicy] = field(default_factory=dict)
    # a waiting task is announced (task.pending) when it starts waiting, then only when the
    # kind of its reason has changed and held this long, and no oftener than this
    pending_interval_seconds: float = 60.0
    # a node silent this long past its heartbeat timeout is lost: its allocations go back
    node_lost_seconds: float = NODE_LOST_SECONDS
    # silence is judged on the heartbeats consumed: when they lag the other events by more
    # than this (their consumer behind, NATS back after an outage), this far behind the clock
    heartbeat_lag_seconds: float = 60.0
    # an unconfirmed reservation expires once the node reports (task.status) consumed reach
    # past its expiry; with none that recent, this much later (a quiet status stream)
    confirmation_lag_seconds: float = 30.0
    # the gateway's public URL, handed to tasks (CRATER_GATEWAY_URL); None: not handed
    gateway_url: str | None = None
    # A task whose launcher confirmed it with its token is failed when its `running` reports
    # (heartbeats) stop for this long, unless the launcher set its own grace.
    task_heartbeat_grace_seconds: float = 60.0
    # Refuse every running/succeeded/failed report that does not carry its allocation's token
    # (the simulated fleet and node agents then must send it); off: only the allocations a
    # launcher confirmed with the token need it.
    require_report_tokens: bool = False

    def restart_for(self, request: TaskRequest) -> RestartPolicy:
        """The task's own restart policy, else its pool's, else never."""
        if request.restart_policy is not None:
            return request.restart_policy
        policy = self.pools.get(request.pool)
        return NEVER_RESTART if policy is None else policy.restart

    def reservation_for(self, request: TaskRequest | None) -> timedelta:
        """The task's own reservation timeout, else its pool's, else the default."""
        ms = self.reservation_timeout_ms
        if request is not None:
            policy = self.pools.get(request.pool)
            if request.reservation_timeout_ms is not None:
                ms = request.reservation_timeout_ms
            elif policy is not None and policy.reservation_timeout_ms is not None:
                ms = policy.reservation_timeout_ms
        return timedelta(milliseconds=ms)

    def pipeline_for(self, pool: str) -> Pipeline:
        policy = self.pools.get(pool)
        return self.pipeline if policy is None else policy.pipeline

    def overcommit_for(self, pool: str) -> Overcommit:
        policy = self.pools.get(pool)
        return NO_OVERCOMMIT if policy is None else policy.overcommit


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

    @property
    def announced_kind(self) -> frozenset[str] | None:
        """The kind of reason AllData heard last; None before the first `task.pending`."""
        return self.told_kinds[-1] if self.told_kinds else None

    @property
    def priority(self) -> int:
        """On the 0..1000 scale, larger first; an escalated task ranks one class higher."""
        base = priority_value(self.request.priority)
        return escalated_priority(base) if self.escalated else base

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
    priority: int = 500  # 0..1000, larger first
    preemptible: bool = False
    granted_seq: int = 0
    yield_by: datetime | None = None  # preempted: released at this time at the latest
    group: str | None = None  # anti-affinity group
    pool: str = "default"
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

    def members(self) -> list[Allocation]:
        return [self, *self.peers]


@dataclass
class Scheduler:
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
    # pool's waiting tasks are judged on that pool's nodes alone (see `_pools_to_retry`).
    pools_independent: bool = field(default=False, compare=False, repr=False)
    # Cancels of tasks not yet profiled (the gateway accepted them; the predictor still has
    # them), by task id: True once the task arrived and ended cancelled (its own cancel
    # report, echoed back, must not start another wait).
    early_cancels: dict[str, bool] = field(default_factory=dict)
    # Tasks with a member held to heartbeats (`Allocation.heartbeat_grace`): the only ones
    # the silence scan reads.
    heartbeating: set[str] = field(default_factory=set, compare=False, repr=False)
    # Each allocation held (a gang's every member) by id: the task it belongs to.
    held_by: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self.quotas.limits = dict(self.config.quotas)
        pipelines = [self.config.pipeline, *(p.pipeline for p in self.config.pools.values())]
        self.pools_independent = all(map(_pool_filtered_first, pipelines))

    # -- entry point -------------------------------------------------------------------------

    def restore(
        self,
        nodes: list[tuple[NodeTopology, NodeCondition, float | None]],
        allocations: list[Allocation],
        pending: list[PendingTask],
        next_seq: int,
        early_cancels: list[str] | None = None,
    ) -> None:
        """Load persisted state (service start): nodes, their live allocations (a gang's
        members each one, in any order), the queue with its escalations and nominations, and
        the cancels waiting for their task to be profiled."""
        self.early_cancels = dict.fromkeys(early_cancels or (), False)
        for topology, condition, heartbeat in nodes:
            node = Node.empty(topology, self.config.overcommit_for(topology.pool))
            node.condition = condition
            node.last_heartbeat_at = heartbeat
            self.cluster.upsert(node)
        members = sorted(allocations, key=lambda a: (a.task_id, a.gang_index))
        for allocation in members:
            head = self.allocations.get(allocation.task_id)
            if head is None:
                self.allocations[allocation.task_id] = allocation
            else:
                head.peers.append(allocation)
            self._take(allocation)
            held = self.cluster.get(allocation.node)
            if held is not None:
                _hold(held, allocation)
                self.cluster.refresh(held.name)
        for head in self.allocations.values():
            # A preempted gang yields as a whole: every member carries the head's deadline.
            for peer in head.peers:
                peer.yield_by = peer.yield_by or head.yield_by
        self.pending = {}
        for task in pending:
            self._enqueue(task)
        self.next_seq = next_seq
        # The workload fragmentation is measured against, rebuilt from what is still here:
        # the live allocations as granted, then the queue (what had left is forgotten).
        for live in sorted(self.allocations.values(), key=lambda a: a.granted_seq):
            if live.mig_profile is None:
                self.cluster.workload.observe_shape(
                    len(live.gpu_ids), live.gpu_milli, None, len(live.cpu_cores), live.memory_mb
                )
        for task in sorted(pending, key=lambda t: t.seq):
            self.cluster.workload.observe(task.demand)
        # Each pool's blocked head keeps its nodes from the start, as before the restart.
        self.backfill = {}
        for task in self._queue():
            blocked = self.quotas.blocking(task.request.tenant, task.demand, task.gang_size)
            if task.request.pool not in self.backfill and not blocked:
                self._make_head(task)
        self.expiry_floor = self.heartbeat_floor = None
        self.restored = True
        self.stale_pools = None
        self.preemptible = Counter(
            a.priority for a in self.allocations.values() if a.preemptible and a.yield_by is None
        )
        self.heartbeating = {
            a.task_id
            for a in self.allocations.values()
            if any(m.heartbeat_grace is not None for m in a.members())
        }

    def handle(self, event: Event) -> list[Event]:
        if isinstance(event, TaskStatusReported) and self.report_refusal(event) is not None:
            return []  # refused (the service says why, MessageRejected): it changes nothing
        self.clock = max(self.clock or event.occurred_at, event.occurred_at)
        now = self.clock
        if self.restored:
            self._resume(now)
        if isinstance(event, TaskStatusReported):
            # Before expiring anything: this report may be the confirmation that was due, and
            # a later one that is in says the reports of an expiry's time are in too.
            self.reports_clock = max(self.reports_clock or event.occurred_at, event.occurred_at)
            if event.status is TaskStatus.RUNNING:
                self._confirm(event)
        if isinstance(event, NodeHealthReported) and self.cluster.get(event.node_id) is not None:
            self.health_clock = max(self.health_clock or event.occurred_at, event.occurred_at)
        decisions: list[Event] = self._expire_reservations(now, event)
        decisions += self._fail_silent_tasks(now, event)
        decisions += self._escalate(now, event)
        changed = self._expire_heartbeats(self._heard_until(now)) or bool(decisions)
        changed = self._end_backoffs(now) or changed
        changed = self._announcements_due(now) or changed
        if isinstance(event, ReservationArmed):
            self._on_armed(event)
        elif isinstance(event, TaskProfiled):
            decisions += self._on_profiled(event)
        elif isinstance(event, TaskStatusReported):
            left = len(self.pending)
            decisions += self._on_status(event)
            changed = (
                changed
                or len(self.pending) < left  # a waiting task was cancelled: the queue moved
                or any(isinstance(d, AllocationReleased) for d in decisions)
            )
        elif isinstance(event, NodeTopologyReported):
            self._on_topology(event)
            changed = True
        elif isinstance(event, NodeHealthReported):
            changed = self._on_health(event) or changed
        elif isinstance(event, ReplicaReleaseRequested):
            decisions += self._on_release_requested(event)
            changed = changed or bool(decisions)
        # After the event: a node's own heartbeat shows it is not lost.
        lost = self._release_lost_nodes(now, event)
        decisions += lost
        changed = changed or bool(lost)
        if changed:
            decisions += self._retry_pending(event)
        return decisions

    # -- tasks -------------------------------------------------------------------------------

    def _on_profiled(self, event: TaskProfiled) -> list[Event]:
        request = event.task
        cancel = self.early_cancels.get(request.task_id)
        if request.task_id in self.pending or request.task_id in self.allocations or cancel:
            return []  # already known (or ended cancelled on arrival): a redelivery
        seq = self.next_seq
        self.next_seq += 1
        if cancel is False:
            return [self._cancelled_on_arrival(event)]
        demand = Demand.of(request, event.prediction, self.config.prediction_margin)
        task = PendingTask(request, event.prediction, demand, seq, submitted_at=event.occurred_at)
        members = task.gang_size
        errors = self._refusals(task)
        if errors:
            return [self._reject(event, request.task_id, errors)]
        self.cluster.workload.observe(demand)
        avoid = self._reserved_for(task)
        granted = self._try_place(task, event, avoid)
        if granted:
            return list(granted)
        self._enqueue(task)
        over = self.quotas.blocking(request.tenant, demand, members)
        found = None if over else self.diagnose(task.filter_demand)
        reasons, summary = self._why_waiting(task, avoid, over, found)
        decisions: list[Event] = self._announce(task, event, reasons, summary)
        head = self.backfill.get(request.pool)
        if not over and (
            head is None or head.task_id not in self.pending or self._order(task) < head.order
        ):
            self._make_head(task)
        return decisions + self._preempt_for(task, event)

    def _refusals(self, task: PendingTask) -> list[FieldError]:
        """Why `task` can never be placed (its tenant's quota, or no node of its pool could
        ever hold it); [] when it could."""
        request, members = task.request, task.gang_size
        return [
            FieldError(
                field=QUOTA_FIELDS[resource],
                reason=f"tenant {request.tenant!r} quota is {limit}; the task alone: {wanted:g}"
                + (f" ({members} gang members)" if members > 1 else ""),
            )
            for resource, wanted, limit in self.quotas.never(request.tenant, task.demand, members)
        ] or self._never_fits(task)

    def _cancelled_on_arrival(self, event: TaskProfiled) -> TaskEnded:
        """A task cancelled while it was being profiled ends cancelled as it arrives: never
        queued, never placed."""
        task_id = event.task.task_id
        self.early_cancels[task_id] = True
        return self._ended(
            task_id,
            TaskStatus.CANCELLED,
            "cancelled before the scheduler received it: never placed",
            event,
        )

    def _enqueue(self, task: PendingTask) -> None:
        self.pending[task.request.task_id] = task
        self._stale(task.request.pool)
        limit = task.request.sla.max_queue_time_seconds
        if limit is not None and task.submitted_at is not None and not task.escalated:
            deadline = task.submitted_at + timedelta(seconds=limit)
            heapq.heappush(self.deadlines, (deadline, task.seq, task.request.task_id))
        if task.not_before is not None:
            heapq.heappush(self.backoffs, (task.not_before, task.seq, task.request.task_id))

    def _announcements_due(self, now: datetime) -> bool:
        """Pools with a waiting task whose new kind of reason may now be announced are
        retried: True if any."""
        due = False
        while self.announcements and self.announcements[0][0] <= now:
            _, _, task_id = heapq.heappop(self.announcements)
            task = self.pending.get(task_id)
            if task is not None and task.kind_since is not None:
                self._stale(task.request.pool)
                due = True
        return due

    def _end_backoffs(self, now: datetime) -> bool:
        """Retried attempts whose backoff is over may be placed again: True if any."""
        woke = False
        while self.backoffs and self.backoffs[0][0] <= now:
            _, _, task_id = heapq.heappop(self.backoffs)
            task = self.pending.get(task_id)
            if task is not None and task.not_before is not None and task.not_before <= now:
                task.not_before = None
                self._stale(task.request.pool)
                woke = True
        return woke

    def _never_fits(self, task: PendingTask) -> list[FieldError]:
        """Why no node of the task's pool could hold it even empty; [] when one could (or
        when there are no nodes yet: they may still come). A gang: every member at once."""
        demand = task.demand
        if not len(self.cluster):
            return []
        in_pool = self.cluster.pool == demand.pool
        if not in_pool.any():
            pools = ", ".join(sorted(set(self.cluster.pool.tolist())))
            return [FieldError(field="pool", reason=f"no node in pool {demand.pool!r} ({pools})")]
        fits, reasons = self.diagnose(demand, free=False, among=in_pool)
        if not fits.any():
            return [
                FieldError(
                    field=judged_field(r.filter),
                    reason=f"no node in pool {demand.pool!r} can ever fit: {r.nodes} {r.message}",
                )
                for r in reasons
            ]
        members = task.gang_size
        if members == 1:
            return []
        if task.same_node:
            together, reasons = self.diagnose(task.filter_demand, free=False, among=in_pool)
            if together.any():
                return []
            detail = ", ".join(f"{r.nodes} {r.message}" for r in reasons)
            return [
                FieldError(
                    field="gang_size",
                    reason=f"no node in pool {demand.pool!r} can ever hold all {members} members "
                    f"together (affinity.gpu same-node): {detail}",
                )
            ]
        room = int(members_per_node(self.cluster, demand, np.flatnonzero(fits)).sum())
        if room >= members:
            return []
        return [
            FieldError(
                field="gang_size",
                reason=f"the nodes of pool {demand.pool!r} could hold at most {room} of the "
                f"{members} members even empty",
            )
        ]

    def _on_status(self, event: TaskStatusReported) -> list[Event]:
        allocation = self.allocations.get(event.task_id)
        if allocation is None:
            waiting = self.pending.get(event.task_id)
            if event.status is TaskStatus.CANCELLED and event.allocation_id is None:
                if waiting is not None:  # cancelled before placed (or between attempts)
                    del self.pending[event.task_id]
                    self._stale(waiting.request.pool)
                    reason = event.message or "cancelled while waiting"
                    return [
                        self._ended(
                            event.task_id, TaskStatus.CANCELLED, reason, event, waiting.attempt
                        )
                    ]
                # Not here yet (still being profiled): it ends cancelled when it comes. (A
                # report naming an allocation is about a task that was here and has ended.)
                self.early_cancels.setdefault(event.task_id, False)
            # Anything else is news of an attempt that is over: the task waits or has ended.
            return []
        members = allocation.members()
        ids = {m.allocation_id for m in members}
        if event.allocation_id not in (None, *ids):
            return []  # news of an earlier allocation of the same task: not this one
        if event.status is TaskStatus.RUNNING:
            return []  # confirmed already (`_confirm`)
        # Any member's end (or a cancel) ends the attempt: every member goes back.
        if allocation.yield_by is not None and event.status is not TaskStatus.SUCCEEDED:
            return self._attempt_over(allocation, ReleaseReason.PREEMPTED, event)
        return self._attempt_over(allocation, ReleaseReason(event.status.value), event)

    def _confirm(self, event: TaskStatusReported) -> None:
        """A node reports the task running: its reservation (the member named, or every
        member) is confirmed and no longer expires. A launcher's report (with the token) is
        also a heartbeat: from the first, the member is failed if they stop."""
        allocation = self.allocations.get(event.task_id)
        if allocation is None:
            return
        for member in allocation.members():
            if event.allocation_id in (None, member.allocation_id):
                member.running = True
                if event.reservation_token is not None:
                    member.heartbeat_grace = (
                        event.heartbeat_grace_seconds
                        or member.heartbeat_grace
                        or self.config.task_heartbeat_grace_seconds
                    )
                    member.heard_at = max(member.heard_at or event.occurred_at, event.occurred_at)
                    self.heartbeating.add(event.task_id)

    def report_refusal(self, event: TaskStatusReported) -> FieldError | None:
        """Why a task report cannot be taken (None: it can). A report carrying a token about
        an allocation held now must carry that allocation's own token, and a `running` that
        would confirm it must come before its reservation's real deadline; once a launcher
        confirmed an allocation with the token, reports about it without the token are
        refused (with `require_report_tokens`, every running/succeeded/failed one). Cancels
        without a token (the gateway's, an operator's) are taken. Reports about what is not
        held (an ended task, an earlier attempt) are taken and change nothing, as before."""
        head = self.allocations.get(event.task_id)
        members = head.members() if head is not None else []
        token = event.reservation_token
        if token is None:
            if event.status is TaskStatus.CANCELLED:
                return None
            for member in members:
                if member.heartbeat_grace is not None and event.allocation_id in (
                    None,
                    member.allocation_id,
                ):
                    return FieldError(
                        field="reservation_token",
                        reason=f"missing: allocation {member.allocation_id!r} was confirmed by "
                        "its launcher with its reservation token; every report about it must "
                        "carry that token",
                    )
            if self.config.require_report_tokens and members:
                return FieldError(
                    field="reservation_token",
                    reason="missing: this scheduler takes a task's running, succeeded or failed "
                    "only with its allocation's reservation token "
                    "(CRATER_SCHEDULER_REQUIRE_REPORT_TOKENS)",
                )
            return None
        named = next((m for m in members if m.allocation_id == event.allocation_id), None)
        if named is None:
            return None
        member = named
        why = token_refusal(
            self.config.token_secret, token, member.allocation_id, member.task_id, member.node
        )
        if why is not None:
            return FieldError(field="reservation_token", reason=why)
        if (
            event.status is TaskStatus.RUNNING
            and not member.running
            and member.armed
            and event.occurred_at > member.expires_at
        ):
            return FieldError(field="reservation_token", reason=_expired(member))
        return None

    def allocation_check(
        self, allocation_id: str, token: str, at: datetime
    ) -> tuple[Allocation, FieldError | None] | None:
        """An allocation held now and why a launcher's `running` with `token`, sent at `at`,
        would be refused (None: taken); None when it is not held. The judgement of
        `report_refusal`, asked before the report is sent (the gateway's synchronous answer)."""
        head = self.allocations.get(self.held_by.get(allocation_id, ""))
        for member in head.members() if head is not None else ():
            if member.allocation_id == allocation_id:
                report = TaskStatusReported(
                    task_id=member.task_id,
                    status=TaskStatus.RUNNING,
                    allocation_id=allocation_id,
                    reservation_token=token,
                    occurred_at=at,
                )
                return member, self.report_refusal(report)
        return None

    def _on_release_requested(self, event: ReplicaReleaseRequested) -> list[Event]:
        """A scaled-in replica, drained: its resources go back."""
        allocation = self.allocations.get(event.task_id) if event.task_id else None
        if allocation is None:
            return []
        return self._attempt_over(allocation, ReleaseReason.SCALED_IN, event)

    def _on_armed(self, event: ReservationArmed) -> None:
        """The grant has left the outbox: its reservation runs from when the stream took it."""
        head = self.allocations.get(event.task_id)
        if head is None:
            return  # ended already
        for member in head.members():
            if member.allocation_id == event.allocation_id and not member.armed:
                member.armed = True
                request = member.task.request if member.task is not None else None
                member.expires_at = event.occurred_at + self.config.reservation_for(request)
                if self.expiry_floor is not None:
                    self.expiry_floor = min(self.expiry_floor, member.expires_at)

    def _attempt_over(
        self,
        allocation: Allocation,
        reason: ReleaseReason,
        cause: Event,
        why: str | None = None,
    ) -> list[Event]:
        """An attempt's resources go back (every member of a gang); then the task is retried,
        as its restart policy says, or ends: exactly one `task.ended` per task."""
        released: list[Event] = list(self._release(allocation, reason, cause))
        task = allocation.task
        attempt = allocation.attempt
        if task is not None:
            policy = self.config.restart_for(task.request)
            on = RESTART_ON.get(reason)
            if on is not None and on in policy.when and attempt < policy.max_attempts:
                return [*released, self._retry(task, attempt + 1, reason, policy, cause)]
        if why is not None:
            pass
        elif reason is ReleaseReason.PREEMPTED and allocation.yield_by is not None:
            why = "it yielded its resources to a higher-priority task"
        elif reason in (ReleaseReason.SUCCEEDED, ReleaseReason.FAILED, ReleaseReason.CANCELLED):
            why = _as_reported(reason, cause)
        else:
            why = END_REASON.get(reason, f"its attempt ended: {reason.value}")
        if attempt > 1:
            why += f" (attempt {attempt})"
        return [
            *released,
            self._ended(
                allocation.task_id,
                END_STATUS[reason],
                why,
                cause,
                attempt,
                allocation_id=allocation.allocation_id,
                release_reason=reason,
            ),
        ]

    def _retry(
        self,
        task: PendingTask,
        attempt: int,
        reason: ReleaseReason,
        policy: RestartPolicy,
        cause: Event,
    ) -> TaskPending:
        """Queue the task again for its next attempt, after the policy's backoff."""
        now = self.clock or cause.occurred_at
        backoff = policy.backoff_before(attempt)
        retried = PendingTask(
            task.request,
            task.prediction,
            task.demand,
            task.seq,  # keeps its place in the queue
            submitted_at=now,  # a queue-time SLA counts from the new wait
            attempt=attempt,
            not_before=now + timedelta(seconds=backoff) if backoff > 0 else None,
        )
        self._enqueue(retried)
        summary = (
            f"attempt {attempt} of {policy.max_attempts} after the last ended {reason.value}"
            + (f"; starts after a backoff of {backoff:g} s" if backoff > 0 else "")
        )
        reasons = [FilterReason(filter="RestartBackoff", code="Retrying", nodes=0, message=summary)]
        task_id = task.request.task_id
        retried.live_reasons = reasons
        retried.last_summary = summary
        retried.told_kinds = (_kind(reasons),)
        retried.announced_at = now
        return TaskPending(
            event_id=derived_event_id(cause.event_id, f"retry:{task_id}:{attempt}"),
            occurred_at=cause.occurred_at,
            task_id=task_id,
            nodes_total=len(self.cluster),
            reasons=reasons,
            summary=summary,
            attempt=attempt,
        )

    def _ended(
        self,
        task_id: str,
        status: TaskStatus,
        reason: str,
        cause: Event,
        attempt: int = 1,
        allocation_id: str | None = None,
        release_reason: ReleaseReason | None = None,
    ) -> TaskEnded:
        """The task's end: the one event AllData hears it from."""
        return TaskEnded(
            event_id=derived_event_id(cause.event_id, f"ended:{task_id}"),
            occurred_at=cause.occurred_at,
            task_id=task_id,
            status=status,
            reason=reason[:2048],
            allocation_id=allocation_id,
            release_reason=None if release_reason is None else release_reason.value,
            attempt=attempt,
        )

    def _escalate(self, now: datetime, cause: Event) -> list[Event]:
        """Tasks waiting past their queue-time SLA rank one class higher, once."""
        escalated: list[Event] = []
        while self.deadlines and self.deadlines[0][0] < now:
            _, _, task_id = heapq.heappop(self.deadlines)
            task = self.pending.get(task_id)
            if task is None or task.escalated or task.submitted_at is None:
                continue  # placed, cancelled, or escalated already
            before = task.priority
            task.escalated = True
            self._stale(task.request.pool)
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

    def _order(self, task: PendingTask) -> tuple[int, float, int]:
        """Queue order: priority (larger first), the tenant's dominant share of the pool
        (smaller first), submission order."""
        key = (task.request.pool, task.request.tenant)
        return -task.priority, self._share(key), task.seq

    def _share(self, key: QueueKey) -> float:
        """The tenant's dominant share of the pool."""
        used = self.pool_usage.get(key)
        if not used:
            return 0.0
        if self.capacity_version != self.cluster.topology_version:
            self.capacity, self.shares = {}, {}  # nodes came, went or changed: afresh
            self.capacity_version = self.cluster.topology_version
        known = self.shares.get(key)
        if known is not None and known[0] is used:  # holdings replaced on every change
            return known[1]
        pool = key[0]
        capacity = self.capacity.get(pool)
        if capacity is None:
            capacity = self.capacity[pool] = pool_capacity(self.cluster, pool)
        share = dominant_share(used, capacity)
        self.shares[key] = (used, share)
        return share

    def _queue(self, pools: set[str] | None = None) -> Iterator[PendingTask]:
        """The waiting tasks (of `pools`; None: all) in queue order; shares are read afresh
        at every step, so a tenant granted a task falls behind the others of its priority at
        once (DRF). A pool's tasks come in the same order with or without the other pools:
        a share is one pool's."""
        bands: dict[int, dict[QueueKey, deque[PendingTask]]] = {}
        for task in sorted(self.pending.values(), key=lambda t: t.seq):
            key = (task.request.pool, task.request.tenant)
            if pools is None or key[0] in pools:
                bands.setdefault(task.priority, {}).setdefault(key, deque()).append(task)
        for priority in sorted(bands, reverse=True):
            queues = bands[priority]
            while queues:
                key = min(queues, key=lambda k: (self._share(k), queues[k][0].seq))
                task = queues[key].popleft()
                if not queues[key]:
                    del queues[key]
                yield task

    def _retry_pending(self, cause: Event) -> list[Event]:
        """Try the waiting tasks again, in queue order. Only those of stale pools: in any
        other, nothing a task's decision reads has changed since its last try.

        Within the pass, a task whose demand and reserved nodes equal those of one that found
        no candidate node since the last grant finds none either: it takes that diagnosis
        instead of running the filters again (nothing was ranked for it before either)."""
        decisions: list[Event] = []
        pools = self._pools_to_retry()
        self.stale_pools, self.ranked_pools = set(), set()
        if pools is None:
            self.backfill = {}
        else:
            for pool in pools:
                self.backfill.pop(pool, None)
        no_candidates: dict[tuple[Demand, Backfill | None], Diagnosis] = {}
        # ... and, for such a task, why it waits: a function of the same, and of its gang
        said: dict[tuple[Demand, Backfill | None, int, bool], tuple[list[FilterReason], str]] = {}
        masks: dict[Backfill, BoolArray] = {}
        for task in self._queue(pools):
            if task.request.task_id not in self.pending or task.not_before is not None:
                continue  # placed or cancelled in this pass, or waiting out a backoff
            head = self._reserving_head(task)
            avoid = None if head is None else masks.get(head)
            if head is not None and avoid is None:
                avoid = masks[head] = head.mask(self.cluster)
            over = self.quotas.blocking(task.request.tenant, task.demand, task.gang_size)
            found: Diagnosis | None = None
            why: tuple[list[FilterReason], str] | None = None
            if not over:
                memo = (task.filter_demand, head)
                found = no_candidates.get(memo)
                if found is not None:
                    why = said.get((*memo, task.gang_size, task.same_node))
                    if why is None:
                        why = said[(*memo, task.gang_size, task.same_node)] = self._why_waiting(
                            task, avoid, over, found
                        )
                else:
                    found = self.diagnose(task.filter_demand)
                    if (found[0] if avoid is None else found[0] & ~avoid).any():
                        granted = self._place(task, cause, found[0], avoid)
                        if granted:
                            del self.pending[task.request.task_id]
                            decisions += granted
                            no_candidates.clear()  # less is free now
                            said.clear()
                            continue
                    else:
                        no_candidates[memo] = found
            reasons, summary = why or self._why_waiting(task, avoid, over, found)
            decisions += self._announce(task, cause, reasons, summary)
            pool = task.request.pool
            if pool not in self.backfill and not over:
                self._make_head(task)
            decisions += self._preempt_for(task, cause)
        # A pool where nodes were ranked would rank (and draw) again: retry it.
        if self.stale_pools is not None:
            self.stale_pools |= self.ranked_pools
        return decisions

    def _pools_to_retry(self) -> set[str] | None:
        """The stale pools, with every pool where a tenant with a quota waits that also waits
        in one of them (a grant to it in one pool changes what it may take in the others);
        None: every pool."""
        if self.stale_pools is None or not self.pools_independent:
            return None
        pools = set(self.stale_pools)
        limited = [t for t in self.pending.values() if t.request.tenant in self.quotas.limits]
        grown = True
        while grown:
            tenants = {t.request.tenant for t in limited if t.request.pool in pools}
            linked = {t.request.pool for t in limited if t.request.tenant in tenants}
            grown = not linked <= pools
            pools |= linked
        return pools

    def _stale(self, pool: str) -> None:
        """Something a waiting task of `pool` reads has changed: retry the pool."""
        if self.stale_pools is not None:
            self.stale_pools.add(pool)

    def _tenant_changed(self, tenant: str) -> None:
        """A tenant's holdings changed: with a quota, its tasks in every pool may now wait
        (or fit) otherwise."""
        if tenant in self.quotas.limits and self.stale_pools is not None:
            self.stale_pools.update(
                t.request.pool for t in self.pending.values() if t.request.tenant == tenant
            )

    def _reserving_head(self, task: PendingTask) -> Backfill | None:
        """The blocked head of `task`'s pool whose nodes `task` must leave alone: when the
        head comes first in the queue."""
        head = self.backfill.get(task.request.pool)
        if head is None or head.task_id == task.request.task_id or head.task_id not in self.pending:
            return None
        if self._order(task) < head.order:
            return None
        return head

    def _reserved_for(self, task: PendingTask) -> BoolArray | None:
        """The nodes `task` must leave alone: those kept for its pool's blocked head, when
        the head comes first in the queue."""
        head = self._reserving_head(task)
        return None if head is None else head.mask(self.cluster)

    def _make_head(self, task: PendingTask) -> None:
        """`task` heads its pool's queue and cannot start: keep the node(s) it waits on."""
        if task.nominated:
            nodes: tuple[str, ...] = task.nominated
        else:
            could, _ = self.diagnose(task.filter_demand, free=False)
            rows = np.flatnonzero(could & self.cluster.ready)
            wanted = 1 if task.same_node or task.gang_size == 1 else task.gang_size
            names: list[str] = []
            # Only nodes whose devices could hold it once emptied (NUMA, NVLink), looking at
            # a bounded number: a head that fits nowhere keeps nothing.
            for i in closest_to_fitting(self.cluster, rows, HEAD_CANDIDATES):
                node = self.cluster.nodes[i]
                if _could_hold(node, task.demand, task.gang_size if task.same_node else 1):
                    names.append(node.name)
                    if len(names) == wanted:
                        break
            nodes = tuple(names)
        self.backfill[task.request.pool] = Backfill(task.request.task_id, self._order(task), nodes)

    def _preempt_for(self, task: PendingTask, cause: Event) -> list[Event]:
        """Ask lower-priority preemptible tasks to yield so `task` fits; they get a grace
        period to checkpoint, then their resources go back (see `_expire_reservations`).
        A gang preempts all or nothing: only victims that make room for every member."""
        mine = task.priority
        if (
            task.nominated
            or not any(p < mine for p in self.preemptible)  # nobody ranks below it
            or self.quotas.blocking(task.request.tenant, task.demand, task.gang_size)
        ):
            return []
        owners: dict[str, Allocation] = {}
        candidates: list[Candidate] = []
        for head in self.allocations.values():
            if not head.preemptible or head.priority >= mine or head.yield_by is not None:
                continue
            for a in head.members():
                owners[a.allocation_id] = head
                candidates.append(
                    Candidate(
                        a.allocation_id,
                        a.node,
                        a.gpu_ids,
                        a.gpu_milli,
                        a.cpu_cores,
                        a.memory_mb,
                        PRIORITY_MAX - a.priority,
                        a.granted_seq,
                        a.mig_profile,
                        a.task_id,
                    )
                )
        if not candidates:
            return []
        # Nodes the task could use if they were emptier: every filter but free amounts.
        fits_empty, _ = self.diagnose(task.filter_demand, free=False)
        ready = fits_empty & self.cluster.ready
        nodes = [self.cluster.nodes[i] for i in np.flatnonzero(ready)]
        if task.gang_size > 1 and not task.same_node:
            fits_now, _ = self.diagnose(task.demand)
            roomy = {self.cluster.nodes[i].name for i in np.flatnonzero(fits_now & ready)}
            chosen = plan_gang(nodes, task.demand, candidates, task.gang_size, roomy)
        else:
            chosen = plan(nodes, task.demand, candidates, task.gang_size)
        if chosen is None:
            return []
        task.nominated = chosen.nodes
        self._stale(task.request.pool)
        now = self.clock or cause.occurred_at
        grace = self.config.grace_period_seconds
        must_stop_by = now + timedelta(seconds=grace)
        decisions: list[Event] = []
        victims = {owners[v.allocation_id].task_id: owners[v.allocation_id] for v in chosen.victims}
        for victim in victims.values():
            self._count_preemptible(victim, -1)
            self._stale(victim.pool)
            for member in victim.members():  # a gang yields whole
                member.yield_by = must_stop_by
                if self.expiry_floor is not None:
                    self.expiry_floor = min(self.expiry_floor, must_stop_by)
                decisions.append(
                    TaskPreempted(
                        event_id=derived_event_id(
                            cause.event_id, f"preempted:{_member_key(member)}"
                        ),
                        occurred_at=cause.occurred_at,
                        task_id=member.task_id,
                        allocation_id=member.allocation_id,
                        node=member.node,
                        preempted_by=task.request.task_id,
                        grace_period_seconds=grace,
                        must_stop_by=must_stop_by,
                    )
                )
        return decisions

    def _expire_reservations(self, now: datetime, cause: Event) -> list[Event]:
        """Allocations whose task never confirmed it runs, past their reservation, and
        preempted ones past their grace period, go back (a gang: all its members)."""
        if self.expiry_floor is not None and self.expiry_floor >= now:
            return []  # nothing can have expired yet
        expired: list[Allocation] = []
        yielded: list[Allocation] = []
        for a in self.allocations.values():
            if a.yield_by is not None:
                # Told to stop: it yields (its node stops it, maybe before it confirmed), it
                # does not expire.
                if a.yield_by < now:
                    yielded.append(a)
            elif any(self._unconfirmed(m, now) for m in a.members()):
                expired.append(a)
        released: list[Event] = []
        for a in sorted(expired, key=lambda a: a.task_id):
            released += self._attempt_over(a, ReleaseReason.EXPIRED, cause)
        for a in sorted(yielded, key=lambda a: a.task_id):
            released += self._attempt_over(a, ReleaseReason.PREEMPTED, cause)
        self.expiry_floor = min(
            (t for a in self.allocations.values() for t in _expiries(a)), default=NEVER
        )
        return released

    def _unconfirmed(self, member: Allocation, now: datetime) -> bool:
        """Whether `member`'s node has truly not confirmed it in time: its reservation, counted
        from when the grant left the outbox, is over, and the task reports of that time have
        been consumed (or, none being that recent, a further lag allowance is over too)."""
        if member.running or not member.armed or member.expires_at >= now:
            return False
        if self.expiries_held_until is not None and now < self.expiries_held_until:
            return False
        reported = _consumed_until(self.reports_clock, now, self.config.confirmation_lag_seconds)
        return member.expires_at < reported

    def _fail_silent_tasks(self, now: datetime, cause: Event) -> list[Event]:
        """Tasks held to heartbeats whose launcher has been silent past its grace fail (their
        restart policy may retry them). Silence is measured, like a node's, to how far the
        task reports have been consumed (a lagging stream or a restart never makes a live task
        look silent), and not while reports a restarted scheduler never acknowledged may
        still be on their way."""
        if not self.heartbeating:
            return []
        if self.expiries_held_until is not None and now < self.expiries_held_until:
            return []
        heard = _consumed_until(self.reports_clock, now, self.config.confirmation_lag_seconds)
        silent: list[tuple[Allocation, Allocation]] = []
        for task_id in sorted(self.heartbeating):
            head = self.allocations.get(task_id)
            if head is None:
                self.heartbeating.discard(task_id)
                continue
            held = [m for m in head.members() if m.heartbeat_grace is not None]
            if not held:  # a later attempt no launcher has confirmed yet
                self.heartbeating.discard(task_id)
            for member in held:
                grace = member.heartbeat_grace or 0.0
                if member.heard_at is None or member.yield_by is not None:
                    continue
                if member.heard_at + timedelta(seconds=grace) < heard:
                    silent.append((head, member))
                    break
        failed: list[Event] = []
        for head, member in silent:
            self.heartbeating.discard(head.task_id)
            why = (
                f"no heartbeat for {member.heartbeat_grace:g} s: allocation "
                f"{member.allocation_id!r} on {member.node} was last reported running at "
                f"{member.heard_at:%Y-%m-%dT%H:%M:%SZ} by its launcher, which stopped reporting"
            )
            failed += self._attempt_over(head, ReleaseReason.FAILED, cause, why=why)
        return failed

    # -- nodes -------------------------------------------------------------------------------

    def _release_lost_nodes(self, now: datetime, cause: Event) -> list[Event]:
        """Allocations on nodes silent past their heartbeat timeout and the lost-node grace go
        back (`node-lost`); their tasks are retried or end failed. Looked for once a second of
        event time at most."""
        if self.lost_scan_at is not None and (now - self.lost_scan_at).total_seconds() < (
            NODE_LOST_SCAN_SECONDS
        ):
            return []
        self.lost_scan_at = now
        if not self.allocations:
            return []
        silence = self.config.heartbeat_timeout_seconds + self.config.node_lost_seconds
        deadline = self._heard_until(now).timestamp() - silence
        lost = {
            node.name
            for node in self.cluster.nodes
            if node.last_heartbeat_at is not None
            and node.last_heartbeat_at < deadline
            and node.condition is NodeCondition.NOT_READY
        }
        if not lost:
            return []
        heads = sorted(
            (a for a in self.allocations.values() if any(m.node in lost for m in a.members())),
            key=lambda a: a.task_id,
        )
        released: list[Event] = []
        for head in heads:
            released += self._attempt_over(head, ReleaseReason.NODE_LOST, cause)
        return released

    def _on_topology(self, event: NodeTopologyReported) -> None:
        existing = self.cluster.get(event.node.node_id)
        node = Node.empty(event.node, self.config.overcommit_for(event.node.pool))
        if existing is not None:
            node.condition = existing.condition
            node.last_heartbeat_at = existing.last_heartbeat_at
        node.last_heartbeat_at = node.last_heartbeat_at or event.occurred_at.timestamp()
        self.cluster.upsert(node)
        self.stale_pools = None  # a node more or changed: every summary counts it
        self._heard_from(node)
        for allocation in self.allocations.values():
            for member in allocation.members():
                if member.node == node.name:
                    _hold(node, member)
        self.cluster.refresh(node.name)

    def _on_health(self, event: NodeHealthReported) -> bool:
        node = self.cluster.get(event.node_id)
        if node is None:
            return False  # health before topology: wait for the topology
        node.last_heartbeat_at = event.occurred_at.timestamp()
        was = node.condition
        node.condition = event.condition
        self.cluster.refresh(node.name)
        self._heard_from(node)
        if was is event.condition:
            return False
        self.stale_pools = None  # readiness is judged first, for every pool's tasks
        return True

    def _resume(self, now: datetime) -> None:
        """The first event after a restore. Heartbeats are not stored one by one (most change
        nothing), so the stored times are old: every node counts as heard now, and is judged
        silent from here. And no reservation expires before the reports the old process took
        but never acknowledged have come again."""
        self.restored = False
        for node in self.cluster.nodes:
            node.last_heartbeat_at = max(node.last_heartbeat_at or 0.0, now.timestamp())
        self.heartbeat_floor = None
        if self.allocations:  # with none restored, every report is about a grant made since
            self.expiries_held_until = now + timedelta(seconds=REDELIVERY_SECONDS)
        for head in self.allocations.values():  # task heartbeats too: silent from here
            for member in head.members():
                if member.heartbeat_grace is not None:
                    member.heard_at = max(member.heard_at or now, now)

    def _heard_until(self, now: datetime) -> datetime:
        """The time up to which nodes' heartbeats have been consumed: silence is measured to
        it, so a lagging stream never makes a live node look silent, and a quiet one still
        lets a dead fleet be found."""
        return _consumed_until(self.health_clock, now, self.config.heartbeat_lag_seconds)

    def _expire_heartbeats(self, now: datetime) -> bool:
        deadline = now.timestamp() - self.config.heartbeat_timeout_seconds
        if self.heartbeat_floor is not None and self.heartbeat_floor >= deadline:
            return False  # no Ready node has been silent that long
        changed = False
        floor = float("inf")
        for node in self.cluster.nodes:
            silent = node.last_heartbeat_at is not None and node.last_heartbeat_at < deadline
            if silent and node.condition is not NodeCondition.NOT_READY:
                node.condition = NodeCondition.NOT_READY
                self.cluster.refresh(node.name)
                self.stale_pools = None
                changed = True
            elif (
                node.last_heartbeat_at is not None and node.condition is not NodeCondition.NOT_READY
            ):
                floor = min(floor, node.last_heartbeat_at)
        self.heartbeat_floor = floor
        return changed

    def _heard_from(self, node: Node) -> None:
        """A node's heartbeat (or condition) changed: it may now be the oldest Ready one."""
        if self.heartbeat_floor is not None and node.last_heartbeat_at is not None:
            self.heartbeat_floor = min(self.heartbeat_floor, node.last_heartbeat_at)

    # -- placement ---------------------------------------------------------------------------

    def diagnose(
        self, demand: Demand, free: bool = True, among: BoolArray | None = None
    ) -> tuple[BoolArray, list[FilterReason]]:
        """Run the filters; each node is charged to the first filter that excludes it."""
        alive = np.ones(len(self.cluster), np.bool_) if among is None else among.copy()
        reasons: list[FilterReason] = []
        for f in self.config.pipeline_for(demand.pool).filters:
            passes = f.passes(self.cluster, demand, free)
            excluded = int(np.count_nonzero(alive & ~passes))
            if excluded:
                reasons.append(
                    FilterReason(
                        filter=f.name, code=f.code, nodes=excluded, message=f.explain(demand)
                    )
                )
            alive &= passes
        return alive, reasons

    def rank(self, demand: Demand, candidates: BoolArray) -> Iterator[Ranked]:
        """Candidates best first: weighted score, ties to the smallest node name. Lazy: the
        per-plugin details are built only for the nodes a caller looks at (usually one)."""
        idx = np.flatnonzero(candidates)
        if not len(idx):
            return
        self.ranked_pools.add(demand.pool)
        total = np.zeros(len(idx))
        parts: list[tuple[str, npt.NDArray[np.float64]]] = []
        for score in self.config.pipeline_for(demand.pool).scores:
            values = np.clip(score.rate(self.cluster, demand, idx), 0.0, 1.0)
            parts.append((score.name, values))
            total += score.weight * values
        total = np.round(total, 9)  # equal scores must compare equal on every machine
        for k in np.lexsort((self.cluster.name_rank[idx], -total)):
            details = [ScoreDetail(plugin=name, score=round(float(v[k]), 4)) for name, v in parts]
            yield int(idx[k]), float(total[k]), details

    def dry_run(self, demand: Demand) -> PlacementAnswer:
        """Every node that fits, best first with its score and devices, and every node that
        does not, with the first filter it fails. Changes nothing."""
        alive = np.ones(len(self.cluster), np.bool_)
        misfits: list[NodeMisfit] = []
        for f in self.config.pipeline_for(demand.pool).filters:
            passes = f.passes(self.cluster, demand, True)
            for row in np.flatnonzero(alive & ~passes):
                misfits.append(
                    NodeMisfit(
                        node_id=self.cluster.nodes[row].name,
                        filter=f.name,
                        code=f.code,
                        reason=f.explain(demand),
                    )
                )
            alive &= passes
        fits: list[NodeFit] = []
        for i, score, details in self.rank(demand, alive):
            node = self.cluster.nodes[i]
            selection = select(node, demand)
            if selection is None:
                misfits.append(
                    NodeMisfit(
                        node_id=node.name,
                        filter="Placement",
                        code="NoLocalPlacement",
                        reason="the GPUs and cores cannot be had together (NUMA)",
                    )
                )
                continue
            fits.append(
                NodeFit(
                    node_id=node.name,
                    score=round(score, 4),
                    scores=details,
                    gpu_ids=list(selection.gpu_ids),
                    cpu_cores=list(selection.cpu_cores),
                    numa_node=selection.numa_node,
                    mig_profile=selection.mig_profile,
                )
            )
        counts: dict[str, int] = {}
        for m in misfits:
            counts[m.reason] = counts.get(m.reason, 0) + 1
        detail = ", ".join(f"{n} {reason}" for reason, n in counts.items())
        summary = f"{len(fits)}/{len(self.cluster)} nodes fit" + (f"; {detail}" if detail else "")
        misfits.sort(key=lambda m: m.node_id)
        return PlacementAnswer(fits=fits, misfits=misfits, summary=summary)

    def _try_place(
        self, task: PendingTask, cause: Event, avoid: BoolArray | None = None
    ) -> list[AllocationGranted]:
        """Place the task (every member of a gang, or none), off the `avoid` nodes."""
        if self.quotas.blocking(task.request.tenant, task.demand, task.gang_size):
            return []
        fits, _ = self.diagnose(task.filter_demand)
        return self._place(task, cause, fits, avoid)

    def _place(
        self, task: PendingTask, cause: Event, fits: BoolArray, avoid: BoolArray | None
    ) -> list[AllocationGranted]:
        """`_try_place` once the filters have passed `fits` (for `task.filter_demand`)."""
        picks = self._choose(task, fits, avoid)
        return [] if picks is None else self._grant_gang(task, picks, cause)

    def _choose(
        self, task: PendingTask, fits: BoolArray, avoid: BoolArray | None
    ) -> list[Pick] | None:
        """Where every member would go (one pick per member), off the `avoid` nodes; None
        when not all of them fit now. Changes nothing: a dry run asks this too."""
        candidates = fits if avoid is None else fits & ~avoid
        if task.gang_size == 1:
            for i, score, details in self.rank(task.demand, candidates):
                node = self.cluster.nodes[i]
                selection = select(node, task.demand)
                if selection is not None:
                    return [(node, selection, score, details)]
            return None
        if task.same_node:
            for i, score, details in self.rank(task.filter_demand, candidates):
                node = self.cluster.nodes[i]
                picks = self._trial(task, [(node, score, details)] * task.gang_size)
                if picks is not None:
                    return picks
            return None
        return self._trial(task, None, avoid)

    def dry_run_task(
        self, request: TaskRequest, prediction: ResourcePrediction | None
    ) -> TaskPlacementAnswer:
        """What submitting `request` with `prediction` would do now, decided as
        `_on_profiled` decides it (refusals, quota, the pool's reserved head, every gang
        member), without queueing, reserving or announcing anything."""
        demand = Demand.of(request, prediction, self.config.prediction_margin)
        task = PendingTask(request, prediction, demand, self.next_seq)
        nodes = self.dry_run(task.filter_demand)
        errors = self._refusals(task)
        picks: list[Pick] | None = None
        reasons: list[FilterReason] = []
        summary = nodes.summary
        if not errors:
            over = self.quotas.blocking(request.tenant, demand, task.gang_size)
            avoid = self._reserved_for(task)
            found = None if over else self.diagnose(task.filter_demand)
            if found is not None:
                picks = self._choose(task, found[0], avoid)
            if picks is None:
                reasons, summary = self._why_waiting(task, avoid, over, found)
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
                )
                for member, (node, selection, score, _) in enumerate(picks or [])
            ],
            reasons=reasons,
            errors=errors,
            gpu_memory_per_gpu_mb=demand.gpu_memory_mb,
            gpu_memory_source=demand.gpu_memory_source,
        )

    def _trial(
        self,
        task: PendingTask,
        nodes: list[tuple[Node, float, list[ScoreDetail]]] | None,
        avoid: BoolArray | None = None,
    ) -> list[Pick] | None:
        """Choose every member's devices in turn, each on the state the previous ones leave,
        then put the state back: all of the members, or None. `nodes`: one per member (a
        same-node gang); None: each member on the best node left for it."""
        picks: list[Pick] = []
        held: list[tuple[Node, Selection]] = []
        milli = task.demand.gpu_milli or WHOLE
        try:
            for member in range(task.gang_size):
                found: tuple[Node, Selection, float, list[ScoreDetail]] | None = None
                if nodes is not None:
                    node, score, details = nodes[member]
                    selection = select(node, task.demand)
                    found = None if selection is None else (node, selection, score, details)
                else:
                    candidates, _ = self.diagnose(task.demand)
                    if avoid is not None:
                        candidates &= ~avoid
                    for i, score, details in self.rank(task.demand, candidates):
                        selection = select(self.cluster.nodes[i], task.demand)
                        if selection is not None:
                            found = (self.cluster.nodes[i], selection, score, details)
                            break
                if found is None:
                    return None
                node, selection = found[0], found[1]
                node.take(
                    selection.gpu_ids,
                    milli,
                    selection.cpu_cores,
                    task.demand.memory_mb,
                    None,
                    selection.mig_profile,
                )
                self.cluster.refresh(node.name)
                held.append((node, selection))
                picks.append(found)
            return picks
        finally:
            for node, selection in reversed(held):
                node.give_back(
                    selection.gpu_ids,
                    milli,
                    selection.cpu_cores,
                    task.demand.memory_mb,
                    None,
                    selection.mig_profile,
                )
                self.cluster.refresh(node.name)

    def _grant_gang(
        self,
        task: PendingTask,
        picks: list[Pick],
        cause: Event,
    ) -> list[AllocationGranted]:
        return [
            self._grant(task, node, selection, score, details, cause, member)
            for member, (node, selection, score, details) in enumerate(picks)
        ]

    def _grant(
        self,
        task: PendingTask,
        node: Node,
        selection: Selection,
        score: float,
        details: list[ScoreDetail],
        cause: Event,
        member: int = 0,
    ) -> AllocationGranted:
        request = task.request
        size = task.gang_size
        suffix = (f":{member}" if member else "") + _attempt_key(task.attempt)
        event_id = derived_event_id(cause.event_id, f"granted:{request.task_id}{suffix}")
        allocation_id = f"alloc-{event_id.hex[:16]}"
        now = self.clock or cause.occurred_at
        expires = now + self.config.reservation_for(request)
        allocation = Allocation(
            allocation_id,
            request.task_id,
            node.name,
            selection.gpu_ids,
            selection.cpu_cores,
            task.demand.memory_mb,
            expires,
            tenant=request.tenant,
            usage=Usage.of(task.demand),
            priority=task.priority,
            preemptible=request.preemptible,
            granted_seq=task.seq,
            group=request.anti_affinity.group,
            gpu_milli=task.demand.gpu_milli or WHOLE,
            pool=request.pool,
            gang_index=member,
            mig_profile=selection.mig_profile,
            armed=False,  # until the grant is read back from the stream
            attempt=task.attempt,
            task=task,
        )
        self._take(allocation)
        _hold(node, allocation)
        self.cluster.refresh(node.name)
        if member:
            self.allocations[request.task_id].peers.append(allocation)
        else:
            self.allocations[request.task_id] = allocation
            self._count_preemptible(allocation, +1)
        checkpoint = self._checkpoint_path(node, request.task_id)
        best = max(details, key=lambda d: d.score).plugin if details else "only fit"
        gang = f"gang member {member + 1}/{size}; " if size > 1 else ""
        token = sign_token(
            self.config.token_secret, allocation_id, request.task_id, node.name, expires
        )
        environment = self._environment(task, node, selection, allocation, checkpoint, token)
        return AllocationGranted(
            event_id=event_id,
            occurred_at=cause.occurred_at,
            allocation_id=allocation_id,
            task_id=request.task_id,
            node=node.name,
            pool=request.pool,
            tenant=request.tenant,
            gpu_ids=list(selection.gpu_ids),
            gpu_memory_mb=task.demand.gpu_memory_mb,
            gpu_milli=allocation.gpu_milli,
            mig_profile=selection.mig_profile,
            cpu_cores=list(selection.cpu_cores),
            numa_node=selection.numa_node,
            memory_mb=task.demand.memory_mb,
            checkpoint_path=checkpoint,
            reservation_token=token,
            reservation_expires_at=expires,
            score=round(score, 4),
            scores=details,
            explanation=(
                f"{gang}{node.name}: score {score:.3f} (strongest: {best}); "
                f"GPU memory {task.demand.gpu_memory_mb} MiB per card "
                f"({task.demand.gpu_memory_source}); NUMA {selection.numa_node}"
            ),
            environment=environment,
            gang_index=member,
            gang_size=size,
            attempt=task.attempt,
        )

    def _take(self, allocation: Allocation) -> None:
        self.held_by[allocation.allocation_id] = allocation.task_id
        if self.expiry_floor is not None:
            self.expiry_floor = min(self.expiry_floor, allocation.expires_at)
        self.quotas.take(allocation.tenant, allocation.usage)
        key = (allocation.pool, allocation.tenant)
        self.pool_usage[key] = self.pool_usage.get(key, Usage()) + allocation.usage
        self._stale(allocation.pool)
        self._tenant_changed(allocation.tenant)

    def _count_preemptible(self, head: Allocation, change: int) -> None:
        """`head` (a task's first member) joins (+1) or leaves (-1) the possible victims."""
        if not head.preemptible or head.yield_by is not None:
            return
        self.preemptible[head.priority] += change
        if not self.preemptible[head.priority]:
            del self.preemptible[head.priority]

    def _release(
        self, allocation: Allocation, reason: ReleaseReason, cause: Event
    ) -> list[AllocationReleased]:
        """The task's resources go back: every member of a gang."""
        del self.allocations[allocation.task_id]
        self._count_preemptible(allocation, -1)
        return [self._release_member(m, reason, cause) for m in allocation.members()]

    def _release_member(
        self, allocation: Allocation, reason: ReleaseReason, cause: Event
    ) -> AllocationReleased:
        node = self.cluster.get(allocation.node)
        if node is not None:
            node.give_back(
                allocation.gpu_ids,
                allocation.gpu_milli,
                allocation.cpu_cores,
                allocation.memory_mb,
                allocation.group,
                allocation.mig_profile,
            )
            self.cluster.refresh(node.name)
        self.quotas.give_back(allocation.tenant, allocation.usage)
        self.held_by.pop(allocation.allocation_id, None)
        key = (allocation.pool, allocation.tenant)
        self.pool_usage[key] = self.pool_usage.get(key, Usage()) - allocation.usage
        self._stale(allocation.pool)
        self._tenant_changed(allocation.tenant)
        return AllocationReleased(
            event_id=derived_event_id(cause.event_id, f"released:{_member_key(allocation)}"),
            occurred_at=cause.occurred_at,
            allocation_id=allocation.allocation_id,
            task_id=allocation.task_id,
            node=allocation.node,
            gpu_ids=list(allocation.gpu_ids),
            cpu_cores=list(allocation.cpu_cores),
            reason=reason,
        )

    # -- events ------------------------------------------------------------------------------

    def _why_waiting(
        self,
        task: PendingTask,
        avoid: BoolArray | None,
        over: list[tuple[str, float, int]],
        found: Diagnosis | None,
    ) -> tuple[list[FilterReason], str]:
        """Why `task` waits, per filter, and the one-line summary. `over`: the quota limits
        it passes; `found`: the filters' verdict on `task.filter_demand` (None when `over`:
        the quota is the reason then)."""
        total = len(self.cluster)
        fits: BoolArray | None = None
        if over:
            reasons = [
                FilterReason(
                    filter="TenantQuota",
                    code="QuotaExceeded",
                    nodes=total,
                    message=(
                        f"tenant {task.request.tenant!r} quota: "
                        + ", ".join(
                            f"{resource} {wanted:g} > {limit}" for resource, wanted, limit in over
                        )
                    ),
                )
            ]
        else:
            fits, reasons = found or self.diagnose(task.filter_demand)
        if fits is not None and avoid is not None and (kept := int(np.count_nonzero(fits & avoid))):
            head = self.backfill[task.request.pool].task_id
            reasons = [
                *reasons,
                FilterReason(
                    filter="Backfill",
                    code="ReservedForWaitingTask",
                    nodes=kept,
                    message=f"kept for {head}, waiting ahead of it",
                ),
            ]
        members = task.gang_size
        if reasons:
            detail = ", ".join(f"{r.nodes} {r.message}" for r in reasons)
        elif total and members > 1:
            detail = f"fewer than the {members} gang members fit at once"
        elif total:
            detail = "no node has the GPUs and CPU cores together on one NUMA node"
        else:
            detail = "no nodes yet"
        if members > 1 and not task.same_node and fits is not None:
            room = int(np.count_nonzero(fits if avoid is None else fits & ~avoid))
            summary = f"{room}/{total} nodes can take a member, {members} needed at once: {detail}"
        else:
            summary = f"0/{total} nodes available: {detail}"
        return reasons, summary

    def _announce(
        self, task: PendingTask, cause: Event, reasons: list[FilterReason], summary: str
    ) -> list[Event]:
        """Keep why `task` waits (queryable at any time), and tell AllData (task.pending) when
        it starts waiting, or when the kind of reason (which filters hold it) has changed and
        the new kind has held for the pending interval, no oftener than that interval. Node
        counts moving inside one kind are not news: announcing them sent hundreds a second."""
        task.live_reasons = reasons
        task.last_summary = summary
        now = self.clock or cause.occurred_at
        kind = _kind(reasons)
        if task.told_kinds and task.announced_at is not None:
            if kind in task.told_kinds:  # as announced, or back to a kind told before
                task.seen_kind = task.kind_since = None
                return []
            interval = timedelta(seconds=self.config.pending_interval_seconds)
            if kind != task.seen_kind or task.kind_since is None:
                task.seen_kind, task.kind_since = kind, now
                due = max(task.kind_since, task.announced_at) + interval
                heapq.heappush(self.announcements, (due, task.seq, task.request.task_id))
            if now - task.kind_since < interval or now - task.announced_at < interval:
                return []
        task.told_kinds, task.announced_at = (*task.told_kinds, kind), now
        task.seen_kind = task.kind_since = None
        return [
            TaskPending(
                event_id=derived_event_id(
                    cause.event_id, f"pending:{task.request.task_id}{_attempt_key(task.attempt)}"
                ),
                occurred_at=cause.occurred_at,
                task_id=task.request.task_id,
                nodes_total=len(self.cluster),
                reasons=reasons,
                summary=summary,
                attempt=task.attempt,
            )
        ]

    @staticmethod
    def _reject(cause: Event, task_id: str, errors: list[FieldError]) -> TaskRejected:
        return TaskRejected(
            event_id=derived_event_id(cause.event_id, f"rejected:{task_id}"),
            occurred_at=cause.occurred_at,
            task_id=task_id,
            errors=errors,
        )

    def _checkpoint_path(self, node: Node, task_id: str) -> str:
        """On the node's local NVMe when it has one, else under the configured root."""
        ssd = _local_ssd(node.topology)
        if ssd is not None and ssd.nvme and ssd.mount_path:
            return f"{ssd.mount_path.rstrip('/')}/crater/checkpoints/{task_id}"
        return f"{self.config.checkpoint_root}/{task_id}"

    def _environment(
        self,
        task: PendingTask,
        node: Node,
        selection: Selection,
        allocation: Allocation,
        checkpoint: str,
        token: str,
    ) -> dict[str, str]:
        """What the task is handed (TASK_ENVIRONMENT names and explains each variable), the
        DataLoader figures fitted to this node: its local SSD, the cores and memory granted."""
        request = task.request
        ssd = _local_ssd(node.topology)
        predicted = task.prediction
        wanted = (
            None
            if predicted is None
            else (predicted.dataloader_num_workers, predicted.dataloader_prefetch_factor)
        )
        workers, prefetch = dataloader_for_node(
            wanted,
            len(selection.cpu_cores),
            len(selection.gpu_ids),
            allocation.memory_mb,
            ssd,
        )
        env = {
            "CRATER_TASK_ID": request.task_id,
            "CRATER_ALLOCATION_ID": allocation.allocation_id,
            "CRATER_ATTEMPT": str(allocation.attempt),
            "CRATER_RESERVATION_TOKEN": token,
            "CRATER_GPU_IDS": ",".join(map(str, selection.gpu_ids)),
            # a count: AllData's scripts read int(os.getenv("CRATER_CPU_CORES"))
            "CRATER_CPU_CORES": str(len(selection.cpu_cores)),
            "CRATER_CPU_CORE_IDS": ",".join(map(str, selection.cpu_cores)),
            "CRATER_NUMA_NODE": "" if selection.numa_node is None else str(selection.numa_node),
            "CRATER_MEMORY_MB": str(allocation.memory_mb),
            "CRATER_CHECKPOINT_PATH": checkpoint,
            "CRATER_PRECISION": request.model_spec.precision.value,
            "CRATER_DATALOADER_NUM_WORKERS": str(workers),
            "CRATER_DATALOADER_PREFETCH_FACTOR": str(prefetch),
        }
        if ssd is not None and ssd.mount_path:
            env["CRATER_SSD_PATH"] = ssd.mount_path
        if selection.mig_profile is not None:
            env["CRATER_MIG_PROFILE"] = selection.mig_profile
        if task.gang_size > 1:
            # rank 0 is granted first: its allocation is the task's own by now
            leader = self.allocations[request.task_id].node
            env["CRATER_GANG_RANK"] = str(allocation.gang_index)
            env["CRATER_GANG_SIZE"] = str(task.gang_size)
            env["CRATER_GANG_LEADER_NODE"] = leader
            leader_node = self.cluster.get(leader)
            if leader_node is not None:
                env["CRATER_MASTER_ADDR"] = leader_node.topology.hostname
        if self.config.gateway_url is not None:
            env["CRATER_GATEWAY_URL"] = self.config.gateway_url
        return env


def _local_ssd(topology: NodeTopology) -> Disk | None:
    """The node's mounted local SSD a task reads its data from and checkpoints to: the
    first NVMe drive, else the first other SSD; None: it has none."""
    mounted = [d for d in topology.disks if d.mount_path and not d.rotational]
    nvme = [d for d in mounted if d.nvme]
    first = nvme or mounted
    return first[0] if first else None


def _consumed_until(stream_clock: datetime | None, now: datetime, allowance: float) -> datetime:
    """How far one stream's events have been consumed, to judge an absence on (no heartbeat,
    no `running`): the latest `occurred_at` consumed from it, or, when it lags the core's clock
    by more than `allowance` seconds (its consumer behind, NATS back after an outage, or
    nothing to say), the clock less the allowance."""
    floor = now - timedelta(seconds=allowance)
    return floor if stream_clock is None else max(stream_clock, floor)


def _as_reported(reason: ReleaseReason, cause: Event) -> str:
    """An end as a report told it: by the launcher (with the token) or the node, with the
    exit code and the message it gave."""
    launcher = getattr(cause, "reservation_token", None) is not None
    why = f"{reason.value} as its {'launcher' if launcher else 'node'} reported"
    code = getattr(cause, "exit_code", None)
    if code is not None:
        why += f" (exit code {code})"
    reported = getattr(cause, "message", None)
    if reported:
        why += f": {reported}"
    return why


def _expired(member: Allocation) -> str:
    """Why a confirmation after the reservation's real deadline is refused."""
    return (
        f"expired: the reservation of allocation {member.allocation_id!r} ended unconfirmed "
        f"at {member.expires_at:%Y-%m-%dT%H:%M:%S.%fZ}; it is released, and the task is "
        "retried or ends (expired)"
    )


def _kind(reasons: list[FilterReason]) -> frozenset[str]:
    """The kind of a wait: which filters hold the task, whatever their node counts."""
    return frozenset(r.filter for r in reasons if r.filter not in TRANSIENT_FILTERS)


def _attempt_key(attempt: int) -> str:
    """An attempt's mark in derived event ids; the first attempt's ids are as they were."""
    return f":a{attempt}" if attempt > 1 else ""


def _expiries(allocation: Allocation) -> Iterator[datetime]:
    """When `allocation` (a gang: any member) could expire or must have yielded."""
    for member in allocation.members():
        if not member.running and member.armed:
            yield member.expires_at
    if allocation.yield_by is not None:
        yield allocation.yield_by


def _hold(node: Node, allocation: Allocation) -> None:
    node.take(
        allocation.gpu_ids,
        allocation.gpu_milli,
        allocation.cpu_cores,
        allocation.memory_mb,
        allocation.group,
        allocation.mig_profile,
    )


def _could_hold(node: Node, demand: Demand, members: int) -> bool:
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
        )
    return True


def _pool_filtered_first(pipeline: Pipeline) -> bool:
    """Whether `pipeline` excludes other pools' nodes before any filter that reads free
    amounts (only readiness may come first): its reasons for a task then change only with
    its own pool's nodes, readiness and the node count."""
    names = [f.name for f in pipeline.filters]
    return "Pool" in names and set(names[: names.index("Pool")]) <= {"NodeReady"}


def _member_key(allocation: Allocation) -> str:
    """A gang member's name in derived event ids; the first member keeps the task's own."""
    index = allocation.gang_index
    key = f"{allocation.task_id}:{index}" if index else allocation.task_id
    return key + _attempt_key(allocation.attempt)
