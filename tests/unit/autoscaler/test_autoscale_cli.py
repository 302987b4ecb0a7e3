"""`crater autoscale-sim`: generate a trace, replay it under both policies, plot."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from crater.cli.main import app


def test_generate_then_replay_with_a_plot(tmp_path: Path) -> None:
    runner = CliRunner()
    trace = tmp_path / "trace.csv"
    made = runner.invoke(
        app, ["autoscale-sim", "--generate", str(trace), "--hours", "0.1", "--seed", "3"]
    )
    assert made.exit_code == 0, made.output
    assert trace.read_text().startswith("timestamp_s,input_tokens,output_tokens\n")

    out, png = tmp_path / "result.json", tmp_path / "plot.png"
    args = ["autoscale-sim", "--trace", str(trace), "--plot", str(png), "--output", str(out)]
    ran = runner.invoke(app, args)
    assert ran.exit_code == 0, ran.output
    assert "SLO attainment" in ran.output
    body = json.loads(out.read_text())
    assert [r["policy"] for r in body["results"]] == ["crater", "hpa"]
    assert all(0 <= r["slo_attainment"] <= 1 for r in body["results"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_trace_is_required() -> None:
    result = CliRunner().invoke(app, ["autoscale-sim"])
    assert result.exit_code != 0
