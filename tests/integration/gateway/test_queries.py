"""Read APIs answered by a responder on the scheduler's NATS query subjects."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime

import httpx
import nats
from nats.aio.msg import Msg

from crater.contracts import NodeCondition, Priority, TaskStatus, TaskType
from crater.contracts.queries import (
    NodesAnswer,
    NodesQuery,
    NodeSummary,
    QuerySubjects,
    TasksAnswer,
    TasksQuery,
    TaskSummary,
)
from crater.runtime.nats_server import NatsServer

NODE = NodeSummary(
    node_id="gpu-a-01",
    pool="gpu-a",
    condition=NodeCondition.READY,
    gpu_model="A100-SXM4-80GB",
    gpu_memory_mb=81920,
    gpus_total=8,
    gpus_free=6,
    cpu_cores_total=128,
    cpu_cores_free=100,
    memory_mb_total=1_048_576,
    memory_mb_free=900_000,
    labels={"crater.ai/gpu-model": "A100"},
)
NOW = datetime(2026, 1, 1, tzinfo=UTC)
TASK = TaskSummary(
    task_id="train-42",
    task_type=TaskType.TRAINING,
    status=TaskStatus.PENDING,
    pool="gpu-a",
    tenant="default",
    priority=Priority.HIGH,
    gpus=2,
    reason="0/1 nodes: 1 InsufficientGpus",
    submitted_at=NOW,
    updated_at=NOW,
)


@asynccontextmanager
async def responder(
    nats_url: str, subject: str, answer: Callable[[bytes], bytes], seen: list[bytes]
) -> AsyncIterator[None]:
    """A stand-in scheduler: a core NATS subscription that replies to every request."""
    connection = await nats.connect(nats_url)

    async def reply(msg: Msg) -> None:
        seen.append(msg.data)
        await msg.respond(answer(msg.data))

    await connection.subscribe(subject, cb=reply)
    await connection.flush()
    try:
        yield
    finally:
        await connection.close()


def tasks_answer(data: bytes) -> bytes:
    query = TasksQuery.model_validate_json(data)
    known = [TASK] if query.task_id in (None, TASK.task_id) else []
    return TasksAnswer(tasks=known).model_dump_json().encode()


async def test_nodes_come_from_the_scheduler(
    client: httpx.AsyncClient, fresh_nats: NatsServer
) -> None:
    seen: list[bytes] = []
    answer = NodesAnswer(nodes=[NODE]).model_dump_json().encode()
    async with responder(fresh_nats.url, QuerySubjects.NODES, lambda _: answer, seen):
        response = await client.get("/api/v1/nodes", params={"pool": "gpu-a"})
    assert response.status_code == 200, response.text
    assert NodesAnswer.model_validate(response.json()) == NodesAnswer(nodes=[NODE])
    assert [NodesQuery.model_validate_json(s) for s in seen] == [NodesQuery(pool="gpu-a")]


async def test_no_scheduler_gives_503(client: httpx.AsyncClient) -> None:
    for path in ("/api/v1/nodes", "/api/v1/tasks", "/api/v1/tasks/train-42"):
        response = await client.get(path)
        assert response.status_code == 503, path
        assert response.json() == {"detail": "scheduler not answering"}


async def test_a_malformed_answer_gives_502(
    client: httpx.AsyncClient, fresh_nats: NatsServer
) -> None:
    async with responder(fresh_nats.url, QuerySubjects.NODES, lambda _: b'{"nodes": 3}', []):
        response = await client.get("/api/v1/nodes")
    assert response.status_code == 502
    assert "NodesAnswer" in response.json()["detail"]


async def test_tasks_are_listed_and_looked_up(
    client: httpx.AsyncClient, fresh_nats: NatsServer
) -> None:
    seen: list[bytes] = []
    async with responder(fresh_nats.url, QuerySubjects.TASKS, tasks_answer, seen):
        listed = await client.get("/api/v1/tasks", params={"status": "pending", "limit": 5})
        one = await client.get("/api/v1/tasks/train-42")
        unknown = await client.get("/api/v1/tasks/nope")
    assert listed.status_code == 200
    assert TasksAnswer.model_validate(listed.json()) == TasksAnswer(tasks=[TASK])
    assert one.status_code == 200
    assert TaskSummary.model_validate(one.json()) == TASK
    assert unknown.status_code == 404
    assert "nope" in unknown.json()["detail"]
    queries = [TasksQuery.model_validate_json(s) for s in seen]
    assert queries[0] == TasksQuery(status=TaskStatus.PENDING, limit=5)
    assert queries[1] == TasksQuery(task_id="train-42", limit=1)


async def test_bad_query_parameters_are_refused_naming_the_parameter(
    client: httpx.AsyncClient,
) -> None:
    response = await client.get("/api/v1/tasks", params={"status": "sleeping", "limit": 0})
    assert response.status_code == 422
    assert {d["field"] for d in response.json()["detail"]} == {"status", "limit"}
