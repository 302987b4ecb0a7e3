from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from crater.callback.domain.signing import generate_secret, sign
from crater.callback.sim.receiver import ReceivedWebhook, Receiver, create_receiver, describe

BODY = {
    "task_id": "train-1",
    "status": "scheduled",
    "allocated_resources": {
        "node": "gpu-01",
        "gpu_ids": [0, 1],
        "cpu_cores": [0, 1, 2, 3, 8],
        "numa_node": 0,
        "checkpoint_path": None,
    },
}


async def client_for(receiver: Receiver) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=receiver.app()),
        base_url="http://alldata",
        auth=("alldata", "secret"),
    )


@pytest.fixture
async def receiver(tmp_path: Path) -> AsyncIterator[tuple[Receiver, httpx.AsyncClient]]:
    state = Receiver("alldata", "secret", record_file=tmp_path / "got.jsonl")
    async with await client_for(state) as client:
        yield state, client


async def test_records_a_delivery_once_and_counts_duplicates(
    receiver: tuple[Receiver, httpx.AsyncClient],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    state, client = receiver
    headers = {"webhook-id": "wh-1", "webhook-timestamp": "1714564800"}
    first = await client.post("/hooks/crater", json=BODY, headers=headers)
    again = await client.post("/hooks/crater", json=BODY, headers=headers)
    assert (first.status_code, first.json()["status"]) == (200, "accepted")
    assert (again.status_code, again.json()["status"]) == (200, "duplicate")

    got = (await client.get("/deliveries")).json()
    assert got["count"] == 1
    assert got["duplicates"] == state.duplicates == 1
    [delivery] = got["deliveries"]
    assert delivery["webhook_id"] == "wh-1"
    assert delivery["path"] == "/hooks/crater"
    assert delivery["body"] == BODY
    assert (await client.get("/deliveries", params={"task_id": "other"})).json()["count"] == 0

    lines = (tmp_path / "got.jsonl").read_text().splitlines()
    assert [json.loads(line)["webhook_id"] for line in lines] == ["wh-1"]
    printed = capsys.readouterr().out
    assert "task train-1 -> scheduled on gpu-01 gpus 0-1 cores 0-3,8 numa 0" in printed
    assert "duplicate webhook wh-1" in printed


@pytest.mark.parametrize("auth", [None, ("alldata", "wrong"), ("someone", "secret")])
async def test_wrong_or_missing_credentials_get_401(auth: tuple[str, str] | None) -> None:
    state = Receiver("alldata", "secret", echo=False)
    transport = httpx.ASGITransport(app=state.app())
    async with httpx.AsyncClient(transport=transport, base_url="http://alldata") as client:
        sent = httpx.BasicAuth(*auth) if auth else httpx.USE_CLIENT_DEFAULT  # default: none
        response = await client.post("/", json=BODY, headers={"webhook-id": "wh-1"}, auth=sent)
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Basic")
    assert state.unauthorized == 1
    assert state.deliveries == []


async def test_bad_requests_are_refused(receiver: tuple[Receiver, httpx.AsyncClient]) -> None:
    state, client = receiver
    assert (await client.post("/", json=BODY)).status_code == 400  # no webhook-id
    no_json = await client.post("/", content=b"{nope", headers={"webhook-id": "x"})
    assert no_json.status_code == 400
    a_list = await client.post("/", json=[1, 2], headers={"webhook-id": "y"})
    assert a_list.status_code == 400
    assert state.deliveries == []
    assert (await client.get("/healthz")).json() == {"status": "ok"}


async def test_failure_injection_is_seeded_and_reproducible() -> None:
    async def outcomes() -> list[int]:
        state = Receiver("alldata", "secret", fail_rate=0.5, seed=7, echo=False)
        async with await client_for(state) as client:
            codes = []
            for n in range(20):
                response = await client.post("/", json=BODY, headers={"webhook-id": f"w{n}"})
                codes.append(response.status_code)
            assert state.failures_injected == codes.count(503)
            assert len(state.deliveries) == codes.count(200)
            return codes

    codes = await outcomes()
    assert set(codes) == {200, 503}
    assert codes == await outcomes()


def test_create_receiver_exposes_its_state() -> None:
    app = create_receiver("u", "p", fail_rate=0.0, echo=False)
    assert isinstance(app.state.receiver, Receiver)
    with pytest.raises(ValueError, match="fail_rate"):
        Receiver("u", "p", fail_rate=2.0)


def test_describe_pending() -> None:
    body = {"task_id": "t", "status": "pending", "reason": "0/4 nodes"}
    line = describe(ReceivedWebhook("abcdef123456", None, "now", "/", body))
    assert line == "task t -> pending: 0/4 nodes  (webhook abcdef12)"


async def test_signatures_are_checked_and_replays_refused() -> None:
    secret = generate_secret()
    state = Receiver("alldata", "secret", echo=False, secret=secret)
    body = json.dumps(BODY).encode()
    now = int(time.time())

    def headers(webhook_id: str, timestamp: int, key: str = secret) -> dict[str, str]:
        return {
            "content-type": "application/json",
            "webhook-id": webhook_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": sign(key, webhook_id, timestamp, body),
        }

    async with await client_for(state) as client:
        good = await client.post("/", content=body, headers=headers("wh-1", now))
        forged = await client.post(
            "/", content=body, headers=headers("wh-2", now, generate_secret())
        )
        stale = await client.post("/", content=body, headers=headers("wh-3", now - 301))
        tampered = await client.post(
            "/", content=body.replace(b"train-1", b"train-2"), headers=headers("wh-4", now)
        )
    assert good.status_code == 200
    assert forged.status_code == 401
    assert stale.status_code == 400
    assert tampered.status_code == 401
    assert [d.webhook_id for d in state.deliveries] == ["wh-1"]
    assert (state.bad_signatures, state.replays_refused) == (2, 1)
