"""The formulas on hand-checked cases."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from crater.contracts import Confidence, TaskRequest
from crater.predictor.domain.catalog import CATALOG, lora_trainable_parameters
from crater.predictor.domain.estimate import (
    Assumptions,
    Correction,
    Refused,
    dataloader_settings,
    predict,
)

GiB = 2**30
MiB = 2**20


def request(**overrides: object) -> TaskRequest:
    body: dict[str, object] = {
        "task_id": "t-1",
        "task_type": "inference",
        "model_config": {"name": "meta-llama/Llama-2-7b-hf", "precision": "fp16"},
        "resource_requirements": {"gpu": {"count": 1, "memory_mb": 20000}},
    }
    body.update(overrides)
    return TaskRequest.model_validate(body)


def training(
    name: str = "meta-llama/Llama-2-7b-hf", gpus: int = 1, **config: object
) -> TaskRequest:
    return request(
        task_type="training",
        model_config={"name": name, "precision": "bf16"},
        resource_requirements={"gpu": {"count": gpus}, "cpu": {"cores": 8 * gpus}},
        training_config=config,
    )


def states_bytes(breakdown: dict[str, int]) -> float:
    return sum(breakdown[k] for k in ("weights", "gradients", "optimizer")) * MiB


def test_fp16_weights_of_a_7b_model_are_13_to_14_gb() -> None:
    prediction = predict(request())
    weights_gb = prediction.breakdown_mb["weights"] * MiB / 1e9
    assert 13.0 <= weights_gb <= 14.0  # 6.74e9 x 2 B = 13.48 GB
    assert prediction.confidence is Confidence.MEDIUM
    assert prediction.model_family == "llama"


def test_mixed_precision_adam_holds_16_bytes_per_parameter_in_model_states() -> None:
    prediction = predict(
        request(
            task_type="training",
            model_config={"name": "custom", "parameters_billion": 1.0, "precision": "bf16"},
        )
    )
    # fp16 weights 2 + fp16 gradients 2 + fp32 master 4 + Adam m 4 + v 4
    assert states_bytes(prediction.breakdown_mb) == pytest.approx(16e9, rel=1e-3)
    assert prediction.confidence is Confidence.LOW  # a parameter count, not a known model


@pytest.mark.parametrize(
    ("optimizer", "per_parameter"),
    [("adamw", 16), ("adam", 16), ("sgd", 12), ("adam8bit", 10)],
)
def test_optimizer_states_by_optimizer(optimizer: str, per_parameter: int) -> None:
    prediction = predict(
        request(
            task_type="training",
            model_config={"name": "custom", "parameters_billion": 1.0, "precision": "fp16"},
            training_config={"optimizer": optimizer},
        )
    )
    assert states_bytes(prediction.breakdown_mb) == pytest.approx(per_parameter * 1e9, rel=1e-3)


def test_fp32_adam_keeps_no_master_copy() -> None:
    prediction = predict(
        request(
            task_type="training",
            model_config={"name": "custom", "parameters_billion": 1.0, "precision": "fp32"},
        )
    )
    assert states_bytes(prediction.breakdown_mb) == pytest.approx(16e9, rel=1e-3)
    assert prediction.breakdown_mb["weights"] * MiB == pytest.approx(4e9, rel=1e-3)


def zero(stage: int, sharding: str = "deepspeed", **extra: object) -> dict[str, int]:
    return predict(
        request(
            task_type="training",
            model_config={"name": "custom", "parameters_billion": 7.5, "precision": "fp16"},
            resource_requirements={"gpu": {"count": 8}},
            gang_size=8,
            training_config={"zero_stage": stage, "sharding": sharding, **extra},
        )
    ).breakdown_mb


@pytest.mark.parametrize(
    ("stage", "expected_gb"),
    # DeepSpeed's estimators (stage_1_and_2.py, stage3.py) at Ψ = 7.5B, N = 64 GPUs: no ZeRO
    # 16Ψ (the ZeRO paper's Figure 1); stages 1-2: 4Ψ + 16Ψ/N (16-bit weights and gradients
    # whole; fp32 master, Adam states and the fp32 gradient partition sharded); stage 3:
    # 18Ψ/N, besides 4x the largest layer
    [(0, 120.0), (1, 31.875), (2, 31.875), (3, 2.109)],
)
def test_zero_stages_follow_deepspeeds_own_estimators(stage: int, expected_gb: float) -> None:
    breakdown = zero(stage)
    assert states_bytes(breakdown) / 1e9 == pytest.approx(expected_gb, rel=0.01)
    if stage == 3:
        assert breakdown["gathered_parameters"] > 0  # 4 x the largest layer


def test_fsdp_shards_what_the_zero_paper_says() -> None:
    # ZeRO paper, Figure 1 (Ψ = 7.5B, N = 64, K = 12): P_os+g 16.6 GB, P_os+g+p 1.875 GB
    assert states_bytes(zero(2, "fsdp")) / 1e9 == pytest.approx(16.6, rel=0.01)
    assert states_bytes(zero(3, "fsdp")) / 1e9 == pytest.approx(1.875, rel=0.01)


def test_a_whole_model_kept_on_every_rank_adds_its_weights_to_the_shards() -> None:
    # LitGPT's 2023 FSDP fine-tuning: the model built on each GPU, then wrapped and kept
    sharded = zero(3, "fsdp")
    kept = zero(3, "fsdp", full_model_per_rank=True)
    assert kept["unsharded_model"] * MiB / 1e9 == pytest.approx(15.0, rel=0.01)  # 2 B x 7.5B
    assert states_bytes(kept) == states_bytes(sharded)
    assert "unsharded_model" not in zero(0, "fsdp", full_model_per_rank=True)  # nothing sharded
    prediction = predict(
        training(gpus=8, gradient_checkpointing=True, zero_stage=3, sharding="fsdp",
                 full_model_per_rank=True)
    )  # fmt: skip
    assert prediction.timeline is not None
    peak = max(p.gpu_memory_mb for p in prediction.timeline.points)
    assert peak == prediction.gpu_memory_per_gpu_mb


def test_zero_offload_moves_the_states_to_the_host() -> None:
    # DeepSpeed: stage 2 with the optimizer offloaded keeps 2Ψ on the GPU
    breakdown = zero(2, offload_optimizer=True)
    assert states_bytes(breakdown) / 1e9 == pytest.approx(15.0, rel=0.01)
    offloaded = predict(
        request(
            task_type="training",
            model_config={"name": "custom", "parameters_billion": 7.5, "precision": "fp16"},
            resource_requirements={"gpu": {"count": 8}},
            gang_size=8,
            training_config={"zero_stage": 3, "offload_optimizer": True,
                             "offload_parameters": True},
        )
    )  # fmt: skip
    assert states_bytes(offloaded.breakdown_mb) == 0
    assert offloaded.host_breakdown_mb["offloaded optimizer"] > 0
    assert offloaded.host_memory_mb > sum(offloaded.host_breakdown_mb.values())


def test_states_are_sharded_across_data_parallel_gpus_by_default() -> None:
    one = predict(training())
    four = predict(training(gpus=4))
    assert four.breakdown_mb["optimizer"] == pytest.approx(one.breakdown_mb["optimizer"] / 4, 1)
    assert "ZeRO-3" in four.method


def test_tensor_parallel_divides_weights_and_activations() -> None:
    one = predict(training("meta-llama/Llama-2-13b-hf", gpus=4, data_parallel=1))
    tp = predict(training("meta-llama/Llama-2-13b-hf", gpus=4, tensor_parallel=4, data_parallel=1))
    assert tp.breakdown_mb["weights"] == pytest.approx(one.breakdown_mb["weights"] / 4, 1)
    assert tp.breakdown_mb["activations"] == pytest.approx(one.breakdown_mb["activations"] / 4, 1)


def test_llama_2_7b_kv_cache_at_4096_tokens_fp16_batch_1_is_2_gib() -> None:
    prediction = predict(request(inference_config={"context_length": 4096, "batch_size": 1}))
    assert prediction.breakdown_mb["kv_cache"] == 2048  # 2·32·32·128·4096·1·2 B


def test_grouped_query_attention_shrinks_the_kv_cache() -> None:
    llama3 = predict(
        request(
            model_config={"name": "meta-llama/Meta-Llama-3-8B"},
            inference_config={"context_length": 8192},
        )
    )
    assert llama3.breakdown_mb["kv_cache"] == 1024  # 2·32·8·128·8192·2 B
    fp8 = predict(
        request(
            model_config={"name": "meta-llama/Meta-Llama-3-8B"},
            inference_config={"context_length": 8192, "kv_cache_dtype": "fp8", "batch_size": 4},
        )
    )
    assert fp8.breakdown_mb["kv_cache"] == 2048


def test_encoders_have_no_kv_cache() -> None:
    prediction = predict(request(model_config={"name": "bert-base-uncased"}))
    assert prediction.breakdown_mb["kv_cache"] == 0


def test_lora_rank_8_on_q_and_v_of_llama_2_7b_trains_4_2m_parameters() -> None:
    count, unknown = lora_trainable_parameters(CATALOG["llama-2-7b"], 8, ["q_proj", "v_proj"])
    assert count == 4_194_304
    assert unknown == []
    prediction = predict(request(task_type="fine-tuning", training_config={"lora": {"rank": 8}}))
    assert prediction.trainable_parameters == 4_194_304
    assert prediction.breakdown_mb["optimizer"] < 64  # 4.2M x 12 B
    assert prediction.breakdown_mb["weights"] * MiB / 1e9 == pytest.approx(13.49, abs=0.05)


def test_qlora_keeps_the_base_in_4_bits() -> None:
    prediction = predict(
        request(
            task_type="fine-tuning",
            model_config={"name": "meta-llama/Llama-2-7b-hf", "precision": "bf16"},
            training_config={
                "lora": {"rank": 16, "target_modules": ["all-linear"], "quantize_base": True}
            },
        )
    )
    assert prediction.trainable_parameters == 39_976_960  # PEFT's count for this setup
    base_gb = (prediction.breakdown_mb["weights"] * MiB - 39_976_960 * 2) / 1e9
    # the blocks' linear layers in NF4 with double quantization, embeddings and head in bf16
    embeddings = 2 * 32000 * 4096
    expected = ((6.74e9 - embeddings) * (4 + 0.127) / 8 + embeddings * 2) / 1e9
    assert base_gb == pytest.approx(expected, rel=0.01)


def test_activations_follow_korthikanti_et_al() -> None:
    # GPT-2 (GeLU 4h MLP), no flash attention: per layer s·b·h·(34 + 5·a·s/h) bytes
    s, b, h, a, layers = 1024, 2, 768, 12, 12
    prediction = predict(training("gpt2", batch_size=b, sequence_length=s, flash_attention=False))
    expected = layers * s * b * h * (34 + 5 * a * s / h)
    assert prediction.breakdown_mb["activations"] * MiB == pytest.approx(expected, rel=1e-4)
    # the loss: 16-bit logits, and in fp32 the log-probabilities, their gradient and
    # log_softmax backward's result, less what is freed by the peak (10 B)
    assert prediction.breakdown_mb["logits"] * MiB == pytest.approx(s * b * 50257 * 12, rel=1e-3)


@pytest.mark.parametrize(("loss", "bytes_per_logit"), [("chunked", 2), ("fused", 0)])
def test_a_chunked_or_fused_loss_keeps_no_full_fp32_logits(loss: str, bytes_per_logit: int) -> None:
    s, b = 8192, 1
    full = predict(training("meta-llama/Llama-3.1-8B", batch_size=b, sequence_length=s))
    other = predict(
        training("meta-llama/Llama-3.1-8B", batch_size=b, sequence_length=s, cross_entropy=loss)
    )
    chunk = 1024 * 128256 * ((bytes_per_logit and 10) or 12)  # one chunk of tokens in fp32
    expected = s * b * 128256 * bytes_per_logit + chunk
    assert other.breakdown_mb["logits"] * MiB == pytest.approx(expected, rel=1e-3)
    assert full.breakdown_mb["logits"] > 3 * other.breakdown_mb["logits"]


def test_gradient_checkpointing_and_flash_attention_cut_activations() -> None:
    plain = predict(training(batch_size=4, sequence_length=4096, flash_attention=False))
    flash = predict(training(batch_size=4, sequence_length=4096))
    checkpointed = predict(
        training(batch_size=4, sequence_length=4096, gradient_checkpointing=True)
    )
    assert plain.breakdown_mb["activations"] > 2 * flash.breakdown_mb["activations"]
    assert checkpointed.breakdown_mb["activations"] < flash.breakdown_mb["activations"] / 5


def test_convolutional_models_scale_with_batch() -> None:
    small = predict(training("resnet50", batch_size=32))
    large = predict(training("microsoft/resnet-50", batch_size=64))
    assert large.breakdown_mb["activations"] == pytest.approx(
        2 * small.breakdown_mb["activations"], 1
    )
    assert "logits" not in small.breakdown_mb


def test_unknown_model_with_a_parameter_count_is_estimated_with_low_confidence() -> None:
    prediction = predict(
        request(model_config={"name": "acme/secret-13b", "parameters_billion": 13.0})
    )
    assert prediction.confidence is Confidence.LOW
    assert prediction.breakdown_mb["weights"] * MiB == pytest.approx(26e9, rel=1e-3)
    assert prediction.breakdown_mb["kv_cache"] > 0


def test_unknown_model_falls_back_to_the_request_with_low_confidence() -> None:
    prediction = predict(request(model_config={"name": "acme/secret-model"}))
    assert prediction.gpu_memory_per_gpu_mb == 20000
    assert prediction.confidence is Confidence.LOW
    assert "unknown model" in prediction.method


def test_unknown_model_without_size_or_memory_is_refused() -> None:
    with pytest.raises(Refused) as refused:
        predict(
            request(
                model_config={"name": "acme/secret"}, resource_requirements={"gpu": {"count": 1}}
            )
        )
    [error] = refused.value.errors
    assert error.field == "model_config.name"
    assert "parameters_billion" in error.reason


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        (
            {"task_type": "training", "training_config": {"sequence_length": 2_000_000}},
            "training_config.sequence_length",
            "beyond",
        ),
        (
            {"task_type": "inference", "inference_config": {"context_length": 1_048_577}},
            "inference_config.context_length",
            "beyond",
        ),
        (
            {
                "task_type": "training",
                "model_config": {"name": "gpt2"},
                "resource_requirements": {"gpu": {"count": 8}},
                "training_config": {"tensor_parallel": 8},
            },
            "training_config.tensor_parallel",
            "12 attention heads",
        ),
        (
            {"task_type": "training", "training_config": {"tensor_parallel": 2}},
            "training_config.tensor_parallel",
            "more than the 1 GPUs",
        ),
        (
            {
                "task_type": "training",
                "resource_requirements": {"gpu": {"count": 2}},
                "training_config": {"data_parallel": 4},
            },
            "training_config.data_parallel",
            "holds 2",
        ),
        (
            {
                "task_type": "training",
                "model_config": {"name": "meta-llama/Llama-2-7b-hf", "precision": "int4"},
            },
            "model_config.precision",
            "cannot be trained",
        ),
        (
            {
                "task_type": "fine-tuning",
                "model_config": {"name": "gpt2"},
                "training_config": {"lora": {"rank": 1024, "target_modules": ["c_attn"]}},
            },
            "training_config.lora.rank",
            "hidden size",
        ),
        (
            {
                "task_type": "fine-tuning",
                "training_config": {"lora": {"target_modules": ["qkv_nope"]}},
            },
            "training_config.lora.target_modules",
            "qkv_nope",
        ),
    ],
)
def test_absurd_inputs_are_refused_naming_the_field(
    body: dict[str, object], field: str, words: str
) -> None:
    with pytest.raises(Refused) as refused:
        predict(request(**body))
    assert [e.field for e in refused.value.errors] == [field]
    assert words in refused.value.errors[0].reason


def test_a_batch_of_zero_never_reaches_the_predictor() -> None:
    with pytest.raises(ValidationError) as error:
        request(task_type="training", training_config={"batch_size": 0})
    assert error.value.errors()[0]["loc"] == ("training_config", "batch_size")


def test_the_timeline_peaks_where_the_prediction_does() -> None:
    prediction = predict(
        training(gpus=8, batch_size=4, sequence_length=4096, gradient_checkpointing=True)
    )
    timeline = prediction.timeline
    assert timeline is not None
    peaks = [p.gpu_memory_mb for p in timeline.points]
    assert max(peaks) == prediction.gpu_memory_per_gpu_mb
    assert timeline.points[0].gpu_memory_mb < max(peaks)  # Adam's states appear at step 1
    phases = {p.phase for p in timeline.points}
    assert {"start", "forward", "backward", "optimizer", "checkpoint"} <= phases
    # a full checkpoint of Llama-2-7B: fp32 master + Adam m, v (12 B) + bf16 weights (2 B)
    assert timeline.checkpoint_size_mb * MiB / 1e9 == pytest.approx(6.74 * 14, rel=0.01)
    assert timeline.checkpoint_seconds == pytest.approx(6.74e9 * 14 / 1e6 / 2000, rel=0.01)
    assert timeline.step_seconds > 0
    assert timeline.dataset_read_mb_per_s > 0


def test_image_training_gets_enough_workers_to_feed_the_gpus() -> None:
    prediction = predict(
        request(
            task_type="training",
            model_config={"name": "resnet-50", "precision": "fp16"},
            data_config={"io_pattern": "random"},
            resource_requirements={"gpu": {"count": 8, "type": "A100"}, "cpu": {"cores": 96}},
            training_config={"batch_size": 256},
        )
    )
    timeline = prediction.timeline
    assert timeline is not None
    # 8 x 256 images per step; each image needs 6 ms of a core
    per_process = 256 / timeline.step_seconds * 0.006
    assert prediction.dataloader_num_workers >= min(per_process, 11)
    assert prediction.dataloader_num_workers <= (96 - 8) // 8
    assert 2 <= prediction.dataloader_prefetch_factor <= 8
    assert timeline.dataset_read_mb_per_s == pytest.approx(
        timeline.samples_per_second * 0.11, rel=1e-6
    )


def test_a_learned_correction_scales_the_peak_and_earns_confidence() -> None:
    raw = predict(request())
    corrected = predict(request(), correction=Correction(factor=1.2, samples=6, mape=0.05))
    assert corrected.gpu_memory_per_gpu_mb == round(raw.gpu_memory_per_gpu_mb * 1.2)
    assert corrected.correction_factor == 1.2
    assert corrected.confidence is Confidence.HIGH
    assert "learned" in corrected.method


def test_assumptions_change_the_overheads() -> None:
    base = predict(request())
    more = predict(request(), Assumptions(cuda_context_mb=1536))
    assert more.gpu_memory_per_gpu_mb - base.gpu_memory_per_gpu_mb == 512


def test_dataloader_settings_leave_a_core_per_gpu_process() -> None:
    assert dataloader_settings(cpu_cores=16, gpus=2) == (7, 2)
    assert dataloader_settings(cpu_cores=1, gpus=1) == (0, 1)


def test_a_learned_correction_scales_the_timeline_too() -> None:
    corrected = predict(training(), correction=Correction(factor=1.5, samples=1))
    assert corrected.timeline is not None
    peak = max(p.gpu_memory_mb for p in corrected.timeline.points)
    assert peak == pytest.approx(corrected.gpu_memory_per_gpu_mb, abs=1)


def test_a_disk_too_slow_for_the_gpus_is_named() -> None:
    prediction = predict(
        request(
            task_type="training",
            model_config={"name": "resnet-50", "precision": "fp16"},
            resource_requirements={"gpu": {"count": 8, "type": "H100"}, "cpu": {"cores": 128}},
            training_config={"batch_size": 256},
        ),
        Assumptions(disk_read_mb_per_s=100),
    )
    assert "IO-bound" in prediction.method
