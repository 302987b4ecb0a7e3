"""The catalog: architectures from Hugging Face configs, names that find them, LoRA counts."""

from __future__ import annotations

import pytest

from crater.contracts import Confidence, TaskRequest
from crater.predictor.domain.architecture import ConfigError, Kind, Mlp, from_hf_config
from crater.predictor.domain.catalog import (
    CATALOG,
    infer,
    lookup,
    lora_trainable_parameters,
    resolve_name,
)
from crater.predictor.domain.estimate import Refused, predict
from crater.predictor.domain.model_configs import KNOWN


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
        # the names issue #24 found refused
        ("Llama-3.1-8B", "llama-3.1-8b"),
        ("Meta-Llama-3.1-8B-Instruct", "llama-3.1-8b"),
        ("Qwen/Qwen-7B", "qwen-7b"),
        ("Qwen2.5-7B", "qwen2.5-7b"),
        # versions, suffixes, organisations, spellings
        ("llama3.1-8b", "llama-3.1-8b"),
        ("meta-llama/Llama-3.2-3B-Instruct", "llama-3.2-3b"),
        ("meta-llama/Llama-3.3-70B-Instruct", "llama-3.3-70b"),
        ("Qwen/Qwen-1_8B-Chat-Int4", "qwen-1.8b"),
        ("Qwen/Qwen1.5-14B-Chat", "qwen1.5-14b"),
        ("Qwen/Qwen2.5-14B-Instruct-AWQ", "qwen2.5-14b"),
        ("Qwen/Qwen3-30B-A3B-Instruct-2507", "qwen3-30b-a3b"),
        ("Qwen/Qwen3-8B-FP8", "qwen3-8b"),
        ("mistralai/Mistral-7B-Instruct-v0.3", "mistral-7b-v0.3"),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b"),
        ("google/gemma-2-9b-it", "gemma-2-9b"),
        ("microsoft/phi-1_5", "phi-1.5"),
        ("microsoft/Phi-3-mini-4k-instruct", "phi-3-mini"),
        ("01-ai/Yi-34B-Chat", "yi-34b"),
        ("THUDM/chatglm3-6b", "chatglm3-6b"),
        ("baichuan-inc/Baichuan2-13B-Chat", "baichuan2-13b"),
        ("deepseek-ai/deepseek-llm-7b-chat", "deepseek-llm-7b"),
        ("deepseek-ai/deepseek-moe-16b-chat", "deepseek-moe-16b"),
        ("deepseek-ai/DeepSeek-V2-Lite-Chat", "deepseek-v2-lite"),
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", "qwen2.5-7b"),
        ("bigscience/T0_3B", "flan-t5-xl"),
        ("google/flan-t5-xxl", "flan-t5-xxl"),
        ("bigscience/mt0-xxl", "mt5-xxl"),
        ("TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T", "tinyllama-1.1b"),
        ("codellama/CodeLlama-34b-Instruct-hf", "codellama-34b"),
        ("unsloth/llama-3-8b-bnb-4bit", "llama-3-8b"),
    ],
)
def test_names_resolve_to_catalog_entries(name: str, expected: str) -> None:
    architecture = lookup(name)
    assert architecture is not None, name
    assert architecture.key == expected


def test_a_family_size_the_catalog_lacks_gets_the_nearest_and_says_so() -> None:
    resolution = resolve_name("Qwen/Qwen2.5-9B")
    assert resolution is not None
    assert resolution.architecture.key == "qwen2.5-7b"
    assert not resolution.exact
    assert "nearest" in resolution.how
    assert lookup("Qwen/Qwen2.5-9B") is None  # not the model itself
    assert lookup("acme/secret-model") is None
    assert resolve_name("acme/secret-model") is None


@pytest.mark.parametrize("key", sorted(KNOWN))
def test_every_shape_adds_up_to_its_published_parameter_count(key: str) -> None:
    assert CATALOG[key].parameters / 1e9 == pytest.approx(KNOWN[key].published_billion, rel=0.03)


def test_the_catalog_covers_the_families_people_fine_tune() -> None:
    families = {a.family for a in CATALOG.values()}
    assert families >= {
        "llama", "qwen", "qwen2", "qwen3", "mistral", "mixtral", "gemma", "phi", "yi", "chatglm",
        "baichuan", "deepseek", "t5", "bert",
    }  # fmt: skip
    kinds = {CATALOG[k].kind for k in ("flan-t5-xl", "bert-large", "llama-3-8b")}
    assert kinds == {Kind.ENCODER_DECODER, Kind.ENCODER, Kind.DECODER}


def test_moe_and_latent_attention_shapes() -> None:
    mixtral = CATALOG["mixtral-8x7b"]
    assert (mixtral.experts, mixtral.active_experts) == (8, 2)
    assert mixtral.active_parameters / 1e9 == pytest.approx(12.9, rel=0.03)  # Mistral AI's figure
    qwen_moe = CATALOG["qwen3-30b-a3b"]
    assert qwen_moe.active_parameters / 1e9 == pytest.approx(3.3, rel=0.05)  # "A3B"
    v2 = CATALOG["deepseek-v2-lite"]
    assert v2.mla
    assert v2.kv_cache_width == 512 + 64  # the compressed latent and the rotary key
    assert v2.dense_layers == 1
    # DeepSeek says 2.4B activated: its count leaves the input embedding (0.2B) out
    assert (v2.active_parameters - v2.vocab * v2.hidden) / 1e9 == pytest.approx(2.4, rel=0.03)
    gemma = CATALOG["gemma-7b"]
    assert (gemma.head_dim, gemma.q_dim, gemma.tied, gemma.mlp) == (256, 4096, True, Mlp.SWIGLU)


@pytest.mark.parametrize(
    ("key", "rank", "modules", "published"),
    [
        ("llama-2-7b", 8, ["q_proj", "v_proj"], 4_194_304),  # LitGPT resource tables
        ("llama-2-13b", 8, ["q_proj", "v_proj"], 6_553_600),
        ("phi-1.5", 8, ["q_proj", "v_proj"], 1_572_864),
        ("stablelm-alpha-3b", 8, ["q_proj", "v_proj"], 2_097_152),
        ("falcon-40b", 8, ["q_proj", "v_proj"], 12_042_240),
        ("mt5-large", 8, ["q", "v"], 2_359_296),  # PEFT README, mt0-large
        ("qwen-7b", 8, ["c_attn"], 4_194_304),  # SWIFT benchmark: 4.19M
        ("qwen-7b", 64, ["c_attn"], 33_554_432),  # 33.55M
        ("qwen-7b", 8, ["all-linear"], 17_891_328),  # 17.89M
    ],
)
def test_lora_counts_match_what_frameworks_print(
    key: str, rank: int, modules: list[str], published: int
) -> None:
    count, unknown = lora_trainable_parameters(CATALOG[key], rank, modules)
    assert unknown == []
    assert count == published


def test_a_config_json_is_read_like_the_catalogs_own() -> None:
    config = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "rope_scaling": None,
    }
    a = from_hf_config(config)
    assert a.parameters == CATALOG["qwen2.5-7b"].parameters
    assert (a.kv_heads, a.head_dim, a.vocab, a.source) == (4, 128, 152064, "config.json")
    # nested text_config (multimodal checkpoints) and aliases (GPT-2's n_embd)
    wrapped = from_hf_config({"model_type": "llava", "text_config": config})
    assert wrapped.parameters == a.parameters


def test_a_config_json_missing_a_size_is_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError) as error:
        from_hf_config({"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32})
    assert error.value.field == "num_attention_heads"
    body = {
        "task_id": "t-1",
        "task_type": "inference",
        "model_config": {
            "name": "acme/secret-7b",
            "hf_config": {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32},
        },
        "resource_requirements": {"gpu": {"count": 1}},
    }
    with pytest.raises(Refused) as refused:
        predict(TaskRequest.model_validate(body))
    assert refused.value.errors[0].field == "model_config.hf_config.num_attention_heads"


def test_a_task_carrying_its_config_json_is_predicted_from_it() -> None:
    config = KNOWN["qwen2.5-7b"].config
    body = {
        "task_id": "t-1",
        "task_type": "inference",
        "model_config": {"name": "acme/house-model", "precision": "bf16", "hf_config": config},
        "resource_requirements": {"gpu": {"count": 1}},
        "inference_config": {"context_length": 4096},
    }
    own = predict(TaskRequest.model_validate(body))
    named = predict(
        TaskRequest.model_validate(
            {**body, "model_config": {"name": "Qwen/Qwen2.5-7B", "precision": "bf16"}}
        )
    )
    assert own.gpu_memory_per_gpu_mb == named.gpu_memory_per_gpu_mb
    assert own.confidence is Confidence.MEDIUM
    assert own.architecture is not None
    assert "config.json" in own.architecture
    assert named.architecture == "catalog qwen2.5-7b for 'Qwen/Qwen2.5-7B'"


def test_a_parameter_count_that_disagrees_keeps_the_named_shape_and_says_so() -> None:
    body = {
        "task_id": "t-1",
        "task_type": "inference",
        "model_config": {"name": "Qwen/Qwen3-30B-A3B", "parameters_billion": 3},
        "resource_requirements": {"gpu": {"count": 1}},
    }
    prediction = predict(TaskRequest.model_validate(body))
    assert prediction.parameters == CATALOG["qwen3-30b-a3b"].parameters
    assert prediction.confidence is Confidence.LOW
    assert "disagrees with qwen3-30b-a3b" in prediction.method


def test_an_unknown_model_gets_a_modern_shape_from_its_size_and_family() -> None:
    a = infer("acme/secret-7b", 7e9)
    assert 3584 <= a.hidden <= 4608
    assert 24 <= a.layers <= 40
    assert a.mlp is Mlp.SWIGLU
    assert a.vocab >= 100_000  # a large vocabulary: the logits are not lost
    assert not a.known
    qwen = infer("acme/qwen-house-7b", 7e9)
    assert qwen.vocab > 150_000


@pytest.mark.parametrize("name", ["\x1e", "/", "--", " "])
def test_a_name_with_no_word_in_it_resolves_to_nothing(name: str) -> None:
    """The 100k fuzz run's crash: a name of control characters left no candidate form."""
    assert resolve_name(name, 7.0) is None
    request = TaskRequest.model_validate(
        {
            "task_id": "t",
            "task_type": "llm_sft",
            "model_config": {"name": name, "hf_config": {"R": None, "a": False}},
        }
    )
    try:
        predict(request)
        errors = []
    except Refused as refused:  # refused with the field, never an IndexError
        errors = refused.errors
    assert all(e.field.startswith("model_config.") for e in errors), errors
