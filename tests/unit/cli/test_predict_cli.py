"""`crater predict FILE.json [--explain] [--plot out.png]`."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from crater.cli.main import app

runner = CliRunner()


def write(tmp_path: Path, body: dict[str, object]) -> Path:
    path = tmp_path / "task.json"
    path.write_text(json.dumps(body))
    return path


def test_prints_the_breakdown_explains_and_draws_the_timeline(tmp_path: Path) -> None:
    task = write(
        tmp_path,
        {
            "task_id": "ft-1",
            "task_type": "fine-tuning",
            "model_config": {"name": "meta-llama/Llama-3-8b-chat-hf", "precision": "bf16"},
            "resource_requirements": {"gpu": {"count": 8, "type": "A100"}, "cpu": {"cores": 64}},
            "training_config": {
                "batch_size": 1,
                "sequence_length": 4096,
                "gradient_checkpointing": True,
            },
        },
    )
    plot = tmp_path / "timeline.png"
    result = runner.invoke(app, ["predict", str(task), "--explain", "--plot", str(plot)])
    assert result.exit_code == 0, result.output
    for word in ("weights", "gradients", "optimizer", "activations", "cuda_context", "peak"):
        assert word in result.output
    assert "num_workers=" in result.output
    assert "checkpoint every 1000 steps" in result.output
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_inference_shows_the_kv_cache(tmp_path: Path) -> None:
    task = write(
        tmp_path,
        {
            "task_id": "serve",
            "task_type": "inference",
            "model_config": {"name": "meta-llama/Llama-2-7b-hf"},
            "resource_requirements": {"gpu": {"count": 1}},
            "inference_config": {"context_length": 4096},
        },
    )
    result = runner.invoke(app, ["predict", str(task), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["breakdown_mb"]["kv_cache"] == 2048


def test_absurd_and_invalid_requests_say_which_field_and_why(tmp_path: Path) -> None:
    absurd = write(
        tmp_path,
        {
            "task_id": "x",
            "task_type": "training",
            "model_config": {"name": "gpt2"},
            "resource_requirements": {"gpu": {"count": 8}},
            "training_config": {"tensor_parallel": 8},
        },
    )
    result = runner.invoke(app, ["predict", str(absurd)])
    assert result.exit_code == 1
    assert "training_config.tensor_parallel" in result.output
    invalid = write(
        tmp_path,
        {
            "task_id": "x",
            "task_type": "training",
            "model_config": {"name": "gpt2"},
            "training_config": {"batch_size": 0},
        },
    )
    result = runner.invoke(app, ["predict", str(invalid)])
    assert result.exit_code == 2  # invalid input (docs/cli.md)
    assert "training_config.batch_size" in result.output


def test_a_config_json_names_the_shape_of_a_model_the_catalog_lacks(tmp_path: Path) -> None:
    body = {
        "task_id": "house",
        "task_type": "inference",
        "model_config": {"name": "acme/house-llm", "precision": "bf16"},
        "resource_requirements": {"gpu": {"count": 1}},
        "inference_config": {"context_length": 4096},
    }
    task = write(tmp_path, body)
    refused = runner.invoke(app, ["predict", str(task)])
    assert refused.exit_code != 0  # no size, no config: nothing to predict from
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 4096,
                "intermediate_size": 14336,
                "num_hidden_layers": 32,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "vocab_size": 128256,
                "tie_word_embeddings": False,
            }
        )
    )
    result = runner.invoke(app, ["predict", str(task), "--hf-config", str(config), "--explain"])
    assert result.exit_code == 0, result.output
    assert "the task's config.json (model_type llama)" in " ".join(result.output.split())
    # the same file named by path, read under the model directory (here: the current one)
    body["model_config"] = {"name": "acme/house-llm", "hf_config_path": "config.json"}
    by_path = runner.invoke(
        app,
        ["predict", str(write(tmp_path, body)), "--json"],
        env={"CRATER_PREDICTOR_MODEL_CONFIG_DIR": str(tmp_path)},
    )
    assert by_path.exit_code == 0, by_path.output
    assert json.loads(by_path.output)["breakdown_mb"]["kv_cache"] == 512  # 8 KV heads, bf16
