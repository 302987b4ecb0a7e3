"""The techniques people train and serve with: quantization schemes, precision modes,
optimizers, offload, the loss, LoRA's dropout, pipelines and serving engines."""

from __future__ import annotations

import pytest

from crater.contracts import TaskRequest
from crater.predictor.domain.catalog import CATALOG
from crater.predictor.domain.estimate import Refused, predict

GIB = 2**30
MIB = 2**20


def body(task_type: str = "inference", **extra: object) -> dict[str, object]:
    base: dict[str, object] = {
        "task_id": "t-1",
        "task_type": task_type,
        "model_config": {"name": "Qwen/Qwen2.5-7B-Instruct", "precision": "bf16"},
        "resource_requirements": {"gpu": {"count": 1}},
    }
    return base | extra


def run(**extra: object) -> dict[str, int]:
    return predict(TaskRequest.model_validate(body(**extra))).breakdown_mb


def train(config: dict[str, object], **model: object) -> TaskRequest:
    spec = {"name": "meta-llama/Llama-3.1-8B", "precision": "bf16", **model}
    return TaskRequest.model_validate(
        body("training", model_config=spec, training_config={"batch_size": 1, **config})
    )


@pytest.mark.parametrize(
    ("quantization", "bits"),
    [("gptq-int8", 8 + 24 / 128), ("gptq", 4 + 20 / 128), ("awq", 4 + 20 / 128), ("fp8", 8),
     ("nf4", 4.5), ("nf4-dq", 4.127), ("int8", 8), ("GPTQ_Int4", 4 + 20 / 128)],
)  # fmt: skip
def test_quantized_weights_keep_embeddings_and_head_in_16_bits(
    quantization: str, bits: float
) -> None:
    a = CATALOG["qwen2.5-7b"]
    weights = run(model_config={"name": "Qwen/Qwen2.5-7B", "quantization": quantization})
    blocks = a.parameters - a.embedding_parameters
    expected = blocks * bits / 8 + a.embedding_parameters * 2
    assert weights["weights"] * MIB == pytest.approx(expected, rel=0.002)


def test_gptq_int8_is_twice_gptq_int4_in_the_blocks() -> None:
    int8 = run(model_config={"name": "Qwen/Qwen2.5-7B", "quantization": "gptq-int8"})
    int4 = run(model_config={"name": "Qwen/Qwen2.5-7B", "quantization": "gptq-int4"})
    assert int8["weights"] > 1.5 * int4["weights"]


def test_an_unknown_quantization_is_refused_with_the_known_ones() -> None:
    with pytest.raises(Refused) as refused:
        run(model_config={"name": "Qwen/Qwen2.5-7B", "quantization": "magic-3bit"})
    [error] = refused.value.errors
    assert error.field == "model_config.quantization"
    assert "magic-3bit" in error.reason
    for known in ("gptq-int4", "gptq-int8", "awq", "nf4", "fp8", "none"):
        assert known in error.reason
    # AllData's "none" says no quantization
    assert run(model_config={"name": "Qwen/Qwen2.5-7B", "quantization": "none"}) == run()


def states(request: TaskRequest) -> float:
    b = predict(request).breakdown_mb
    return (b["weights"] + b["gradients"] + b["optimizer"]) * MIB / 8.03e9


@pytest.mark.parametrize(
    ("config", "per_parameter"),
    [
        ({}, 16),  # AMP: bf16 weights and gradients, fp32 master, momentum, variance
        ({"master_weights": False}, 8),  # pure bf16: the states in bf16 too
        ({"optimizer": "adamw8bit"}, 10),  # 2 + 2 + 4 master + 2 for both states
        ({"optimizer": "adamw8bit", "master_weights": False}, 6),
        ({"optimizer": "sgd"}, 12),
        ({"optimizer": "sgd-plain"}, 8),  # no momentum: weights, gradients and master only
        ({"optimizer": "sgd-plain", "master_weights": False}, 4),
        ({"optimizer": "adafactor", "master_weights": False}, 4.05),  # factored: ~nothing
        ({"optimizer": "paged-adamw", "master_weights": False}, 4),  # states in host memory
    ],
)
def test_precision_modes_and_optimizers(config: dict[str, object], per_parameter: float) -> None:
    assert states(train(config)) == pytest.approx(per_parameter, rel=0.02)


def test_paged_and_offloaded_states_are_predicted_in_host_memory() -> None:
    paged = predict(train({"optimizer": "paged-adamw8bit"}))
    assert paged.host_breakdown_mb["paged optimizer"] * MIB / 8.03e9 == pytest.approx(6, rel=0.02)
    offloaded = predict(train({"offload_optimizer": True}))
    assert offloaded.breakdown_mb["optimizer"] == 0
    assert offloaded.host_breakdown_mb["offloaded optimizer"] > 0
    plain = predict(train({}))
    assert offloaded.host_memory_mb > plain.host_memory_mb


def test_optimizer_in_backward_holds_one_gradient_at_a_time() -> None:
    b = predict(train({"optimizer_in_backward": True})).breakdown_mb
    largest = CATALOG["llama-3.1-8b"].largest_layer_parameters  # the embedding
    assert b["gradients"] * MIB == pytest.approx(largest * 2, rel=0.01)


def test_offloaded_activations_leave_two_layers_on_the_card() -> None:
    plain = predict(train({"sequence_length": 4096})).breakdown_mb
    moved = predict(train({"sequence_length": 4096, "offload_activations": True}))
    assert moved.breakdown_mb["activations"] == pytest.approx(
        plain["activations"] * 2 / 32, rel=0.01
    )
    assert moved.host_breakdown_mb["offloaded activations"] >= plain["activations"]


def test_parameters_offloaded_need_zero_3() -> None:
    with pytest.raises(Refused) as refused:
        predict(train({"offload_parameters": True}))
    assert refused.value.errors[0].field == "training_config.offload_parameters"
    b = predict(train({"offload_parameters": True, "zero_stage": 3})).breakdown_mb
    assert b["weights"] == 0
    assert b["gathered_parameters"] > 0


def test_lora_dropout_keeps_a_copy_of_each_adapted_input() -> None:
    lora = {"rank": 16, "target_modules": ["all-linear"]}
    dry = predict(train({"sequence_length": 2048, "lora": lora})).breakdown_mb
    wet = predict(train({"sequence_length": 2048, "lora": lora | {"dropout": 0.05}}))
    a = CATALOG["llama-3.1-8b"]
    # per token and layer each adapter drops out its own copy of its module's input: q, k,
    # v, o, gate, up (h each) and down (f), 2 bytes and a 1-byte mask each
    inputs = a.layers * (6 * a.hidden + a.ffn)
    extra = 2048 * inputs * 3
    assert (wet.breakdown_mb["activations"] - dry["activations"]) * MIB == pytest.approx(
        extra, rel=0.01
    )


def test_a_classification_head_has_no_vocabulary_logits() -> None:
    request = TaskRequest.model_validate(
        body(
            "training",
            model_config={"name": "bert-large-uncased", "precision": "fp32"},
            training_config={"sequence_length": 512, "task_head": "classification"},
        )
    )
    assert "logits" not in predict(request).breakdown_mb


def test_pipeline_stages_split_the_weights_and_the_layers() -> None:
    one = predict(train({"data_parallel": 1}))
    request = TaskRequest.model_validate(
        body(
            "training",
            model_config={"name": "meta-llama/Llama-3.1-8B", "precision": "bf16"},
            resource_requirements={"gpu": {"count": 2}},
            training_config={"pipeline_parallel": 2, "data_parallel": 1, "zero_stage": 0},
        )
    )
    two = predict(request)
    assert two.breakdown_mb["weights"] == pytest.approx(one.breakdown_mb["weights"] / 2, rel=0.01)
    assert two.breakdown_mb["activations"] < one.breakdown_mb["activations"]
    assert "pipeline 2" in two.method


def test_a_paged_engine_takes_its_share_of_the_card() -> None:
    request = TaskRequest.model_validate(
        body(
            resource_requirements={"gpu": {"count": 1, "type": "h100-sxm-80gb"}},
            inference_config={"engine": "paged", "gpu_memory_utilization": 0.9},
        )
    )
    prediction = predict(request)
    assert prediction.gpu_memory_per_gpu_mb == pytest.approx(0.9 * 80 * 1024, abs=2)
    assert "paged engine" in prediction.method
    unnamed = predict(TaskRequest.model_validate(body(inference_config={"engine": "paged"})))
    assert "name the card" in unnamed.method


def test_mla_caches_the_compressed_latent() -> None:
    kv = run(
        model_config={"name": "deepseek-ai/DeepSeek-V2-Lite-Chat"},
        inference_config={"context_length": 8192},
    )["kv_cache"]
    assert kv * MIB == 27 * (512 + 64) * 8192 * 2  # layers x latent+rope x tokens x bf16
