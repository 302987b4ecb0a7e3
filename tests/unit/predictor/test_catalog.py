from __future__ import annotations

import pytest

from crater.predictor.domain.catalog import CATALOG, infer, lookup


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("meta-llama/Llama-3-8b-chat-hf", "llama-3-8b"),
        ("meta-llama/Meta-Llama-3-70B-Instruct", "llama-3-70b"),
        ("meta-llama/Llama-2-70b-chat-hf", "llama-2-70b"),
        ("mistralai/Mistral-7B-v0.1", "mistral-7b"),
        ("Qwen/Qwen2-7B-Instruct", "qwen2-7b"),
        ("bert-base-uncased", "bert-base"),
        ("google-bert/bert-large-cased", "bert-large"),
        ("openai-community/gpt2-xl", "gpt2-xl"),
        ("gpt2", "gpt2"),
        ("microsoft/resnet-50", "resnet-50"),
        ("runwayml/stable-diffusion-v1-5", "stable-diffusion-unet"),
    ],
)
def test_names_resolve_to_catalog_entries(name: str, expected: str) -> None:
    architecture = lookup(name)
    assert architecture is not None
    assert architecture.key == expected


def test_longer_variants_resolve_to_their_base_and_strangers_do_not() -> None:
    found = lookup("togethercomputer/llama-2-7b-32k")
    assert found is not None
    assert found.key == "llama-2-7b"
    assert lookup("acme/secret-model") is None


@pytest.mark.parametrize("key", sorted(CATALOG))
def test_transformer_shapes_add_up_to_their_published_parameter_counts(key: str) -> None:
    a = CATALOG[key]
    if not a.hidden:
        return
    h, kv, f, layers = a.hidden, a.kv_dim, a.ffn, a.layers
    attention = 2 * h * h + 2 * h * kv
    mlp = (3 if a.mlp == "swiglu" else 2) * h * f
    untied = 1 if a.family in ("gpt2", "bert") else 2  # GPT-2 and BERT tie the output layer
    total = layers * (attention + mlp) + untied * a.vocab * h
    assert total == pytest.approx(a.parameters, rel=0.06)


def test_an_unknown_model_gets_a_plausible_shape_from_its_size() -> None:
    a = infer("acme/secret-7b", 7e9)
    assert 3584 <= a.hidden <= 4608
    assert 24 <= a.layers <= 40
    assert not a.known
