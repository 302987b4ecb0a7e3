"""What the predictor keeps: its predictions, who holds which GPUs and the peaks seen on them,
and the learned corrections. Each handler's change is one transaction; granted and released
events are recorded in the inbox in that same transaction, so a redelivery changes nothing."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from crater.contracts import AllocationGranted, AllocationReleased, NodeMetricsReported
from crater.predictor.adapters.orm import allocations, corrections, inbox, predictions
from crater.predictor.domain.learning import UNINFORMATIVE, Rule, Track, learn
from crater.runtime.outbox import first_delivery

Key = tuple[str, str]  # (model family, task type)


class LearningStore:
    def __init__(self, sessions: async_sessionmaker[Any], rule: Rule, consumer: str) -> None:
        self.sessions = sessions
        self.rule = rule
        self.consumer = consumer

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

    async def record_prediction(
        self, task_id: str, family: str, task_type: str, raw_mb: int, predicted_mb: int
    ) -> None:
        """Keep what was predicted; a redelivery (same task) leaves the first record."""
        async with self.sessions() as session, session.begin():
            exists = await session.scalar(
                select(predictions.c.task_id).where(predictions.c.task_id == task_id)
            )
            if exists is None:
                await session.execute(
                    insert(predictions).values(
                        task_id=task_id,
                        family=family,
                        task_type=task_type,
                        raw_mb=raw_mb,
                        predicted_mb=predicted_mb,
                        created_at=datetime.now(UTC),
                    )
                )

    async def granted(self, event: AllocationGranted) -> None:
        async with self.sessions() as session, session.begin():
            if not await first_delivery(session, inbox, self.consumer, event.event_id):
                return
            await session.execute(
                insert(allocations).values(
                    allocation_id=event.allocation_id,
                    task_id=event.task_id,
                    node=event.node,
                    gpu_ids=list(event.gpu_ids),
                    observed_peak_mb=0,
                    active=True,
                    granted_at=event.occurred_at,
                )
            )

    async def observe(self, event: NodeMetricsReported) -> int:
        """Raise the observed peak of every task running on the node; returns how many rose."""
        used = {g.index: g.memory_used_mb for g in event.gpus}
        if not used:
            return 0
        raised = 0
        async with self.sessions() as session, session.begin():
            rows = (
                await session.execute(
                    select(allocations).where(
                        allocations.c.node == event.node_id, allocations.c.active.is_(True)
                    )
                )
            ).all()
            for row in rows:
                seen = [used[i] for i in row.gpu_ids if i in used]
                if seen and max(seen) > row.observed_peak_mb:
                    await session.execute(
                        update(allocations)
                        .where(allocations.c.allocation_id == row.allocation_id)
                        .values(observed_peak_mb=max(seen))
                    )
                    raised += 1
        return raised

    async def released(self, event: AllocationReleased) -> tuple[Key, Track] | None:
        """Close the allocation and fold its observed peak into the task's correction."""
        async with self.sessions() as session, session.begin():
            if not await first_delivery(session, inbox, self.consumer, event.event_id):
                return None
            allocation = (
                await session.execute(
                    select(allocations).where(allocations.c.allocation_id == event.allocation_id)
                )
            ).first()
            if allocation is None or not allocation.active:
                return None
            await session.execute(
                update(allocations)
                .where(allocations.c.allocation_id == event.allocation_id)
                .values(active=False, released_at=event.occurred_at)
            )
            if event.reason in UNINFORMATIVE or allocation.observed_peak_mb <= 0:
                return None
            prediction = (
                await session.execute(
                    select(predictions).where(predictions.c.task_id == event.task_id)
                )
            ).first()
            if prediction is None or prediction.raw_mb <= 0:
                return None
            key = (prediction.family, prediction.task_type)
            return key, await self._learn(session, key, prediction, allocation.observed_peak_mb)

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


def _track(row: Any) -> Track:
    if row is None:
        return Track()
    return Track(row.factor, row.samples, row.abs_pct_error_sum)
