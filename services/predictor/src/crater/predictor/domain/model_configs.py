"""The catalog's models, each as the fields of its Hugging Face config.json the predictor reads.

Values are those of the model's published config.json on the Hugging Face Hub (hidden_size,
intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim,
vocab_size, max_position_embeddings, tie_word_embeddings, and the MoE, MLA and T5 fields), in
the same names, read by the same `from_hf_config` a task's own config.json goes through. Each
entry also carries the parameter count its model card states (billions), which the test of
the catalog checks the shape against.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class Known(NamedTuple):
    key: str  # the catalog key: <family>-<size>
    family: str  # what learned corrections are kept under
    published_billion: float  # the model card's parameter count
    config: dict[str, Any]  # config.json, the fields that decide memory


def _decoder(model_type: str, h: int, f: int, layers: int, heads: int, kv: int, vocab: int,
             context: int, tie: bool = False, **extra: Any) -> dict[str, Any]:  # fmt: skip
    return {
        "model_type": model_type,
        "hidden_size": h,
        "intermediate_size": f,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "vocab_size": vocab,
        "max_position_embeddings": context,
        "tie_word_embeddings": tie,
        **extra,
    }


def _llama(*args: Any, **extra: Any) -> dict[str, Any]:
    return _decoder("llama", *args, **extra)


def _qwen2(*args: Any, **extra: Any) -> dict[str, Any]:
    return _decoder("qwen2", *args, **extra)


def _qwen3(*args: Any, **extra: Any) -> dict[str, Any]:
    return _decoder("qwen3", *args, head_dim=128, **extra)


def _qwen1(h: int, intermediate: int, layers: int, heads: int, vocab: int) -> dict[str, Any]:
    # Qwen (1)'s remote code: intermediate_size counts gate and up together; kv_channels
    return {
        "model_type": "qwen",
        "hidden_size": h,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "kv_channels": h // heads,
        "vocab_size": vocab,
        "seq_length": 8192,
    }


def _t5(d: int, ff: int, layers: int, heads: int, vocab: int, gated: bool, tie: bool) -> dict:  # type: ignore[type-arg]
    return {
        "model_type": "t5",
        "d_model": d,
        "d_ff": ff,
        "num_layers": layers,
        "num_decoder_layers": layers,
        "num_heads": heads,
        "d_kv": 64,
        "vocab_size": vocab,
        "feed_forward_proj": "gated-gelu" if gated else "relu",
        "tie_word_embeddings": tie,
        "n_positions": 512,
    }


def _chatglm(layers: int, vocab: int, context: int) -> dict[str, Any]:
    return {
        "model_type": "chatglm",
        "hidden_size": 4096,
        "num_layers": layers,
        "num_attention_heads": 32,
        "multi_query_attention": True,
        "multi_query_group_num": 2,
        "kv_channels": 128,
        "ffn_hidden_size": 13696,
        "padded_vocab_size": vocab,
        "seq_length": context,
    }


def _deepseek_moe(model_type: str, h: int, f: int, layers: int, heads: int, moe_f: int,
                  experts: int, top: int, shared: int, dense: int, vocab: int,
                  **mla: int) -> dict[str, Any]:  # fmt: skip
    config = _decoder(model_type, h, f, layers, heads, heads, vocab, 4096)
    config |= {
        "moe_intermediate_size": moe_f,
        "n_routed_experts": experts,
        "num_experts_per_tok": top,
        "n_shared_experts": shared,
        "first_k_dense_replace": dense,
    }
    return config | mla


def _gpt2(h: int, layers: int, heads: int) -> dict[str, Any]:
    return {"model_type": "gpt2", "n_embd": h, "n_layer": layers, "n_head": heads,
            "vocab_size": 50257, "n_positions": 1024}  # fmt: skip


def _bert(h: int, layers: int, heads: int) -> dict[str, Any]:
    return {"model_type": "bert", "hidden_size": h, "intermediate_size": 4 * h,
            "num_hidden_layers": layers, "num_attention_heads": heads, "vocab_size": 30522,
            "max_position_embeddings": 512, "type_vocab_size": 2}  # fmt: skip


L2, L3 = 4096, 8192
K = [
    # Meta Llama 2 (meta-llama/Llama-2-*-hf), Code Llama
    Known("llama-2-7b", "llama", 6.74, _llama(4096, 11008, 32, 32, 32, 32000, L2)),
    Known("llama-2-13b", "llama", 13.0, _llama(5120, 13824, 40, 40, 40, 32000, L2)),
    Known("llama-2-70b", "llama", 69.0, _llama(8192, 28672, 80, 64, 8, 32000, L2)),
    Known("codellama-7b", "llama", 6.74, _llama(4096, 11008, 32, 32, 32, 32016, 16384)),
    Known("codellama-13b", "llama", 13.0, _llama(5120, 13824, 40, 40, 40, 32016, 16384)),
    Known("codellama-34b", "llama", 33.7, _llama(8192, 22016, 48, 64, 8, 32000, 16384)),
    Known("codellama-70b", "llama", 69.0, _llama(8192, 28672, 80, 64, 8, 32016, 16384)),
    Known("tinyllama-1.1b", "llama", 1.1, _llama(2048, 5632, 22, 32, 4, 32000, 2048)),
    # Meta Llama 3, 3.1, 3.2, 3.3 (128K vocabulary, grouped-query attention)
    Known("llama-3-8b", "llama", 8.03, _llama(4096, 14336, 32, 32, 8, 128256, L3)),
    Known("llama-3-70b", "llama", 70.6, _llama(8192, 28672, 80, 64, 8, 128256, L3)),
    Known("llama-3.1-8b", "llama", 8.03, _llama(4096, 14336, 32, 32, 8, 128256, 131072)),
    Known("llama-3.1-70b", "llama", 70.6, _llama(8192, 28672, 80, 64, 8, 128256, 131072)),
    Known("llama-3.1-405b", "llama", 405.9, _llama(16384, 53248, 126, 128, 8, 128256, 131072)),
    Known("llama-3.2-1b", "llama", 1.24,
          _llama(2048, 8192, 16, 32, 8, 128256, 131072, tie=True, head_dim=64)),
    Known("llama-3.2-3b", "llama", 3.21,
          _llama(3072, 8192, 28, 24, 8, 128256, 131072, tie=True, head_dim=128)),
    Known("llama-3.3-70b", "llama", 70.6, _llama(8192, 28672, 80, 64, 8, 128256, 131072)),
    # Mistral AI
    Known("mistral-7b", "mistral", 7.24,
          _decoder("mistral", 4096, 14336, 32, 32, 8, 32000, 32768)),
    Known("mistral-7b-v0.3", "mistral", 7.25,
          _decoder("mistral", 4096, 14336, 32, 32, 8, 32768, 32768)),
    Known("mistral-nemo-12b", "mistral", 12.2,
          _decoder("mistral", 5120, 14336, 40, 32, 8, 131072, 131072, head_dim=128)),
    Known("mixtral-8x7b", "mixtral", 46.7,
          _decoder("mixtral", 4096, 14336, 32, 32, 8, 32000, 32768,
                   num_local_experts=8, num_experts_per_tok=2)),
    Known("mixtral-8x22b", "mixtral", 140.6,
          _decoder("mixtral", 6144, 16384, 56, 48, 8, 32768, 65536,
                   num_local_experts=8, num_experts_per_tok=2)),
    # Qwen (1): remote code, 152K vocabulary
    Known("qwen-1.8b", "qwen", 1.84, _qwen1(2048, 11008, 24, 16, 151936)),
    Known("qwen-7b", "qwen", 7.72, _qwen1(4096, 22016, 32, 32, 151936)),
    Known("qwen-14b", "qwen", 14.2, _qwen1(5120, 27392, 40, 40, 152064)),
    Known("qwen-72b", "qwen", 72.3, _qwen1(8192, 49152, 80, 64, 152064)),
    # Qwen1.5, Qwen2, Qwen2.5 (Qwen2ForCausalLM)
    Known("qwen1.5-0.5b", "qwen2", 0.46, _qwen2(1024, 2816, 24, 16, 16, 151936, 32768, tie=True)),
    Known("qwen1.5-1.8b", "qwen2", 1.84, _qwen2(2048, 5504, 24, 16, 16, 151936, 32768)),
    Known("qwen1.5-4b", "qwen2", 3.95, _qwen2(2560, 6912, 40, 20, 20, 151936, 32768)),
    Known("qwen1.5-7b", "qwen2", 7.72, _qwen2(4096, 11008, 32, 32, 32, 151936, 32768)),
    Known("qwen1.5-14b", "qwen2", 14.2, _qwen2(5120, 13696, 40, 40, 40, 152064, 32768)),
    Known("qwen1.5-32b", "qwen2", 32.5, _qwen2(5120, 27392, 64, 40, 8, 152064, 32768)),
    Known("qwen1.5-72b", "qwen2", 72.3, _qwen2(8192, 24576, 80, 64, 64, 152064, 32768)),
    Known("qwen1.5-110b", "qwen2", 111.0, _qwen2(8192, 49152, 80, 64, 8, 152064, 32768)),
    Known("qwen2-0.5b", "qwen2", 0.49, _qwen2(896, 4864, 24, 14, 2, 151936, 32768, tie=True)),
    Known("qwen2-1.5b", "qwen2", 1.54, _qwen2(1536, 8960, 28, 12, 2, 151936, 32768, tie=True)),
    Known("qwen2-7b", "qwen2", 7.62, _qwen2(3584, 18944, 28, 28, 4, 152064, 32768)),
    Known("qwen2-72b", "qwen2", 72.7, _qwen2(8192, 29568, 80, 64, 8, 152064, 32768)),
    Known("qwen2.5-0.5b", "qwen2", 0.49, _qwen2(896, 4864, 24, 14, 2, 151936, 32768, tie=True)),
    Known("qwen2.5-1.5b", "qwen2", 1.54, _qwen2(1536, 8960, 28, 12, 2, 151936, 32768, tie=True)),
    Known("qwen2.5-3b", "qwen2", 3.09, _qwen2(2048, 11008, 36, 16, 2, 151936, 32768, tie=True)),
    Known("qwen2.5-7b", "qwen2", 7.62, _qwen2(3584, 18944, 28, 28, 4, 152064, 32768)),
    Known("qwen2.5-14b", "qwen2", 14.7, _qwen2(5120, 13824, 48, 40, 8, 152064, 32768)),
    Known("qwen2.5-32b", "qwen2", 32.8, _qwen2(5120, 27648, 64, 40, 8, 152064, 32768)),
    Known("qwen2.5-72b", "qwen2", 72.7, _qwen2(8192, 29568, 80, 64, 8, 152064, 32768)),
    # Qwen3 (128-wide heads whatever the hidden size), dense and MoE
    Known("qwen3-0.6b", "qwen3", 0.6, _qwen3(1024, 3072, 28, 16, 8, 151936, 40960, tie=True)),
    Known("qwen3-1.7b", "qwen3", 1.7, _qwen3(2048, 6144, 28, 16, 8, 151936, 40960, tie=True)),
    Known("qwen3-4b", "qwen3", 4.0, _qwen3(2560, 9728, 36, 32, 8, 151936, 40960, tie=True)),
    Known("qwen3-8b", "qwen3", 8.2, _qwen3(4096, 12288, 36, 32, 8, 151936, 40960)),
    Known("qwen3-14b", "qwen3", 14.8, _qwen3(5120, 17408, 40, 40, 8, 151936, 40960)),
    Known("qwen3-32b", "qwen3", 32.8, _qwen3(5120, 25600, 64, 64, 8, 151936, 40960)),
    Known("qwen3-30b-a3b", "qwen3", 30.5,
          _decoder("qwen3_moe", 2048, 6144, 48, 32, 4, 151936, 40960, head_dim=128,
                   moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8)),
    Known("qwen3-235b-a22b", "qwen3", 235.0,
          _decoder("qwen3_moe", 4096, 12288, 94, 64, 4, 151936, 40960, head_dim=128,
                   moe_intermediate_size=1536, num_experts=128, num_experts_per_tok=8)),
    # Google Gemma (256K vocabulary, GeGLU, tied)
    Known("gemma-2b", "gemma", 2.51,
          _decoder("gemma", 2048, 16384, 18, 8, 1, 256000, L3, tie=True, head_dim=256)),
    Known("gemma-7b", "gemma", 8.54,
          _decoder("gemma", 3072, 24576, 28, 16, 16, 256000, L3, tie=True, head_dim=256)),
    Known("gemma-2-2b", "gemma", 2.61,
          _decoder("gemma2", 2304, 9216, 26, 8, 4, 256000, L3, tie=True, head_dim=256)),
    Known("gemma-2-9b", "gemma", 9.24,
          _decoder("gemma2", 3584, 14336, 42, 16, 8, 256000, L3, tie=True, head_dim=256)),
    Known("gemma-2-27b", "gemma", 27.2,
          _decoder("gemma2", 4608, 36864, 46, 32, 16, 256000, L3, tie=True, head_dim=128)),
    # Microsoft Phi
    Known("phi-1.5", "phi", 1.42, _decoder("phi", 2048, 8192, 24, 32, 32, 51200, 2048)),
    Known("phi-2", "phi", 2.78, _decoder("phi", 2560, 10240, 32, 32, 32, 51200, 2048)),
    Known("phi-3-mini", "phi", 3.82, _decoder("phi3", 3072, 8192, 32, 32, 32, 32064, 4096)),
    Known("phi-3-medium", "phi", 14.0, _decoder("phi3", 5120, 17920, 40, 40, 10, 32064, 4096)),
    Known("phi-4", "phi", 14.7, _decoder("phi3", 5120, 17920, 40, 40, 10, 100352, 16384)),
    # 01.AI Yi (Llama architecture)
    Known("yi-6b", "yi", 6.06, _llama(4096, 11008, 32, 32, 4, 64000, L2)),
    Known("yi-9b", "yi", 8.83, _llama(4096, 11008, 48, 32, 4, 64000, L2)),
    Known("yi-34b", "yi", 34.4, _llama(7168, 20480, 60, 56, 8, 64000, L2)),
    # Zhipu ChatGLM (remote code: multi-query groups, padded vocabulary)
    Known("chatglm2-6b", "chatglm", 6.24, _chatglm(28, 65024, 32768)),
    Known("chatglm3-6b", "chatglm", 6.24, _chatglm(28, 65024, 8192)),
    Known("glm-4-9b", "chatglm", 9.4, _chatglm(40, 151552, 131072)),
    # Baichuan 2 (remote code: fused W_pack attention, 125K vocabulary)
    Known("baichuan2-7b", "baichuan", 7.51,
          _decoder("baichuan", 4096, 11008, 32, 32, 32, 125696, L2)),
    Known("baichuan2-13b", "baichuan", 13.9,
          _decoder("baichuan", 5120, 13696, 40, 40, 40, 125696, L2)),
    # DeepSeek: dense (Llama architecture), MoE, and multi-head latent attention
    Known("deepseek-llm-7b", "deepseek", 6.91, _llama(4096, 11008, 30, 32, 32, 102400, L2)),
    Known("deepseek-llm-67b", "deepseek", 67.4, _llama(8192, 22016, 95, 64, 8, 102400, L2)),
    Known("deepseek-moe-16b", "deepseek", 16.4,
          _deepseek_moe("deepseek", 2048, 10944, 28, 16, 1408, 64, 6, 2, 1, 102400)),
    Known("deepseek-v2-lite", "deepseek", 15.7,
          _deepseek_moe("deepseek_v2", 2048, 10944, 27, 16, 1408, 64, 6, 2, 1, 102400,
                        kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                        v_head_dim=128)),
    Known("deepseek-v2", "deepseek", 235.7,
          _deepseek_moe("deepseek_v2", 5120, 12288, 60, 128, 1536, 160, 6, 2, 1, 102400,
                        q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                        qk_rope_head_dim=64, v_head_dim=128)),
    Known("deepseek-v3", "deepseek", 671.0,
          _deepseek_moe("deepseek_v3", 7168, 18432, 61, 128, 2048, 256, 8, 1, 3, 129280,
                        q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                        qk_rope_head_dim=64, v_head_dim=128)),
    # Falcon, StableLM, BLOOM
    Known("falcon-7b", "falcon", 6.92,
          {"model_type": "falcon", "hidden_size": 4544, "num_hidden_layers": 32,
           "num_attention_heads": 71, "multi_query": True, "new_decoder_architecture": False,
           "vocab_size": 65024, "max_position_embeddings": 2048}),
    Known("falcon-40b", "falcon", 41.8,
          {"model_type": "falcon", "hidden_size": 8192, "num_hidden_layers": 60,
           "num_attention_heads": 128, "num_kv_heads": 8, "new_decoder_architecture": True,
           "vocab_size": 65024, "max_position_embeddings": 2048, "tie_word_embeddings": False}),
    Known("stablelm-alpha-3b", "stablelm", 3.64,
          _decoder("gpt_neox", 4096, 16384, 16, 32, 32, 50688, 4096)),
    Known("bloom-560m", "bloom", 0.56,
          {"model_type": "bloom", "hidden_size": 1024, "n_layer": 24, "n_head": 16,
           "vocab_size": 250880, "seq_length": 2048}),
    Known("bloom-1b1", "bloom", 1.07,
          {"model_type": "bloom", "hidden_size": 1536, "n_layer": 24, "n_head": 16,
           "vocab_size": 250880, "seq_length": 2048}),
    Known("bloom-7b1", "bloom", 7.07,
          {"model_type": "bloom", "hidden_size": 4096, "n_layer": 30, "n_head": 32,
           "vocab_size": 250880, "seq_length": 2048}),
    # T5 family: encoder-decoder (v1.0 ReLU and tied; v1.1, FLAN-T5, T0, mT5, mT0 gated GELU)
    Known("t5-small", "t5", 0.06, _t5(512, 2048, 6, 8, 32128, False, True)),
    Known("t5-base", "t5", 0.22, _t5(768, 3072, 12, 12, 32128, False, True)),
    Known("t5-large", "t5", 0.74, _t5(1024, 4096, 24, 16, 32128, False, True)),
    Known("flan-t5-base", "t5", 0.25, _t5(768, 2048, 12, 12, 32128, True, False)),
    Known("flan-t5-large", "t5", 0.78, _t5(1024, 2816, 24, 16, 32128, True, False)),
    Known("flan-t5-xl", "t5", 2.85, _t5(2048, 5120, 24, 32, 32128, True, False)),
    Known("flan-t5-xxl", "t5", 11.1, _t5(4096, 10240, 24, 64, 32128, True, False)),
    Known("mt5-base", "t5", 0.58, _t5(768, 2048, 12, 12, 250112, True, False)),
    Known("mt5-large", "t5", 1.23, _t5(1024, 2816, 24, 16, 250112, True, False)),
    Known("mt5-xl", "t5", 3.74, _t5(2048, 5120, 24, 32, 250112, True, False)),
    Known("mt5-xxl", "t5", 12.9, _t5(4096, 10240, 24, 64, 250112, True, False)),
    # GPT-2 (Radford et al. 2019) and BERT (Devlin et al. 2019)
    Known("gpt2", "gpt2", 0.124, _gpt2(768, 12, 12)),
    Known("gpt2-medium", "gpt2", 0.355, _gpt2(1024, 24, 16)),
    Known("gpt2-large", "gpt2", 0.774, _gpt2(1280, 36, 20)),
    Known("gpt2-xl", "gpt2", 1.56, _gpt2(1600, 48, 25)),
    Known("bert-base", "bert", 0.110, _bert(768, 12, 12)),
    Known("bert-large", "bert", 0.335, _bert(1024, 24, 16)),
]  # fmt: skip

KNOWN: dict[str, Known] = {k.key: k for k in K}

# Other names of the same architecture (checkpoints that differ only in their weights).
ALIASES: dict[str, str] = {
    "llama-3.1-8b-instruct": "llama-3.1-8b",
    "llama-2-7b-chat": "llama-2-7b",
    "vicuna-7b": "llama-2-7b",
    "vicuna-13b": "llama-2-13b",
    "mistral-7b-v0.2": "mistral-7b",
    "mistral-7b-v0.1": "mistral-7b",
    "zephyr-7b": "mistral-7b",
    "openhermes-2.5-mistral-7b": "mistral-7b",
    "mixtral-8x7b-v0.1": "mixtral-8x7b",
    "qwen2.5-coder-7b": "qwen2.5-7b",
    "qwen2.5-math-7b": "qwen2.5-7b",
    "qwen2.5-coder-14b": "qwen2.5-14b",
    "qwen2.5-coder-32b": "qwen2.5-32b",
    "qwq-32b": "qwen2.5-32b",
    "deepseek-r1-distill-qwen-1.5b": "qwen2.5-1.5b",
    "deepseek-r1-distill-qwen-7b": "qwen2.5-7b",
    "deepseek-r1-distill-qwen-14b": "qwen2.5-14b",
    "deepseek-r1-distill-qwen-32b": "qwen2.5-32b",
    "deepseek-r1-distill-llama-8b": "llama-3.1-8b",
    "deepseek-r1-distill-llama-70b": "llama-3.3-70b",
    "deepseek-r1": "deepseek-v3",
    "deepseek-coder-v2-lite": "deepseek-v2-lite",
    "deepseek-coder-6.7b": "llama-2-7b",
    "t0-3b": "flan-t5-xl",
    "t0": "flan-t5-xxl",
    "t5-v1.1-xl": "flan-t5-xl",
    "t5-v1.1-xxl": "flan-t5-xxl",
    "t5-3b": "flan-t5-xl",
    "mt0-xxl": "mt5-xxl",
    "mt0-xl": "mt5-xl",
    "mt0-large": "mt5-large",
    "mt0-base": "mt5-base",
    "bloomz-7b1": "bloom-7b1",
    "bloomz-560m": "bloom-560m",
    "stablelm-base-alpha-3b": "stablelm-alpha-3b",
    "stablelm-tuned-alpha-3b": "stablelm-alpha-3b",
    "gpt2-small": "gpt2",
    "gpt-2": "gpt2",
    "phi-3-mini-4k": "phi-3-mini",
    "phi-3-mini-128k": "phi-3-mini",
    "phi-3-medium-4k": "phi-3-medium",
    "phi-3-medium-128k": "phi-3-medium",
    "phi-3.5-mini": "phi-3-mini",
    "llama-2-7b-32k": "llama-2-7b",
    # Yi-1.5: Yi continued on more tokens, the same shapes
    "yi-1.5-6b": "yi-6b",
    "yi-1.5-9b": "yi-9b",
    "yi-1.5-34b": "yi-34b",
}
