from __future__ import annotations

import pytest

from crater.contracts import Confidence, TaskRequest
from crater.predictor.domain.catalog import normalise, parameters_billion
from crater.predictor.domain.estimate import dataloader_settings, predict


def request(**overrides: object) -> TaskRequest:
    body: dict[str, object] = {
        "task_id": "t-1",
        "task_type": "inference",
        "model_config": {"name": "meta-llama/Llama-2-7b-hf", "precision": "fp16"},
        "resource_requirements": {"gpu": {"count": 1, "memory_mb": 20000}},
    }
    body.update(overrides)
    return TaskRequest.model_validate(body)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("meta-llama/Llama-3-8b-chat-hf", "llama-3-8b"),
        ("mistralai/Mistral-7B-v0.1", "mistral-7b"),
        ("bert-base-uncased", "bert-base"),
        ("gpt2", "gpt2"),
    ],
)
def test_names_resolve_to_catalog_keys(name: str, expected: str) -> None:
    assert normalise(name) == expected
    assert parameters_billion(name) is not None


def test_fp16_weights_of_a_7b_model_are_13_to_14_gb() -> None:
    prediction = predict(request())
    weights_gb = prediction.breakdown_mb["weights"] / 1024
    assert 12.5 <= weights_gb <= 14.0
    assert prediction.confidence is Confidence.MEDIUM


def test_mixed_precision_adam_holds_16_bytes_per_parameter() -> None:
    prediction = predict(
        request(
            task_type="training",
            model_config={"name": "custom", "parameters_billion": 1.0, "precision": "bf16"},
        )
    )
    states = sum(prediction.breakdown_mb[k] for k in ("weights", "gradients", "optimizer"))
    assert states == pytest.approx(16e9 / 2**20, rel=0.001)
    assert prediction.confidence is Confidence.LOW  # a parameter count, not a known model


def test_training_states_are_sharded_across_gpus() -> None:
    one = predict(request(task_type="training"))
    four = predict(request(task_type="training", resource_requirements={"gpu": {"count": 4}}))
    assert four.breakdown_mb["optimizer"] == pytest.approx(one.breakdown_mb["optimizer"] / 4, 1)


def test_unknown_model_falls_back_to_the_request_with_low_confidence() -> None:
    prediction = predict(request(model_config={"name": "acme/secret-model"}))
    assert prediction.gpu_memory_per_gpu_mb == 20000
    assert prediction.confidence is Confidence.LOW
    assert "unknown model" in prediction.method


def test_dataloader_settings_leave_a_core_per_gpu_process() -> None:
    assert dataloader_settings(cpu_cores=16, gpus=2) == (7, 2)
    assert dataloader_settings(cpu_cores=1, gpus=1) == (0, 1)
