"""`crater simulate` end to end on a tiny trace: the table, and the CSV, JSON and PNG."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from crater.cli import errors
from crater.cli.main import app
from crater.scheduler.sim.variants import write_pods
from tests.unit.scheduler.test_fragmentation import PODS


def test_simulate_writes_the_curve(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(
        "sn,cpu_milli,memory_mib,gpu,model\n"
        "node-a,32000,131072,2,T4\nnode-b,32000,131072,1,V100M16\n"
    )
    pods = tmp_path / "openb_pod_list_default.csv"  # the default trace, by its name
    header = (
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
        "creation_time,deletion_time,scheduled_time\n"
    )
    rows = [
        "p-1,2500,1024,1,460,,LS,Running,0,1,0",
        "p-2,1000,1024,1,1000,,LS,Running,0,1,0",
        "p-3,4000,2048,0,0,,BE,Running,0,1,0",
        "p-4,1500,1024,1,250,T4|A10,LS,Running,0,1,0",
    ]
    pods.write_text(header + "\n".join(rows) + "\n")
    out = tmp_path / "results"
    args = ["simulate", "--nodes", str(nodes), "--pods", str(pods), "--policy", "fgd"]
    result = CliRunner().invoke(app, [*args, "--seeds", "1-2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "unallocated GPUs at 130%" in result.output
    # the published figures in words, not a dict's repr
    assert (
        "published for fgd on default: GPU allocation 95.23% at 100% arrived, 95.39% at 130%; "
        in result.output
    )
    assert "{'at_100'" not in result.output
    summary = json.loads((out / "openb_fgd.json").read_text())
    assert summary["seeds"] == [1, 2]
    assert summary["curve"]
    assert max(int(x) for x in summary["curve"]) <= 130
    lines = (out / "openb_fgd.csv").read_text().splitlines()
    assert lines[0] == "arrived_pct,gpu_alloc_pct,cpu_alloc_pct,memory_alloc_pct"
    assert (out / "openb_fgd.png").stat().st_size > 0

    # Another trace is named by its file, its results too, and shown with that trace's own
    # published figures (the paper's artifact), not the default's; out of a terminal,
    # progress comes as lines.
    other = tmp_path / "openb_pod_list_gpuspec10.csv"
    other.write_text(pods.read_text())
    args = ["simulate", "--nodes", str(nodes), "--pods", str(other), "--policy", "fgd"]
    result = CliRunner().invoke(app, [*args, "--seeds", "1-2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "openb (gpuspec10): fgd" in result.output
    assert "published for fgd on gpuspec10: GPU allocation 94.66% at 100% arrived, " in (
        result.output
    )
    assert re.search(r"fgd seed 1: (\d+)/\1 pods", result.output)
    assert "seed 2 done (2/2)" in result.output
    summary = json.loads((out / "openb_gpuspec10_fgd.json").read_text())
    assert (summary["trace"], summary["variant"]) == ("gpuspec10", None)
    assert (summary["published"]["at_100"], summary["published"]["at_130"]) == (94.663, 94.949)
    assert len(summary["published"]["curve"]) == 11  # 80, 85, ..., 130


def test_simulate_replays_a_derived_trace(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(
        "sn,cpu_milli,memory_mib,gpu,model\ng8,96000,393216,8,G2\nt4,104000,524288,2,T4\n"
    )
    pods = tmp_path / "pods.csv"
    write_pods(PODS, pods)
    out = tmp_path / "results"
    args = ["simulate", "--nodes", str(nodes), "--pods", str(pods), "--out", str(out)]
    result = CliRunner().invoke(app, [*args, "--variant", "sharing:80", "--seeds", "1-2"])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "openb_pods_sharing80_crater.json").read_text())
    assert (summary["trace"], summary["variant"], summary["seeds"], summary["published"]) == (
        "pods",
        "sharing80",
        [1, 2],
        None,
    )
    wrong = CliRunner().invoke(app, [*args, "--variant", "busy"])
    assert wrong.exit_code != 0
    assert "--variant" in wrong.output


def test_simulate_without_the_trace_says_where_to_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRATER_OPENB_DIR", str(tmp_path / "nowhere"))
    result = CliRunner().invoke(app, ["simulate"])
    assert result.exit_code == errors.USAGE
    assert "set CRATER_OPENB_DIR" in result.output
    missing = CliRunner().invoke(app, ["simulate", "--nodes", str(tmp_path / "no.csv")])
    assert missing.exit_code == errors.USAGE
    assert "no such file" in missing.output


def test_simulate_writes_outside_the_committed_results_and_prints_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(
        "sn,cpu_milli,memory_mib,gpu,model\ng8,96000,393216,8,G2\nt4,104000,524288,2,T4\n"
    )
    pods = tmp_path / "pods.csv"
    write_pods(PODS, pods)
    monkeypatch.chdir(tmp_path)
    args = ["simulate", "--nodes", str(nodes), "--pods", str(pods), "--seed", "3", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["seeds"] == [3]
    assert (tmp_path / "var" / "simulate" / "openb_pods_crater.json").is_file()
    assert not (tmp_path / "benchmarks").exists()
