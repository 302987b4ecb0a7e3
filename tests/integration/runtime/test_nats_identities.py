"""A secured nats-server (TLS, one user per service, permissions from the catalog): each
identity is refused what its role does not produce, and the services run under their own."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import nats.errors
import pytest
from faststream import TestApp
from prometheus_client import CollectorRegistry

from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    MessageRejected,
    NodeCondition,
    NodeHealthReported,
    NodeTopologyReported,
    Subjects,
    TaskStatus,
    TaskStatusReported,
    TaskSubmitted,
)
from crater.contracts.queries import NodesAnswer, NodesQuery, QuerySubjects
from crater.gateway.app import GatewaySettings
from crater.gateway.app import build as build_gateway
from crater.predictor.app import PredictorSettings
from crater.predictor.app import build as build_predictor
from crater.runtime import dev_pki
from crater.runtime.bus import encode, make_broker, publish
from crater.runtime.nats_connection import NatsConnection
from crater.runtime.nats_permissions import node_identity
from crater.runtime.nats_server import NatsServer, start_nats_server
from crater.scheduler.app import SchedulerSettings
from crater.scheduler.app import build as build_scheduler
from tests.integration.gateway.test_schedule import task
from tests.integration.scheduler.test_scheduler_over_nats import profiled
from tests.support.events import EventTap
from tests.support.topologies import node


@dataclass
class Secured:
    server: NatsServer
    security: dev_pki.DevSecurity
    log: Path

    def as_(self, identity: str) -> NatsConnection:
        return NatsConnection(
            self.server.url,
            identity,
            self.security.password(identity),
            str(self.security.ca_cert),
        )

    def settings(self, identity: str) -> dict[str, str]:
        return {
            "nats_url": self.server.url,
            "nats_user": identity,
            # as a file it comes through CRATER_NATS_PASSWORD_FILE (the one *_FILE mechanism)
            "nats_password": self.security.password(identity),
            "nats_tls_ca": str(self.security.ca_cert),
        }

    def violations(self) -> list[str]:
        return [line for line in self.log.read_text().splitlines() if "Violation" in line]


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[Secured]:
    security = dev_pki.prepare(tmp_path / "security", nodes=("node-a", "node-b"))
    log = tmp_path / "nats.log"
    with start_nats_server(
        tmp_path / "js", log_file=log, config_file=security.config, tls=True
    ) as server:
        yield Secured(server, security, log)


async def refused(connection: NatsConnection, subject: str) -> list[Exception]:
    """Publish `subject` as `connection`'s user; the server's errors it answered with."""
    errors: list[Exception] = []

    async def on_error(error: Exception) -> None:
        errors.append(error)

    client = await connection.connect(error_cb=on_error)
    try:
        await client.publish(subject, b"{}")
        await client.flush()
        await asyncio.sleep(0.2)
    finally:
        await client.close()
    return errors


async def test_the_probe_cannot_grant_and_the_gateway_cannot_report_health(
    secured: Secured,
) -> None:
    [error] = await refused(secured.as_("probe"), Subjects.ALLOCATION_GRANTED.subject)
    assert "permissions violation" in str(error).lower()
    [error] = await refused(secured.as_("gateway"), Subjects.NODE_HEALTH.for_node("x"))
    assert "permissions violation" in str(error).lower()
    # what their roles produce goes through
    assert await refused(secured.as_("probe"), Subjects.NODE_HEALTH.for_node("x")) == []
    assert await refused(secured.as_("gateway"), Subjects.TASK_SUBMITTED.subject) == []
    assert len(secured.violations()) == 2


async def test_no_password_a_wrong_one_or_no_tls_is_refused(secured: Secured) -> None:
    good = secured.as_("scheduler")
    for attempt in (
        NatsConnection(good.url, tls_ca=good.tls_ca),
        NatsConnection(good.url, "scheduler", "wrong", good.tls_ca),
    ):
        with pytest.raises((nats.errors.Error, OSError)):
            await attempt.connect(
                connect_timeout=2, max_reconnect_attempts=0, allow_reconnect=False
            )
    plain = NatsConnection(good.url.replace("tls://", "nats://"), "scheduler", good.password)
    with pytest.raises((nats.errors.Error, OSError)):
        await plain.connect(connect_timeout=2, max_reconnect_attempts=0, allow_reconnect=False)


@pytest.fixture
async def tap(secured: Secured) -> AsyncIterator[EventTap]:
    event_tap = EventTap(await secured.as_("admin").connect())
    await event_tap.connection.subscribe("crater.v1.>", cb=event_tap._on_message)
    await event_tap.connection.flush()
    yield event_tap
    await event_tap.close()


async def test_services_work_under_their_own_identities(
    secured: Secured, tap: EventTap, tmp_path: Path
) -> None:
    """Gateway (KV bucket, publishing, queries), predictor and scheduler (streams, durable
    consumers, acks, query replies), the probe reporting a node: no permission refused."""
    _, scheduler_app = build_scheduler(
        SchedulerSettings(
            database_url=f"sqlite+aiosqlite:///{tmp_path / 's.db'}", **secured.settings("scheduler")
        )
    )
    _, predictor_app = build_predictor(
        PredictorSettings(
            database_url=f"sqlite+aiosqlite:///{tmp_path / 'p.db'}", **secured.settings("predictor")
        )
    )
    gateway = build_gateway(GatewaySettings(query_timeout_seconds=5, **secured.settings("gateway")))
    probe, _ = make_broker(secured.as_("probe"), "probe", CollectorRegistry(), None)
    async with (
        TestApp(scheduler_app),
        TestApp(predictor_app),
        gateway.router.lifespan_context(gateway),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway), base_url="http://gw") as http,
    ):
        await probe.start()
        try:
            await publish(probe, NodeTopologyReported(node=node("a100-01", gpus=8)))
        finally:
            await probe.stop()
        accepted = await http.post("/api/v1/schedule", json=task())
        assert accepted.status_code == 202, accepted.text
        await tap.wait_for(TaskSubmitted)
        [granted] = await tap.wait_for(AllocationGranted)
        assert (granted.task_id, granted.node) == ("train-42", "a100-01")
        nodes = await http.get("/api/v1/nodes")
        assert nodes.status_code == 200, nodes.text
        assert [n["node_id"] for n in nodes.json()["nodes"]] == ["a100-01"]
        known = await http.get("/api/v1/tasks/train-42")
        assert known.status_code == 200, known.text
    assert secured.violations() == []


async def test_a_node_reports_only_as_itself(secured: Secured) -> None:
    node_a = secured.as_(node_identity("node-a"))
    [error] = await refused(node_a, Subjects.NODE_HEALTH.for_node("node-b"))
    assert "permissions violation" in str(error).lower()
    assert await refused(node_a, Subjects.NODE_HEALTH.for_node("node-a")) == []
    assert await refused(node_a, Subjects.TASK_STATUS.subject) == []
    [error] = await refused(node_a, Subjects.ALLOCATION_GRANTED.subject)
    assert "permissions violation" in str(error).lower()
    assert len(secured.violations()) == 2


async def report(secured: Secured, identity: str, subject: str, body: bytes) -> None:
    """Publish `body` on `subject` to JetStream as `identity`, waiting for the stream's ack."""
    client = await secured.as_(identity).connect()
    try:
        await client.jetstream().publish(subject, body, timeout=5)
    finally:
        await client.close()


async def test_a_body_naming_another_node_than_its_subject_is_refused(
    secured: Secured, tap: EventTap, tmp_path: Path
) -> None:
    """node-a's credential may publish on node-a's subject, but not say node-b is down there:
    the scheduler's consumer refuses it (field node_id) and node-b stays as it reported."""
    _, scheduler_app = build_scheduler(
        SchedulerSettings(
            database_url=f"sqlite+aiosqlite:///{tmp_path / 's.db'}", **secured.settings("scheduler")
        )
    )
    as_b, as_a = node_identity("node-b"), node_identity("node-a")
    async with TestApp(scheduler_app):
        topology = NodeTopologyReported(node=node("node-b", gpus=1))
        await report(secured, as_b, Subjects.NODE_TOPOLOGY.for_node("node-b"), encode(topology))
        ready = NodeHealthReported(node_id="node-b", condition=NodeCondition.READY, score=100)
        await report(secured, as_b, Subjects.NODE_HEALTH.for_node("node-b"), encode(ready))
        forged = NodeHealthReported(node_id="node-b", condition=NodeCondition.NOT_READY, score=0)
        await report(secured, as_a, Subjects.NODE_HEALTH.for_node("node-a"), encode(forged))
        [rejected] = await tap.wait_for(MessageRejected)
        assert rejected.subject == Subjects.NODE_HEALTH.for_node("node-a")
        assert rejected.consumer == "scheduler"
        [wrong] = rejected.errors
        assert wrong.field == "node_id"
        assert "'node-b'" in wrong.reason
        assert "'node-a'" in wrong.reason
        client = await secured.as_("admin").connect()
        try:
            reply = await client.request(
                QuerySubjects.NODES, NodesQuery().model_dump_json().encode(), timeout=5
            )
        finally:
            await client.close()
        [node_b] = NodesAnswer.model_validate_json(reply.data).nodes
        assert (node_b.node_id, node_b.condition) == ("node-b", NodeCondition.READY)
    assert secured.violations() == []


async def test_a_task_report_on_an_allocation_the_task_does_not_hold_is_refused(
    secured: Secured, tap: EventTap, tmp_path: Path
) -> None:
    """The attack: a forged `succeeded` naming a made-up allocation, from a node's credential
    (which may publish task.status), released a running task. Now refused by name."""
    _, scheduler_app = build_scheduler(
        SchedulerSettings(
            database_url=f"sqlite+aiosqlite:///{tmp_path / 's.db'}", **secured.settings("scheduler")
        )
    )
    as_b, as_a = node_identity("node-b"), node_identity("node-a")
    async with TestApp(scheduler_app):
        topology = NodeTopologyReported(node=node("node-b", gpus=1))
        await report(secured, as_b, Subjects.NODE_TOPOLOGY.for_node("node-b"), encode(topology))
        await tap.wait_for(NodeTopologyReported)
        arrival = profiled("victim", gpus=1)
        await report(secured, "admin", Subjects.TASK_PROFILED.subject, encode(arrival))
        [grant] = await tap.wait_for(AllocationGranted, lambda g: g.task_id == "victim")
        forged = TaskStatusReported(
            task_id="victim", status=TaskStatus.SUCCEEDED, allocation_id="alloc-made-up"
        )
        await report(secured, as_a, Subjects.TASK_STATUS.subject, encode(forged))
        [rejected] = await tap.wait_for(
            MessageRejected, lambda r: r.subject == Subjects.TASK_STATUS.subject
        )
        [error] = rejected.errors
        assert error.field == "allocation_id"
        assert "does not hold allocation 'alloc-made-up'" in error.reason
        assert grant.allocation_id in error.reason
        await asyncio.sleep(0.3)
        assert tap.of(AllocationReleased, lambda r: r.task_id == "victim") == []
    assert secured.violations() == []
