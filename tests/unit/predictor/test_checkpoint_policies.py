"""Gradient checkpointing policies: full, selective, offloaded and every k-th block."""

from __future__ import annotations

import pytest

from crater.contracts import TaskRequest
from crater.contracts.tasks import CheckpointPolicy, TrainingConfig
from crater.predictor.domain.estimate import predict

MiB = 2**20


def training(**config: object) -> TaskRequest:
    return TaskRequest.model_validate(
        {
            "task_id": "t-1",
            "task_type": "training",
            "model_config": {"name": "meta-llama/Llama-2-7b-hf", "precision": "bf16"},
            "resource_requirements": {"gpu": {"count": 1}, "cpu": {"cores": 8}},
            "training_config": {"batch_size": 4, "sequence_length": 4096, **config},
        }
    )


def activations(**config: object) -> int:
    return predict(training(**config)).breakdown_mb["activations"]


def test_the_bool_still_means_full_recomputation() -> None:
    assert TrainingConfig().recompute is CheckpointPolicy.NONE
    assert TrainingConfig(gradient_checkpointing=True).recompute is CheckpointPolicy.FULL
    named = TrainingConfig(gradient_checkpointing=True, checkpoint_policy="selective")
    assert named.recompute is CheckpointPolicy.SELECTIVE
    assert activations(gradient_checkpointing=True) == activations(checkpoint_policy="full")


@pytest.mark.parametrize("flash", [True, False])
def test_offloaded_below_full_below_every_second_below_none_on_the_gpu(flash: bool) -> None:
    none = activations(flash_attention=flash)
    full = activations(flash_attention=flash, checkpoint_policy="full")
    every_2 = activations(flash_attention=flash, checkpoint_policy="every-k")
    offloaded = activations(flash_attention=flash, checkpoint_policy="offloaded")
    assert offloaded < full < every_2 < none
    every_1 = activations(flash_attention=flash, checkpoint_policy="every-k", checkpoint_every=1)
    assert every_1 == full  # every block checkpointed is full recomputation
    every_4 = activations(flash_attention=flash, checkpoint_policy="every-k", checkpoint_every=4)
    assert every_2 < every_4 < none


def test_selective_is_no_checkpointing_under_flash_attention() -> None:
    assert activations(checkpoint_policy="selective") == activations()


def test_selective_saves_exactly_the_attention_cores_without_flash_attention() -> None:
    plain = activations(flash_attention=False)
    selective = activations(flash_attention=False, checkpoint_policy="selective")
    # Llama-2-7B: 32 layers, 32 heads; 5·a·s²·b bytes per layer at 16 bits, all but the one
    # layer whose core is recomputed in backward
    core = 5 * 32 * 4096**2 * 4
    assert (plain - selective) * MiB == pytest.approx(31 * core, rel=1e-4)
    assert selective > activations(flash_attention=False, checkpoint_policy="full")


def test_offloaded_checkpoints_take_host_memory() -> None:
    full = predict(training(checkpoint_policy="full"))
    offloaded = predict(training(checkpoint_policy="offloaded"))
    assert "offloaded checkpoints" not in full.host_breakdown_mb
    # 32 block inputs of 2·s·b·h bytes
    expected = 32 * 2 * 4096 * 4 * 4096
    assert offloaded.host_breakdown_mb["offloaded checkpoints"] * MiB == pytest.approx(
        expected, rel=1e-3
    )
    assert offloaded.host_memory_mb > full.host_memory_mb
    longer = predict(training(checkpoint_policy="offloaded", sequence_length=8192))
    assert longer.host_memory_mb > offloaded.host_memory_mb


def test_explain_names_the_policy() -> None:
    assert (
        "offloaded gradient checkpointing"
        in predict(training(checkpoint_policy="offloaded")).method
    )
    assert (
        "selective gradient checkpointing"
        in predict(training(checkpoint_policy="selective")).method
    )
    assert (
        "every 3 blocks"
        in predict(training(checkpoint_policy="every-k", checkpoint_every=3)).method
    )
    assert "checkpointing" not in predict(training()).method


def test_recomputation_time_follows_the_policy() -> None:
    def step(**config: object) -> float:
        timeline = predict(training(**config)).timeline
        assert timeline is not None
        return timeline.step_seconds

    none, full = step(), step(checkpoint_policy="full")
    assert step(checkpoint_policy="offloaded") == full
    assert none < step(checkpoint_policy="every-k") < full
    assert step(checkpoint_policy="selective") == none  # flash recomputes its scores anyway
    eager = step(flash_attention=False)
    assert eager < step(flash_attention=False, checkpoint_policy="selective") < full
