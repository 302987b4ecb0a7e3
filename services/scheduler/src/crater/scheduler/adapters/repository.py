"""Writes the core's decisions to the database, and reads the state back on start."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import bindparam, delete, func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from crater.contracts import (
    FINAL_STATUSES,
    AllocationGranted,
    AllocationReleased,
    AttemptRecord,
    Event,
    GpuCordonRequested,
    HeldAllocation,
    NodeCondition,
    NodeHealthReported,
    NodeTopology,
    NodeTopologyReported,
    PredictedPeaks,
    Priority,
    ResourcePrediction,
    TaskEnded,
    TaskEscalated,
    TaskPending,
    TaskPreempted,
    TaskProfiled,
    TaskRejected,
    TaskRequest,
    TasksQuery,
    TaskStatus,
    TaskStatusReported,
    TaskSummary,
    TenantBudgetExceeded,
    TenantBudgetRestored,
)
from crater.runtime.outbox import IN_LIST_LIMIT
from crater.runtime.writes import HeldWrites, Rows
from crater.scheduler.adapters.orm import allocations, budget_holds, early_cancels, nodes, tasks
from crater.scheduler.domain.cordons import stored as stored_cordons
from crater.scheduler.domain.core import (
    Allocation,
    PendingTask,
    Scheduler,
    SchedulerConfig,
)
from crater.scheduler.domain.demand import PREDICTION_MARGIN, Demand
from crater.scheduler.domain.inputs import ReservationArmed
from crater.scheduler.domain.lifecycle import FAILED_ON
from crater.scheduler.domain.quotas import Usage

FINAL = [s.value for s in FINAL_STATUSES]

# The hot writes, built once: a statement built per row costs more CPU than running it
# (coercing every value, then a cache key for the compiled form); these are compiled once
# and take their values as parameters. Parameters that name a row start with `b_`, apart
# from the columns they set.
INSERT_TASK = insert(tasks)
INSERT_ALLOCATION = insert(allocations)
SET_TASK = update(tasks).where(tasks.c.task_id == bindparam("b_task_id"))
SET_ALLOCATION = update(allocations).where(
    allocations.c.allocation_id == bindparam("b_allocation_id")
)
# A node's `running` shows on a placed task only: a late report of an earlier attempt never
# turns a waiting (or ended) task into a running one. Ends are the core's (task.ended).
REPORT_RUNNING = (
    update(tasks)
    .where(tasks.c.task_id == bindparam("b_task_id"))
    .where(tasks.c.status.in_([TaskStatus.SCHEDULED.value, TaskStatus.RUNNING.value]))
)
MARK_RUNNING = (
    update(allocations)
    .where(allocations.c.task_id == bindparam("b_task_id"))
    .where(allocations.c.released_at.is_(None))
    .values(running=True)
)
ARM_RESERVATION = (
    update(allocations)
    .where(allocations.c.allocation_id == bindparam("b_allocation_id"))
    .where(allocations.c.armed.is_(False))
)
SET_NODE = update(nodes).where(nodes.c.node_id == bindparam("b_node_id"))
SET_CORDONS = (
    update(nodes)
    .where(nodes.c.node_id == bindparam("b_node_id"))
    .values(cordons=bindparam("cordons"))
)
DELETE_EARLY_CANCEL = delete(early_cancels).where(early_cancels.c.task_id == bindparam("b_task_id"))


def task_row(task_id: str) -> Rows:
    return Rows("tasks", task_id)


def allocation_row(allocation_id: str) -> Rows:
    return Rows("allocations", allocation_id)


# A task waiting or running (an attempt or the next one to come).
LIVE_STATUSES = [TaskStatus.PENDING.value, TaskStatus.SCHEDULED.value, TaskStatus.RUNNING.value]


class SchedulerRepository:
    """Reads, and the writes of decisions. The hot writes are held (crater.runtime.writes)
    and sent grouped by `flush`, which the caller runs before its transaction commits; every
    read here flushes first."""

    def __init__(self, session: AsyncSession | AsyncConnection) -> None:
        self.session = session
        self.writes = HeldWrites()

    # -- writes ------------------------------------------------------------------------------

    async def flush(self) -> None:
        """Send the held writes (before a read, and before the commit)."""
        if len(self.writes):
            await self.writes.flush(self.session)

    async def _now(self, statement: Any, params: dict[str, Any] | None = None) -> Any:
        """Run a statement that is not held, after what is."""
        await self.flush()
        return await self.session.execute(statement, params)

    async def record(
        self,
        event: Event,
        decisions: list[Event],
        seq: int | None,
        core: Scheduler | None = None,
    ) -> None:
        """Persist what `event` and the decisions it caused changed. `core`: the scheduler
        that decided, for the state a decision does not carry (a retry's backoff, what a
        waiting task was last announced as)."""
        now = datetime.now(UTC)
        if isinstance(event, TaskProfiled) and seq is not None:
            await self._insert_task(event, seq, now)
        elif isinstance(event, ReservationArmed):
            self.writes.add(
                ARM_RESERVATION,
                {
                    "b_allocation_id": event.allocation_id,
                    "armed": True,
                    "reservation_expires_at": _armed_expiry(core, event),
                },
                allocation_row(event.allocation_id),
            )
        elif isinstance(event, TaskStatusReported):
            if event.status is TaskStatus.CANCELLED and event.allocation_id is None:
                await self._remember_early_cancel(event.task_id, now)
            if event.status is TaskStatus.RUNNING:
                self.writes.add(
                    REPORT_RUNNING,
                    {"b_task_id": event.task_id, "status": event.status.value, "updated_at": now},
                    task_row(event.task_id),
                )
                # Every allocation of the task: their ids are not known here.
                self.writes.add(MARK_RUNNING, {"b_task_id": event.task_id}, Rows("allocations"))
                if event.reservation_token is not None and core is not None:
                    await self._held_to_heartbeats(event, core)
        elif isinstance(event, NodeTopologyReported):
            await self._upsert_node(event.node, None, event.occurred_at.timestamp(), now)
        elif isinstance(event, NodeHealthReported):
            self.writes.add(
                SET_NODE,
                {
                    "b_node_id": event.node_id,
                    "condition": event.condition.value,
                    "last_heartbeat_at": event.occurred_at.timestamp(),
                    "updated_at": now,
                },
                Rows("nodes", event.node_id),
            )
        if isinstance(event, NodeHealthReported | GpuCordonRequested) and core is not None:
            node = core.cluster.get(event.node_id)
            if node is not None:  # its cordons as they are now (docs/health.md)
                self.writes.add(
                    SET_CORDONS,
                    {"b_node_id": event.node_id, "cordons": stored_cordons(node)},
                    Rows("nodes", event.node_id),
                )
        if isinstance(event, TenantBudgetExceeded | TenantBudgetRestored) and core is not None:
            await self._hold(event.tenant, core.quotas.holds.get(event.tenant), now)
        for decision in decisions:
            await self._apply(decision, now, core)

    async def _hold(self, tenant: str, hold: TenantBudgetExceeded | None, now: datetime) -> None:
        """The tenant's hold as the core has it now: stored, replaced or gone."""
        await self._now(delete(budget_holds).where(budget_holds.c.tenant == tenant))
        if hold is not None:
            await self._now(
                insert(budget_holds).values(
                    tenant=tenant, event=hold.model_dump(mode="json"), held_at=now
                )
            )

    async def _held_to_heartbeats(self, event: TaskStatusReported, core: Scheduler) -> None:
        """A launcher's `running`: its allocation's grace, as the core holds it now."""
        head = core.allocations.get(event.task_id)
        for member in head.members() if head is not None else ():
            if member.allocation_id == event.allocation_id:
                self.writes.add(
                    SET_ALLOCATION,
                    {
                        "b_allocation_id": member.allocation_id,
                        "heartbeat_grace_seconds": member.heartbeat_grace,
                    },
                    allocation_row(member.allocation_id),
                )

    async def _nominate(self, task_id: str, node: str, now: datetime) -> None:
        """Victims yield on `node` for `task_id` (a gang's may yield on several nodes)."""
        await self.flush()
        known = await self.session.scalar(
            select(tasks.c.nominated_nodes).where(tasks.c.task_id == task_id)
        )
        nominated = sorted({*(known or []), node})
        await self._set_task(task_id, now, nominated_node=nominated[0], nominated_nodes=nominated)

    async def _remember_early_cancel(self, task_id: str, now: datetime) -> None:
        """A cancel of a task not received yet waits for it (the core does the same)."""
        if await self.task_known(task_id):  # flushes
            return
        waiting = await self.session.scalar(
            select(early_cancels.c.task_id).where(early_cancels.c.task_id == task_id)
        )
        if waiting is None:
            await self._now(insert(early_cancels).values(task_id=task_id, cancelled_at=now))

    async def _apply(self, decision: Event, now: datetime, core: Scheduler | None) -> None:
        if isinstance(decision, TaskEnded):
            await self._set_task(
                decision.task_id,
                now,
                status=decision.status.value,
                reason=decision.reason,
                not_before=None,
            )
            # A task cancelled before it arrived has ended: the cancel has been used.
            self.writes.add(
                DELETE_EARLY_CANCEL,
                {"b_task_id": decision.task_id},
                Rows("early_cancels", decision.task_id),
            )
        elif isinstance(decision, AllocationGranted):
            self.writes.add(
                INSERT_ALLOCATION,
                {
                    "allocation_id": decision.allocation_id,
                    "task_id": decision.task_id,
                    "node": decision.node,
                    "gpu_ids": decision.gpu_ids,
                    "cpu_cores": decision.cpu_cores,
                    "memory_mb": decision.memory_mb,
                    "numa_node": decision.numa_node,
                    "checkpoint_path": decision.checkpoint_path,
                    "reservation_token": decision.reservation_token,
                    "reservation_expires_at": decision.reservation_expires_at,
                    "running": False,
                    "granted_at": decision.occurred_at,
                    "gang_index": decision.gang_index,
                    "armed": False,
                    "attempt": decision.attempt,
                    "environment": decision.environment,
                },
                allocation_row(decision.allocation_id),
                task_row(decision.task_id),  # after its task's row
            )
            if decision.gang_index:
                return  # the task's row shows its first member; every member is a row above
            await self._set_task(
                decision.task_id,
                now,
                status=TaskStatus.SCHEDULED.value,
                node=decision.node,
                gpu_ids=decision.gpu_ids,
                reason=decision.explanation,
            )
        elif isinstance(decision, TaskPending):
            waiting = core.pending.get(decision.task_id) if core is not None else None
            values: dict[str, Any] = {
                "status": TaskStatus.PENDING.value,
                "reason": decision.summary,
            }
            values["attempt"] = decision.attempt
            if waiting is not None:
                values["not_before"] = waiting.not_before
                values["pending_kind"] = [sorted(kind) for kind in waiting.told_kinds]
                values["pending_at"] = waiting.announced_at
            await self._set_task(decision.task_id, now, **values)
        elif isinstance(decision, TaskRejected):
            reason = "; ".join(f"{e.field}: {e.reason}" for e in decision.errors)
            await self._set_task(
                decision.task_id, now, status=TaskStatus.REJECTED.value, reason=reason
            )
        elif isinstance(decision, TaskEscalated):
            await self._set_task(decision.task_id, now, escalated=True)
        elif isinstance(decision, TaskPreempted):
            self.writes.add(
                SET_ALLOCATION,
                {
                    "b_allocation_id": decision.allocation_id,
                    "yield_by": decision.must_stop_by,
                    "time_limited": decision.time_limit_seconds is not None,
                },
                allocation_row(decision.allocation_id),
            )
            if decision.preempted_by is not None:
                await self._nominate(decision.preempted_by, decision.node, now)
            await self._set_task(
                decision.task_id,
                now,
                reason=f"{decision.cause()}: {decision.grace_period_seconds} s to checkpoint",
            )
        elif isinstance(decision, AllocationReleased):
            self.writes.add(
                SET_ALLOCATION,
                {
                    "b_allocation_id": decision.allocation_id,
                    "released_at": decision.occurred_at,
                    "release_reason": decision.reason.value,
                },
                allocation_row(decision.allocation_id),
            )
            # What becomes of the task (retried, or its end) is the decision that follows.

    async def _insert_task(self, event: TaskProfiled, seq: int, now: datetime) -> None:
        request = event.task
        self.writes.add(
            INSERT_TASK,
            {
                "task_id": request.task_id,
                "seq": seq,
                "task_type": request.task_type.value,
                "pool": request.pool,
                "tenant": request.tenant,
                "priority": str(
                    request.priority.value
                    if isinstance(request.priority, Priority)
                    else request.priority
                ),
                "gpus": request.resource_requirements.gpu.count,
                "status": TaskStatus.PENDING.value,
                "request": request.model_dump(mode="json"),
                "prediction": event.prediction.model_dump(mode="json"),
                "gpu_ids": [],
                "submitted_at": event.occurred_at,
                "updated_at": now,
            },
            task_row(request.task_id),
        )

    async def _set_task(self, task_id: str, now: datetime, **values: Any) -> None:
        self.writes.add(
            SET_TASK, {"b_task_id": task_id, "updated_at": now, **values}, task_row(task_id)
        )

    async def _upsert_node(
        self,
        topology: NodeTopology,
        condition: NodeCondition | None,
        heartbeat: float,
        now: datetime,
    ) -> None:
        await self.flush()
        exists = await self.session.scalar(
            select(nodes.c.node_id).where(nodes.c.node_id == topology.node_id)
        )
        values: dict[str, Any] = {
            "pool": topology.pool,
            "topology": topology.model_dump(mode="json"),
            "updated_at": now,
        }
        if exists is None:
            await self._now(
                insert(nodes).values(
                    node_id=topology.node_id,
                    condition=(condition or NodeCondition.READY).value,
                    last_heartbeat_at=heartbeat,
                    **values,
                )
            )
        else:
            await self._now(
                update(nodes).where(nodes.c.node_id == topology.node_id).values(**values)
            )

    async def task_request(
        self, task_id: str
    ) -> tuple[TaskRequest, ResourcePrediction | None] | None:
        """A task's request and prediction, as it was submitted (a replica template)."""
        row = (
            await self.session.execute(
                select(tasks.c.request, tasks.c.prediction).where(tasks.c.task_id == task_id)
            )
        ).first()
        if row is None:
            return None
        prediction = ResourcePrediction.model_validate(row.prediction) if row.prediction else None
        return TaskRequest.model_validate(row.request), prediction

    async def task_states(self, task_ids: list[str]) -> dict[str, str]:
        """Those of `task_ids` stored already, each with its status."""
        await self.flush()
        known: dict[str, str] = {}
        for start in range(0, len(task_ids), IN_LIST_LIMIT):
            rows = await self.session.execute(
                select(tasks.c.task_id, tasks.c.status).where(
                    tasks.c.task_id.in_(task_ids[start : start + IN_LIST_LIMIT])
                )
            )
            known.update((task_id, status) for task_id, status in rows)
        return known

    async def service_template(
        self, service: str
    ) -> tuple[str, TaskRequest, ResourcePrediction | None] | None:
        """The latest inference task of `service` (its `anti_affinity.group`), ended or not:
        the fleet's request when the autoscaler names no template. A rare path (no replica
        known to the autoscaler), so a scan of the inference tasks is acceptable."""
        row = (
            await self.session.execute(
                select(tasks.c.task_id, tasks.c.request, tasks.c.prediction)
                .where(tasks.c.task_type == "inference")
                .where(tasks.c.request["anti_affinity"]["group"].as_string() == service)
                .order_by(tasks.c.seq.desc())
                .limit(1)
            )
        ).first()
        if row is None:
            return None
        prediction = ResourcePrediction.model_validate(row.prediction) if row.prediction else None
        return row.task_id, TaskRequest.model_validate(row.request), prediction

    async def task_known(self, task_id: str) -> bool:
        await self.flush()
        found = await self.session.scalar(select(tasks.c.task_id).where(tasks.c.task_id == task_id))
        return found is not None

    # -- reads -------------------------------------------------------------------------------

    async def load(self, config: SchedulerConfig) -> Scheduler:
        """Rebuild the core from the database: nodes, live allocations, waiting tasks."""
        scheduler = Scheduler(config=config)
        node_rows = (await self.session.execute(select(nodes).order_by(nodes.c.node_id))).all()
        alloc_rows = (
            await self.session.execute(
                select(
                    allocations,
                    tasks.c.request,
                    tasks.c.prediction,
                    tasks.c.tenant,
                    tasks.c.seq,
                    tasks.c.escalated,
                    tasks.c.submitted_at,
                    tasks.c.attempt.label("task_attempt"),
                )
                .join(tasks, tasks.c.task_id == allocations.c.task_id)
                .where(allocations.c.released_at.is_(None))
            )
        ).all()
        pending_rows = (
            await self.session.execute(
                select(tasks).where(tasks.c.status == TaskStatus.PENDING.value)
            )
        ).all()
        max_seq = await self.session.scalar(select(func.max(tasks.c.seq)))
        waiting_cancels = (await self.session.scalars(select(early_cancels.c.task_id))).all()
        holds = (await self.session.scalars(select(budget_holds.c.event))).all()
        # Tasks told to yield that wait or run again: each one's latest deadline to yield, so
        # that its pool's victim cooldown goes on across the restart.
        victim_rows = (
            await self.session.execute(
                select(allocations.c.task_id, tasks.c.pool, func.max(allocations.c.yield_by))
                .join(tasks, tasks.c.task_id == allocations.c.task_id)
                .where(allocations.c.yield_by.is_not(None))
                # told to stop at its time limit: not a victim of anyone
                .where(allocations.c.time_limited.is_not(True))
                .where(tasks.c.status.in_(LIVE_STATUSES))
                .group_by(allocations.c.task_id, tasks.c.pool)
            )
        ).all()
        # Where each task still waiting or running failed an earlier attempt: its retries
        # go elsewhere while they can (`Placer.shunned`).
        failed_rows = (
            await self.session.execute(
                select(allocations.c.task_id, allocations.c.node)
                .join(tasks, tasks.c.task_id == allocations.c.task_id)
                .where(allocations.c.release_reason.in_([r.value for r in FAILED_ON]))
                .where(tasks.c.status.in_(LIVE_STATUSES))
            )
        ).all()
        failed_on: dict[str, set[str]] = {}
        for task_id, node in failed_rows:
            failed_on.setdefault(task_id, set()).add(node)

        def waiting(row: Any) -> PendingTask:
            task = _pending(row, config.prediction_margin)
            task.failed_on = tuple(sorted(failed_on.get(task.request.task_id, ())))
            return task

        scheduler.restore(
            nodes=[
                (
                    NodeTopology.model_validate(r.topology),
                    NodeCondition(r.condition),
                    r.last_heartbeat_at,
                )
                for r in node_rows
            ],
            cordons={r.node_id: r.cordons for r in node_rows if r.cordons},
            allocations=[
                Allocation(
                    r.allocation_id,
                    r.task_id,
                    r.node,
                    tuple(r.gpu_ids),
                    tuple(r.cpu_cores),
                    r.memory_mb,
                    _aware(r.reservation_expires_at),
                    running=r.running,
                    tenant=r.tenant,
                    usage=Usage.of(_pending(r, config.prediction_margin).demand),
                    user=r.request.get("user"),
                    priority=_pending(r, config.prediction_margin).priority,
                    preemptible=bool(r.request["preemptible"]),
                    granted_seq=r.seq,
                    group=r.request["anti_affinity"]["group"],
                    gpu_milli=_pending(r, config.prediction_margin).demand.gpu_milli or 1000,
                    mig_profile=_pending(r, config.prediction_margin).demand.mig_profile,
                    pool=r.request["pool"],
                    gang_index=r.gang_index,
                    yield_by=_aware(r.yield_by) if r.yield_by is not None else None,
                    armed=r.armed,
                    attempt=r.attempt,
                    heartbeat_grace=r.heartbeat_grace_seconds,
                    task=waiting(r),
                    # on a card lent during a CPU phase: its grant said so to the replica
                    lent_by=(r.environment or {}).get("CRATER_LENT_BY"),
                    granted_at=_aware(r.granted_at),
                    time_limited=bool(r.time_limited),
                    # the SSD chosen with the GPUs: its grant told the task (and the space held)
                    disk=(disk := (r.environment or {}).get("CRATER_SSD_DEVICE")),
                    disk_gb=_pending(r, config.prediction_margin).demand.disk_gb if disk else 0,
                )
                for r in alloc_rows
            ],
            pending=[waiting(r) for r in pending_rows],
            next_seq=(max_seq or 0) + 1,
            early_cancels=sorted(waiting_cancels),
            budget_holds=[TenantBudgetExceeded.model_validate(h) for h in holds],
            victims=[(task_id, pool, _aware(when)) for task_id, pool, when in victim_rows],
        )
        return scheduler

    async def task_summaries(self, query: TasksQuery) -> list[TaskSummary]:
        statement = select(tasks).order_by(tasks.c.seq.desc()).limit(query.limit)
        if query.task_id is not None:
            statement = statement.where(tasks.c.task_id == query.task_id)
        if query.task_ids is not None:
            statement = statement.where(tasks.c.task_id.in_(query.task_ids))
        if query.status is not None:
            statement = statement.where(tasks.c.status == query.status.value)
        if query.tenant is not None:
            statement = statement.where(tasks.c.tenant == query.tenant)
        if query.pool is not None:
            statement = statement.where(tasks.c.pool == query.pool)
        if query.search is not None:
            statement = statement.where(
                func.lower(tasks.c.task_id).contains(query.search.lower(), autoescape=True)
            )
        rows = (await self.session.execute(statement)).all()
        one = query.task_id is not None
        return [
            TaskSummary(
                task_id=r.task_id,
                task_type=r.task_type,
                status=r.status,
                pool=r.pool,
                tenant=r.tenant,
                priority=r.priority,
                gpus=r.gpus,
                node=r.node,
                gpu_ids=r.gpu_ids or [],
                reason=r.reason,
                submitted_at=_aware(r.submitted_at),
                updated_at=_aware(r.updated_at),
                attempt=r.attempt,
                history=await self._history(r.task_id) if one else [],
                allocations=await self._held(r.task_id) if one else [],
                predicted=_peaks(prediction),
                prediction=prediction if one else None,
            )
            for r in rows
            for prediction in (_prediction(r.prediction),)
        ]

    async def allocation(self, allocation_id: str) -> Any | None:
        """One allocation's stored row, held or released; None: no such allocation."""
        return (
            await self.session.execute(
                select(allocations).where(allocations.c.allocation_id == allocation_id)
            )
        ).first()

    async def _held(self, task_id: str) -> list[HeldAllocation]:
        """What the task holds now, a gang's members by rank; empty when it holds nothing."""
        rows = (
            await self.session.execute(
                select(allocations)
                .where(allocations.c.task_id == task_id, allocations.c.released_at.is_(None))
                .order_by(allocations.c.gang_index)
            )
        ).all()
        return [
            HeldAllocation(
                allocation_id=r.allocation_id,
                node=r.node,
                gpu_ids=r.gpu_ids,
                cpu_cores=r.cpu_cores,
                numa_node=r.numa_node,
                memory_mb=r.memory_mb,
                checkpoint_path=r.checkpoint_path,
                gang_index=r.gang_index,
                attempt=r.attempt,
                running=r.running,
                reservation_token=r.reservation_token,
                reservation_expires_at=_aware(r.reservation_expires_at),
                environment=r.environment or {},
            )
            for r in rows
        ]

    async def _history(self, task_id: str) -> list[AttemptRecord]:
        """The task's placements, oldest first (a gang's first members)."""
        rows = (
            await self.session.execute(
                select(allocations)
                .where(allocations.c.task_id == task_id, allocations.c.gang_index == 0)
                .order_by(allocations.c.attempt, allocations.c.granted_at)
            )
        ).all()
        return [
            AttemptRecord(
                attempt=r.attempt,
                allocation_id=r.allocation_id,
                node=r.node,
                gpu_ids=r.gpu_ids,
                granted_at=_aware(r.granted_at),
                released_at=_aware(r.released_at) if r.released_at is not None else None,
                release_reason=r.release_reason,
            )
            for r in rows
        ]


def _pending(row: Any, margin: float = PREDICTION_MARGIN) -> PendingTask:
    request = TaskRequest.model_validate(row.request)
    prediction = ResourcePrediction.model_validate(row.prediction) if row.prediction else None
    seq, reason = getattr(row, "seq", 0), getattr(row, "reason", None)
    submitted = getattr(row, "submitted_at", None)
    not_before = getattr(row, "not_before", None)
    announced_at = getattr(row, "pending_at", None)
    kind = getattr(row, "pending_kind", None)
    return PendingTask(
        request,
        prediction,
        Demand.of(request, prediction, margin),
        seq,
        reason,
        nominated=_nominated(row),
        submitted_at=_aware(submitted) if submitted is not None else None,
        escalated=bool(getattr(row, "escalated", False)),
        attempt=getattr(row, "task_attempt", None) or getattr(row, "attempt", 1) or 1,
        not_before=_aware(not_before) if not_before is not None else None,
        # a task announced before these were kept counts as announced at its submission
        told_kinds=_told_kinds(kind),
        announced_at=_aware(announced_at)
        if announced_at is not None
        else _aware(submitted)
        if submitted is not None
        else None,
    )


def _told_kinds(stored: Any) -> tuple[frozenset[str], ...]:
    """The kinds of reason a waiting task was told of, as stored: a list of filter lists, the
    latest last (or, from before, one list); a task from before any was kept: one empty kind,
    so it counts as told it waits."""
    if not stored:
        return (frozenset(),)
    if all(isinstance(kind, list) for kind in stored):
        return tuple(frozenset(kind) for kind in stored)
    return (frozenset(stored),)


def _armed_expiry(core: Scheduler | None, event: ReservationArmed) -> datetime:
    """The reservation's end as the core set it on arming."""
    head = core.allocations.get(event.task_id) if core is not None else None
    for member in head.members() if head is not None else ():
        if member.allocation_id == event.allocation_id:
            return member.expires_at
    config = core.config if core is not None else SchedulerConfig()
    return event.occurred_at + config.reservation_for(None)


def _nominated(row: Any) -> tuple[str, ...]:
    """Where victims yield for the task; rows from before gangs preempted name one node."""
    nodes = getattr(row, "nominated_nodes", None)
    if nodes:
        return tuple(nodes)
    node = getattr(row, "nominated_node", None)
    return (node,) if node else ()


def _aware(moment: datetime) -> datetime:
    # SQLite hands back naive datetimes; they were written in UTC.
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _prediction(stored: Any) -> ResourcePrediction | None:
    return ResourcePrediction.model_validate(stored) if stored else None


def _peaks(prediction: ResourcePrediction | None) -> PredictedPeaks | None:
    if prediction is None:
        return None
    return PredictedPeaks(
        gpu_memory_per_gpu_mb=prediction.gpu_memory_per_gpu_mb,
        host_memory_mb=prediction.host_memory_mb,
        confidence=prediction.confidence,
    )
