"""`Scheduler.handle(event) -> decisions`: the one scheduling core.

The service, tests and any replay feed it the same events in the same order and get the same
decisions back, bit for bit: every emitted event takes its id from the event that caused it
and its time from that event's `occurred_at`.

`Scheduler` is the cluster state (`state.SchedulerState`) and a thin dispatcher over it: each
event goes to the collaborators with one job each (admission, placer, preemptor, ledger,
wait list, retry index and pass, reservations, task lifecycle, nodes), which share that state.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    Event,
    FieldError,
    FilterReason,
    GpuCordonRequested,
    NodeCondition,
    NodeHealthReported,
    NodeTopology,
    NodeTopologyReported,
    PlacementAnswer,
    ReplicaReleaseRequested,
    ResourcePrediction,
    TaskPhaseReported,
    TaskPlacementAnswer,
    TaskProfiled,
    TaskRequest,
    TaskStatus,
    TaskStatusReported,
    TenantBudgetExceeded,
    TenantBudgetRestored,
)
from crater.scheduler.domain.admission import Admission
from crater.scheduler.domain.cluster import (
    BoolArray,
    Node,
)
from crater.scheduler.domain.config import NODE_LOST_SECONDS, SchedulerConfig
from crater.scheduler.domain.cordons import Cordons
from crater.scheduler.domain.cordons import restore as restore_cordons
from crater.scheduler.domain.cycle import Cycle
from crater.scheduler.domain.demand import Demand
from crater.scheduler.domain.guarantees import Guarantees
from crater.scheduler.domain.inputs import ReservationArmed
from crater.scheduler.domain.ledger import Ledger
from crater.scheduler.domain.lending import Lending
from crater.scheduler.domain.lifecycle import END_REASON, END_STATUS, RESTART_ON, Lifecycle
from crater.scheduler.domain.limits import TimeLimits
from crater.scheduler.domain.nodes import NODE_LOST_SCAN_SECONDS, NodeWatch
from crater.scheduler.domain.phases import Phases, restored_lent_milli
from crater.scheduler.domain.placer import Diagnosis, Pick, Placer, Ranked
from crater.scheduler.domain.preemptor import Preemptor, forget_victims
from crater.scheduler.domain.quotas import Over
from crater.scheduler.domain.reasons import TRANSIENT_FILTERS, Reasons
from crater.scheduler.domain.reconcile import Reconciler
from crater.scheduler.domain.reservations import NEVER, Reservations
from crater.scheduler.domain.retries import RetryIndex, pool_filtered_first
from crater.scheduler.domain.state import (
    Allocation,
    PendingTask,
    SchedulerState,
    arm_limit,
    hold,
)
from crater.scheduler.domain.waitlist import HEAD_CANDIDATES, Waitlist

__all__ = [
    "END_REASON",
    "END_STATUS",
    "HEAD_CANDIDATES",
    "NEVER",
    "NODE_LOST_SCAN_SECONDS",
    "NODE_LOST_SECONDS",
    "REDELIVERY_SECONDS",
    "RESTART_ON",
    "TRANSIENT_FILTERS",
    "Allocation",
    "Diagnosis",
    "PendingTask",
    "Pick",
    "Ranked",
    "Scheduler",
    "SchedulerConfig",
]

# After a restart, what was delivered to the old process and not acknowledged comes again
# only once JetStream's ack wait (30 s) has passed: a `running` among it must still count.
REDELIVERY_SECONDS = 35.0


@dataclass
class Scheduler(SchedulerState):
    """The cluster state, and `handle(event)` dispatching each event to the collaborators."""

    retries: RetryIndex = field(init=False, repr=False, compare=False)
    ledger: Ledger = field(init=False, repr=False, compare=False)
    placer: Placer = field(init=False, repr=False, compare=False)
    waitlist: Waitlist = field(init=False, repr=False, compare=False)
    reasons: Reasons = field(init=False, repr=False, compare=False)
    preemptor: Preemptor = field(init=False, repr=False, compare=False)
    lifecycle: Lifecycle = field(init=False, repr=False, compare=False)
    reservations: Reservations = field(init=False, repr=False, compare=False)
    nodes: NodeWatch = field(init=False, repr=False, compare=False)
    cordons: Cordons = field(init=False, repr=False, compare=False)
    reconciler: Reconciler = field(init=False, repr=False, compare=False)
    admission: Admission = field(init=False, repr=False, compare=False)
    cycle: Cycle = field(init=False, repr=False, compare=False)
    lending: Lending = field(init=False, repr=False, compare=False)
    phasing: Phases = field(init=False, repr=False, compare=False)
    guarantees: Guarantees = field(init=False, repr=False, compare=False)
    time_limits: TimeLimits = field(init=False, repr=False, compare=False)
    # A reloaded configuration was taken: the next event retries every waiting task.
    reconfigured: bool = field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.quotas.configure(
            self.config.quotas,
            self.config.tenant_shares,
            self.config.user_limits,
            self.config.queues,
            self.config.queue_of,
        )
        self.guarantees = Guarantees(self)
        self.quotas.borrow_check = self.guarantees
        pipelines = [self.config.pipeline, *(p.pipeline for p in self.config.pools.values())]
        self.pools_independent = all(map(pool_filtered_first, pipelines))
        self.retries = RetryIndex(self)
        self.ledger = Ledger(self, self.retries)
        # The collaborators run the filters through `self.diagnose`, looked up at each call.
        self.placer = Placer(self, self.ledger, owner=self)
        self.waitlist = Waitlist(self, self.retries, self.placer)
        self.reasons = Reasons(self, self.placer, self.guarantees)
        self.preemptor = Preemptor(self, self.retries, self.ledger, self.placer, self.guarantees)
        self.lifecycle = Lifecycle(self, self.retries, self.ledger, self.waitlist)
        self.reservations = Reservations(self, self.lifecycle)
        self.time_limits = TimeLimits(self, self.preemptor)
        self.nodes = NodeWatch(self, self.lifecycle)
        self.cordons = Cordons(self, self.lifecycle)
        self.reconciler = Reconciler(self, self.lifecycle)
        self.lending = Lending(self, self.retries, self.placer)
        self.phasing = Phases(self, self.placer, self.preemptor)
        self.admission = Admission(
            self,
            self.placer,
            self.waitlist,
            self.reasons,
            self.preemptor,
            self.lending,
            self.phasing,
        )
        self.cycle = Cycle(
            self,
            self.retries,
            self.placer,
            self.waitlist,
            self.reasons,
            self.preemptor,
            self.lending,
            self.phasing,
            self.guarantees,
        )

    # -- entry point -------------------------------------------------------------------------

    def refuse_config(self, config: SchedulerConfig) -> str | None:
        """Why `config` (the pools and quotas files reloaded) cannot replace the running one
        without a restart, naming the field; None when it can."""
        for pool in sorted(set(self.config.pools) | set(config.pools)):
            if self.config.overcommit_for(pool) != config.overcommit_for(pool):
                return (
                    f"pools.{pool}.overcommit: nodes are sized with it when they report; "
                    "changing it needs a restart"
                )
        return None

    def reconfigure(self, config: SchedulerConfig) -> str | None:
        """Take `config` (reloaded pools and quotas) from the next event on; every waiting task
        is tried again then. Loans made stay until they end and remain reclaimable by their
        lender. Returns why it was refused (the old one kept), or None."""
        why = self.refuse_config(config)
        if why is not None:
            return why
        self.config = config
        self.quotas.configure(
            config.quotas, config.tenant_shares, config.user_limits, config.queues, config.queue_of
        )
        pipelines = [config.pipeline, *(p.pipeline for p in config.pools.values())]
        self.pools_independent = all(map(pool_filtered_first, pipelines))
        self.retries.cohorts = {
            pool: mates for pool in config.pools if (mates := config.cohort_of(pool))
        }
        self.cycle.lending = self.admission.lending = self.lending if self.lending.active else None
        self.stale_pools = None  # every pool: any decision may now differ
        self.due_free = {}  # the grace period may have changed
        self.reconfigured = True
        return None

    def restore(
        self,
        nodes: list[tuple[NodeTopology, NodeCondition, float | None]],
        allocations: list[Allocation],
        pending: list[PendingTask],
        next_seq: int,
        early_cancels: list[str] | None = None,
        budget_holds: list[TenantBudgetExceeded] | None = None,
        victims: list[tuple[str, str, datetime]] | None = None,
        cordons: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        """Load persisted state (service start): nodes, their live allocations (a gang's
        members each one, in any order), the queue with its escalations and nominations, the
        cancels waiting for their task to be profiled, and the tenants their hard budget
        holds; `victims`: (task id, pool, latest deadline to yield) of tasks told to yield
        that wait or run again (their pool's victim cooldown counts from it)."""
        self.victims, self.victims_due = {}, []
        for task_id, pool, must_stop_by in sorted(victims or ()):
            cooldown = self.config.victim_cooldown_for(pool)
            if cooldown > 0:
                until = must_stop_by + timedelta(seconds=cooldown)
                self.victims[task_id] = until
                heapq.heappush(self.victims_due, (until, task_id))
        self.early_cancels = dict.fromkeys(early_cancels or (), False)
        self.quotas.holds = {hold.tenant: hold for hold in budget_holds or ()}
        for topology, condition, heartbeat in nodes:
            node = Node.empty(topology, self.config.overcommit_for(topology.pool))
            node.condition = condition
            node.last_heartbeat_at = heartbeat
            self.cluster.upsert(node)
        members = sorted(allocations, key=lambda a: (a.task_id, a.gang_index))
        restored_lent_milli(members)
        for allocation in members:
            head = self.allocations.get(allocation.task_id)
            if head is None:
                self.allocations[allocation.task_id] = allocation
            else:
                head.peers.append(allocation)
            self.ledger.take(allocation)
            held = self.cluster.get(allocation.node)
            if held is not None:
                hold(held, allocation)
                self.cluster.refresh(held.name)
        # Cordons last: a cordoned card's free share is blocked on top of what is held.
        for name, data in sorted((cordons or {}).items()):
            cordoned = self.cluster.get(name)
            if cordoned is not None:
                restore_cordons(cordoned, data)
                self.cluster.refresh(name)
        self.limits = []
        for head in self.allocations.values():
            # A preempted gang yields as a whole: every member carries the head's deadline.
            for peer in head.peers:
                peer.yield_by = peer.yield_by or head.yield_by
                peer.time_limited = peer.time_limited or head.time_limited
            # Its time limit as the configuration in force says, from its stored grant time.
            if head.task is not None:
                limit = self.config.run_limit_for(head.task.request)
                for member in head.members():
                    member.run_limit = limit
            arm_limit(self, head)
        self.phases = {}
        self.phasing.restore()
        self.pending = {}
        self.claimants = {}  # not stored: a restart forgets which owner claimed first
        for task in pending:
            self.waitlist.enqueue(task)
            self.admission.wake_when_hold_ends(task)  # its hold still ends, restart or not
        self.next_seq = next_seq
        # The workload fragmentation is measured against, rebuilt from what is still here:
        # the live allocations as granted, then the queue (what had left is forgotten).
        for live in sorted(self.allocations.values(), key=lambda a: a.granted_seq):
            if live.mig_profile is None and live.lent_by is None:
                self.cluster.workload.observe_shape(
                    len(live.gpu_ids), live.gpu_milli, None, len(live.cpu_cores), live.memory_mb
                )
        for task in sorted(pending, key=lambda t: t.seq):
            self.cluster.workload.observe(task.demand)
        # Each pool's blocked head keeps its nodes from the start, as before the restart.
        self.backfill = {}
        for task in self.waitlist.queue():
            blocked = self.quotas.blocking(
                task.request.tenant, task.demand, task.gang_size, task.request.user
            )
            if task.request.pool not in self.backfill and not blocked:
                self.waitlist.make_head(task)
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
        self.lending.age(now)
        self.guarantees.age(now)
        if self.restored:
            self._resume(now)
        if isinstance(event, TaskStatusReported):
            # Before expiring anything: this report may be the confirmation that was due, and
            # a later one that is in says the reports of an expiry's time are in too.
            self.reports_clock = max(self.reports_clock or event.occurred_at, event.occurred_at)
            if event.status is TaskStatus.RUNNING:
                self.reservations.confirm(event)
        if isinstance(event, NodeHealthReported) and self.cluster.get(event.node_id) is not None:
            self.health_clock = max(self.health_clock or event.occurred_at, event.occurred_at)
        decisions: list[Event] = self.reservations.expire_reservations(now, event)
        decisions += self.reservations.fail_silent_tasks(now, event)
        decisions += self.time_limits.enforce(now, event)
        decisions += self.waitlist.escalate(now, event)
        forget_victims(self, now)
        changed = self.nodes.expire_heartbeats(self.nodes.heard_until(now)) or bool(decisions)
        changed = self.retries.end_backoffs(now) or changed
        changed = self.retries.preferences_due(now) or changed
        changed = self.retries.announcements_due(now) or changed
        changed = self.retries.wakeups_due(now) or changed
        changed = self.waitlist.age(now) or changed
        changed = self._budget_periods_over(now) or changed
        if self.reconfigured:
            self.reconfigured, changed = False, True
        if isinstance(event, ReservationArmed):
            self.reservations.on_armed(event)
        elif isinstance(event, TaskProfiled):
            decisions += self.admission.on_profiled(event)
        elif isinstance(event, TaskStatusReported):
            left = len(self.pending)
            decisions += self.lifecycle.on_status(event)
            changed = (
                changed
                or len(self.pending) < left  # a waiting task was cancelled: the queue moved
                or any(isinstance(d, AllocationReleased) for d in decisions)
            )
        elif isinstance(event, NodeTopologyReported):
            self.nodes.on_topology(event)
            changed = True
        elif isinstance(event, NodeHealthReported):
            changed = self.nodes.on_health(event) or changed
            self.reconciler.on_health(event)
            ended, moved = self.cordons.on_health(event)
            decisions += ended
            changed = changed or moved or bool(ended)
        elif isinstance(event, GpuCordonRequested):
            ended, moved = self.cordons.on_request(event)
            decisions += ended
            changed = changed or moved
        elif isinstance(event, ReplicaReleaseRequested):
            decisions += self.lifecycle.on_release_requested(event)
            changed = changed or bool(decisions)
        elif isinstance(event, TenantBudgetExceeded | TenantBudgetRestored):
            changed = self._on_budget(event, now) or changed
        elif isinstance(event, TaskPhaseReported):
            decisions += self.phasing.on_phase(event)
            changed = True
        # After the event: a node's own heartbeat shows it is not lost.
        lost = self.nodes.release_lost_nodes(now, event)
        decisions += lost
        changed = changed or bool(lost)
        # The periodic check of the ledger against itself and the nodes' reports, when due.
        drift, moved = self.reconciler.run(now, event)
        decisions += drift
        changed = changed or moved
        if changed:
            decisions += self._retry_pending(event)
        if self.phases:
            decisions += self.phasing.settle(event)
        self.lending.observe(now)
        if self.lending.forecasts:
            decisions += self.preemptor.reclaim_ahead(self.lending, event)
        return decisions

    def _on_budget(self, event: TenantBudgetExceeded | TenantBudgetRestored, now: datetime) -> bool:
        """A hard budget passed holds its tenant's work not yet placed; within it again (or
        its period over) lets it go. A soft limit only warns: nothing changes here. Returns
        whether the tenant's waiting tasks may now decide otherwise."""
        if event.limit != "hard":
            return False
        tenant = event.tenant
        held = self.quotas.holds.get(tenant)
        if isinstance(event, TenantBudgetExceeded):
            if event.period_end <= now or (
                held is not None and held.period_start > event.period_start
            ):
                return False  # a period over already, or older than the hold in force
            self.quotas.holds[tenant] = event
        else:
            if held is None or event.period_start < held.period_start:
                return False  # nothing held, or about an earlier period than the hold
            del self.quotas.holds[tenant]
        self._tenant_stale(tenant)
        return held is None or isinstance(event, TenantBudgetRestored)

    def _budget_periods_over(self, now: datetime) -> bool:
        """Holds whose budget period has ended let their tenants' work go."""
        if not self.quotas.holds:
            return False  # none held (every event asks)
        over = [t for t, hold in self.quotas.holds.items() if hold.period_end <= now]
        for tenant in over:
            del self.quotas.holds[tenant]
            self._tenant_stale(tenant)
        return bool(over)

    def _tenant_stale(self, tenant: str) -> None:
        """The tenant's waiting tasks, in every pool, may decide otherwise now."""
        for task in self.pending.values():
            if task.request.tenant == tenant:
                self.retries.stale(task.request.pool)

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

    # -- queries -----------------------------------------------------------------------------

    def diagnose(
        self, demand: Demand, free: bool = True, among: BoolArray | None = None
    ) -> Diagnosis:
        """The filters' verdict: the nodes that pass, and why the others do not."""
        return self.placer.run_filters(demand, free, among)

    def rank(self, demand: Demand, candidates: BoolArray) -> Iterator[Ranked]:
        """Candidates best first (see `Placer.rank`)."""
        return self.placer.rank(demand, candidates)

    def dry_run(self, demand: Demand) -> PlacementAnswer:
        """Every node that fits, best first, and every node that does not, with why."""
        return self.placer.dry_run(demand)

    def dry_run_task(
        self, request: TaskRequest, prediction: ResourcePrediction | None
    ) -> TaskPlacementAnswer:
        """What submitting `request` would do now; changes nothing."""
        return self.admission.dry_run_task(request, prediction)

    def report_refusal(self, event: TaskStatusReported) -> FieldError | None:
        """Why a task report cannot be taken (None: it can)."""
        return self.reservations.report_refusal(event)

    def allocation_check(
        self, allocation_id: str, token: str, at: datetime
    ) -> tuple[Allocation, FieldError | None] | None:
        """An allocation held now and why a launcher's `running` would be refused."""
        return self.reservations.allocation_check(allocation_id, token, at)

    # -- the retry pass and its steps (a subclass may retry otherwise: tests' naive reference) --

    def _retry_pending(self, cause: Event) -> list[Event]:
        return self.cycle.retry_pending(cause)

    def _queue(self, pools: set[str] | None = None) -> Iterator[PendingTask]:
        return self.waitlist.queue(pools)

    def _reserved_for(self, task: PendingTask) -> BoolArray | None:
        return self.waitlist.reserved_for(task)

    def _make_head(self, task: PendingTask) -> None:
        self.waitlist.make_head(task)

    def _try_place(
        self, task: PendingTask, cause: Event, avoid: BoolArray | None = None
    ) -> list[AllocationGranted]:
        return self.placer.try_place(task, cause, avoid)

    def _why_waiting(
        self,
        task: PendingTask,
        avoid: BoolArray | None,
        over: list[Over],
        found: Diagnosis | None,
    ) -> tuple[list[FilterReason], str]:
        return self.reasons.why_waiting(task, avoid, over, found)

    def _announce(
        self, task: PendingTask, cause: Event, reasons: list[FilterReason], summary: str
    ) -> list[Event]:
        return self.reasons.announce(task, cause, reasons, summary)

    def _preempt_for(self, task: PendingTask, cause: Event) -> list[Event]:
        return self.preemptor.preempt_for(task, cause)
