"""Names of a service's replicas in a Stack, and the order a Stack starts its processes in."""

from __future__ import annotations

import itertools
from pathlib import Path
from types import SimpleNamespace

import pytest

from crater.cli import stack
from crater.cli.stack import SERVICES, Stack, replica_names


def test_replica_names() -> None:
    assert replica_names("callback", 1) == ["callback"]
    assert replica_names("callback", 3) == ["callback", "callback-2", "callback-3"]
    with pytest.raises(ValueError, match="at least one replica"):
        replica_names("gateway", 0)


def test_the_local_node_agent_starts_once_the_services_answer(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The services declare the streams (before their /healthz answers); the node agent may
    declare none, and started beside them it could come first and fail on 'stream not found'
    (a demo without local-01, once in a few runs)."""
    events: list[str] = []

    class FakeNats:
        url = "nats://127.0.0.1:1"

    def spawn(
        self: Stack,
        name: str,
        port: int,
        args: list[str],
        env: object = None,
        address: object = None,
    ) -> None:
        events.append(f"spawn {name}")
        self.processes[name] = SimpleNamespace(name=name)  # type: ignore[assignment]

    monkeypatch.setattr(stack, "start_nats_server", lambda *a, **k: FakeNats())
    monkeypatch.setattr(stack, "migrate", lambda *urls: None)
    ports = itertools.count(20000)
    monkeypatch.setattr(stack, "free_port", lambda host="127.0.0.1": next(ports))
    monkeypatch.setattr(Stack, "_spawn", spawn)
    monkeypatch.setattr(
        stack, "wait_healthy", lambda process: events.append(f"healthy {process.name}")
    )
    Stack(tmp_path).start(local_node=True)
    agent = events.index("spawn agent")
    assert {f"healthy {name}" for name in SERVICES} <= set(events[:agent]), events
    assert events[agent + 1 :] == ["healthy agent"]


def test_a_port_promised_to_one_process_is_never_handed_to_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel may call a port free twice while the process it went to has not bound it
    yet (a replica's port was drawn after the first services were spawned)."""
    drawn = iter([5, 5, 7, 5, 7, 8])
    monkeypatch.setattr(stack, "free_port", lambda host="127.0.0.1": next(drawn))
    s = Stack(tmp_path, ports={"gateway": 7})
    assert [s._free_port() for _ in range(2)] == [5, 8]
