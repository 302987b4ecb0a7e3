"""Device check: peak GPU memory of real training steps, for the techniques no published figure
covers (issue #24): SGD, Megatron-style selective recomputation and torchtune's every-k
activation checkpointing, beside AdamW controls of the same shapes.

Each run builds a model from its published config.json values (random weights: memory does
not depend on them), takes three optimizer steps on random tokens (batch x seq, labels = the
inputs, Hugging Face's own loss) and reports `torch.cuda.max_memory_allocated()` over the
whole run, model creation included, in bytes: what reference.yaml calls `allocated`. The
runs share one process; each starts from a reset peak and an empty card but for PyTorch's
cuBLAS workspace (`allocated_before_bytes`, counted in every run's peak as in any process).

The techniques, done the way their users do them:
- AMP: fp32 weights under `torch.autocast(bfloat16)`; pure bf16: the model in bfloat16.
- SGD: `torch.optim.SGD(momentum=0.9)` (one state a weight); `momentum=0` has none.
- optimizer in backward: one optimizer per parameter stepped from its
  `register_post_accumulate_grad_hook`, the gradient freed at once (PyTorch's recipe, LOMO's
  idea).
- full checkpointing: `gradient_checkpointing_enable()` (non-reentrant); every-k: the same,
  then only blocks 0, k, 2k, ... keep it (torchtune's `ac_option` k).
- Megatron selective: eager attention, its core (QK^T, softmax, dropout, x V) inside
  `torch.utils.checkpoint`, so only its inputs and output are kept (Korthikanti et al. 2022,
  section 4.2).

Prints one JSON object per run and writes them all to $OUT/predictor_measured.json when OUT is
set. Needs a CUDA card, PyTorch and transformers (>= 5); no test imports it. `--smoke` runs
tiny configs on the CPU to check the code paths (no figures).

    python3 benchmarks/predictor/measure_on_gpu.py [--only NAME ...] [--smoke]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
import transformers
from torch.utils.checkpoint import checkpoint
from transformers import AttentionInterface, AutoConfig, AutoModelForCausalLM
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

# The published config.json values (Hugging Face Hub) of the models measured.
CONFIGS: dict[str, dict[str, Any]] = {
    "meta-llama/Llama-3.2-1B": {
        "model_type": "llama", "vocab_size": 128256, "hidden_size": 2048,
        "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 64, "tie_word_embeddings": True,
        "max_position_embeddings": 131072, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
    },
    "Qwen/Qwen2.5-1.5B": {
        "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 1536,
        "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
        "num_key_value_heads": 2, "tie_word_embeddings": True, "max_position_embeddings": 131072,
        "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
    },
    "meta-llama/Llama-3.1-8B": {
        "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "tie_word_embeddings": False,
        "max_position_embeddings": 131072, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
    },
}  # fmt: skip
# --smoke: the same code on shapes a CPU runs in seconds
TINY = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}  # fmt: skip


@dataclass(frozen=True)
class Run:
    """One measured setup, its keys named as reference.yaml names them."""

    name: str
    model: str
    batch: int
    seq: int
    master_weights: bool  # AMP (fp32 weights, bf16 autocast) or pure bf16
    optimizer: str = "adamw"  # adamw | sgd (momentum 0.9) | sgd-plain (momentum 0)
    optimizer_in_backward: bool = False
    checkpoint_policy: str | None = None  # full | every-k | selective
    checkpoint_every: int | None = None
    flash_attention: bool = True  # SDPA (flash on this card) or eager attention
    extra: dict[str, Any] = field(default_factory=dict)


L1, Q15, L8 = "meta-llama/Llama-3.2-1B", "Qwen/Qwen2.5-1.5B", "meta-llama/Llama-3.1-8B"
RUNS = [
    # SGD
    Run("sgd-amp-1b", L1, 4, 2048, True, "sgd"),
    Run("sgd-amp-1b-ckpt", L1, 4, 2048, True, "sgd", checkpoint_policy="full"),
    Run("sgd-bf16-1b", L1, 4, 2048, False, "sgd"),
    Run("sgdplain-bf16-1b", L1, 4, 2048, False, "sgd-plain"),
    Run("sgd-bf16-1b-inbackward-ckpt", L1, 4, 2048, False, "sgd-plain", True, "full"),
    Run("sgd-amp-qwen1.5b-ckpt", Q15, 2, 4096, True, "sgd", checkpoint_policy="full"),
    Run("sgd-bf16-8b-ckpt", L8, 1, 4096, False, "sgd", checkpoint_policy="full"),
    Run("sgd-amp-8b-ckpt", L8, 1, 2048, True, "sgd", checkpoint_policy="full"),
    # AdamW controls of the same shapes
    Run("adamw-amp-1b", L1, 4, 2048, True, "adamw"),
    Run("adamw-bf16-8b-ckpt", L8, 1, 4096, False, "adamw", checkpoint_policy="full"),
    # every-k (torchtune ac_option)
    Run("everyk2-bf16-1b", L1, 4, 4096, False, checkpoint_policy="every-k", checkpoint_every=2),
    Run("everyk4-bf16-1b", L1, 4, 4096, False, checkpoint_policy="every-k", checkpoint_every=4),
    Run("full-bf16-1b", L1, 4, 4096, False, checkpoint_policy="full"),
    Run("none-bf16-1b", L1, 4, 4096, False),
    Run("everyk2-bf16-qwen1.5b", Q15, 2, 4096, False, checkpoint_policy="every-k",
        checkpoint_every=2),
    # Megatron selective: eager attention with and without its core recomputed
    Run("eager-bf16-1b", L1, 2, 2048, False, flash_attention=False),
    Run("selective-bf16-1b", L1, 2, 2048, False, checkpoint_policy="selective",
        flash_attention=False),
    Run("selective-bf16-qwen1.5b", Q15, 2, 2048, False, checkpoint_policy="selective",
        flash_attention=False),
    Run("selective-amp-1b", L1, 2, 2048, True, "sgd", checkpoint_policy="selective",
        flash_attention=False),
]  # fmt: skip


def _eager_attention(module: torch.nn.Module) -> Callable[..., Any]:
    """The model's own eager attention (each modeling file has one)."""
    return sys.modules[type(module).__module__].eager_attention_forward  # type: ignore[no-any-return]


def selective_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Eager attention whose core is recomputed in backward: Megatron's selective policy."""
    eager = _eager_attention(module)

    def core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        CALLS["attention_cores"] += 1
        return eager(module, q, k, v, attention_mask, **kwargs)[0]  # type: ignore[no-any-return]

    return checkpoint(core, query, key, value, use_reentrant=False), None


# What ran in the last step: the evidence that each policy did what it says.
CALLS = {"layer_forwards": 0, "attention_cores": 0, "steps_in_backward": 0}


def _count_layer(*_: Any) -> None:
    CALLS["layer_forwards"] += 1


AttentionInterface.register("selective", selective_attention)
AttentionMaskInterface.register("selective", ALL_MASK_ATTENTION_FUNCTIONS["eager"])


def build(run: Run, device: torch.device, smoke: bool) -> torch.nn.Module:
    values = {**CONFIGS[run.model], **(TINY if smoke else {})}
    config = AutoConfig.for_model(**values)
    attention = "sdpa" if run.flash_attention else "eager"
    if run.checkpoint_policy == "selective":
        attention = "selective"
    dtype = torch.float32 if run.master_weights else torch.bfloat16
    with device:
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attention)
    model.config.use_cache = False
    if run.checkpoint_policy in ("full", "every-k"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if run.checkpoint_policy == "every-k":
        assert run.checkpoint_every
        for i, layer in enumerate(model.model.layers):
            layer.gradient_checkpointing = i % run.checkpoint_every == 0
    for layer in model.model.layers:
        layer.register_forward_pre_hook(_count_layer)
    model.train()
    return model  # type: ignore[no-any-return]


def optimizers(
    run: Run, model: torch.nn.Module
) -> tuple[torch.optim.Optimizer | None, Callable[[], None]]:
    """The optimizer, or None when each parameter steps itself in backward; and what undoes
    the hooks (a hook holds its parameter beyond the garbage collector's sight)."""

    def make(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        if run.optimizer == "adamw":
            return torch.optim.AdamW(params, lr=1e-5, foreach=False)
        momentum = 0.9 if run.optimizer == "sgd" else 0.0
        return torch.optim.SGD(params, lr=1e-5, momentum=momentum, foreach=False)

    if not run.optimizer_in_backward:
        return make(list(model.parameters())), lambda: None
    each = {p: make([p]) for p in model.parameters()}

    def step(p: torch.Tensor) -> None:
        CALLS["steps_in_backward"] += 1
        each[p].step()  # type: ignore[index]
        each[p].zero_grad(set_to_none=True)  # type: ignore[index]

    hooks = [p.register_post_accumulate_grad_hook(step) for p in model.parameters()]

    def undo() -> None:
        for hook in hooks:
            hook.remove()
        each.clear()

    return None, undo


def train(run: Run, device: torch.device, smoke: bool, steps: int = 3) -> dict[str, Any]:
    cuda = device.type == "cuda"
    left = 0
    if cuda:
        torch.cuda.synchronize()
        # What stays between runs is PyTorch's cuBLAS workspace (64 MiB on this card), which
        # a real training process holds too; anything more is a leak of the last run.
        left = torch.cuda.memory_allocated()
        assert left <= 128 * 2**20, f"{left} bytes still allocated before {run.name}"
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    model = build(run, device, smoke)
    optimizer, undo = optimizers(run, model)
    batch, seq = (2, 64) if smoke else (run.batch, run.seq)
    vocab = model.config.vocab_size
    tokens = torch.randint(0, vocab, (batch, seq), device=device)
    losses = []
    for _ in range(steps):
        CALLS.update(dict.fromkeys(CALLS, 0))
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=run.master_weights):
            loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        losses.append(float(loss.detach()))
        del loss
        if optimizer is not None:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    if cuda:
        torch.cuda.synchronize()
    figures = {
        "allocated_before_bytes": left if cuda else None,
        "allocated_bytes": torch.cuda.max_memory_allocated() if cuda else None,
        "reserved_bytes": torch.cuda.max_memory_reserved() if cuda else None,
        "parameters": sum(p.numel() for p in model.parameters()),
        "losses": [round(x, 4) for x in losses],
        "layers": model.config.num_hidden_layers,
        "last_step": dict(CALLS),
        "seconds": round(time.perf_counter() - started, 2),
    }
    undo()
    del model, optimizer, tokens
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="*", help="run names (default: all)")
    parser.add_argument("--smoke", action="store_true", help="tiny configs on the CPU")
    args = parser.parse_args()
    device = torch.device("cpu" if args.smoke else "cuda")
    card = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    header = {
        "card": card,
        "card_bytes": torch.cuda.get_device_properties(0).total_memory if card != "cpu" else None,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "host": platform.node(),
    }
    print(json.dumps(header), flush=True)
    results: list[dict[str, Any]] = []
    for run in RUNS:
        if args.only and run.name not in args.only:
            continue
        try:
            figures = train(run, device, args.smoke)
        except torch.OutOfMemoryError as error:
            figures = {"error": f"out of memory: {str(error)[:200]}"}
        except Exception as error:  # a run's failure is reported, the others still run
            figures = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
        results.append({**asdict(run), **figures})
        print(json.dumps(results[-1]), flush=True)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if os.environ.get("OUT"):
        out = Path(os.environ["OUT"]) / "predictor_measured.json"
        out.write_text(json.dumps({**header, "runs": results}, indent=2) + "\n")
    return 0 if results and all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(partial(main)())
