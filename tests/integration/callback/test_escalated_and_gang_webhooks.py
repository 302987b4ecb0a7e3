"""AllData hears that a task escalated, and tells a gang's members apart: a real
nats-server, a real database, the reference receiver over HTTP."""

from __future__ import annotations

from faststream import TestApp

from crater.callback.app import build
from crater.contracts import TaskEscalated, WebhookDelivered
from crater.runtime.bus import publish
from crater.runtime.nats_server import NatsServer
from tests.integration.callback.conftest import ServedReceiver
from tests.integration.callback.test_callback_over_nats import settings
from tests.support.events import EventTap
from tests.support.lifecycle import OCCURRED, granted


async def test_an_escalation_and_each_gang_member_reach_alldata(
    fresh_nats: NatsServer, tap: EventTap, receiver: ServedReceiver, database_url: str
) -> None:
    # The typed body: gang_index and escalated_priority are Crater's fields.
    service, app = build(settings(fresh_nats, database_url, receiver.url, webhook_format="crater"))
    async with TestApp(app):
        escalated = TaskEscalated(
            task_id="late",
            waited_seconds=75.5,
            max_queue_time_seconds=60,
            priority=100,
            escalated_priority=500,
            occurred_at=OCCURRED,
        )
        await publish(service.broker, escalated)
        for member, host in enumerate(("gpu-01", "gpu-02")):
            grant = granted("ddp", node=host, gang_index=member, gang_size=2)
            await publish(service.broker, grant.model_copy(update={"allocation_id": f"a-{member}"}))
        await tap.wait_for(WebhookDelivered, count=3)

    bodies = {(d.body["task_id"], d.body["gang_index"]): d.body for d in receiver.state.deliveries}
    late = bodies[("late", None)]
    assert (late["status"], late["escalated_priority"]) == ("pending", 500)
    assert "escalated" in late["reason"]
    assert late["event_id"] == str(escalated.event_id)
    members = [bodies[("ddp", i)] for i in (0, 1)]
    assert [(b["status"], b["gang_size"]) for b in members] == [("scheduled", 2)] * 2
    assert [b["allocated_resources"]["node"] for b in members] == ["gpu-01", "gpu-02"]
