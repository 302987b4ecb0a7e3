"""What AllData is told under faults: a task's events across CRATER_TASKS and CRATER_ALLOCATIONS
in adversarial orders, one stream lagging past the order wait, redeliveries, a second end,
late reports, old-style node terminal reports and releases, a lost answer, two replicas on
one database and a restart. At the receiver: exactly one terminal webhook per task, statuses
in lifecycle order, and a repeat only under the same webhook id. Real nats-server, real
database (SQLite and PostgreSQL), the reference receiver over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import uvicorn
from fastapi import Request, Response
from faststream import TestApp
from sqlalchemy import select

from crater.callback.adapters import tables
from crater.callback.app import CallbackSettings, build
from crater.callback.sim.receiver import Receiver
from crater.contracts import (
    AllocationReleased,
    Event,
    ReleaseReason,
    TaskStatus,
    WebhookDelivered,
)
from crater.runtime.bus import encode, publish, subject_of
from crater.runtime.db import make_engine
from crater.runtime.nats_server import NatsServer, free_port
from crater.runtime.service import Service
from tests.integration.callback.conftest import PASSWORD, USERNAME
from tests.integration.callback.sequenced import Numbering, report
from tests.support.events import EventTap, publish_raw
from tests.support.lifecycle import (
    OCCURRED,
    ended,
    granted,
    pending,
    preempted,
    rejected,
    status,
)

ORDER_WAIT = 0.5
TERMINAL = {"succeeded", "failed", "cancelled", "rejected"}
RANK = {"pending": 0, "scheduled": 1, "running": 2, "preempted": 3}


def settings(nats: NatsServer, database_url: str, url: str, **fields: object) -> CallbackSettings:
    values: dict[str, object] = {
        "nats_url": nats.url,
        "database_url": database_url,
        "webhook_url": url,
        "webhook_username": USERNAME,
        "webhook_password": PASSWORD,
        "webhook_timeout_seconds": 1.0,
        "claim_seconds": 2.0,
        "initial_backoff_seconds": 0.05,
        "max_backoff_seconds": 0.2,
        "retry_seed": 1,
        "poll_seconds": 0.05,
        "order_wait_seconds": ORDER_WAIT,
        # These tests read Crater's fields (event_id, attempt, ...) from the typed body.
        "webhook_format": "crater",
    }
    return CallbackSettings.model_validate(values | fields)


def released(task_id: str, reason: ReleaseReason = ReleaseReason.SUCCEEDED) -> AllocationReleased:
    return AllocationReleased(
        allocation_id=f"alloc-{task_id}",
        task_id=task_id,
        node="gpu-01",
        gpu_ids=[0, 1],
        cpu_cores=[0, 1, 2, 3],
        reason=reason,
        occurred_at=OCCURRED,
    )


class Watched:
    """The reference receiver, and every POST it was sent (repeats included), as AllData's
    access log would show them: webhook-id header, and optionally one answer held back past
    the sender's timeout (a 2xx lost on the way back)."""

    def __init__(self) -> None:
        self.state = Receiver(USERNAME, PASSWORD, echo=False)
        self.posted: list[str] = []
        self.lose_answer_to: str | None = None
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/hooks"

    def app(self) -> Any:
        api = self.state.app()

        @api.middleware("http")
        async def watch(request: Request, call_next: Callable[..., Awaitable[Response]]) -> Any:
            webhook_id = request.headers.get("webhook-id", "")
            self.posted.append(webhook_id)
            response = await call_next(request)
            if webhook_id and webhook_id == self.lose_answer_to:
                self.lose_answer_to = None
                await asyncio.sleep(2.0)  # past the sender's timeout: the 2xx never arrives
            return response

        return api

    def told(self, task_id: str) -> list[dict[str, Any]]:
        """What AllData keeps for the task: each webhook id once, in arrival order."""
        return [d.body for d in self.state.deliveries if d.body["task_id"] == task_id]

    def statuses(self, task_id: str) -> list[str]:
        return [b["status"] for b in self.told(task_id) if not b.get("duplicate_submission")]


@contextlib.asynccontextmanager
async def serving(watched: Watched) -> AsyncIterator[Watched]:
    server = uvicorn.Server(
        uvicorn.Config(watched.app(), host="127.0.0.1", port=watched.port, log_level="warning")
    )
    task = asyncio.create_task(server.serve())
    for _ in range(200):
        if server.started:
            break
        await asyncio.sleep(0.02)
    try:
        yield watched
    finally:
        server.should_exit = True
        await task


def assert_lifecycle_truth(watched: Watched, task_id: str) -> list[str]:
    """One terminal webhook, last; the rest in lifecycle order; each webhook id once."""
    statuses = watched.statuses(task_id)
    terminals = [s for s in statuses if s in TERMINAL]
    assert len(terminals) == 1, statuses
    assert statuses[-1] in TERMINAL, statuses
    ranks = [RANK[s] for s in statuses[:-1]]
    assert ranks == sorted(ranks), statuses
    ids = [b["event_id"] for b in watched.told(task_id)]
    assert len(ids) == len(set(ids))
    return statuses


async def redeliver(nats: NatsServer, event: Event) -> None:
    """The same event again under a new message id: JetStream cannot drop it, the inbox must."""
    await publish_raw(
        nats.url, subject_of(event), encode(event), **{"Nats-Msg-Id": str(uuid.uuid4())}
    )


async def superseded(database_url: str) -> dict[str, list[str]]:
    """The delivery log's superseded deliveries: task -> reasons, as operators read them."""
    engine = make_engine(database_url)
    d = tables.deliveries.c
    try:
        async with engine.connect() as connection:
            rows = (
                await connection.execute(
                    select(d.task_id, d.last_error).where(d.state == "superseded").order_by(d.id)
                )
            ).all()
    finally:
        await engine.dispose()
    found: dict[str, list[str]] = {}
    for task_id, reason in rows:
        found.setdefault(task_id, []).append(reason)
    return found


async def superseded_count(database_url: str, count: int, timeout: float = 15.0) -> None:
    """Wait until the delivery log holds `count` superseded deliveries (each stream's
    consumer goes at its own pace), and a moment more for anything that would follow."""
    deadline = asyncio.get_running_loop().time() + timeout
    while sum(map(len, (await superseded(database_url)).values())) < count:
        assert asyncio.get_running_loop().time() < deadline, await superseded(database_url)
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.3)


def counted(service: Service, watched: Watched, reason: str) -> float:
    labels = {"endpoint": watched.url, "reason": reason}
    return service.registry.get_sample_value("crater_webhook_superseded_total", labels) or 0.0


async def test_one_stream_lagging_past_the_order_wait_still_tells_one_end_in_order(
    fresh_nats: NatsServer, tap: EventTap, database_url: str
) -> None:
    numbered = Numbering()
    # "slow-grants": the allocation stream lags. "slow-tasks": the task stream lags.
    lagging_grant = {
        "pending": numbered(pending("slow-grants")),
        "granted": numbered(granted("slow-grants")),
        "released": numbered(released("slow-grants")),
        "ended": numbered(ended("slow-grants")),
    }
    lagging_tasks = {
        "pending": numbered(pending("slow-tasks")),
        "granted": numbered(granted("slow-tasks")),
        "released": numbered(released("slow-tasks", ReleaseReason.FAILED)),
        "ended": numbered(ended("slow-tasks", TaskStatus.FAILED, "failed")),
    }
    watched = Watched()
    async with serving(watched):
        url = watched.url
        service, app = build(settings(fresh_nats, database_url, url))
        async with TestApp(app):
            # CRATER_TASKS is current for slow-grants (with the node's own reports, the
            # old-style terminal one included), CRATER_ALLOCATIONS for slow-tasks.
            await publish(service.broker, lagging_grant["pending"])
            await publish(service.broker, report("slow-grants"))
            await publish(service.broker, report("slow-grants", TaskStatus.SUCCEEDED))
            await publish(service.broker, lagging_grant["ended"])
            await publish(service.broker, lagging_tasks["granted"])
            await publish(service.broker, lagging_tasks["released"])
            # The lagging streams come after the order wait let what was there go: the end
            # of slow-grants, and the grant of slow-tasks.
            await tap.wait_for(WebhookDelivered, lambda e: e.task_status == "succeeded")
            await tap.wait_for(WebhookDelivered, lambda e: e.task_status == "scheduled")
            # Then the lagging streams, each redelivering one of its events.
            await publish(service.broker, lagging_grant["granted"])
            await publish(service.broker, lagging_grant["released"])
            await redeliver(fresh_nats, lagging_grant["granted"])
            await publish(service.broker, lagging_tasks["pending"])
            await publish(service.broker, report("slow-tasks"))
            await publish(service.broker, report("slow-tasks", TaskStatus.FAILED))
            await publish(service.broker, lagging_tasks["ended"])
            await redeliver(fresh_nats, lagging_tasks["ended"])
            await tap.wait_for(WebhookDelivered, lambda e: e.task_status == "failed")
            await superseded_count(database_url, 3)
        reasons = await superseded(database_url)

    # slow-grants: its running report never saw its grant within the wait, the end went
    # once its own wait ran out, and the grant that came after it is not told.
    assert assert_lifecycle_truth(watched, "slow-grants") == ["pending", "succeeded"]
    assert [r.split(":")[0] for r in reasons["slow-grants"]] == [
        "superseded (no_grant)",
        "superseded (out_of_order)",
    ]
    # slow-tasks: scheduled went after its wait; the pending that lagged behind it is not told.
    assert assert_lifecycle_truth(watched, "slow-tasks") == ["scheduled", "running", "failed"]
    assert [r.split(":")[0] for r in reasons["slow-tasks"]] == ["superseded (out_of_order)"]
    [end] = [b for b in watched.told("slow-tasks") if b["status"] == "failed"]
    assert (end["release_reason"], end["attempt"]) == ("failed", 1)
    assert counted(service, watched, "out_of_order") == 2
    assert counted(service, watched, "no_grant") == 1
    assert len(watched.posted) == len(set(watched.posted)) == 5  # no repeat was needed


async def test_after_the_end_nothing_more_is_told_and_a_second_end_never(
    fresh_nats: NatsServer, tap: EventTap, database_url: str
) -> None:
    numbered = Numbering()
    first = [numbered(pending("done")), numbered(granted("done"))]
    end = numbered(ended("done"))
    watched = Watched()
    async with serving(watched):
        service, app = build(settings(fresh_nats, database_url, watched.url))
        async with TestApp(app):
            for event in first:
                await publish(service.broker, event)
            await publish(service.broker, report("done"))
            await publish(service.broker, numbered(released("done")))
            await publish(service.broker, end)
            await tap.wait_for(WebhookDelivered, lambda e: e.task_status == "succeeded")
            # After the end: a second end under another id (a confused producer), a running
            # report with no allocation (after everything), the node's running again (under
            # another id), an old-style node end, a refused resubmission.
            second = ended("done", TaskStatus.FAILED)
            await publish(service.broker, second)
            await publish(service.broker, status("done"))
            await publish(service.broker, report("done"))
            await publish(service.broker, report("done", TaskStatus.SUCCEEDED))
            await publish(service.broker, rejected("done", duplicate=True))
            await tap.wait_for(WebhookDelivered, lambda e: e.task_status == "rejected")
            await superseded_count(database_url, 3)
        reasons = await superseded(database_url)

    assert assert_lifecycle_truth(watched, "done") == [
        "pending",
        "scheduled",
        "running",
        "succeeded",
    ]
    # The refused resubmission is told, and says it is not the task's end.
    [refused] = [b for b in watched.told("done") if b.get("duplicate_submission")]
    assert refused["status"] == "rejected"
    assert "already known" in refused["reason"]
    assert [r.split(":")[0] for r in reasons["done"]] == [
        "superseded (second_end)",
        "superseded (after_end)",
        "superseded (repeat)",
    ]
    assert str(end.event_id) in reasons["done"][0]  # it names the end that was told
    for reason in ("second_end", "after_end", "repeat"):
        assert counted(service, watched, reason) == 1


async def test_a_lost_answer_repeats_the_end_under_the_same_webhook_id(
    fresh_nats: NatsServer, tap: EventTap, database_url: str
) -> None:
    numbered = Numbering()
    end = numbered(ended("lost-ack"))
    watched = Watched()
    watched.lose_answer_to = str(end.event_id)
    async with serving(watched):
        service, app = build(settings(fresh_nats, database_url, watched.url))
        async with TestApp(app):
            await publish(service.broker, end)
            [delivered] = await tap.wait_for(WebhookDelivered, timeout=15)

    assert delivered.attempts == 2  # the first POST's answer never came back
    assert watched.posted == [str(end.event_id)] * 2  # the same webhook id both times
    assert watched.state.duplicates == 1  # which is how AllData drops the repeat
    [body] = watched.told("lost-ack")
    assert body["event_id"] == str(end.event_id)
    assert assert_lifecycle_truth(watched, "lost-ack") == ["succeeded"]


async def test_replicas_sharing_the_database_and_a_restart_keep_one_end_per_task(
    fresh_nats: NatsServer, tap: EventTap, database_url: str
) -> None:
    """Two callback replicas share the consumers and the database: one task's events are
    recorded and released by either. Then a fresh one starts: the guard is in the database."""
    numbered = Numbering()
    tasks = [f"r{n}" for n in range(8)]
    lifecycles = {
        task_id: [
            numbered(pending(task_id)),
            numbered(granted(task_id)),
            report(task_id),
            report(task_id, TaskStatus.SUCCEEDED),  # old style: not told
            numbered(released(task_id)),
            numbered(ended(task_id)),
        ]
        for task_id in tasks
    }
    watched = Watched()
    async with serving(watched):
        # Exactly once only while no post outlasts its timeout or its claim: a loaded
        # machine (a parallel suite) must not make a retry, which the receiver counts.
        config = settings(
            fresh_nats, database_url, watched.url, webhook_timeout_seconds=10.0, claim_seconds=20.0
        )
        one, app_one = build(config)
        _two, app_two = build(config)
        async with TestApp(app_one), TestApp(app_two):
            # Each task's events from the last to the first, both streams interleaved.
            for n in reversed(range(6)):
                for task_id in tasks:
                    await publish(one.broker, lifecycles[task_id][n])
            for task_id in tasks[:4]:  # and the ends once more, under their own ids
                await redeliver(fresh_nats, lifecycles[task_id][5])
            for task_id in tasks:  # each task's own end: a repeat must not count for another
                await tap.wait_for(
                    WebhookDelivered,
                    lambda e, t=task_id: e.task_id == t and e.task_status == "succeeded",
                )
            await asyncio.sleep(0.5)
        for task_id in tasks:
            assert assert_lifecycle_truth(watched, task_id)[-1] == "succeeded"
        told = len(watched.state.deliveries)
        before = sum(map(len, (await superseded(database_url)).values()))

        three, app_three = build(config)
        async with TestApp(app_three):
            for task_id in tasks:  # late: a second end and a running report, after a restart
                await publish(three.broker, ended(task_id, TaskStatus.FAILED))
                await publish(three.broker, report(task_id))
            await publish(three.broker, granted("after-restart"))
            await tap.wait_for(WebhookDelivered, lambda e: e.task_id == "after-restart")
            await superseded_count(database_url, before + 2 * len(tasks))

    assert len(watched.state.deliveries) == told + 1  # only the other task's webhook
    for task_id in tasks:
        assert assert_lifecycle_truth(watched, task_id)[-1] == "succeeded"
    assert counted(three, watched, "second_end") == len(tasks)
    assert counted(three, watched, "repeat") == len(tasks)  # the node said running before
    assert watched.state.duplicates == 0


async def test_each_webhook_of_a_retried_task_says_its_attempt(
    fresh_nats: NatsServer, tap: EventTap, database_url: str
) -> None:
    """A node's running and a preemption do not say their attempt: AllData is told the one of
    the event before them, so a late report of the first attempt cannot pass for the second's."""
    numbered = Numbering()
    second = "alloc-retried-2"
    emitted: list[Event] = [
        numbered(pending("retried")),
        numbered(granted("retried")),
        report("retried"),
        numbered(preempted("retried")),
        numbered(released("retried", ReleaseReason.PREEMPTED)),
        numbered(pending("retried").model_copy(update={"attempt": 2})),
        numbered(granted("retried", allocation_id=second, attempt=2)),
        report("retried").model_copy(update={"allocation_id": second}),
        numbered(released("retried").model_copy(update={"allocation_id": second})),
        numbered(ended("retried", attempt=2)),
    ]
    watched = Watched()
    async with serving(watched):
        # No post may outlast its timeout on a loaded machine: the retry would be a duplicate.
        config = settings(
            fresh_nats, database_url, watched.url, webhook_timeout_seconds=10.0, claim_seconds=20.0
        )
        service, app = build(config)
        async with TestApp(app):
            for event in reversed(emitted):  # the worst order: the end first
                await publish(service.broker, event)
            # each waits its order turn, one after another: slow on a loaded machine
            await tap.wait_for(WebhookDelivered, count=8, timeout=60)

    told = [(b["status"], b["attempt"]) for b in watched.told("retried")]
    assert told == [
        ("pending", 1),
        ("scheduled", 1),
        ("running", 1),
        ("preempted", 1),
        ("pending", 2),
        ("scheduled", 2),
        ("running", 2),
        ("succeeded", 2),
    ]
    assert watched.state.duplicates == 0
