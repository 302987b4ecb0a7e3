"""What the predictor keeps: its predictions, who holds which GPUs (whole cards or not, since
when running), the readings on those cards until the release decides which count, and the
learned corrections. Each handler's change is one transaction; granted and released events
are recorded in the inbox in that same transaction, so a redelivery changes nothing, and a
grant is recorded once per allocation id whatever its event id."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid5

from sqlalchemy import bindparam, delete, func, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    NodeMetricsReported,
    ReleaseReason,
    TaskStatus,
    TaskStatusReported,
    TaskUnderutilized,
    TaskUsageReported,
)
from crater.predictor.adapters.orm import (
    allocations,
    corrections,
    early_running,
    inbox,
    predictions,
    samples,
    usage_records,
    usage_samples,
    usage_windows,
)
from crater.predictor.domain.learning import (
    UNINFORMATIVE,
    Held,
    Observation,
    Outcome,
    Rule,
    Sample,
    Track,
    exclusive,
    judge,
    learn,
    observe,
    overlaps,
)
from crater.predictor.domain.sla import SlaRule, Window, fold
from crater.predictor.domain.usage import HeldTask, UsageRecord
from crater.runtime.db import insert_all_if_absent, write_transaction
from crater.runtime.outbox import IN_LIST_LIMIT
from crater.runtime.unit_of_work import REDELIVERED, all_once, unit_of_work

Key = tuple[str, str]  # (model family, task type)

# Prebuilt executemany statements of the batched handlers (bind names differ from columns).
_RUNNING_AT = (
    update(allocations)
    .where(allocations.c.allocation_id == bindparam("b_id"), allocations.c.running_at.is_(None))
    .values(running_at=bindparam("b_at"))
)
_RECORD_RELEASED = (
    update(usage_records)
    .where(usage_records.c.allocation_id == bindparam("b_id"))
    .values(released_at=bindparam("b_at"))
)
_ALLOCATION_RELEASED = (
    update(allocations)
    .where(allocations.c.allocation_id == bindparam("b_id"))
    .values(active=False, released_at=bindparam("b_at"), observed_peak_mb=bindparam("b_peak"))
)
_UNDERUTILIZED_NAMESPACE = UUID("0b7d2c5e-61f4-4f4e-8f0e-4a3c9d1e7b25")


def underutilized_id(task_id: str, attempt: int) -> UUID:
    """One id per attempt's breach, whichever sample completes it: said once, even if the
    handler runs again after publishing (JetStream drops the copy)."""
    return uuid5(_UNDERUTILIZED_NAMESPACE, f"{task_id}\n{attempt}")


@dataclass(frozen=True)
class Measured:
    """What one usage sample changed: the attempt's last whole-window mean, if any, and the
    breach it completed (published already)."""

    task_id: str
    measured: float | None
    breach: TaskUnderutilized | None = None


@dataclass(frozen=True)
class Released:
    """What a release taught: the outcome, the correction it belongs to, the new track."""

    outcome: Outcome
    key: Key | None
    track: Track | None


class LearningStore:
    def __init__(
        self,
        sessions: async_sessionmaker[Any],
        rule: Rule,
        consumer: str,
        sla: SlaRule | None = None,
    ) -> None:
        self.sessions = sessions
        self.rule = rule
        self.consumer = consumer
        self.sla = sla or SlaRule()

    async def track(self, family: str, task_type: str) -> Track:
        async with self.sessions() as session:
            row = (
                await session.execute(
                    select(corrections).where(
                        corrections.c.family == family, corrections.c.task_type == task_type
                    )
                )
            ).first()
        return _track(row)

    async def tracks(self) -> dict[Key, Track]:
        async with self.sessions() as session:
            rows = (await session.execute(select(corrections))).all()
        return {(r.family, r.task_type): _track(r) for r in rows}

    async def record_predictions(self, rows: Sequence[dict[str, Any]]) -> None:
        """Keep what was predicted (`prediction_record` rows), in one transaction; a
        redelivery (same task) leaves the first record."""
        if not rows:
            return
        # ON CONFLICT DO NOTHING: two submissions of one task profiled at once (a redelivery
        # racing the first, or a task id submitted again) must not collide on the key.
        async with write_transaction(self.sessions) as session:
            await insert_all_if_absent(session, predictions, rows)

    async def predicted(self, task_id: str) -> bool:
        """Whether a submission of `task_id` was profiled here before."""
        async with self.sessions() as session:
            found = await session.scalar(
                select(predictions.c.task_id).where(predictions.c.task_id == task_id)
            )
        return found is not None

    async def granted(self, event: AllocationGranted) -> bool:
        """Record who holds which cards; False for an allocation id already recorded (a grant
        repeated under a new event id), which changes nothing."""
        [outcome] = await self.granted_many([event])
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def granted_many(self, events: Sequence[AllocationGranted]) -> list[bool | BaseException]:
        """`granted` for a pull batch, in one transaction (each alone if that fails): per
        event, False for a repeated allocation id, True otherwise (a redelivery too)."""
        outcomes = await all_once(self.sessions, inbox, self.consumer, events, self._grant_all)
        return [True if o is REDELIVERED else o for o in outcomes]

    async def _grant_all(
        self, session: AsyncSession, events: Sequence[AllocationGranted]
    ) -> list[bool]:
        """Record a batch of grants with a few statements for the batch, as if one after
        another: False for an allocation id recorded already (before, or earlier in the
        batch); a running report that came first (`early_running`) gives its time."""
        ids = sorted({e.allocation_id for e in events})
        early: dict[str, Any] = {}
        known = await _stored(session, allocations.c.allocation_id, ids)
        for chunk in _chunks(ids):
            early.update(
                (r.allocation_id, r.running_at)
                for r in await session.execute(
                    select(early_running.c.allocation_id, early_running.c.running_at).where(
                        early_running.c.allocation_id.in_(chunk)
                    )
                )
            )
        recorded: list[bool] = []
        held: list[dict[str, Any]] = []
        records: list[dict[str, Any]] = []
        started: list[str] = []
        for event in events:
            if event.allocation_id in known:
                recorded.append(False)
                continue
            known.add(event.allocation_id)
            running_at = early.pop(event.allocation_id, None)
            if running_at is not None:
                started.append(event.allocation_id)
            held.append(
                {
                    "allocation_id": event.allocation_id,
                    "task_id": event.task_id,
                    "node": event.node,
                    "gpu_ids": list(event.gpu_ids),
                    "observed_peak_mb": 0,
                    "active": True,
                    "granted_at": event.occurred_at,
                    "exclusive": exclusive(event.gpu_milli, event.mig_profile),
                    "running_at": running_at,
                    "released_at": None,
                }
            )
            records.append(
                {
                    "allocation_id": event.allocation_id,
                    "task_id": event.task_id,
                    "tenant": event.tenant,
                    "pool": event.pool,
                    "node": event.node,
                    "gpu_model": event.gpu_model,
                    "gpus": len(event.gpu_ids),
                    "gpu_milli": event.gpu_milli,
                    "gpu_memory_mb": event.gpu_memory_mb,
                    "cpu_cores": len(event.cpu_cores),
                    "memory_mb": event.memory_mb,
                    "granted_at": event.occurred_at,
                    "released_at": None,
                    "sampled_seconds": 0.0,
                    "busy_seconds": 0.0,
                    "host_memory_used_mb": None,
                    "cpu_utilization_percent": None,
                }
            )
            recorded.append(True)
        for chunk in _chunks(started):
            await session.execute(
                delete(early_running).where(early_running.c.allocation_id.in_(chunk))
            )
        if held:
            await session.execute(insert(allocations), held)
            await session.execute(insert(usage_records), records)
        return recorded

    async def running(self, event: TaskStatusReported) -> None:
        """Note when the allocation started running: readings before it do not count."""
        [outcome] = await self.running_many([event])
        if isinstance(outcome, BaseException):
            raise outcome

    async def running_many(
        self, events: Sequence[TaskStatusReported]
    ) -> list[BaseException | None]:
        """`running` for a pull batch, in one transaction (each alone if that fails); a
        report of another status changes nothing. Idempotent: no inbox mark."""
        reports = [e for e in events if e.status is TaskStatus.RUNNING]
        outcomes = iter(await all_once(self.sessions, None, self.consumer, reports, self._run_all))
        results: list[BaseException | None] = []
        for event in events:
            outcome = next(outcomes) if event.status is TaskStatus.RUNNING else None
            results.append(outcome if isinstance(outcome, BaseException) else None)
        return results

    async def _run_all(
        self, session: AsyncSession, events: Sequence[TaskStatusReported]
    ) -> list[None]:
        """`_run` for a batch of running reports, in order, with a few statements for the
        reports naming their allocation (the usual kind): its running time set once, or kept
        in `early_running` when its grant has not been recorded yet."""
        ids = sorted({e.allocation_id for e in events if e.allocation_id})
        present = await _stored(session, allocations.c.allocation_id, ids)
        seen = await _stored(session, early_running.c.allocation_id, ids)
        started: list[dict[str, Any]] = []
        early: list[dict[str, Any]] = []

        async def flush() -> None:
            if started:
                await session.execute(_RUNNING_AT, started)
            if early:
                await session.execute(insert(early_running), early)
            started.clear()
            early.clear()

        for event in events:
            allocation_id = event.allocation_id
            if not allocation_id:  # by its task: the earlier ones written first, in order
                await flush()
                await self._run(session, event)
            elif allocation_id in present:
                started.append({"b_id": allocation_id, "b_at": event.occurred_at})
            elif allocation_id not in seen:
                seen.add(allocation_id)
                early.append({"allocation_id": allocation_id, "running_at": event.occurred_at})
        await flush()
        return [None] * len(events)

    async def _run(self, session: AsyncSession, event: TaskStatusReported) -> None:
        where = (
            [allocations.c.allocation_id == event.allocation_id]
            if event.allocation_id
            else [allocations.c.task_id == event.task_id, allocations.c.active.is_(True)]
        )
        rows = (await session.execute(select(allocations.c.allocation_id).where(*where))).all()
        if rows:
            await session.execute(
                update(allocations)
                .where(*where, allocations.c.running_at.is_(None))
                .values(running_at=event.occurred_at)
            )
        elif event.allocation_id:
            # the grant is still on its way through the other consumer: keep the time
            seen = await session.scalar(
                select(early_running.c.allocation_id).where(
                    early_running.c.allocation_id == event.allocation_id
                )
            )
            if seen is None:
                await session.execute(
                    insert(early_running).values(
                        allocation_id=event.allocation_id, running_at=event.occurred_at
                    )
                )

    async def observe(self, event: NodeMetricsReported) -> int:
        """Keep a reading for every allocation active on the node: the highest memory in use
        on its cards. Which readings count is decided on release. Returns how many were kept."""
        cards = {g.index: g for g in event.gpus}
        if not cards:
            return 0
        kept = 0
        async with write_transaction(self.sessions) as session:
            rows = (
                await session.execute(
                    select(allocations.c.allocation_id, allocations.c.gpu_ids).where(
                        allocations.c.node == event.node_id, allocations.c.active.is_(True)
                    )
                )
            ).all()
            if not rows:
                return 0
            done = set(
                (
                    await session.scalars(
                        select(samples.c.allocation_id).where(
                            samples.c.allocation_id.in_([r.allocation_id for r in rows]),
                            samples.c.sampled_at == event.occurred_at,
                        )
                    )
                ).all()
            )  # a redelivered report adds nothing
            values = []
            for row in rows:
                seen = [cards[i] for i in row.gpu_ids if i in cards]
                if not seen or row.allocation_id in done:
                    continue
                top = max(seen, key=lambda g: g.memory_used_mb)
                values.append(
                    {
                        "allocation_id": row.allocation_id,
                        "sampled_at": event.occurred_at,
                        "used_mb": top.memory_used_mb,
                        "total_mb": top.memory_total_mb,
                    }
                )
            if values:
                await session.execute(insert(samples), values)
                kept = len(values)
        return kept

    async def usage(
        self,
        event: TaskUsageReported,
        on_breach: Callable[[TaskUnderutilized], Awaitable[None]],
    ) -> Measured | None:
        """Keep a task's own sample: its peak card memory for learning at release, and its GPU
        utilisation in the attempt's SLA window. A breach is handed to `on_breach` before the
        commit, so a failed publish is retried with the sample. None for a redelivery."""
        async with unit_of_work(self.sessions, inbox, self.consumer, event.event_id) as work:
            session = work.session
            if not work.first:
                return None
            allocation_id = event.allocation_id or await session.scalar(
                select(allocations.c.allocation_id).where(
                    allocations.c.task_id == event.task_id, allocations.c.active.is_(True)
                )
            )
            utilization = event.gpu_utilization_percent
            if allocation_id and utilization is not None:
                record = usage_records.c.allocation_id == allocation_id
                await session.execute(
                    update(usage_records)
                    .where(record, usage_records.c.released_at.is_(None))
                    .values(
                        sampled_seconds=usage_records.c.sampled_seconds + event.interval_seconds,
                        busy_seconds=usage_records.c.busy_seconds
                        + event.interval_seconds * utilization / 100,
                    )
                )
            host, cpu = event.host_memory_used_mb, event.cpu_utilization_percent
            if allocation_id and (host is not None or cpu is not None):
                latest: dict[str, Any] = {}
                if host is not None:
                    latest["host_memory_used_mb"] = host
                if cpu is not None:
                    latest["cpu_utilization_percent"] = cpu
                await session.execute(
                    update(usage_records)
                    .where(
                        usage_records.c.allocation_id == allocation_id,
                        usage_records.c.released_at.is_(None),
                    )
                    .values(**latest)
                )
            if allocation_id and event.gpus:
                top = max(event.gpus, key=lambda g: g.memory_used_mb)
                known = await session.scalar(
                    select(usage_samples.c.allocation_id).where(
                        usage_samples.c.allocation_id == allocation_id,
                        usage_samples.c.sampled_at == event.occurred_at,
                    )
                )
                if known is None:
                    await session.execute(
                        insert(usage_samples).values(
                            allocation_id=allocation_id,
                            sampled_at=event.occurred_at,
                            used_mb=top.memory_used_mb,
                            total_mb=top.memory_total_mb or 0,
                        )
                    )
            minimum = await session.scalar(
                select(predictions.c.min_gpu_utilization_percent).where(
                    predictions.c.task_id == event.task_id
                )
            )
            if minimum is None:
                return Measured(event.task_id, None)
            where = (
                usage_windows.c.task_id == event.task_id,
                usage_windows.c.attempt == event.attempt,
            )
            # Locked: replicas sharing the durable may fold two samples of one attempt at
            # once, and each must see the other's (SQLite has one writer at a time anyway).
            window_row = select(usage_windows).where(*where).with_for_update()
            row = (await session.execute(window_row)).first()
            window = (
                Window(
                    _aware(row.started_at),
                    row.seconds,
                    row.weighted_sum,
                    row.samples,
                    row.measured,
                    row.breached,
                )
                if row
                else Window(event.occurred_at - timedelta(seconds=event.interval_seconds))
            )
            window, breach = fold(
                window,
                event.occurred_at,
                event.interval_seconds,
                event.gpu_utilization_percent,
                minimum,
                self.sla,
            )
            values = {
                "seconds": window.seconds,
                "weighted_sum": window.weighted_sum,
                "samples": window.samples,
                "measured": window.measured,
                "breached": window.breached,
            }
            if row is None:
                await session.execute(
                    insert(usage_windows).values(
                        task_id=event.task_id,
                        attempt=event.attempt,
                        allocation_id=allocation_id,
                        started_at=window.started_at,
                        **values,
                    )
                )
            else:
                await session.execute(update(usage_windows).where(*where).values(**values))
            said = None
            if breach is not None:
                said = TaskUnderutilized(
                    event_id=underutilized_id(event.task_id, event.attempt),
                    task_id=event.task_id,
                    allocation_id=allocation_id,
                    attempt=event.attempt,
                    measured_gpu_utilization_percent=round(breach.measured, 2),
                    min_gpu_utilization_percent=minimum,
                    window_seconds=breach.seconds,
                    samples=breach.samples,
                )
                await on_breach(said)
            return Measured(event.task_id, window.measured, said)

    async def released(self, event: AllocationReleased) -> Released | None:
        """Close the allocation and fold the task's own measured peak into its correction;
        None when the allocation is unknown or already closed (a redelivery)."""
        [outcome] = await self.released_many([event])
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def released_many(
        self, events: Sequence[AllocationReleased]
    ) -> list[Released | BaseException | None]:
        """`released` for a pull batch, in one transaction (each alone if that fails)."""
        outcomes = await all_once(self.sessions, inbox, self.consumer, events, self._release_all)
        return [None if o is REDELIVERED else o for o in outcomes]

    async def _release_all(
        self, session: AsyncSession, events: Sequence[AllocationReleased]
    ) -> list[Released | None]:
        """`_release` for a batch, in order, as if one after another: the allocations, their
        readings and their tasks' predictions read with a statement each for the batch, the
        closing writes sent as one executemany each. A release that reads what earlier ones
        wrote (the neighbours of a task that ran, a correction learned) has them sent first."""
        ids = sorted({e.allocation_id for e in events})
        rows: dict[str, Any] = {}
        own: dict[str, list[Sample]] = {}
        node: dict[str, list[Sample]] = {}
        for chunk in _chunks(ids):
            for row in await session.execute(
                select(allocations).where(allocations.c.allocation_id.in_(chunk))
            ):
                rows[row.allocation_id] = row
        live = sorted(i for i, row in rows.items() if row.active)
        for table, kept in ((usage_samples, own), (samples, node)):
            for chunk in _chunks(live):
                mine = table.c.allocation_id.in_(chunk)
                for r in await session.execute(select(table).where(mine)):
                    kept.setdefault(r.allocation_id, []).append(
                        Sample(_aware(r.sampled_at), r.used_mb, r.total_mb)
                    )
                await session.execute(delete(table).where(mine))
        task_ids = sorted({e.task_id for e in events if e.allocation_id in live})
        predicted: dict[str, Any] = {}
        for chunk in _chunks(task_ids):
            for row in await session.execute(
                select(predictions).where(predictions.c.task_id.in_(chunk))
            ):
                predicted[row.task_id] = row
        records: list[dict[str, Any]] = []
        closed: list[dict[str, Any]] = []

        async def flush() -> None:
            if records:
                await session.execute(_RECORD_RELEASED, records)
            if closed:
                await session.execute(_ALLOCATION_RELEASED, closed)
            records.clear()
            closed.clear()

        done: list[Released | None] = []
        released: set[str] = set()
        for event in events:
            allocation = rows.get(event.allocation_id)
            if allocation is None or not allocation.active or event.allocation_id in released:
                done.append(None)
                continue
            released.add(event.allocation_id)
            released_at = event.occurred_at
            records.append({"b_id": event.allocation_id, "b_at": released_at})
            # The task's own samples when it sent any: the node's readings may hold memory
            # that was not its own. One rule judges either (observe, judge, learn).
            readings = own.get(event.allocation_id) or node.get(event.allocation_id, [])
            prediction = predicted.get(event.task_id)
            key = (prediction.family, prediction.task_type) if prediction else None
            if _reads_neighbours(allocation, event.reason, prediction):
                await flush()  # the neighbours' releases earlier in the batch are read
            outcome, observation = await self._judge(
                session, allocation, released_at, event.reason, readings, prediction
            )
            closed.append(
                {
                    "b_id": event.allocation_id,
                    "b_at": released_at,
                    "b_peak": observation.peak_mb if observation else 0,
                }
            )
            if outcome is not Outcome.LEARNED or key is None or observation is None:
                done.append(Released(outcome, key, None))
                continue
            await flush()
            track = await self._learn(session, key, prediction, observation.peak_mb)
            done.append(Released(outcome, key, track))
        await flush()
        return done

    async def usage_records(
        self, since: datetime, until: datetime, tenant: str | None = None
    ) -> list[UsageRecord]:
        """Every allocation held at some moment of [since, until) (`tenant`'s only)."""
        table = usage_records.c
        where = [
            table.granted_at < until,
            or_(table.released_at.is_(None), table.released_at > since),
        ]
        if tenant is not None:
            where.append(table.tenant == tenant)
        async with self.sessions() as session:
            rows = (await session.execute(select(usage_records).where(*where))).all()
        return [_record(r) for r in rows]

    async def held(self) -> list[HeldTask]:
        """Every allocation held now, with when it started running and the latest readings
        of its use: its own sample's fullest card, else (cards held whole and alone) the
        node's reading on them; its own latest host memory and CPU use."""
        records = await self.usage_records_held()
        if not records:
            return []
        ids = [r.allocation_id for r, _, _ in records]
        latest: dict[str, dict[str, tuple[int, int]]] = {}
        async with self.sessions() as session:
            # A running report that raced its grant (the two consumers commit concurrently)
            # can be left in early_running: it still says when the task started.
            early = {
                r.allocation_id: r.running_at
                for r in await session.execute(
                    select(early_running).where(early_running.c.allocation_id.in_(ids))
                )
            }
            running = {
                r.allocation_id: (
                    _aware(started)
                    if (started := r.running_at or early.get(r.allocation_id))
                    else None,
                    r.exclusive,
                )
                for r in await session.execute(
                    select(
                        allocations.c.allocation_id,
                        allocations.c.running_at,
                        allocations.c.exclusive,
                    ).where(allocations.c.allocation_id.in_(ids))
                )
            }
            for source, table in (("own", usage_samples), ("node", samples)):
                newest = (
                    select(table.c.allocation_id, func.max(table.c.sampled_at).label("at"))
                    .where(table.c.allocation_id.in_(ids))
                    .group_by(table.c.allocation_id)
                    .subquery()
                )
                rows = await session.execute(
                    select(table.c.allocation_id, table.c.used_mb, table.c.total_mb).join(
                        newest,
                        (table.c.allocation_id == newest.c.allocation_id)
                        & (table.c.sampled_at == newest.c.at),
                    )
                )
                for r in rows:
                    latest.setdefault(r.allocation_id, {})[source] = (r.used_mb, r.total_mb)
        held = []
        for record, host, cpu in records:
            started, alone = running.get(record.allocation_id, (None, False))
            readings = latest.get(record.allocation_id, {})
            reading = readings.get("own") or (readings.get("node") if alone else None)
            held.append(
                HeldTask(
                    record=record,
                    running_at=started,
                    gpu_memory_used_mb=reading[0] if reading else None,
                    gpu_memory_card_mb=reading[1] if reading and reading[1] else None,
                    host_memory_used_mb=host,
                    cpu_utilization_percent=cpu,
                )
            )
        return held

    async def usage_records_held(self) -> list[tuple[UsageRecord, int | None, float | None]]:
        """The records of the allocations held now, each with its task's latest host memory
        and CPU use."""
        async with self.sessions() as session:
            rows = (
                await session.execute(
                    select(usage_records).where(usage_records.c.released_at.is_(None))
                )
            ).all()
        return [(_record(r), r.host_memory_used_mb, r.cpu_utilization_percent) for r in rows]

    async def _judge(
        self,
        session: AsyncSession,
        allocation: Any,
        released_at: datetime,
        reason: ReleaseReason,
        readings: list[Sample],
        prediction: Any,
    ) -> tuple[Outcome, Observation | None]:
        if reason in UNINFORMATIVE:
            return Outcome.UNINFORMATIVE, None
        if not allocation.exclusive:
            return Outcome.SHARED, None
        if allocation.running_at is None:
            return Outcome.NEVER_RAN, None
        if prediction is None or prediction.raw_mb <= 0:
            return Outcome.NO_PREDICTION, None
        # anyone else on the same cards while this one held them: those moments do not count
        neighbours = await session.execute(
            select(
                allocations.c.gpu_ids, allocations.c.granted_at, allocations.c.released_at
            ).where(
                allocations.c.node == allocation.node,
                allocations.c.allocation_id != allocation.allocation_id,
                allocations.c.granted_at < released_at,
                or_(
                    allocations.c.released_at.is_(None),
                    allocations.c.released_at > allocation.granted_at,
                ),
            )
        )
        others = [
            Held(_aware(n.granted_at), _aware(n.released_at) if n.released_at else None)
            for n in neighbours
            if overlaps(allocation.gpu_ids, n.gpu_ids)
        ]
        observation = observe(
            readings, _aware(allocation.running_at), released_at, others, self.rule
        )
        return judge(observation, prediction.raw_mb, self.rule), observation

    async def _learn(
        self, session: AsyncSession, key: Key, prediction: Any, observed: int
    ) -> Track:
        where = (corrections.c.family == key[0], corrections.c.task_type == key[1])
        row = (await session.execute(select(corrections).where(*where).with_for_update())).first()
        track = learn(_track(row), prediction.raw_mb, prediction.predicted_mb, observed, self.rule)
        values = {
            "factor": track.factor,
            "samples": track.samples,
            "abs_pct_error_sum": track.abs_pct_error_sum,
            "updated_at": datetime.now(UTC),
        }
        if row is None:
            await session.execute(
                insert(corrections).values(family=key[0], task_type=key[1], **values)
            )
        else:
            await session.execute(update(corrections).where(*where).values(**values))
        return track


def _chunks(values: Sequence[str]) -> list[Sequence[str]]:
    """`values` in IN lists of at most IN_LIST_LIMIT."""
    return [values[i : i + IN_LIST_LIMIT] for i in range(0, len(values), IN_LIST_LIMIT)]


async def _stored(session: AsyncSession, column: Any, values: Sequence[str]) -> set[str]:
    """Which of `values` the table of `column` holds, read in IN lists."""
    found: set[str] = set()
    for chunk in _chunks(values):
        found.update(await session.scalars(select(column).where(column.in_(chunk))))
    return found


def _reads_neighbours(allocation: Any, reason: ReleaseReason, prediction: Any) -> bool:
    """Whether `_judge` reads the other allocations of the node (the ones it returns early
    for it does not)."""
    return (
        reason not in UNINFORMATIVE
        and bool(allocation.exclusive)
        and allocation.running_at is not None
        and prediction is not None
        and prediction.raw_mb > 0
    )


def _record(r: Any) -> UsageRecord:
    return UsageRecord(
        allocation_id=r.allocation_id,
        task_id=r.task_id,
        tenant=r.tenant,
        pool=r.pool,
        gpu_model=r.gpu_model,
        gpus=r.gpus,
        gpu_milli=r.gpu_milli,
        gpu_memory_mb=r.gpu_memory_mb,
        cpu_cores=r.cpu_cores,
        memory_mb=r.memory_mb,
        granted_at=_aware(r.granted_at),
        released_at=_aware(r.released_at) if r.released_at else None,
        sampled_seconds=r.sampled_seconds,
        busy_seconds=r.busy_seconds,
    )


def _aware(moment: datetime) -> datetime:
    """SQLite hands back naive datetimes; every time the store keeps is UTC."""
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _track(row: Any) -> Track:
    if row is None:
        return Track()
    return Track(row.factor, row.samples, row.abs_pct_error_sum)


def prediction_record(
    task_id: str,
    family: str,
    task_type: str,
    raw_mb: int,
    predicted_mb: int,
    min_gpu_utilization_percent: float | None = None,
) -> dict[str, Any]:
    """A row of `record_predictions`: what was predicted for `task_id`, and before the
    learned correction (`raw_mb`)."""
    return {
        "task_id": task_id,
        "family": family,
        "task_type": task_type,
        "raw_mb": raw_mb,
        "predicted_mb": predicted_mb,
        "created_at": datetime.now(UTC),
        "min_gpu_utilization_percent": min_gpu_utilization_percent,
    }
