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


def test_several_hpa_targets_and_the_rule_side_by_side(tmp_path: Path) -> None:
    runner = CliRunner()
    trace = tmp_path / "trace.csv"
    sharp = ["--bursts-per-hour", "20", "--burst-factor", "3", "6", "--burst-seconds", "10", "20"]
    made = runner.invoke(
        app, ["autoscale-sim", "--generate", str(trace), "--hours", "0.05", "--seed", "2", *sharp]
    )
    assert made.exit_code == 0, made.output
    out = tmp_path / "result.json"
    args = ["autoscale-sim", "--trace", str(trace), "--output", str(out), "--strategy", "rule"]
    ran = runner.invoke(app, [*args, "--hpa-target", "0.5", "--hpa-target", "0.7"])
    assert ran.exit_code == 0, ran.output
    body = json.loads(out.read_text())
    assert [r["policy"] for r in body["results"]] == ["crater", "hpa 0.5", "hpa 0.7"]
    assert body["config"]["strategy"] == "rule"
    assert body["config"]["hpa_target_utilisation"] == [0.5, 0.7]


def test_a_bad_strategy_is_refused_by_name(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("timestamp_s,input_tokens,output_tokens\n0.5,10,10\n")
    result = CliRunner().invoke(app, ["autoscale-sim", "--trace", str(trace), "--strategy", "x"])
    assert result.exit_code != 0
    assert "--strategy" in result.output


def test_the_simulator_starts_from_the_services_defaults() -> None:
    # One source of defaults: what the simulator measures is what the service ships.
    import inspect

    from crater.autoscaler.app import AutoscalerSettings
    from crater.cli.autoscale import autoscale_sim

    settings = AutoscalerSettings()
    defaults = inspect.signature(autoscale_sim).parameters
    assert defaults["drain_seconds"].default == settings.drain_seconds
    assert defaults["strategy"].default == settings.strategy
    assert defaults["max_replicas"].default == settings.max_replicas
    assert defaults["min_replicas"].default == settings.min_replicas
    assert defaults["scale_in_step"].default == settings.max_scale_in_step
    assert (defaults["headroom"].default or None) == settings.scale_in_headroom
    assert defaults["warm_pool"].default == settings.warm_pool_size


def test_a_run_off_the_shipped_defaults_says_so(tmp_path: Path) -> None:
    runner = CliRunner()
    trace = tmp_path / "trace.csv"
    made = runner.invoke(
        app, ["autoscale-sim", "--generate", str(trace), "--hours", "0.05", "--seed", "4"]
    )
    assert made.exit_code == 0, made.output
    out = tmp_path / "result.json"
    shipped = runner.invoke(app, ["autoscale-sim", "--trace", str(trace), "--output", str(out)])
    assert shipped.exit_code == 0, shipped.output
    assert "NOT THE SHIPPED DEFAULTS" not in shipped.output
    assert json.loads(out.read_text())["config"]["not_the_shipped_defaults"] == []
    args = ["--max-replicas", "24", "--scale-in-step", "16", "--initial-replicas", "3"]
    other = runner.invoke(
        app, ["autoscale-sim", "--trace", str(trace), "--output", str(out), *args]
    )
    assert other.exit_code == 0, other.output
    assert "NOT THE SHIPPED DEFAULTS" in other.output
    assert "max_replicas 24 (ships 16)" in other.output
    [note] = json.loads(out.read_text())["config"]["not_the_shipped_defaults"]
    assert "max_scale_in_step 16 (ships 1)" in note
    assert json.loads(out.read_text())["results"][0]["initial_replicas"] == 3


def test_json_prints_the_results_on_stdout(tmp_path: Path) -> None:
    runner = CliRunner()
    trace = tmp_path / "trace.csv"
    made = runner.invoke(
        app, ["autoscale-sim", "--generate", str(trace), "--hours", "0.05", "--seed", "4"]
    )
    assert made.exit_code == 0, made.output
    ran = runner.invoke(app, ["autoscale-sim", "--trace", str(trace), "--json"])
    assert ran.exit_code == 0, ran.output
    body = json.loads(ran.stdout)
    assert [r["policy"] for r in body["results"]] == ["crater", "hpa"]


def test_each_baseline_can_be_run_at_its_targets(tmp_path: Path) -> None:
    runner = CliRunner()
    trace = tmp_path / "trace.csv"
    made = runner.invoke(
        app, ["autoscale-sim", "--generate", str(trace), "--hours", "0.05", "--seed", "4"]
    )
    assert made.exit_code == 0, made.output
    out = tmp_path / "result.json"
    args = ["autoscale-sim", "--trace", str(trace), "--output", str(out), "--policy", "baseline"]
    chosen = ["--baseline", "hpa-slots", "--baseline", "hpa-kv", "--baseline", "kpa"]
    targets = ["--hpa-kv-target", "0.5", "--hpa-kv-target", "0.8", "--kpa-target", "6"]
    ran = runner.invoke(app, [*args, *chosen, *targets])
    assert ran.exit_code == 0, ran.output
    body = json.loads(out.read_text())
    assert [r["policy"] for r in body["results"]] == ["hpa", "hpa-kv 0.5", "hpa-kv 0.8", "kpa"]
    assert body["config"]["baselines"] == ["hpa-slots", "hpa-kv", "kpa"]
    assert body["config"]["hpa_kv_target_utilisation"] == [0.5, 0.8]
    assert body["config"]["kpa_target_concurrency"] == [6.0]
    assert all(r["decisions_not_carried_out"] == 0 for r in body["results"])


def test_an_unknown_baseline_is_refused_by_name(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("timestamp_s,input_tokens,output_tokens\n0.5,10,10\n")
    result = CliRunner().invoke(app, ["autoscale-sim", "--trace", str(trace), "--baseline", "vpa"])
    assert result.exit_code != 0
    assert "hpa-slots, hpa-kv, kpa" in result.output


def test_a_heavy_tailed_trace_is_generated_by_its_profile(tmp_path: Path) -> None:
    runner = CliRunner()
    trace = tmp_path / "coding.csv"
    made = runner.invoke(
        app, ["autoscale-sim", "--generate", str(trace), "--hours", "0.2", "--tokens", "coding"]
    )
    assert made.exit_code == 0, made.output
    rows = [line.split(",") for line in trace.read_text().splitlines()[1:]]
    prompts = sorted(int(r[1]) for r in rows)
    outputs = sorted(int(r[2]) for r in rows)
    assert 1_300 < prompts[len(prompts) // 2] < 1_700  # median ~1,500
    assert 8 < outputs[len(outputs) // 2] < 20  # short answers, median ~13


def test_an_unknown_token_profile_is_refused_by_name(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["autoscale-sim", "--generate", str(tmp_path / "t.csv"), "--tokens", "poetry"]
    )
    assert result.exit_code == 2
    assert "--tokens is one of short, conversation, coding" in result.output
    assert not (tmp_path / "t.csv").exists()
