"""`crater list-nodes` shows each node's place in the network fabric where nodes declare one,
and the table as before where none do."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from crater.cli.main import app
from crater.contracts import FabricPlace, NodeCondition, NodesAnswer, NodeSummary


def summary(name: str, fabric: FabricPlace | None) -> NodeSummary:
    return NodeSummary(
        node_id=name,
        pool="default",
        condition=NodeCondition.READY,
        gpu_model="A100",
        gpu_memory_mb=81920,
        gpus_total=8,
        gpus_free=8,
        cpu_cores_total=64,
        cpu_cores_free=64,
        memory_mb_total=512_000,
        memory_mb_free=512_000,
        fabric=fabric,
    )


def listed(monkeypatch: pytest.MonkeyPatch, *nodes: NodeSummary) -> str:
    body = NodesAnswer(nodes=list(nodes)).model_dump_json().encode()

    def answer(*_: Any, **__: Any) -> httpx.Response:
        return httpx.Response(200, content=body)

    monkeypatch.setattr("crater.cli.gateway.call", answer)
    monkeypatch.setenv("COLUMNS", "200")
    result = CliRunner().invoke(app, ["list-nodes"])
    assert result.exit_code == 0, result.output
    return result.output


def test_the_fabric_column_appears_only_where_nodes_declare_a_place(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plain = listed(monkeypatch, summary("n1", None))
    assert "fabric" not in plain
    placed = listed(
        monkeypatch, summary("n1", FabricPlace(spine="s1", leaf="leaf-3")), summary("n2", None)
    )
    assert "fabric" in placed
    assert "s1/leaf-3/-" in placed
