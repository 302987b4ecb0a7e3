"""Whether a task fits the card it asks for: a range, a verdict, and a refusal when no card of
its kind could hold it."""

from __future__ import annotations

import pytest

from crater.contracts import CardFit, TaskRequest
from crater.predictor.domain.estimate import Correction, Refused, predict


def llama_training(gpu: dict[str, object], **config: object) -> TaskRequest:
    return TaskRequest.model_validate(
        {
            "task_id": "t-1",
            "task_type": "training",
            "model_config": {"name": "meta-llama/Llama-3.1-8B", "precision": "bf16"},
            "resource_requirements": {"gpu": gpu},
            "training_config": {"batch_size": 1, "sequence_length": 2048, **config},
        }
    )


def test_a_prediction_carries_its_range() -> None:
    p = predict(llama_training({"count": 1}, master_weights=False, gradient_checkpointing=True))
    assert p.gpu_memory_low_mb is not None
    assert p.gpu_memory_high_mb is not None
    assert p.gpu_memory_low_mb < p.gpu_memory_per_gpu_mb < p.gpu_memory_high_mb
    assert p.fit is None  # no card named


@pytest.mark.parametrize(
    ("gpu", "verdict"),
    [
        ({"count": 1, "type": "h200-141gb"}, CardFit.FITS),
        ({"count": 1, "memory_mb": 81920}, CardFit.TIGHT),
        ({"count": 1, "type": "a100-pcie-40gb"}, CardFit.DOES_NOT_FIT),
    ],
)
def test_the_verdict_on_the_card_asked_for(gpu: dict[str, object], verdict: CardFit) -> None:
    # 8B in pure bf16 with checkpointing: ~70 GiB predicted, ~100 GiB at the high end
    p = predict(llama_training(gpu, master_weights=False, gradient_checkpointing=True))
    assert p.fit is not None
    assert p.fit.verdict is verdict
    if verdict is not CardFit.FITS:
        assert p.fit.reason in p.method  # said where people read


def test_what_no_card_of_its_kind_holds_is_refused_naming_the_field() -> None:
    with pytest.raises(Refused) as refused:
        predict(llama_training({"count": 1, "type": "rtx-4090"}))
    [error] = refused.value.errors
    assert error.field == "resource_requirements.gpu.type"
    assert "the largest rtx4090" in error.reason
    assert "LoRA" in error.reason  # what would make it fit
    # the same on an A100: the largest A100 (80 GB) cannot hold it either, a B200 can
    with pytest.raises(Refused):
        predict(llama_training({"count": 1, "type": "A100"}))
    assert predict(llama_training({"count": 1, "type": "b200"})).fit is None


def test_no_card_among_the_ordered_models_holding_it_is_refused_naming_that_field() -> None:
    with pytest.raises(Refused) as refused:
        predict(llama_training({"count": 1, "models": ["rtx-4090", "a100-40gb"]}))
    [error] = refused.value.errors
    assert error.field == "resource_requirements.gpu.models"
    assert "the largest a100" in error.reason
    # one listed model that can hold it is enough
    assert predict(llama_training({"count": 1, "models": ["rtx-4090", "b200"]})).fit is None


def test_a_learned_correction_moves_the_verdict_but_never_refuses_by_itself() -> None:
    request = llama_training(
        {"count": 1, "type": "a100-sxm4-80gb"}, master_weights=False, gradient_checkpointing=True
    )
    plain = predict(request)
    corrected = predict(request, correction=Correction(1.9, 10, 0.05))
    assert plain.fit is not None
    assert corrected.fit is not None
    assert corrected.fit.verdict is CardFit.DOES_NOT_FIT
    assert corrected.gpu_memory_low_mb > plain.gpu_memory_low_mb  # type: ignore[operator]
