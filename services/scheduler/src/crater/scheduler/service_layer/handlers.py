"""The scheduler's one use case: an event comes in, the core decides, the change and the events
it causes commit together (outbox), and only then is the message acknowledged."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from sqlalchemy import select
from sqlalchemy.ext.asyncio import async_sessionmaker

from crater.contracts import (
    AllocationCheck,
    AllocationGranted,
    AllocationQuery,
    AuditExplainAnswer,
    AuditExplainQuery,
    AuditStep,
    Confidence,
    ConfigApplied,
    ConfigApply,
    Event,
    FieldError,
    NodeHealthReported,
    NodeSummary,
    NodeTopologyReported,
    PlacementAnswer,
    PlacementQuery,
    PoolsAnswer,
    PoolsQuery,
    ReplicasRequested,
    ResourcePrediction,
    TaskPending,
    TaskPlacementAnswer,
    TaskPlacementQuery,
    TaskProfiled,
    TaskRejected,
    TaskRequest,
    TasksQuery,
    TaskStartEstimated,
    TaskStatus,
    TaskStatusReported,
    TaskSummary,
    TraceContext,
    derived_event_id,
)
from crater.contracts.tasks import DEFAULT_HOST_MEMORY_MB
from crater.runtime.bus import Rejections, subject_of
from crater.runtime.db import write_transaction
from crater.runtime.leadership import Deposed
from crater.runtime.outbox import (
    IN_LIST_LIMIT,
    OutboxRelay,
    TaskSequencer,
    first_deliveries,
    stage,
)
from crater.runtime.unit_of_work import unit_of_work
from crater.scheduler import audit
from crater.scheduler.adapters import fence
from crater.scheduler.adapters.config_watch import ConfigWatch, with_files
from crater.scheduler.adapters.orm import inbox, outbox
from crater.scheduler.adapters.pools_file import parse_pools
from crater.scheduler.adapters.quotas_file import parse_quotas
from crater.scheduler.adapters.repository import SchedulerRepository
from crater.scheduler.adapters.yaml_spec import SpecError
from crater.scheduler.audit import CORE, LEADER, SERVICE, AuditLog
from crater.scheduler.domain.core import Scheduler, SchedulerConfig
from crater.scheduler.domain.demand import Demand
from crater.scheduler.domain.inputs import ReservationArmed
from crater.scheduler.domain.phases import phase_state
from crater.scheduler.domain.pools import PoolPolicy
from crater.scheduler.domain.quotas import QUOTA_FIELDS, TenantQuotas, Usage
from crater.scheduler.domain.tokens import token_allocation, token_refusal
from crater.scheduler.domain.views import node_summaries, pool_summaries
from crater.scheduler.sim.forecast import Estimate, Forecast, Told, run_forward, worth_telling
from crater.scheduler.sim.forecast import snapshot as forecast_snapshot

log = logging.getLogger("crater.scheduler")

# Telemetry repeats itself by nature and applying it twice changes nothing: no inbox for it
# (nor for a grant read back: arming twice arms once). What the core decides on such an event
# may still repeat a decision already staged (the same event delivered again after a crash
# between commit and ack): those are left out by their id, see `_not_staged_before`.
IDEMPOTENT_BY_NATURE = (NodeTopologyReported, NodeHealthReported, ReservationArmed)

# The most records of one task's story an audit explain query reads (the rest: the CLI).
EXPLAIN_MAX_RECORDS = 1_000


# Fine below 10 ms: the targets are p99 < 2 ms at 1,000 nodes and < 10 ms at 10,000.
DECISION_BUCKETS = tuple(
    ms / 1000 for ms in (0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 7.5, 10, 25, 50, 100, 500)
)


class SchedulerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.decision_seconds = Histogram(
            "crater_scheduler_decision_seconds",
            "Time the scheduling core took to decide on one event.",
            buckets=DECISION_BUCKETS,
            registry=registry,
        )
        self.batch_size = Histogram(
            "crater_scheduler_batch_events",
            "Events decided and committed in one database transaction.",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
            registry=registry,
        )
        self.decisions = Counter(
            "crater_scheduler_decisions",
            "Decisions taken, by kind.",
            ["kind"],
            registry=registry,
        )
        self.pending = Gauge(
            "crater_scheduler_pending_tasks", "Tasks waiting for resources.", registry=registry
        )
        self.allocations = Gauge(
            "crater_scheduler_active_allocations", "Allocations held now.", registry=registry
        )
        self.nodes = Gauge("crater_scheduler_nodes", "Nodes known.", registry=registry)
        self.estimates_told = Counter(
            "crater_scheduler_estimates_told",
            "Start estimates told of waiting tasks (task.estimated): first known, or moved.",
            registry=registry,
        )
        self.quota = Gauge(
            "crater_tenant_quota",
            "A tenant's quota (quotas file), by resource (gpus, gpu_memory_mb, cpu_cores, "
            "memory_mb); a resource without a limit has no series.",
            ["tenant", "resource"],
            registry=registry,
        )
        self.quota_used = Gauge(
            "crater_tenant_quota_used",
            "What a tenant holds now, by the resource its quota counts (a shared card counts "
            "its share).",
            ["tenant", "resource"],
            registry=registry,
        )
        self.placement_wait = Histogram(
            "crater_task_placement_wait_seconds",
            "How long tasks waited from reaching the scheduler to their (first attempt's) "
            "placement, by pool; a gang once.",
            ["pool"],
            buckets=(0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 24 * 3600),
            registry=registry,
        )
        self.budget_held = Gauge(
            "crater_tenant_budget_held",
            "1 while a tenant's hard budget holds its work not yet placed (tenant.budget_"
            "exceeded), until its period ends or the budget is raised; no series otherwise.",
            ["tenant"],
            registry=registry,
        )
        self.from_the_future = Counter(
            "crater_scheduler_events_from_the_future",
            "Events dated further ahead of this scheduler's clock than the allowed skew: "
            "refused, so they cannot move the core's clock.",
            ["kind"],
            registry=registry,
        )
        self.config_reloads = Counter(
            "crater_scheduler_config_reloads",
            "Pools/quotas files changed on disk and read again, by outcome: applied, or "
            "refused (invalid, or a change that needs a restart; the running one kept).",
            ["outcome"],
            registry=registry,
        )
        self.preemptions_held = Counter(
            "crater_scheduler_preemptions_held",
            "Preemptions held back, by rule: min_run (victims under their pool's minimum run "
            "time), victim_cooldown (victims preempted lately), unproven (no set of victims "
            "would make room for the whole task); once per wait while the reason holds.",
            ["rule"],
            registry=registry,
        )
        self.drift = Counter(
            "crater_scheduler_drift",
            "What the periodic reconciliation found apart between the ledger and reality, by "
            "kind (orphaned-allocation, unknown-allocation, unknown-process, over-capacity, "
            "ledger-mismatch) "
            "and what was done (released, held, freed, reported, corrected); each is an "
            "allocation.drift event saying why.",
            ["kind", "action"],
            registry=registry,
        )
        self.ageing_steps = Counter(
            "crater_scheduler_ageing_steps",
            "Steps waiting tasks rose in the queue for their wait (ageing).",
            registry=registry,
        )
        self.repeated_decisions = Counter(
            "crater_scheduler_repeated_decisions",
            "Decisions left out because an earlier delivery of the same event staged them.",
            registry=registry,
        )


@dataclass
class Waiting:
    """An event waiting to be decided and committed with the batch it arrived in."""

    event: Event
    consumer: str
    outcome: asyncio.Future[list[Event]]
    # The context its message came with (a batch consumer's): what its decisions carry, so a
    # task's trace goes on through the scheduler. None: the span handling it (per message).
    trace: TraceContext | None = None


class SchedulerService:
    def __init__(
        self,
        sessions: async_sessionmaker[Any],
        relay: OutboxRelay,
        config: SchedulerConfig,
        metrics: SchedulerMetrics,
        rejections: Rejections | None = None,
        max_clock_skew_seconds: float = 30.0,
        audit: AuditLog | None = None,
        watch: ConfigWatch | None = None,
        estimate_interval_seconds: float = 10.0,
        estimate_tell_interval_seconds: float = 300.0,
    ) -> None:
        self.sessions = sessions
        self.watch = watch
        self.relay = relay
        self.config = config
        self.metrics = metrics
        self.rejections = rejections
        # The core's clock is the latest event time it saw: one event from the future would
        # move it for good (every node NotReady, every reservation expired).
        self.max_skew = timedelta(seconds=max_clock_skew_seconds)
        self.scheduler = Scheduler(config=config)
        # Numbers each task's lifecycle events, so the callback can deliver them in order.
        self.sequencer = TaskSequencer(outbox)
        # One decision at a time: the core is single-threaded by design (determinism).
        self.lock = asyncio.Lock()
        # One audit explain at a time: its replays share the GIL with the live core.
        self.explaining = asyncio.Lock()
        self.arrived: list[Waiting] = []  # events waiting for the next batch commit
        # Task reports the core refused (a wrong or missing token), said once committed.
        self.refused: list[tuple[TaskStatusReported, FieldError]] = []
        # The epoch this process leads with (crater.runtime.leadership); None: it does not
        # lead, and no decision commits (adapters/fence.py).
        self.epoch: int | None = None
        self.on_deposed: Callable[[], None] = lambda: None
        # Every input the core decides on and every decision, in the core's order, written in
        # the decision's transaction (crater.scheduler.audit).
        self.audit = audit or AuditLog()
        # The core was (re)loaded from the tables: the next commit records the configuration
        # it runs and a snapshot of it, so a replay goes on from the state it really had.
        self.reset_due = False
        # Start estimates (sim/forecast.py): the last one and when it was made (monotonic),
        # made again on a query at most once per interval, one at a time.
        self.estimate_interval = estimate_interval_seconds
        self.forecast: Forecast | None = None
        self.forecast_made = 0.0
        self.forecasting = asyncio.Lock()
        # Telling waiting tasks' estimates (task.estimated, a `pending` webhook): at most once
        # per this interval (0: never), after a commit; what was told last, per task.
        self.tell_interval = estimate_tell_interval_seconds
        self.told: dict[str, Told] = {}
        self.told_checked = 0.0
        self.telling: asyncio.Task[list[Event]] | None = None

    async def load(self) -> None:
        async with self.sessions() as session:
            self.scheduler = await SchedulerRepository(session).load(self.config)
        self.reset_due = True
        self.sequencer.reset()
        self._observe()
        log.info(
            "state loaded: %d nodes, %d allocations, %d pending",
            len(self.scheduler.cluster),
            len(self.scheduler.allocations),
            len(self.scheduler.pending),
        )

    async def take_over(self, epoch: int, holder: str) -> None:
        """Lead with `epoch`: the database's fence first (from now on a deposed leader's
        commits are refused, and one in flight has landed), then the state as committed."""
        async with write_transaction(self.sessions) as session:
            connection = await session.connection()
            await fence.claim(connection, epoch, holder)
            # The log says where a leader began: its core was loaded from the tables here.
            self.audit.begin()
            body = json.dumps({"epoch": epoch, "holder": holder})
            self.audit.add(LEADER, None, [], epoch, kind="TakeOver", body=body)
            await self.audit.flush(connection)
        await self.load()
        self.epoch = epoch
        self.told_checked = time.monotonic()  # the first look one interval after taking over

    async def handle(self, event: Event, consumer: str) -> list[Event]:
        """Decide on `event` and commit; returns once its commit is done (then the message is
        acked). Events that arrive while a commit runs (a pull batch is handled concurrently)
        wait and then commit together, in arrival order: one transaction, one fsync, for many
        messages instead of one each."""
        if event.occurred_at - datetime.now(UTC) > self.max_skew:
            await self._refuse_future(event)
            return []
        waiting = Waiting(event, consumer, asyncio.get_running_loop().create_future())
        self.arrived.append(waiting)
        if len(self.arrived) == 1:
            # The rest of a pull batch is handled by tasks that are ready to run: let them
            # arrive too, so the first message does not commit alone.
            await asyncio.sleep(0)
        async with self.lock:
            if not waiting.outcome.done():
                batch, self.arrived = self.arrived, []
                await self._commit(batch)
        return waiting.outcome.result()

    async def handle_batch(
        self, consumer: str, arrivals: Sequence[tuple[Event, TraceContext | None]]
    ) -> list[BaseException | None]:
        """A batch consumer's pull batch, each event with the trace context it came with:
        decided and committed, in order, in one transaction with whatever else arrived
        meanwhile. Returns each event's outcome: None once committed (its message is then
        acked), else why not; a failing commit is tried again event by event (`_commit`), so
        only an event to blame fails. An event's decisions carry its own trace context."""
        loop = asyncio.get_running_loop()
        now = datetime.now(UTC)
        waiting: list[Waiting | None] = []
        for event, trace in arrivals:
            if event.occurred_at - now > self.max_skew:
                waiting.append(None)  # refused below, never decided
                continue
            waiting.append(Waiting(event, consumer, loop.create_future(), trace))
        self.arrived.extend(w for w in waiting if w is not None)
        async with self.lock:
            if any(w is not None and not w.outcome.done() for w in waiting):
                batch, self.arrived = self.arrived, []
                await self._commit(batch)
        outcomes: list[BaseException | None] = []
        for (event, _), arrived in zip(arrivals, waiting, strict=True):
            if arrived is not None:
                outcomes.append(arrived.outcome.exception())
                continue
            try:
                await self._refuse_future(event)
                outcomes.append(None)
            except Exception as error:  # the refusal could not be said: delivered again
                outcomes.append(error)
        return outcomes

    async def _commit(self, batch: list[Waiting]) -> None:
        self.metrics.batch_size.observe(len(batch))
        try:
            outcomes = await self._decide_and_commit(batch)
        except Deposed as error:
            # Another leads now: nothing was committed; the messages go back (nacked) to the
            # durable consumers, where the new leader takes them.
            log.error("refused by the fence: %s", error)
            self.epoch = None
            self.on_deposed()
            for waiting in batch:
                waiting.outcome.set_exception(error)
        except Exception as error:
            # The commit failed after the core changed its mind: go back to what is stored.
            self.refused = []  # decided again, on the redelivery
            await self.load()
            if len(batch) == 1:
                batch[0].outcome.set_exception(error)  # redelivered
                return
            for waiting in batch:  # each alone, so only a message to blame is redelivered
                await self._commit([waiting])
        else:
            self.reset_due = False  # the restored state is in the log now
            for waiting, decisions in zip(batch, outcomes, strict=True):
                waiting.outcome.set_result(decisions)
            refused, self.refused = self.refused, []
            for report, refusal in refused:
                await self._refuse_report(report, refusal)
            decided = [d for decisions in outcomes for d in decisions]
            if decided:
                self.relay.wake()
                self._log(decided)
            self._observe()
            self._tell_estimates_when_due()
        finally:
            for waiting in batch:  # cancelled (shutdown): the others are not left waiting
                if not waiting.outcome.done():
                    waiting.outcome.set_exception(RuntimeError("the commit was interrupted"))

    async def _decide_and_commit(self, batch: list[Waiting]) -> list[list[Event]]:
        """The batch in one transaction, each statement once for the batch where it can be
        (inbox, duplicate tasks, sequence numbers, outbox) rather than once per event. The
        process's other writers (the outbox relay) wait their turn (`write_transaction`)."""
        async with write_transaction(self.sessions) as session:
            # Core statements only: the connection skips the ORM session's per-statement work.
            connection = await session.connection()
            await fence.check(connection, self.epoch)  # first: a deposed leader writes nothing
            self.audit.begin()
            if self.reset_due:  # before any decision: the state as it was loaded
                self.audit.add_config(audit.CONFIG_LOADED, self.config, self.epoch)
                self.audit.add_snapshot(audit.RESTORED, self.scheduler, self.epoch)
            repository = SchedulerRepository(connection)
            checked = [
                i for i, w in enumerate(batch) if not isinstance(w.event, IDEMPOTENT_BY_NATURE)
            ]
            firsts = await first_deliveries(
                connection, inbox, [(batch[i].consumer, batch[i].event.event_id) for i in checked]
            )
            fresh = [True] * len(batch)
            for i, first in zip(checked, firsts, strict=True):
                fresh[i] = first
            seen: set[UUID] = set()
            for i, waiting in enumerate(batch):  # one event twice in a batch: decided once
                fresh[i] = fresh[i] and waiting.event.event_id not in seen
                seen.add(waiting.event.event_id)
            known = await repository.task_states(
                [
                    w.event.task.task_id
                    for w, f in zip(batch, fresh, strict=True)
                    if f and isinstance(w.event, TaskProfiled)
                ]
            )
            outcomes = []
            for waiting, first in zip(batch, fresh, strict=True):
                outcomes.append(
                    await self._decide(repository, waiting.event, known) if first else []
                )
            await repository.flush()  # the batch's rows, a statement at a time
            traced = [
                d.model_copy(update={"trace": w.trace}) if w.trace and d.trace is None else d
                for w, decisions in zip(batch, outcomes, strict=True)
                for d in decisions
            ]
            stamped = await self.sequencer.stamp(connection, traced)
            await stage(connection, outbox, *stamped)
            await self.audit.flush(connection, self.scheduler)  # a periodic snapshot when due
            numbered = iter(stamped)
            decided = [[next(numbered) for _ in decisions] for decisions in outcomes]
        self.audit.committed()  # the next batch chains from this one's head, unread
        return decided

    async def _decide(
        self, repository: SchedulerRepository, event: Event, known: dict[str, str]
    ) -> list[Event]:
        """One new event inside the batch's transaction: decide and record. `known` holds the
        task ids stored or recorded so far in this batch, each with its status."""
        if isinstance(event, TaskProfiled):
            task_id = event.task.task_id
            if task_id in known:
                # The same task id under a new event id (a redelivery never gets here: the
                # inbox): refused aloud, outside the core and the task's row, which stay as
                # they are.
                refused: list[Event] = [
                    duplicate_submission(event.event_id, task_id, known[task_id])
                ]
                self.audit.add(SERVICE, event, refused, self.epoch)
                return refused
            known[task_id] = TaskStatus.PENDING.value
        if isinstance(event, TaskStatusReported):
            refusal = self.scheduler.report_refusal(event)
            if refusal is not None:  # the core leaves it too; nothing is recorded
                self.audit.add(SERVICE, event, [], self.epoch)  # but the log says it came
                self.refused.append((event, refusal))
                return []
        self.reload()
        seq = self.scheduler.next_seq
        started = time.perf_counter()
        decisions = self.scheduler.handle(event)
        self.metrics.decision_seconds.observe(time.perf_counter() - started)
        # Every input, a heartbeat that changed nothing too: it moved the core's clock.
        self.audit.add(CORE, event, decisions, self.epoch)
        if isinstance(event, TaskProfiled):
            known[event.task.task_id] = _status_after(event.task.task_id, decisions)
        if isinstance(event, NodeHealthReported) and not decisions:
            return []  # a heartbeat like the last one: nothing to store
        if decisions and isinstance(event, IDEMPOTENT_BY_NATURE):
            decisions = await self._not_staged_before(repository, decisions)
        await repository.record(event, decisions, seq, self.scheduler)
        return decisions

    async def _not_staged_before(
        self, repository: SchedulerRepository, decisions: list[Event]
    ) -> list[Event]:
        """`decisions` (on an event that has no inbox) without those already in the outbox:
        the same event delivered again repeats them (their ids derive from it). Recording and
        staging them again would break the unique keys and fail the batch."""
        ids = [str(d.event_id) for d in decisions]
        staged: set[str] = set()
        for start in range(0, len(ids), IN_LIST_LIMIT):
            rows = await repository.session.execute(
                select(outbox.c.event_id).where(
                    outbox.c.event_id.in_(ids[start : start + IN_LIST_LIMIT])
                )
            )
            staged.update(event_id for (event_id,) in rows)
        if not staged:
            return decisions
        self.metrics.repeated_decisions.inc(len(staged))
        return [d for d in decisions if str(d.event_id) not in staged]

    async def _refuse_future(self, event: Event) -> None:
        """An event dated too far ahead: counted and refused by name; the core never sees it."""
        kind = type(event).__name__
        self.metrics.from_the_future.labels(kind=kind).inc()
        if self.rejections is None:
            return
        ahead = (event.occurred_at - datetime.now(UTC)).total_seconds()
        await self.rejections.reject(
            subject_of(event) if not isinstance(event, ReservationArmed) else "",
            event.model_dump_json().encode(),
            [
                FieldError(
                    field="occurred_at",
                    reason=f"{ahead:.0f} s ahead of the scheduler's clock; at most "
                    f"{self.max_skew.total_seconds():g} s of skew is accepted",
                )
            ],
        )

    async def _refuse_report(self, report: TaskStatusReported, refusal: FieldError) -> None:
        """A task report refused by the core (a wrong or missing token): said by name, once
        (its redelivery stops at the inbox)."""
        log.warning(
            "refused a %s report of %s (allocation %s): %s: %s",
            report.status.value,
            report.task_id,
            report.allocation_id,
            refusal.field,
            refusal.reason,
        )
        if self.rejections is None:
            return
        await self.rejections.reject(
            subject_of(report),
            report.model_dump_json(exclude={"reservation_token"}).encode(),
            [refusal],
            error_class="ReportRefused",  # refused at once, never retried (kind decode)
        )

    async def check_allocation(self, query: AllocationQuery) -> AllocationCheck:
        """Would a launcher's report about `query.allocation_id` with its token be taken now?
        An allocation held now is judged by the core (`report_refusal`); a released one by
        its stored row, with the same token function."""
        allocation_id, token = query.allocation_id, query.reservation_token
        if token_allocation(token) != allocation_id:  # malformed, or another allocation's
            why = token_refusal(self.config.token_secret, token, allocation_id, "", "")
            return AllocationCheck(allocation_id=allocation_id, verdict="forged", reason=why)
        live = self.scheduler.allocation_check(allocation_id, token, datetime.now(UTC))
        if live is not None:
            member, refusal = live
            phase = self.scheduler.phases.get(member.task_id)
            if phase is not None and phase.allocation_id != allocation_id:
                phase = None  # another member's (never: a gang does not lend) or attempt's
            found = AllocationCheck(
                allocation_id=allocation_id,
                verdict="accepted",
                task_id=member.task_id,
                node=member.node,
                running=member.running,
                reservation_expires_at=member.expires_at,
                lending=None if phase is None else phase_state(phase),
                must_be_free_by=None if phase is None else phase.must_be_free_by,
            )
            if refusal is None:
                return found
            verdict = "expired" if refusal.reason.startswith("expired") else "forged"
            return found.model_copy(update={"verdict": verdict, "reason": refusal.reason})
        async with self.sessions() as session:
            row = await SchedulerRepository(session).allocation(allocation_id)
        if row is None:
            return AllocationCheck(
                allocation_id=allocation_id,
                verdict="unknown",
                reason=f"no allocation {allocation_id!r} was ever granted",
            )
        stored = AllocationCheck(
            allocation_id=allocation_id,
            verdict="released",
            task_id=row.task_id,
            node=row.node,
            running=row.running,
            reservation_expires_at=_utc(row.reservation_expires_at),
        )
        why = token_refusal(self.config.token_secret, token, allocation_id, row.task_id, row.node)
        if why is not None:
            return stored.model_copy(update={"verdict": "forged", "reason": why})
        if row.release_reason == "expired":
            reason = (
                f"expired: the reservation of allocation {allocation_id!r} ended unconfirmed at "
                f"{_utc(row.reservation_expires_at):%Y-%m-%dT%H:%M:%SZ} and it was released"
            )
            return stored.model_copy(update={"verdict": "expired", "reason": reason})
        released = (
            "" if row.released_at is None else f" at {_utc(row.released_at):%Y-%m-%dT%H:%M:%SZ}"
        )
        reason = (
            f"allocation {allocation_id!r} of task {row.task_id!r} is no longer held: released "
            f"({row.release_reason or 'ended'}){released}"
        )
        return stored.model_copy(update={"reason": reason})

    async def request_replicas(self, event: ReplicasRequested, consumer: str) -> list[Event]:
        """Turn the autoscaler's request into one task.profiled per new replica, copying the
        template replica's request: they come back through the normal path, and the log shows
        where each replica came from. A fleet keeps a template while any of its tasks is
        stored: the named template, else the service's latest task (`anti_affinity.group`),
        ended or not; with neither, each replica is refused naming the service and why."""
        try:
            return await self._request_replicas(event, consumer)
        except Deposed:
            self.epoch = None
            self.on_deposed()
            raise

    async def _request_replicas(self, event: ReplicasRequested, consumer: str) -> list[Event]:
        async with (
            self.lock,
            unit_of_work(self.sessions, inbox, consumer, event.event_id, outbox) as work,
        ):
            if not work.first:
                return []
            session = work.session
            await fence.check(await session.connection(), self.epoch)
            repository = SchedulerRepository(session)
            named = event.template_task_id
            template = await repository.task_request(named) if named else None
            fallback: str | None = None  # the service's task copied instead
            if template is None and (found := await repository.service_template(event.service)):
                fallback, template = found[0], (found[1], found[2])
            known = await repository.task_states(event.task_ids)
            staged: list[Event] = []
            for task_id in event.task_ids:
                event_id = derived_event_id(event.event_id, f"replica:{task_id}")
                if task_id in known:
                    # A new request (a redelivery stops at the inbox) naming a known task:
                    # refused aloud, the known task untouched.
                    staged.append(duplicate_submission(event_id, task_id, known[task_id]))
                    continue
                if template is None:
                    staged.append(
                        TaskRejected(
                            event_id=event_id,
                            task_id=task_id,
                            errors=[
                                FieldError(
                                    field="template_task_id",
                                    reason=_no_template(event.service, named),
                                )
                            ],
                        )
                    )
                    continue
                request, prediction = template
                staged.append(
                    TaskProfiled(
                        event_id=event_id,
                        task=request.model_copy(update={"task_id": task_id}),
                        prediction=prediction or _no_prediction(request),
                    )
                )
            if fallback is not None:
                log.info(
                    "replicas of %s copy %s: %s",
                    event.service,
                    fallback,
                    f"template {named!r} is not known" if named else "no template was named",
                )
            self.audit.begin()
            self.audit.add(SERVICE, event, staged, self.epoch)
            await self.audit.flush(session)
            staged = await self.sequencer.stamp(session, staged)
            await work.stage(*staged)
        self.relay.wake()
        return staged

    async def tasks(self, query: TasksQuery) -> list[TaskSummary]:
        """Stored summaries, with each waiting task's live reason and its reasons per filter:
        `task.pending` is sent only when the kind of reason changes, the answer here is always
        current."""
        async with self.sessions() as session:
            summaries = await SchedulerRepository(session).task_summaries(query)
        live = self.scheduler.pending
        waiting = query.estimates and any(s.task_id in live for s in summaries)
        estimates = (await self.estimates()).estimates if waiting else {}
        return [
            s.model_copy(
                update={
                    "reason": live[s.task_id].last_summary or s.reason,
                    "reasons": list(live[s.task_id].live_reasons),
                    **estimated(estimates.get(s.task_id), self.forecast),
                }
            )
            if s.task_id in live
            else s
            for s in summaries
        ]

    async def estimates(self) -> Forecast:
        """Every waiting task's place and estimated start: made again when the last is older
        than the interval. The core is copied in a thread holding the decision lock (no
        decision changes it meanwhile, and the event loop, with the leader's lease renewals,
        is not held up: a copy of a 1,000-node core takes over a second); the copy is then run
        forward in a thread while decisions go on."""
        async with self.forecasting:
            fresh = time.monotonic() - self.forecast_made < self.estimate_interval
            if self.forecast is not None and fresh:
                return self.forecast
            started = time.monotonic()
            try:
                async with self.lock:
                    clone = await asyncio.to_thread(forecast_snapshot, self.scheduler)
                self.forecast = await asyncio.to_thread(run_forward, clone)
            except Exception:  # an estimate is advice: the query still answers without it
                log.exception("start estimates failed; answering without them")
                self.forecast = Forecast(at=self.scheduler.clock)
            self.forecast_made = time.monotonic()
            log.info(
                "start estimates for %d waiting tasks in %.3f s (%d events run forward)",
                len(self.forecast.estimates),
                self.forecast_made - started,
                self.forecast.events,
            )
            return self.forecast

    def _tell_estimates_when_due(self) -> None:
        """Start telling estimates in the background when the interval has passed since the
        last look and tasks wait (decisions go on meanwhile; one telling at a time)."""
        if not self.tell_interval or self.epoch is None or not self.scheduler.pending:
            return
        if self.telling is not None and not self.telling.done():
            return
        if time.monotonic() - self.told_checked < self.tell_interval:
            return
        self.told_checked = time.monotonic()
        self.telling = asyncio.create_task(self.tell_estimates())

    async def stop_telling(self) -> None:
        """Cancel a telling under way (stepping down, shutting down): what it had not
        committed is told by the next leader's first look."""
        if self.telling is not None and not self.telling.done():
            self.telling.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.telling

    async def tell_estimates(self, limit: int = 1_000) -> list[Event]:
        """Each start estimate that is news (`forecast.worth_telling`) of a task that has
        waited at least the interval (by the core's clock), as
        `task.estimated`, at most `limit` at once (the heads of the queues first: the rest on
        the next look). Numbered and staged under the decision lock, and only for tasks still
        waiting then: every later event of the task is numbered after it, so its `pending`
        webhook never follows the task's `scheduled`. An estimate is advice: a failure is
        logged and the next look tries again."""
        try:
            forecast = await self.estimates()
            async with self.lock:
                if self.epoch is None or forecast.at is None:
                    return []
                pending = self.scheduler.pending
                for task_id in [t for t in self.told if t not in pending]:
                    del self.told[task_id]
                # A task that waited less than the interval is no news yet: most start soon.
                settled = forecast.at - timedelta(seconds=self.tell_interval)
                news = [
                    e
                    for e in sorted(forecast.estimates.values(), key=lambda e: e.position)
                    if e.task_id in pending
                    and (pending[e.task_id].submitted_at or forecast.at) <= settled
                    and worth_telling(self.told.get(e.task_id), pending[e.task_id].attempt, e)
                ][:limit]
                if not news:
                    return []
                as_of = f" (as of {forecast.at:%Y-%m-%dT%H:%M:%SZ})"
                events: list[Event] = [
                    TaskStartEstimated(
                        event_id=uuid4(),
                        occurred_at=forecast.at,
                        task_id=e.task_id,
                        attempt=pending[e.task_id].attempt,
                        pool=e.pool,
                        queue_position=e.position,
                        estimated_start_at=e.start_at,
                        estimate=e.note + as_of,
                    )
                    for e in news
                ]
                try:
                    async with write_transaction(self.sessions) as session:
                        connection = await session.connection()
                        await fence.check(connection, self.epoch)
                        stamped = await self.sequencer.stamp(connection, events)
                        await stage(connection, outbox, *stamped)
                except BaseException:
                    self.sequencer.reset()  # its numbers were never committed
                    raise
                for e in news:
                    self.told[e.task_id] = Told(pending[e.task_id].attempt, e.start_at, forecast.at)
            self.metrics.estimates_told.inc(len(stamped))
            self.relay.wake()
            return stamped
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("telling start estimates failed; the next look tries again")
            return []

    async def explain(self, query: AuditExplainQuery) -> AuditExplainAnswer:
        """The task's story from the audit log (`crater audit explain`): its records through
        the task index, each placement replayed from the nearest snapshot before it on a core
        of its own, in a thread (the live core is not touched, the event loop not held), one
        explain at a time, within the query's budget: what does not fit is left out and said
        (`truncated`)."""
        deadline = time.monotonic() + query.budget_seconds  # waiting for the lock included
        config = self.config if query.placements else None
        async with self.explaining, self.sessions() as session:
            told = await audit.explain_log(
                session,
                query.task_id,
                config,
                max_records=EXPLAIN_MAX_RECORDS,
                max_placements=query.max_placements,
                deadline=deadline,
                offload=asyncio.to_thread,
            )
        steps = told.steps
        return AuditExplainAnswer(
            task_id=query.task_id,
            truncated=told.truncated,
            notes=told.notes,
            records_read=told.records_read,
            events_replayed=told.events_replayed,
            replayed_from=told.replayed_from,
            steps=[
                AuditStep(
                    seq=s.seq,
                    decided_at=s.decided_at,
                    epoch=s.epoch,
                    source=s.source,
                    input_kind=s.input_kind,
                    input_occurred_at=s.input_occurred_at,
                    decision_kind=s.decision["kind"] if s.decision else None,
                    decision=s.decision["event"] if s.decision else None,
                    placement=TaskPlacementAnswer.model_validate(s.placement)
                    if s.placement
                    else None,
                )
                for s in steps
            ],
        )

    def dry_run(self, query: PlacementQuery) -> PlacementAnswer:
        demand = Demand.of_query(query)
        return self.scheduler.dry_run(demand)

    def dry_run_task(self, query: TaskPlacementQuery) -> TaskPlacementAnswer:
        return self.scheduler.dry_run_task(query.task, query.prediction)

    def nodes(self, pool: str | None) -> list[NodeSummary]:
        return node_summaries(self.scheduler.cluster, pool)

    def pools(self, query: PoolsQuery) -> PoolsAnswer:
        return pool_summaries(self.scheduler, query.pool, query.tenant)

    def reload(self) -> str | None:
        """Take the pools and quotas files again when they changed on disk (see
        `adapters.config_watch`): applied from this event on, or refused with the field and
        the reason, the running configuration kept. Returns why it was refused, if it was."""
        if self.watch is None:
            return None
        found = self.watch.poll(self.config)
        if found is None:
            return None
        why = found.refused
        if found.config is not None:
            why = self.scheduler.reconfigure(found.config)
            if why is None:
                self.config = found.config  # a reload of the state (take-over) keeps it
                # in the log before the event it first decides: a replay reloads it there
                self.audit.add_config(audit.CONFIG_RELOADED, found.config, self.epoch)
                self.metrics.config_reloads.labels(outcome="applied").inc()
                log.info(
                    "pools and quotas reloaded: %d pools, %d tenant quotas",
                    len(found.config.pools),
                    len(found.config.quotas),
                )
                return None
        self.metrics.config_reloads.labels(outcome="refused").inc()
        log.warning("pools/quotas file refused, the running configuration kept: %s", why)
        body = json.dumps({"reason": why})
        self.audit.add(SERVICE, None, [], self.epoch, kind=audit.CONFIG_REFUSED, body=body)
        return why

    async def apply_config(self, request: ConfigApply) -> ConfigApplied:
        """A pools or quotas file sent over the API (the gateway's admin routes): validated,
        then applied from the next event on exactly as a changed file is (`reload`), its
        configuration record committed first; or refused naming each field, the running
        configuration kept. Either way the audit log says so. The file on disk is not written
        (docs/pools.md, "Reloading over the API", says why)."""
        origin = f"{request.file} (API)"
        pools: dict[str, PoolPolicy] | None = None
        tenants: TenantQuotas | None = None
        try:
            if request.file == "pools":
                pools = parse_pools(request.text, origin)
            else:
                tenants = parse_quotas(request.text, origin)
        except SpecError as error:
            async with self.lock:
                return await self._config_answer(request, None, error.problems)
        async with self.lock:  # over the configuration running now, between two decisions
            running = self.config
            proposed = with_files(
                running,
                running.pools if pools is None else pools,
                tenants
                or TenantQuotas(
                    running.quotas,
                    running.tenant_shares,
                    running.user_limits,
                    running.queues,
                    running.queue_of,
                ),
            )
            why = self.scheduler.refuse_config(proposed)
            if why is not None:
                field, _, reason = why.partition(": ")
                return await self._config_answer(request, None, [(field, reason)])
            return await self._config_answer(request, proposed, [])

    async def _config_answer(
        self,
        request: ConfigApply,
        config: SchedulerConfig | None,
        problems: list[tuple[str, str]],
    ) -> ConfigApplied:
        """Record `config` (applied) or `problems` (refused) in the audit log, in their own
        transaction, then apply `config` to the core; the answer says what runs now. Called
        holding the lock: no decision commits meanwhile."""
        who = request.requested_by or "unknown"
        try:
            async with write_transaction(self.sessions) as session:
                connection = await session.connection()
                await fence.check(connection, self.epoch)  # only the leader changes its core
                self.audit.begin()
                if config is not None:
                    self.audit.add_config(audit.CONFIG_RELOADED, config, self.epoch)
                else:
                    body = json.dumps(
                        {
                            "reason": "; ".join(f"{f}: {r}" for f, r in problems),
                            "file": request.file,
                            "requested_by": who,
                        }
                    )
                    kind = audit.CONFIG_REFUSED
                    self.audit.add(SERVICE, None, [], self.epoch, kind=kind, body=body)
                await self.audit.flush(connection)
        except Deposed as error:
            self.epoch = None
            self.on_deposed()
            problems = [("scheduler", f"this scheduler no longer leads ({error}): try again")]
            config = None
        errors = [FieldError(field=f, reason=r) for f, r in problems]
        if config is None:
            self.metrics.config_reloads.labels(outcome="refused").inc()
            log.warning("%s file from %s refused: %s", request.file, who, errors)
        else:
            self.scheduler.reconfigure(config)  # refuse_config passed under the same lock
            self.config = config
            self.metrics.config_reloads.labels(outcome="applied").inc()
            log.info("%s file from %s applied over the API", request.file, who)
        running = self.config
        tenants = sorted({*running.quotas, *running.tenant_shares, *running.user_limits})
        summary = (
            f"applied: {len(running.pools)} pools, {len(tenants)} tenant quotas, from the next "
            "event on (the file on disk is unchanged)"
            if config is not None
            else "refused, the running configuration kept: "
            + "; ".join(f"{e.field}: {e.reason}" for e in errors)
        )
        return ConfigApplied(
            file=request.file,
            applied=config is not None,
            errors=errors,
            pools=sorted(running.pools),
            tenants=tenants,
            summary=summary,
        )

    def _observe(self) -> None:
        tally, self.scheduler.tally = self.scheduler.tally, collections.Counter()
        for rule, count in tally.items():
            if rule == "ageing_steps":
                self.metrics.ageing_steps.inc(count)
            elif rule.startswith("drift:"):
                _, kind, action = rule.split(":")
                self.metrics.drift.labels(kind=kind, action=action).inc(count)
            else:
                self.metrics.preemptions_held.labels(rule=rule).inc(count)
        self.metrics.pending.set(len(self.scheduler.pending))
        self.metrics.allocations.set(len(self.scheduler.allocations))
        self.metrics.nodes.set(len(self.scheduler.cluster))
        quotas = self.scheduler.quotas
        self.metrics.budget_held.clear()
        for tenant in quotas.holds:
            self.metrics.budget_held.labels(tenant=tenant).set(1)
        for tenant, quota in quotas.limits.items():
            used = quotas.used.get(tenant, Usage())
            for resource in QUOTA_FIELDS:
                limit = getattr(quota, resource)
                if limit is not None:
                    self.metrics.quota.labels(tenant=tenant, resource=resource).set(limit)
                    self.metrics.quota_used.labels(tenant=tenant, resource=resource).set(
                        getattr(used, resource)
                    )

    def _log(self, decisions: list[Event]) -> None:
        """Count the decisions by kind and log them. Cheap on the hot path: one counter
        update per kind, and the messages are formatted only if DEBUG is on (lazy %-args):
        no line per message at INFO (the events and the audit log say each decision)."""
        for kind, count in collections.Counter(type(d).__name__ for d in decisions).items():
            self.metrics.decisions.labels(kind=kind).inc(count)
        for d in decisions:
            if isinstance(d, AllocationGranted) and d.attempt == 1 and d.gang_index == 0:
                held = self.scheduler.allocations.get(d.task_id)
                waiting = held.task if held is not None else None
                if waiting is not None and waiting.submitted_at is not None:
                    seconds = (d.occurred_at - waiting.submitted_at).total_seconds()
                    self.metrics.placement_wait.labels(pool=d.pool).observe(max(0.0, seconds))
        if not log.isEnabledFor(logging.DEBUG):
            return
        for d in decisions:
            if isinstance(d, AllocationGranted):
                log.debug(
                    "placed %s on %s gpus=%s: %s", d.task_id, d.node, d.gpu_ids, d.explanation
                )
            elif isinstance(d, TaskPending):
                log.debug("pending %s: %s", d.task_id, d.summary)
            elif isinstance(d, TaskRejected):
                log.debug("rejected %s: %s", d.task_id, d.errors)


def duplicate_submission(source: UUID, task_id: str, status: str) -> TaskRejected:
    """The refusal of a submission that reuses a known task id: `duplicate` set, so it says
    nothing of the known task. Its id derives from the refused event's, so a retried commit
    publishes it once."""
    return TaskRejected(
        event_id=derived_event_id(source, "duplicate"),
        task_id=task_id,
        duplicate=True,
        errors=[FieldError(field="task_id", reason=duplicate_reason(task_id, status))],
    )


def duplicate_reason(task_id: str, status: str) -> str:
    """The gateway's 409 says the same (gateway/claims.py): a task id is never reused, for the
    scheduler keeps every task it stored."""
    return (
        f"task {task_id!r} is known already (status {status}): a task id is used once, an "
        f"ended task's too; this submission is refused and {task_id!r} is unchanged: "
        "submit under a new task_id"
    )


def estimated(estimate: Estimate | None, made: Forecast | None) -> dict[str, Any]:
    """A waiting task's summary fields from its estimate (none: nothing to add)."""
    if estimate is None or made is None:
        return {}
    as_of = f" (as of {made.at:%Y-%m-%dT%H:%M:%SZ})" if made.at is not None else ""
    return {
        "queue_position": estimate.position,
        "estimated_start_at": estimate.start_at,
        "estimate": estimate.note + as_of,
    }


def _utc(moment: datetime) -> datetime:
    """A stored time as an aware UTC one (SQLite keeps none)."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _no_template(service: str, named: str | None) -> str:
    """Why no replica of `service` can be made; never a bare None in the text."""
    asked = f"the named template {named!r} is not a known task" if named else "none was named"
    return (
        f"no request to copy for a replica of service {service!r}: {asked}, and no inference "
        f"task with anti_affinity.group {service!r} is known; submit one replica of the "
        "service first"
    )


def _status_after(task_id: str, decisions: list[Event]) -> str:
    """A task's status after the core's first decision on it (for a duplicate in the same
    batch): placed, refused or waiting."""
    for decision in decisions:
        if isinstance(decision, AllocationGranted) and decision.task_id == task_id:
            return TaskStatus.SCHEDULED.value
        if isinstance(decision, TaskRejected) and decision.task_id == task_id:
            return TaskStatus.REJECTED.value
    return TaskStatus.PENDING.value


def _no_prediction(request: TaskRequest) -> ResourcePrediction:
    gpu = request.resource_requirements.gpu
    return ResourcePrediction(
        gpu_memory_per_gpu_mb=gpu.memory_mb,
        host_memory_mb=request.resource_requirements.memory.capacity_mb or DEFAULT_HOST_MEMORY_MB,
        confidence=Confidence.LOW,
        method="copied from the replica template's request",
        dataloader_num_workers=0,
        dataloader_prefetch_factor=1,
    )
