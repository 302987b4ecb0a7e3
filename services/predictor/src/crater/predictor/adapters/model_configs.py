"""A task's config.json named by path (model_config.hf_config_path), read from the predictor's
model directory (CRATER_PREDICTOR_MODEL_CONFIG_DIR), never outside it."""

from __future__ import annotations

import json
from pathlib import Path

from crater.contracts import FieldError, TaskRequest
from crater.contracts.tasks import HF_CONFIG_MAX_BYTES
from crater.predictor.domain.estimate import Refused

FIELD = "model_config.hf_config_path"


def with_model_config(request: TaskRequest, directory: Path | None) -> TaskRequest:
    """`request` carrying the config.json its hf_config_path names (a directory: its
    config.json), unless it carries one already; Refused naming the field when the file
    cannot be read as one."""
    spec = request.model_spec
    if spec.hf_config is not None or spec.hf_config_path is None:
        return request

    def refuse(reason: str) -> Refused:
        return Refused([FieldError(field=FIELD, reason=reason)])

    if directory is None:
        raise refuse(
            "this predictor has no model directory (CRATER_PREDICTOR_MODEL_CONFIG_DIR): send "
            "the config.json itself as model_config.hf_config"
        )
    root = directory.resolve()
    path = (root / spec.hf_config_path).resolve()
    if not path.is_relative_to(root):
        raise refuse(f"{spec.hf_config_path!r} leads outside the model directory")
    if path.is_dir():
        path = path / "config.json"
    try:
        with path.open("rb") as file:
            raw = file.read(HF_CONFIG_MAX_BYTES + 1)
    except OSError as error:
        raise refuse(f"{spec.hf_config_path!r}: {error.strerror or error}") from None
    if len(raw) > HF_CONFIG_MAX_BYTES:
        raise refuse(f"{spec.hf_config_path!r} is over {HF_CONFIG_MAX_BYTES} bytes")
    try:
        config = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise refuse(f"{spec.hf_config_path!r} is not JSON: {error}") from None
    if not isinstance(config, dict):
        raise refuse(f"{spec.hf_config_path!r} is not a JSON object")
    model = spec.model_copy(update={"hf_config": config})
    return request.model_copy(update={"model_spec": model})
