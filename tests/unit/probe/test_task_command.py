"""The command a node agent runs: what a task may ask, and what it is refused, by field."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from crater.contracts import TaskRequest

BASE: dict[str, Any] = {"task_id": "t-1", "task_type": "training", "model_config": {"name": "m"}}


def test_a_command_with_env_and_working_dir_is_kept() -> None:
    task = TaskRequest.model_validate(
        {
            **BASE,
            "command": ["python", "train.py", "--steps", "3"],
            "env": {"OMP_NUM_THREADS": "2", "_X": ""},
            "working_dir": "/srv/job",
            "image": "pytorch/pytorch:2.3.0",
        }
    )
    assert task.command == ["python", "train.py", "--steps", "3"]
    assert task.env == {"OMP_NUM_THREADS": "2", "_X": ""}
    assert task.working_dir == "/srv/job"
    assert task.image == "pytorch/pytorch:2.3.0"
    assert TaskRequest.model_validate(BASE).command is None  # a launcher starts it


@pytest.mark.parametrize(
    ("extra", "field", "reason"),
    [
        ({"env": {"CRATER_TASK_ID": "x"}}, "env", "'CRATER_TASK_ID' is refused"),
        ({"env": {"crater_gpu_ids": "0"}}, "env", "'crater_gpu_ids' is refused"),
        ({"env": {"1BAD": "x"}}, "env", "'1BAD' is not a variable name"),
        ({"env": {"A": "x\x00y"}}, "env", "NUL"),
        ({"command": []}, "command", "at least 1 item"),
        ({"command": ["ok", ""]}, "command", "at least 1 character"),
        ({"command": ["a"] * 257}, "command", "at most 256 items"),
        ({"command": ["a\x00"]}, "command", "argument 0 contains a NUL byte"),
        ({"working_dir": "relative/dir"}, "working_dir", "must be an absolute path"),
        ({"image": ""}, "image", "at least 1 character"),
    ],
)
def test_bad_execution_fields_are_refused_by_name(
    extra: dict[str, Any], field: str, reason: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        TaskRequest.model_validate({**BASE, **extra})
    errors = refused.value.errors()
    assert errors[0]["loc"][0] == field
    assert reason in errors[0]["msg"]
