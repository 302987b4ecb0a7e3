"""`Scheduler.handle(event) -> decisions`: the one scheduling core.

The service, tests and any replay feed it the same events in the same order and get the same
decisions back, bit for bit: every emitted event takes its id from the event that caused it
and its time from that event's `occurred_at`.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import numpy as np
import numpy.typing as npt

from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    Event,
    FieldError,
    FilterReason,
    NodeCondition,
    NodeFit,
    NodeHealthReported,
    NodeMisfit,
    NodeTopology,
    NodeTopologyReported,
    PlacementAnswer,
    Priority,
    ReleaseReason,
    ReplicaReleaseRequested,
    ResourcePrediction,
    ScoreDetail,
    TaskPending,
    TaskPreempted,
    TaskProfiled,
    TaskRejected,
    TaskRequest,
    TaskStatus,
    TaskStatusReported,
    derived_event_id,
)
from crater.scheduler.domain.cluster import WHOLE, BoolArray, ClusterArrays, Node
from crater.scheduler.domain.demand import PREDICTION_MARGIN, Demand
from crater.scheduler.domain.placement import Selection, select
from crater.scheduler.domain.plugins import DEFAULT_PIPELINE, Pipeline
from crater.scheduler.domain.preemption import Candidate, plan
from crater.scheduler.domain.quotas import QUOTA_FIELDS, Quota, Quotas, Usage

# (node row, total score, per-plugin scores)
Ranked = tuple[int, float, list[ScoreDetail]]

PRIORITY_RANK = {Priority.HIGH: 0, Priority.MEDIUM: 1, Priority.LOW: 2}

# Which request field a filter judges: named in a rejection.
FILTER_FIELDS = {
    "Pool": "pool",
    "GpuCount": "resource_requirements.gpu.count",
    "GpuModel": "resource_requirements.gpu.type",
    "GpuMemory": "resource_requirements.gpu.memory_mb",
    "CpuCores": "resource_requirements.cpu.cores",
    "Memory": "resource_requirements.memory.capacity_mb",
    "DiskCapacity": "resource_requirements.ssd.capacity_gb",
    "AvxSupport": "resource_requirements.cpu.avx_support",
    "AntiAffinity": "anti_affinity.group",
}


@dataclass(frozen=True)
class SchedulerConfig:
    pipeline: Pipeline = DEFAULT_PIPELINE
    reservation_seconds: int = 30
    heartbeat_timeout_seconds: float = 30.0
    token_secret: bytes = b"crater-development-only"
    checkpoint_root: str = "/var/lib/crater/checkpoints"
    quotas: dict[str, Quota] = field(default_factory=dict)
    grace_period_seconds: int = 30
    prediction_margin: float = PREDICTION_MARGIN


@dataclass
class PendingTask:
    request: TaskRequest
    prediction: ResourcePrediction | None
    demand: Demand
    seq: int
    last_summary: str | None = None
    nominated_node: str | None = None  # where victims are yielding for it

    @property
    def order(self) -> tuple[int, int]:
        return PRIORITY_RANK[self.request.priority], self.seq


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
    usage: Usage = field(default_factory=Usage)
    priority_rank: int = PRIORITY_RANK[Priority.MEDIUM]
    preemptible: bool = False
    granted_seq: int = 0
    yield_by: datetime | None = None  # preempted: released at this time at the latest
    group: str | None = None  # anti-affinity group


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
    quotas: Quotas = field(default_factory=Quotas)

    def __post_init__(self) -> None:
        self.quotas.limits = dict(self.config.quotas)

    # -- entry point -------------------------------------------------------------------------

    def restore(
        self,
        nodes: list[tuple[NodeTopology, NodeCondition, float | None]],
        allocations: list[Allocation],
        pending: list[PendingTask],
        next_seq: int,
    ) -> None:
        """Load persisted state (service start): nodes, their live allocations, the queue."""
        for topology, condition, heartbeat in nodes:
            node = Node.empty(topology)
            node.condition = condition
            node.last_heartbeat_at = heartbeat
            self.cluster.upsert(node)
        for allocation in allocations:
            self.allocations[allocation.task_id] = allocation
            self.quotas.take(allocation.tenant, allocation.usage)
            held = self.cluster.get(allocation.node)
            if held is not None:
                _hold(held, allocation)
                self.cluster.refresh(held.name)
        self.pending = {task.request.task_id: task for task in pending}
        self.next_seq = next_seq

    def handle(self, event: Event) -> list[Event]:
        self.clock = max(self.clock or event.occurred_at, event.occurred_at)
        now = self.clock
        decisions: list[Event] = self._expire_reservations(now, event)
        changed = self._expire_heartbeats(now) or bool(decisions)
        if isinstance(event, TaskProfiled):
            decisions += self._on_profiled(event)
        elif isinstance(event, TaskStatusReported):
            decisions += self._on_status(event)
            changed = changed or any(isinstance(d, AllocationReleased) for d in decisions)
        elif isinstance(event, NodeTopologyReported):
            self._on_topology(event)
            changed = True
        elif isinstance(event, NodeHealthReported):
            changed = self._on_health(event) or changed
        elif isinstance(event, ReplicaReleaseRequested):
            decisions += self._on_release_requested(event)
            changed = changed or bool(decisions)
        if changed:
            decisions += self._retry_pending(event)
        return decisions

    # -- tasks -------------------------------------------------------------------------------

    def _on_profiled(self, event: TaskProfiled) -> list[Event]:
        request = event.task
        if request.task_id in self.pending or request.task_id in self.allocations:
            return []  # already known: a redelivery
        seq = self.next_seq
        self.next_seq += 1
        if request.gang_size > 1:
            return [
                self._reject(
                    event,
                    request.task_id,
                    [FieldError(field="gang_size", reason="gang scheduling is not supported yet")],
                )
            ]
        demand = Demand.of(request, event.prediction, self.config.prediction_margin)
        errors = [
            FieldError(
                field=QUOTA_FIELDS[resource],
                reason=f"tenant {request.tenant!r} quota is {limit}; the task alone: {wanted:g}",
            )
            for resource, wanted, limit in self.quotas.never(request.tenant, demand)
        ] or self._never_fits(demand)
        if errors:
            return [self._reject(event, request.task_id, errors)]
        task = PendingTask(request, event.prediction, demand, seq)
        granted = self._try_place(task, event)
        if granted is not None:
            return [granted]
        self.pending[request.task_id] = task
        return [self._pending_event(task, event), *self._preempt_for(task, event)]

    def _never_fits(self, demand: Demand) -> list[FieldError]:
        """Why no node of the task's pool could hold it even empty; [] when one could (or
        when there are no nodes yet: they may still come)."""
        if not len(self.cluster):
            return []
        in_pool = self.cluster.pool == demand.pool
        if not in_pool.any():
            pools = ", ".join(sorted(set(self.cluster.pool.tolist())))
            return [FieldError(field="pool", reason=f"no node in pool {demand.pool!r} ({pools})")]
        fits, reasons = self.diagnose(demand, free=False, among=in_pool)
        if fits.any():
            return []
        return [
            FieldError(
                field=FILTER_FIELDS.get(r.filter, r.filter),
                reason=f"no node in pool {demand.pool!r} can ever fit: {r.nodes} {r.message}",
            )
            for r in reasons
        ]

    def _on_status(self, event: TaskStatusReported) -> list[Event]:
        allocation = self.allocations.get(event.task_id)
        if allocation is not None and event.allocation_id not in (None, allocation.allocation_id):
            return []  # news of an earlier allocation of the same task: not this one
        if allocation is None:
            if event.status is not TaskStatus.RUNNING:
                self.pending.pop(event.task_id, None)  # cancelled before it was placed
            return []
        if event.status is TaskStatus.RUNNING:
            allocation.running = True
            return []
        if allocation.yield_by is not None:
            return [self._release(allocation, ReleaseReason.PREEMPTED, event)]
        return [self._release(allocation, ReleaseReason(event.status.value), event)]

    def _on_release_requested(self, event: ReplicaReleaseRequested) -> list[Event]:
        """A scaled-in replica, drained: its resources go back."""
        allocation = self.allocations.get(event.task_id) if event.task_id else None
        if allocation is None:
            return []
        return [self._release(allocation, ReleaseReason.SCALED_IN, event)]

    def _retry_pending(self, cause: Event) -> list[Event]:
        decisions: list[Event] = []
        for task in sorted(self.pending.values(), key=lambda t: t.order):
            granted = self._try_place(task, cause)
            if granted is not None:
                del self.pending[task.request.task_id]
                decisions.append(granted)
            else:
                pending = self._pending_event(task, cause)
                if pending.summary != task.last_summary:
                    decisions.append(pending)
                decisions += self._preempt_for(task, cause)
        return decisions

    def _preempt_for(self, task: PendingTask, cause: Event) -> list[Event]:
        """Ask lower-priority preemptible tasks to yield so `task` fits; they get a grace
        period to checkpoint, then their resources go back (see `_expire_reservations`)."""
        if task.nominated_node is not None or self.quotas.blocking(
            task.request.tenant, task.demand
        ):
            return []
        rank = PRIORITY_RANK[task.request.priority]
        candidates = [
            Candidate(
                a.task_id,
                a.node,
                a.gpu_ids,
                a.gpu_milli,
                a.cpu_cores,
                a.memory_mb,
                a.priority_rank,
                a.granted_seq,
            )
            for a in self.allocations.values()
            if a.preemptible and a.priority_rank > rank and a.yield_by is None
        ]
        if not candidates:
            return []
        # Nodes the task could use if they were emptier: every filter but free amounts.
        fits_empty, _ = self.diagnose(task.demand, free=False)
        ready = fits_empty & self.cluster.ready
        nodes = [self.cluster.nodes[i] for i in np.flatnonzero(ready)]
        chosen = plan(nodes, task.demand, candidates)
        if chosen is None:
            return []
        task.nominated_node = chosen.node
        now = self.clock or cause.occurred_at
        grace = self.config.grace_period_seconds
        decisions: list[Event] = []
        for victim in chosen.victims:
            allocation = self.allocations[victim.task_id]
            allocation.yield_by = now + timedelta(seconds=grace)
            decisions.append(
                TaskPreempted(
                    event_id=derived_event_id(cause.event_id, f"preempted:{victim.task_id}"),
                    occurred_at=cause.occurred_at,
                    task_id=victim.task_id,
                    allocation_id=allocation.allocation_id,
                    node=allocation.node,
                    preempted_by=task.request.task_id,
                    grace_period_seconds=grace,
                )
            )
        return decisions

    def _expire_reservations(self, now: datetime, cause: Event) -> list[Event]:
        """Allocations whose task never confirmed it runs, past their reservation, and
        preempted ones past their grace period, go back."""
        expired = [a for a in self.allocations.values() if not a.running and a.expires_at < now]
        yielded = [
            a
            for a in self.allocations.values()
            if a.yield_by is not None and a.yield_by < now and a not in expired
        ]
        released: list[Event] = [
            self._release(a, ReleaseReason.EXPIRED, cause)
            for a in sorted(expired, key=lambda a: a.task_id)
        ]
        return released + [
            self._release(a, ReleaseReason.PREEMPTED, cause)
            for a in sorted(yielded, key=lambda a: a.task_id)
        ]

    # -- nodes -------------------------------------------------------------------------------

    def _on_topology(self, event: NodeTopologyReported) -> None:
        existing = self.cluster.get(event.node.node_id)
        node = Node.empty(event.node)
        if existing is not None:
            node.condition = existing.condition
            node.last_heartbeat_at = existing.last_heartbeat_at
        node.last_heartbeat_at = node.last_heartbeat_at or event.occurred_at.timestamp()
        self.cluster.upsert(node)
        for allocation in self.allocations.values():
            if allocation.node == node.name:
                _hold(node, allocation)
        self.cluster.refresh(node.name)

    def _on_health(self, event: NodeHealthReported) -> bool:
        node = self.cluster.get(event.node_id)
        if node is None:
            return False  # health before topology: wait for the topology
        node.last_heartbeat_at = event.occurred_at.timestamp()
        was = node.condition
        node.condition = event.condition
        self.cluster.refresh(node.name)
        return was is not event.condition

    def _expire_heartbeats(self, now: datetime) -> bool:
        deadline = now.timestamp() - self.config.heartbeat_timeout_seconds
        changed = False
        for node in self.cluster.nodes:
            silent = node.last_heartbeat_at is not None and node.last_heartbeat_at < deadline
            if silent and node.condition is not NodeCondition.NOT_READY:
                node.condition = NodeCondition.NOT_READY
                self.cluster.refresh(node.name)
                changed = True
        return changed

    # -- placement ---------------------------------------------------------------------------

    def diagnose(
        self, demand: Demand, free: bool = True, among: BoolArray | None = None
    ) -> tuple[BoolArray, list[FilterReason]]:
        """Run the filters; each node is charged to the first filter that excludes it."""
        alive = np.ones(len(self.cluster), np.bool_) if among is None else among.copy()
        reasons: list[FilterReason] = []
        for f in self.config.pipeline.filters:
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
        total = np.zeros(len(idx))
        parts: list[tuple[str, npt.NDArray[np.float64]]] = []
        for score in self.config.pipeline.scores:
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
        for f in self.config.pipeline.filters:
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
                )
            )
        counts: dict[str, int] = {}
        for m in misfits:
            counts[m.reason] = counts.get(m.reason, 0) + 1
        detail = ", ".join(f"{n} {reason}" for reason, n in counts.items())
        summary = f"{len(fits)}/{len(self.cluster)} nodes fit" + (f"; {detail}" if detail else "")
        misfits.sort(key=lambda m: m.node_id)
        return PlacementAnswer(fits=fits, misfits=misfits, summary=summary)

    def _try_place(self, task: PendingTask, cause: Event) -> AllocationGranted | None:
        if self.quotas.blocking(task.request.tenant, task.demand):
            return None
        candidates, _ = self.diagnose(task.demand)
        for i, score, details in self.rank(task.demand, candidates):
            node = self.cluster.nodes[i]
            selection = select(node, task.demand)
            if selection is not None:
                return self._grant(task, node, selection, score, details, cause)
        return None

    def _grant(
        self,
        task: PendingTask,
        node: Node,
        selection: Selection,
        score: float,
        details: list[ScoreDetail],
        cause: Event,
    ) -> AllocationGranted:
        request = task.request
        event_id = derived_event_id(cause.event_id, f"granted:{request.task_id}")
        allocation_id = f"alloc-{event_id.hex[:16]}"
        now = self.clock or cause.occurred_at
        expires = now + timedelta(seconds=self.config.reservation_seconds)
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
            priority_rank=PRIORITY_RANK[request.priority],
            preemptible=request.preemptible,
            granted_seq=task.seq,
            group=request.anti_affinity.group,
            gpu_milli=task.demand.gpu_milli or WHOLE,
        )
        self.quotas.take(request.tenant, allocation.usage)
        _hold(node, allocation)
        self.cluster.refresh(node.name)
        self.allocations[request.task_id] = allocation
        checkpoint = self._checkpoint_path(node, request.task_id)
        best = max(details, key=lambda d: d.score).plugin if details else "only fit"
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
            cpu_cores=list(selection.cpu_cores),
            numa_node=selection.numa_node,
            memory_mb=task.demand.memory_mb,
            checkpoint_path=checkpoint,
            reservation_token=self._token(allocation_id, request.task_id, node.name, expires),
            reservation_expires_at=expires,
            score=round(score, 4),
            scores=details,
            explanation=(
                f"{node.name}: score {score:.3f} (strongest: {best}); "
                f"GPU memory {task.demand.gpu_memory_mb} MiB per card "
                f"({task.demand.gpu_memory_source}); NUMA {selection.numa_node}"
            ),
            environment=self._environment(task, selection, checkpoint),
        )

    def _release(
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
            )
            self.cluster.refresh(node.name)
        del self.allocations[allocation.task_id]
        self.quotas.give_back(allocation.tenant, allocation.usage)
        return AllocationReleased(
            event_id=derived_event_id(cause.event_id, f"released:{allocation.task_id}"),
            occurred_at=cause.occurred_at,
            allocation_id=allocation.allocation_id,
            task_id=allocation.task_id,
            node=allocation.node,
            gpu_ids=list(allocation.gpu_ids),
            cpu_cores=list(allocation.cpu_cores),
            reason=reason,
        )

    # -- events ------------------------------------------------------------------------------

    def _pending_event(self, task: PendingTask, cause: Event) -> TaskPending:
        total = len(self.cluster)
        over = self.quotas.blocking(task.request.tenant, task.demand)
        _, reasons = self.diagnose(task.demand)
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
        if reasons:
            detail = ", ".join(f"{r.nodes} {r.message}" for r in reasons)
        elif total:
            detail = "no node has the GPUs and CPU cores together on one NUMA node"
        else:
            detail = "no nodes yet"
        summary = f"0/{total} nodes available: {detail}"
        task.last_summary = summary
        return TaskPending(
            event_id=derived_event_id(cause.event_id, f"pending:{task.request.task_id}"),
            occurred_at=cause.occurred_at,
            task_id=task.request.task_id,
            nodes_total=total,
            reasons=reasons,
            summary=summary,
        )

    @staticmethod
    def _reject(cause: Event, task_id: str, errors: list[FieldError]) -> TaskRejected:
        return TaskRejected(
            event_id=derived_event_id(cause.event_id, f"rejected:{task_id}"),
            occurred_at=cause.occurred_at,
            task_id=task_id,
            errors=errors,
        )

    def _checkpoint_path(self, node: Node, task_id: str) -> str:
        mounts = [d.mount_path for d in node.topology.disks if d.nvme and d.mount_path]
        root = f"{mounts[0].rstrip('/')}/crater/checkpoints" if mounts else None
        return f"{root or self.config.checkpoint_root}/{task_id}"

    def _token(self, allocation_id: str, task_id: str, node: str, expires: datetime) -> str:
        expiry = int(expires.timestamp())
        claim = f"{allocation_id}.{task_id}.{node}.{expiry}"
        signature = hmac.new(self.config.token_secret, claim.encode(), hashlib.sha256)
        return f"v1.{allocation_id}.{expiry}.{signature.hexdigest()}"

    @staticmethod
    def _environment(task: PendingTask, selection: Selection, checkpoint: str) -> dict[str, str]:
        env = {
            "CRATER_GPU_IDS": ",".join(map(str, selection.gpu_ids)),
            "CRATER_CPU_CORES": ",".join(map(str, selection.cpu_cores)),
            "CRATER_NUMA_NODE": "" if selection.numa_node is None else str(selection.numa_node),
            "CRATER_CHECKPOINT_PATH": checkpoint,
            "CRATER_PRECISION": task.request.model_spec.precision.value,
        }
        if task.prediction is not None:
            env["CRATER_DATALOADER_NUM_WORKERS"] = str(task.prediction.dataloader_num_workers)
            env["CRATER_DATALOADER_PREFETCH_FACTOR"] = str(
                task.prediction.dataloader_prefetch_factor
            )
        return env


def _hold(node: Node, allocation: Allocation) -> None:
    node.take(
        allocation.gpu_ids,
        allocation.gpu_milli,
        allocation.cpu_cores,
        allocation.memory_mb,
        allocation.group,
    )
