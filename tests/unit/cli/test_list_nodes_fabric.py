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


def test_fabric_export_nests_nodes_by_spine_leaf_and_domain_as_graphviz_clusters(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    nodes = [
        summary("a1", FabricPlace(spine="s1", leaf="leaf-1", nvlink_domain="nvl-1")),
        summary("a2", FabricPlace(spine="s1", leaf="leaf-1", nvlink_domain="nvl-1")),
        summary("b1", FabricPlace(spine="s2", leaf="leaf-1")),  # another leaf-1: another leaf
        summary("loose", None),
    ]
    body = NodesAnswer(nodes=nodes).model_dump_json().encode()
    monkeypatch.setattr(
        "crater.cli.gateway.call", lambda *_, **__: httpx.Response(200, content=body)
    )
    out = tmp_path / "fabric.dot"
    result = CliRunner().invoke(app, ["fabric-export", "--output", str(out)])
    assert result.exit_code == 0, result.output
    dot = out.read_text()
    assert dot.startswith("graph fabric {")
    assert dot.rstrip().endswith("}")
    assert dot.count("{") == dot.count("}")
    clusters = [line.split('"')[1] for line in dot.splitlines() if "subgraph" in line]
    assert clusters == [
        "cluster_no declared place",
        "cluster_spine s1",
        "cluster_spine s1/leaf leaf-1",
        "cluster_spine s1/leaf leaf-1/NVLink domain nvl-1",
        "cluster_spine s2",
        "cluster_spine s2/leaf leaf-1",
    ]
    # each node inside its innermost cluster: a1 and a2 after nvl-1 opens, b1 after s2's leaf
    lines = dot.splitlines()
    at = {
        name: next(i for i, line in enumerate(lines) if line.strip().startswith(f'"{name}"'))
        for name in ("a1", "a2", "b1", "loose")
    }
    opened = {c: next(i for i, line in enumerate(lines) if f'"{c}"' in line) for c in clusters}
    assert opened["cluster_spine s1/leaf leaf-1/NVLink domain nvl-1"] < at["a1"] < at["a2"]
    assert opened["cluster_spine s2/leaf leaf-1"] < at["b1"]
    assert opened["cluster_no declared place"] < at["loose"] < opened["cluster_spine s1"]
    assert "8/8 GPUs free" in dot
