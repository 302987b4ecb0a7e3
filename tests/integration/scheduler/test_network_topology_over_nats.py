"""Network topology across nodes on a real nats-server and a real database: a node's place
arrives with its topology and survives a restart of the scheduler; a malformed place is
refused naming the field, and the consumer moves on."""

from __future__ import annotations

import json

from faststream import TestApp

from crater.contracts import (
    AllocationGranted,
    FabricPlace,
    MessageRejected,
    NodeTopologyReported,
)
from crater.runtime.bus import publish
from crater.runtime.nats_server import NatsServer
from crater.scheduler.app import SchedulerSettings, build
from tests.integration.scheduler.test_gang_cancel_over_nats import nodes_known, profiled
from tests.support.events import EventTap, publish_raw
from tests.support.scheduler import leading
from tests.support.topologies import node


async def test_places_arrive_persist_and_a_malformed_one_is_refused_by_field(
    fresh_nats: NatsServer, tap: EventTap, database_url: str
) -> None:
    settings = SchedulerSettings(nats_url=fresh_nats.url, database_url=database_url)
    service, app = build(settings)
    leaves = {"n1": "a", "n2": "b", "n3": "b"}
    async with TestApp(app):
        bad = NodeTopologyReported(node=node("bad", gpus=4)).model_dump(mode="json")
        bad["node"]["fabric"] = {"leaf": "leaf 3"}
        await publish_raw(fresh_nats.url, "crater.v1.node.topology.bad", json.dumps(bad).encode())
        for name, leaf in leaves.items():
            place = FabricPlace(spine="s1", leaf=leaf)
            await publish(
                service.broker, NodeTopologyReported(node=node(name, gpus=4, fabric=place))
            )
        await nodes_known(service, 3)
        [refused] = await tap.wait_for(MessageRejected)
        assert [e.field for e in refused.errors] == ["node.fabric.leaf"]
        assert service.state.scheduler.cluster.get("bad") is None
    # a new process: the places come back with the nodes from the database
    service, app = build(settings)
    async with TestApp(app):
        await leading(service)
        cluster = service.state.scheduler.cluster
        assert cluster.fabric_nodes == 3
        assert {n.name: n.topology.fabric.leaf for n in cluster.nodes} == leaves  # type: ignore[union-attr]
        gang = profiled("ddp", gpus=4, gang_size=2, network_topology={"required": "leaf"})
        await publish(service.broker, gang)
        members = await tap.wait_for(AllocationGranted, count=2)
        assert sorted(g.node for g in members) == ["n2", "n3"]
