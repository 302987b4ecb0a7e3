"""The scheduler's read queries the console asks: tasks filtered by tenant, pool and id, with
their reasons per filter and predicted peaks; the pools."""

from __future__ import annotations

from faststream import TestApp

from crater.contracts import (
    AllocationGranted,
    NodeTopologyReported,
    PoolsAnswer,
    PoolsQuery,
    QuerySubjects,
    TaskPending,
    TaskProfiled,
    TasksAnswer,
    TasksQuery,
)
from crater.runtime.bus import publish
from crater.runtime.nats_server import NatsServer
from crater.scheduler.app import SchedulerSettings, build
from tests.integration.scheduler.test_scheduler_over_nats import PREDICTION, profiled, query
from tests.support.events import EventTap
from tests.support.topologies import node


def of_tenant(task_id: str, gpus: int, tenant: str) -> TaskProfiled:
    event = profiled(task_id, gpus)
    return event.model_copy(update={"task": event.task.model_copy(update={"tenant": tenant})})


async def tasks(url: str, **filters: object) -> TasksAnswer:
    body = TasksQuery.model_validate(filters).model_dump_json().encode()
    return TasksAnswer.model_validate_json(await query(url, QuerySubjects.TASKS, body))


async def test_tasks_filtered_with_reasons_and_peaks_and_the_pools(
    fresh_nats: NatsServer, tap: EventTap, database_url: str
) -> None:
    settings = SchedulerSettings(nats_url=fresh_nats.url, database_url=database_url)
    service, app = build(settings)
    async with TestApp(app):
        await publish(service.broker, NodeTopologyReported(node=node("a100-01", gpus=4)))
        await publish(service.broker, of_tenant("Search-Train-1", 4, "search"))
        await tap.wait_for(AllocationGranted)
        await publish(service.broker, of_tenant("ads-train-2", 2, "ads"))
        await tap.wait_for(TaskPending)

        everyone = await tasks(fresh_nats.url)
        assert [t.task_id for t in everyone.tasks] == ["ads-train-2", "Search-Train-1"]
        waiting, placed = everyone.tasks
        assert [(r.code, r.nodes) for r in waiting.reasons] == [("InsufficientGpus", 1)]
        assert placed.reasons == []
        assert placed.predicted is not None
        assert placed.predicted.gpu_memory_per_gpu_mb == PREDICTION.gpu_memory_per_gpu_mb
        assert placed.prediction is None  # only for one task asked by id

        [one] = (await tasks(fresh_nats.url, task_id="Search-Train-1", limit=1)).tasks
        assert one.prediction == PREDICTION
        assert [t.task_id for t in (await tasks(fresh_nats.url, tenant="ads")).tasks] == [
            "ads-train-2"
        ]
        assert [t.task_id for t in (await tasks(fresh_nats.url, search="search-t")).tasks] == [
            "Search-Train-1"
        ]
        assert (await tasks(fresh_nats.url, search="%")).tasks == []  # not a wildcard
        assert (await tasks(fresh_nats.url, pool="inference")).tasks == []

        body = PoolsQuery(tenant="search").model_dump_json().encode()
        pools = PoolsAnswer.model_validate_json(
            await query(fresh_nats.url, QuerySubjects.POOLS, body)
        )
        [pool] = pools.pools
        assert (pool.pool, pool.gpus.total, pool.gpus.allocated) == ("default", 4, 4)
        assert (pool.tasks_placed, pool.tasks_waiting) == (1, 1)
        assert [(h.tenant, h.gpus, h.share) for h in pool.tenants] == [("search", 4, 1.0)]
        assert [q.tenant for q in pools.quotas] == ["search"]
