"""The predictor's grants, running reports and releases applied a pull batch at a time (a few
statements for the batch) leave exactly what the same events leave applied one by one:
the same outcomes, the same rows, the same learned correction. On a SQLite file and on
PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select

from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    NodeMetricsReported,
    ReleaseReason,
    TaskStatusReported,
)
from crater.predictor.adapters.orm import (
    allocations,
    corrections,
    early_running,
    samples,
    usage_records,
)
from crater.predictor.adapters.store import LearningStore, prediction_record
from crater.predictor.app import MIGRATIONS_DIR
from crater.predictor.domain.learning import Rule
from crater.runtime.db import make_engine, make_session_factory, upgrade_to_head_async
from tests.integration.predictor.test_predictor_over_nats import (
    granted,
    metrics,
    released,
    running,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(second: float) -> datetime:
    return T0 + timedelta(seconds=second)


def scenario(p: str) -> dict[str, list[Any]]:
    """One run's events, every id and node prefixed by `p` (two runs share a database)."""
    node = f"{p}node"

    def grant(task: str, allocation: str, gpus: list[int], second: float) -> AllocationGranted:
        event = granted(f"{p}{task}", f"{p}{allocation}", gpus)
        return event.model_copy(update={"node": node, "occurred_at": at(second)})

    def run(task: str, allocation: str, second: float) -> TaskStatusReported:
        event = running(f"{p}{task}", f"{p}{allocation}")
        return event.model_copy(update={"occurred_at": at(second)})

    def release(
        task: str, allocation: str, second: float, reason: ReleaseReason
    ) -> AllocationReleased:
        event = released(f"{p}{task}", f"{p}{allocation}", [0], reason)
        return event.model_copy(update={"node": node, "occurred_at": at(second)})

    def reading(used: dict[int, int], second: float) -> NodeMetricsReported:
        event = metrics(used, total_mb=400_000)
        return event.model_copy(update={"node_id": node, "occurred_at": at(second)})

    first = grant("learns", "a1", [0], 0)
    return {
        "early": [run("early", "a3", 1)],  # its grant comes after it
        "grants": [
            first,
            grant("shared-task", "a2", [1], 0),
            granted(f"{p}other", f"{p}a1", [5]).model_copy(update={"node": node}),  # repeat
            grant("early", "a3", [2], 0),
            first,  # the same event twice in one batch
        ],
        "running": [run("learns", "a1", 2), run("learns", "a1", 3), run("gone", "a9", 2)],
        "readings": [reading({0: 500 + 100 * s, 1: 90, 2: 10}, s) for s in (4, 5, 6, 7)],
        "releases": [
            release("learns", "a1", 10, ReleaseReason.SUCCEEDED),
            release("learns", "a1", 11, ReleaseReason.SUCCEEDED),  # released already
            release("shared-task", "a2", 10, ReleaseReason.SUCCEEDED),
            release("early", "a3", 12, ReleaseReason.PREEMPTED),
            release("nobody", "a8", 12, ReleaseReason.SUCCEEDED),  # never granted
        ],
    }


async def rows(store: LearningStore, p: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the run's ids, the prefix taken off, times as UTC."""

    def plain(value: Any) -> Any:
        if isinstance(value, str):
            return value.removeprefix(p)
        if isinstance(value, datetime):
            return value if value.tzinfo else value.replace(tzinfo=UTC)
        return value

    kept: dict[str, list[tuple[Any, ...]]] = {}
    async with store.sessions() as session:
        for table, key in (
            (allocations, allocations.c.allocation_id),
            (usage_records, usage_records.c.allocation_id),
            (early_running, early_running.c.allocation_id),
            (samples, samples.c.allocation_id),
            (corrections, corrections.c.family),
        ):
            found = await session.execute(select(table).where(key.like(f"{p}%")).order_by(key))
            columns = [c.name for c in table.columns if c.name != "updated_at"]
            kept[table.name] = [tuple(plain(getattr(r, c)) for c in columns) for r in found.all()]
    return kept


async def test_a_batch_leaves_what_one_by_one_leaves(database_url: str) -> None:
    await upgrade_to_head_async(database_url, MIGRATIONS_DIR)
    engine = make_engine(database_url)
    try:
        store = LearningStore(make_session_factory(engine), Rule(min_observations=1), "predictor")
        outcomes: dict[str, list[Any]] = {}
        for p, batched in (("one-", False), ("all-", True)):
            events = scenario(p)
            await store.record_predictions(
                [
                    prediction_record(f"{p}{task}", f"{p}llama", "training", 400, 400)
                    for task in ("learns", "shared-task", "early")
                ]
            )
            got: list[Any] = []
            for kind, apply in (
                ("early", store.running_many),
                ("grants", store.granted_many),
                ("running", store.running_many),
                ("readings", None),
                ("releases", store.released_many),
            ):
                if apply is None:
                    for reading in events[kind]:
                        await store.observe(reading)
                elif batched:
                    got += await apply(events[kind])
                else:
                    for event in events[kind]:
                        got += await apply([event])
            outcomes[p] = [
                (o.outcome, o.key and o.key[0].removeprefix(p), o.track)
                if o is not None and not isinstance(o, bool)
                else o
                for o in got
            ]
        assert outcomes["one-"] == outcomes["all-"]
        learned = [o for o in outcomes["all-"] if isinstance(o, tuple) and o[2] is not None]
        assert len(learned) == 2  # two corrections of one family learned in one batch
        assert await rows(store, "one-") == await rows(store, "all-")
        # a repeat of an allocation id, in the batch or after it, is refused: False
        assert outcomes["all-"][1:6] == [True, True, False, True, True]
    finally:
        await engine.dispose()
