"""`crater_client.cpu_phase`: what it posts on entering and leaving, with which credential,
how it waits for the scheduler to say its cards are its own again, and how a refusal
surfaces. Against a stand-in gateway on a local port."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from crater_client import Conflict, CpuPhase, CraterError, cpu_phase
from crater_client.monitoring import RESERVATION_TOKEN_HEADER

ENV = {
    "CRATER_GPU_IDS": "0,1",
    "CRATER_CPU_CORE_IDS": "0",
    "CRATER_MEMORY_MB": "1024",
    "CRATER_TASK_ID": "train-1",
    "CRATER_ALLOCATION_ID": "alloc-1",
    "CRATER_RESERVATION_TOKEN": "token-1",
}


class Gateway(ThreadingHTTPServer):
    """Records each POSTed body and its headers, answering `status`; answers each GET with
    the next of `standings` (the last one again once they run out), recording its path."""

    def __init__(self, status: int = 202, standings: tuple[str, ...] = ("returned",)) -> None:
        self.posts: list[tuple[str, dict[str, Any], dict[str, str]]] = []
        self.gets: list[tuple[str, dict[str, str]]] = []
        self.status = status
        self.standings = standings
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                headers = {k.lower(): v for k, v in self.headers.items()}
                gateway.posts.append((self.path, body, headers))
                self.answer(gateway.status, {"phase": body.get("phase")})

            def do_GET(self) -> None:
                gateway.gets.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
                lending = gateway.standings[min(len(gateway.gets), len(gateway.standings)) - 1]
                self.answer(200, {"lending": lending})

            def answer(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


def cards() -> dict[int, tuple[float, int, int]]:
    return {0: (0.0, 30000, 81920), 1: (0.0, 1000, 81920)}


def phase_of(gateway: Gateway, wait: float = 5.0, token: str | None = "token-1") -> CpuPhase:
    return CpuPhase(
        gateway_url=gateway.url,
        task_id="train-1",
        allocation_id="alloc-1",
        credentials={"authorization": "Bearer key-1"},
        token=token,
        gpu_ids=[0, 1],
        expected_seconds=600,
        wait_seconds=wait,
        read_gpus=cards,
    )


def test_it_posts_begin_and_end_and_waits_until_the_scheduler_returns_the_cards() -> None:
    gateway = Gateway(standings=("lent", "reclaiming", "returned"))
    with phase_of(gateway) as phase:
        path, begun, headers = gateway.posts[0]
        assert path == "/api/v1/tasks/train-1/phase"
        assert begun["phase"] == "cpu"
        assert begun["allocation_id"] == "alloc-1"
        assert begun["expected_seconds"] == 600
        assert [(g["gpu_id"], g["memory_used_mb"]) for g in begun["gpus"]] == [
            (0, 30000),
            (1, 1000),
        ]
        assert headers["authorization"] == "Bearer key-1"
    _, ended, _ = gateway.posts[1]
    assert ended["phase"] == "gpu"
    assert ended["event_id"] != begun["event_id"]
    assert phase.free is True
    assert len(gateway.gets) == 3  # lent (the end not taken yet), reclaiming, returned
    path, headers = gateway.gets[0]
    assert path == "/api/v1/tasks/train-1/phase?allocation_id=alloc-1"
    assert headers[RESERVATION_TOKEN_HEADER.lower()] == "token-1"
    gateway.shutdown()


def test_cards_not_returned_in_time_are_said_not_free() -> None:
    gateway = Gateway(standings=("reclaiming",))
    with phase_of(gateway, wait=0.6) as phase:
        pass
    assert phase.free is False
    assert phase.standing == {"lending": "reclaiming"}
    gateway.shutdown()


def test_without_a_reservation_token_it_does_not_ask() -> None:
    gateway = Gateway()
    with phase_of(gateway, token=None) as phase:
        pass
    assert phase.free is None
    assert [body["phase"] for _, body, _ in gateway.posts] == ["cpu", "gpu"]
    assert not gateway.gets
    gateway.shutdown()


def test_a_refused_begin_raises_and_the_block_does_not_run() -> None:
    gateway = Gateway(status=409)
    ran = False
    with pytest.raises(Conflict) as refused, phase_of(gateway):
        ran = True
    assert not ran
    assert refused.value.status == 409
    gateway.shutdown()


def test_the_environment_names_the_task_and_a_missing_gateway_is_said() -> None:
    gateway = Gateway()
    phase = cpu_phase(environ={**ENV, "CRATER_GATEWAY_URL": gateway.url}, wait_seconds=0)
    assert phase.url == f"{gateway.url}/api/v1/tasks/train-1/phase"
    assert phase.credentials == {RESERVATION_TOKEN_HEADER: "token-1"}
    assert phase.token == "token-1"
    with pytest.raises(CraterError, match="CRATER_GATEWAY_URL"):
        cpu_phase(environ=ENV)
    gateway.shutdown()
