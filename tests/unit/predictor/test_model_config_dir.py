"""model_config.hf_config_path: a config.json read from the predictor's model directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from crater.contracts import TaskRequest
from crater.predictor.adapters.model_configs import with_model_config
from crater.predictor.domain.estimate import Refused
from crater.predictor.domain.model_configs import KNOWN


def request(path: str) -> TaskRequest:
    return TaskRequest.model_validate(
        {
            "task_id": "t-1",
            "task_type": "inference",
            "model_config": {"name": "acme/model", "hf_config_path": path},
            "resource_requirements": {"gpu": {"count": 1}},
        }
    )


def test_a_config_json_is_read_from_the_directory(tmp_path: Path) -> None:
    (tmp_path / "qwen").mkdir()
    (tmp_path / "qwen" / "config.json").write_text(json.dumps(KNOWN["qwen2.5-7b"].config))
    loaded = with_model_config(request("qwen"), tmp_path)  # a directory: its config.json
    assert loaded.model_spec.hf_config == KNOWN["qwen2.5-7b"].config


@pytest.mark.parametrize(
    ("path", "directory", "said"),
    [
        ("missing/config.json", True, "No such file"),
        ("config.json", False, "no model directory"),
        ("bad.json", True, "not JSON"),
        ("list.json", True, "not a JSON object"),
    ],
)
def test_what_cannot_be_read_is_refused_naming_the_field(
    tmp_path: Path, path: str, directory: bool, said: str
) -> None:
    (tmp_path / "bad.json").write_text("{")
    (tmp_path / "list.json").write_text("[]")
    with pytest.raises(Refused) as refused:
        with_model_config(request(path), tmp_path if directory else None)
    [error] = refused.value.errors
    assert error.field == "model_config.hf_config_path"
    assert said in error.reason


def test_a_path_out_of_the_directory_never_reaches_the_predictor() -> None:
    for path in ("../etc/passwd", "/etc/passwd", "a/../../b"):
        with pytest.raises(ValidationError):
            request(path)
