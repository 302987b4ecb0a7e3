"""An operator's cordon of a card over the gateway: checked against the nodes the scheduler
knows (404 naming node_id or gpu), refused naming a field out of range (422), else published
on crater.v1.node.cordon for the scheduler (202)."""

from __future__ import annotations

import httpx

from crater.contracts import GpuCordonRequested
from crater.contracts.queries import NodesAnswer, QuerySubjects
from crater.runtime.nats_server import NatsServer
from tests.integration.gateway.test_queries import NODE, responder
from tests.support.events import EventTap

ANSWER = NodesAnswer(nodes=[NODE]).model_dump_json().encode()


async def test_a_card_is_cordoned_and_uncordoned_through_the_bus(
    client: httpx.AsyncClient, fresh_nats: NatsServer, tap: EventTap
) -> None:
    base = f"/api/v1/admin/nodes/{NODE.node_id}/gpus"
    async with responder(fresh_nats.url, QuerySubjects.NODES, lambda _: ANSWER, []):
        cordoned = await client.post(f"{base}/3/cordon", json={"reason": "fan noise"})
        lifted = await client.post(f"{base}/3/uncordon")
    assert cordoned.status_code == 202, cordoned.text
    assert lifted.status_code == 202, lifted.text
    assert cordoned.json()["cordon"] is True
    published = await tap.wait_for(GpuCordonRequested, count=2)
    assert [(e.node_id, e.gpu, e.cordon, e.reason) for e in published] == [
        (NODE.node_id, 3, True, "fan noise"),
        (NODE.node_id, 3, False, ""),
    ]
    assert str(published[0].event_id) == cordoned.json()["event_id"]


async def test_no_such_node_or_card_and_bad_fields_are_refused_by_name(
    client: httpx.AsyncClient, fresh_nats: NatsServer
) -> None:
    async with responder(fresh_nats.url, QuerySubjects.NODES, lambda _: ANSWER, []):
        ghost = await client.post("/api/v1/admin/nodes/ghost-01/gpus/0/cordon")
        beyond = await client.post(f"/api/v1/admin/nodes/{NODE.node_id}/gpus/8/cordon")
        bad_id = await client.post("/api/v1/admin/nodes/a.b/gpus/0/uncordon")
        negative = await client.post(f"/api/v1/admin/nodes/{NODE.node_id}/gpus/-1/cordon")
        long = await client.post(
            f"/api/v1/admin/nodes/{NODE.node_id}/gpus/0/cordon", json={"reason": "x" * 600}
        )
    assert ghost.status_code == 404
    assert ghost.json()["detail"][0]["field"] == "node_id"
    assert beyond.status_code == 404
    assert beyond.json()["detail"][0] == {"field": "gpu", "reason": "gpu-a-01 has 8 GPUs (0..7)"}
    assert bad_id.status_code == 422
    assert bad_id.json()["detail"][0]["field"] == "node_id"
    assert negative.status_code == 422
    assert negative.json()["detail"][0]["field"] == "gpu"
    assert long.status_code == 422
