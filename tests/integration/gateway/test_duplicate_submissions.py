"""A task id submitted again is answered 409 with the known task's status, over a real stack
(nats-server, predictor, scheduler and its database); replicas of the gateway claim an id
once between them; a gateway that died between claiming an id and publishing it does not
block the id for good, and a failed publish frees it at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import uuid4

import httpx
import nats
from faststream import TestApp

from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    NodeTopologyReported,
    QuerySubjects,
    Streams,
    TaskRejected,
    TaskRequest,
    TasksQuery,
    TaskStatus,
    TaskStatusReported,
    TaskSubmitted,
)
from crater.gateway.app import ACCEPTED_BUCKET, GatewaySettings, build
from crater.gateway.claims import Claim, body_digest, claim_key
from crater.predictor.app import PredictorSettings
from crater.predictor.app import build as build_predictor
from crater.runtime.bus import ensure_streams, publish
from crater.runtime.nats_server import NatsServer
from crater.scheduler.app import SchedulerSettings
from crater.scheduler.app import build as build_scheduler
from tests.integration.gateway.test_schedule import task
from tests.support.events import EventTap
from tests.support.topologies import node

GRACE_S = 30.0  # above a publish's retries (PUBLISH_GIVE_UP_SECONDS)


@asynccontextmanager
async def gateway(nats_url: str, query_s: float = 0.5) -> AsyncIterator[httpx.AsyncClient]:
    """One replica of the gateway, its lifespan run as uvicorn would run it. Without a
    scheduler each submission waits `query_s` for its view (the tap listens on every
    subject, so the query has a responder that never answers)."""
    app = build(
        GatewaySettings(
            nats_url=nats_url, query_timeout_seconds=query_s, abandoned_claim_seconds=GRACE_S
        )
    )
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http,
    ):
        yield http


async def submissions(tap: EventTap, task_id: str) -> list[TaskSubmitted]:
    await asyncio.sleep(0.3)  # anything published late would show by now
    return tap.of(TaskSubmitted, lambda e: e.task_id == task_id)


def refused(response: httpx.Response, task_id: str, status: str) -> dict[str, Any]:
    assert response.status_code == 409, response.text
    body: dict[str, Any] = response.json()
    assert (body["task_id"], body["status"]) == (task_id, status)
    [error] = body["detail"]
    assert error["field"] == "task_id"
    assert task_id in error["reason"]
    return body


async def test_a_known_task_is_answered_409_with_its_state_and_goes_on(
    fresh_nats: NatsServer, tap: EventTap, database_url: str, tmp_path: Path
) -> None:
    scheduler, scheduler_app = build_scheduler(
        SchedulerSettings(nats_url=fresh_nats.url, database_url=database_url)
    )
    _, predictor_app = build_predictor(
        PredictorSettings(
            nats_url=fresh_nats.url, database_url=f"sqlite+aiosqlite:///{tmp_path / 'p.db'}"
        )
    )
    # A scheduler answering late reads as unknown and the claim decides ("submitted"): on a
    # loaded machine 0.5 s was too short for a scheduled task.
    slow = gateway(fresh_nats.url, query_s=10.0)
    async with TestApp(scheduler_app), TestApp(predictor_app), slow as http:
        await publish(scheduler.broker, NodeTopologyReported(node=node("a100-01", gpus=8)))
        first = await http.post("/api/v1/schedule", json=task())
        assert first.status_code == 202, first.text
        [granted] = await tap.wait_for(AllocationGranted)

        # Same id, another body: refused with the scheduler's view of the known task.
        again = await http.post(
            "/api/v1/schedule",
            json=task(resource_requirements={"gpu": {"count": 1, "memory_mb": 1000}}),
        )
        body = refused(again, "train-42", "scheduled")
        assert "status scheduled" in body["detail"][0]["reason"]
        assert len(await submissions(tap, "train-42")) == 1  # nothing reached the bus
        assert service_task(scheduler, "train-42").gpu_ids == tuple(granted.gpu_ids)

        # The same id past the gateway (task.submitted on the bus, a new event id), while the
        # task runs: the predictor passes it on, the scheduler refuses it aloud.
        running = TaskStatusReported(
            task_id="train-42", status=TaskStatus.RUNNING, allocation_id=granted.allocation_id
        )
        await publish(scheduler.broker, running)
        await until_status(http, "train-42", "running")
        bypass = TaskSubmitted.model_validate(task(priority="low"))
        await publish(scheduler.broker, bypass)
        [duplicate] = await tap.wait_for(TaskRejected)
        assert (duplicate.task_id, duplicate.duplicate) == ("train-42", True)
        assert duplicate.errors[0].field == "task_id"
        assert "status running" in duplicate.errors[0].reason
        assert (await http.get("/api/v1/tasks/train-42")).json()["status"] == "running"
        assert [g.task_id for g in tap.of(AllocationGranted)] == ["train-42"]

        # An ended task's id is not reused either.
        done = TaskStatusReported(
            task_id="train-42", status=TaskStatus.SUCCEEDED, allocation_id=granted.allocation_id
        )
        await publish(scheduler.broker, done)
        await tap.wait_for(AllocationReleased)
        refused(await http.post("/api/v1/schedule", json=task()), "train-42", "succeeded")
        assert len(await submissions(tap, "train-42")) == 2  # the first, the bypass: none here

        # A task the scheduler stored without this gateway (a replica the autoscaler asked
        # for, or the bus directly) is refused here too.
        direct = task(task_id="direct-1")
        await publish(scheduler.broker, TaskSubmitted.model_validate(direct))
        await tap.wait_for(AllocationGranted, lambda g: g.task_id == "direct-1")
        refused(await http.post("/api/v1/schedule", json=direct), "direct-1", "scheduled")


async def until_status(http: httpx.AsyncClient, task_id: str, status: str) -> None:
    for _ in range(200):
        if (await http.get(f"/api/v1/tasks/{task_id}")).json().get("status") == status:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{task_id} never {status}")


def service_task(scheduler: Any, task_id: str) -> Any:
    return scheduler.state.scheduler.allocations[task_id]


async def test_an_id_accepted_but_not_yet_known_to_the_scheduler_is_refused(
    fresh_nats: NatsServer, tap: EventTap
) -> None:
    async with gateway(fresh_nats.url) as http:  # no scheduler: the claim alone decides
        first = await http.post("/api/v1/schedule", json=task())
        assert first.status_code == 202
        again = await http.post("/api/v1/schedule", json=task(priority="low"))
        body = refused(again, "train-42", "submitted")
        assert first.json()["event_id"] in body["detail"][0]["reason"]
        # A retry under the same Idempotency-Key is the same submission: accepted, once.
        keyed = {"Idempotency-Key": "k-1"}
        one = await http.post("/api/v1/schedule", json=task(task_id="t-2"), headers=keyed)
        two = await http.post("/api/v1/schedule", json=task(task_id="t-2"), headers=keyed)
        assert one.status_code == two.status_code == 202
        assert one.json()["event_id"] == two.json()["event_id"]
        assert len(await submissions(tap, "train-42")) == 1
        assert len(await submissions(tap, "t-2")) == 1


async def test_replicas_racing_for_one_id_accept_it_once(
    fresh_nats: NatsServer, tap: EventTap
) -> None:
    async with gateway(fresh_nats.url) as a, gateway(fresh_nats.url) as b:
        for round_ in range(5):
            task_id = f"race-{round_}"
            answers = await asyncio.gather(
                a.post("/api/v1/schedule", json=task(task_id=task_id, priority="high")),
                b.post("/api/v1/schedule", json=task(task_id=task_id, priority="low")),
            )
            assert sorted(r.status_code for r in answers) == [202, 409], [r.text for r in answers]
            [event] = await submissions(tap, task_id)
            [winner] = [r for r in answers if r.status_code == 202]
            assert str(event.event_id) == winner.json()["event_id"]


async def write_claim(nats_url: str, task_id: str, claim: Claim) -> None:
    """What a gateway leaves in the bucket when it dies after claiming, before publishing."""
    connection = await nats.connect(nats_url)
    try:
        bucket = await connection.jetstream().key_value(ACCEPTED_BUCKET)
        await bucket.put(claim_key(task_id), claim.encode())
    finally:
        await connection.close()


async def test_a_claim_left_by_a_dead_gateway_is_taken_over_after_the_grace(
    fresh_nats: NatsServer, tap: EventTap
) -> None:
    async with gateway(fresh_nats.url) as http:
        now = datetime.now(UTC)
        fresh = Claim(event_id=uuid4(), claimed_at=now)
        await write_claim(fresh_nats.url, "orphan", fresh)
        # Within the grace the claimer may still be publishing. Not a 409 (a client told
        # "known" would stop retrying a task perhaps never submitted): retry later.
        busy = await http.post("/api/v1/schedule", json=task(task_id="orphan"))
        assert busy.status_code == 503, busy.text
        assert busy.headers["Retry-After"] == "6"
        assert "being submitted by another request" in busy.json()["detail"]
        assert await submissions(tap, "orphan") == []

        stale = Claim(event_id=uuid4(), claimed_at=now - timedelta(seconds=GRACE_S + 1))
        await write_claim(fresh_nats.url, "orphan", stale)
        # Past it, and never confirmed: nothing holds the id, so it is not cancellable...
        assert (await http.post("/api/v1/tasks/orphan/cancel")).status_code in (404, 503)
        # ...and a new submission (another body) takes the id over under its own event id.
        taken = await http.post("/api/v1/schedule", json=task(task_id="orphan"))
        assert taken.status_code == 202, taken.text
        assert taken.json()["event_id"] != str(stale.event_id)
        [event] = await submissions(tap, "orphan")
        assert str(event.event_id) == taken.json()["event_id"]
        # The id is now held by that submission, confirmed.
        refused(
            await http.post("/api/v1/schedule", json=task(task_id="orphan")), "orphan", "submitted"
        )

        # The same body as the dead gateway's goes out under that submission's event id: had
        # its publish got through, JetStream (or the inboxes) would drop this copy.
        body = task(task_id="orphan-2")
        same = Claim(
            event_id=uuid4(),
            claimed_at=now - timedelta(seconds=GRACE_S + 1),
            body=body_digest(TaskRequest.model_validate(body)),
        )
        await write_claim(fresh_nats.url, "orphan-2", same)
        retried = await http.post("/api/v1/schedule", json=body)
        assert retried.status_code == 202, retried.text
        assert retried.json()["event_id"] == str(same.event_id)
        [event] = await submissions(tap, "orphan-2")
        assert event.event_id == same.event_id


async def test_a_failed_publish_frees_the_id_at_once(fresh_nats: NatsServer, tap: EventTap) -> None:
    async with gateway(fresh_nats.url) as http:
        connection = await nats.connect(fresh_nats.url)
        try:
            await connection.jetstream().delete_stream(Streams.TASKS.name)
        finally:
            await connection.close()
        failed = await http.post("/api/v1/schedule", json=task(task_id="unlucky"))
        assert failed.status_code == 503, failed.text
        assert "NATS unavailable" in failed.json()["detail"]

        await ensure_streams(fresh_nats.url)
        retried = await http.post("/api/v1/schedule", json=task(task_id="unlucky"))
        assert retried.status_code == 202, retried.text
        connection = await nats.connect(fresh_nats.url)
        try:
            js = connection.jetstream()
            assert (await js.stream_info(Streams.TASKS.name)).state.messages == 1
            stored = await js.get_last_msg(Streams.TASKS.name, "crater.v1.task.submitted")
        finally:
            await connection.close()
        assert (
            str(TaskSubmitted.model_validate_json(stored.data or b"").event_id)
            == (retried.json()["event_id"])
        )


async def test_concurrent_resubmissions_ask_the_scheduler_together_and_each_hears_its_own(
    fresh_nats: NatsServer, tap: EventTap, database_url: str, tmp_path: Path
) -> None:
    """A burst of submissions asks the scheduler about their ids in a few questions, not one
    each (`TasksQuery.task_ids`), and every id still gets its own answer."""
    scheduler, scheduler_app = build_scheduler(
        SchedulerSettings(nats_url=fresh_nats.url, database_url=database_url)
    )
    _, predictor_app = build_predictor(
        PredictorSettings(
            nats_url=fresh_nats.url, database_url=f"sqlite+aiosqlite:///{tmp_path / 'p.db'}"
        )
    )
    ids = [f"burst-{n}" for n in range(40)]
    slow = gateway(fresh_nats.url, query_s=10.0)
    async with TestApp(scheduler_app), TestApp(predictor_app), slow as http:
        await publish(scheduler.broker, NodeTopologyReported(node=node("a100-01", gpus=8)))
        for task_id in ids[:4]:  # these four fill the node (two GPUs each)
            assert (
                await http.post("/api/v1/schedule", json=task(task_id=task_id))
            ).status_code == 202
        await tap.wait_for(AllocationGranted, count=4)
        questions: list[int] = []
        counter = await nats.connect(fresh_nats.url)

        async def count(msg: Any) -> None:
            questions.append(len(TasksQuery.model_validate_json(msg.data).task_ids or [1]))

        await counter.subscribe(QuerySubjects.TASKS, cb=count)
        await counter.flush()
        try:
            answers = await asyncio.gather(
                *(http.post("/api/v1/schedule", json=task(task_id=i)) for i in ids)
            )
        finally:
            await counter.close()
    for task_id, answer in zip(ids, answers, strict=True):
        if task_id in ids[:4]:
            refused(answer, task_id, "scheduled")
        else:
            assert answer.status_code == 202, answer.text
    assert sum(questions) == len(ids)
    assert len(questions) < len(ids) / 2, questions
