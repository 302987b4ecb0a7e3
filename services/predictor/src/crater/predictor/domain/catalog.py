"""Known model sizes, from the published configurations (parameter counts in billions)."""

from __future__ import annotations

import re

PARAMETERS_BILLION: dict[str, float] = {
    "llama-2-7b": 6.74,
    "llama-2-13b": 13.0,
    "llama-2-70b": 69.0,
    "llama-3-8b": 8.03,
    "llama-3-70b": 70.6,
    "mistral-7b": 7.24,
    "qwen2-7b": 7.62,
    "gpt2": 0.124,
    "gpt2-medium": 0.355,
    "gpt2-large": 0.774,
    "gpt2-xl": 1.56,
    "bert-base": 0.110,
    "bert-large": 0.340,
    "resnet-50": 0.0256,
    "stable-diffusion-unet": 0.860,
}

_NOISE = re.compile(r"-(hf|chat|instruct|uncased|cased|v0\.\d|v\d)$")


def normalise(name: str) -> str:
    """`meta-llama/Llama-3-8b-chat-hf` -> `llama-3-8b`: drop the organisation and suffixes."""
    key = name.lower().rsplit("/", 1)[-1].replace("_", "-")
    previous = None
    while previous != key:
        previous, key = key, _NOISE.sub("", key)
    return key


def parameters_billion(name: str) -> float | None:
    key = normalise(name)
    if key in PARAMETERS_BILLION:
        return PARAMETERS_BILLION[key]
    # the longest catalog name the key starts with ("llama-2-7b-32k" -> "llama-2-7b")
    matches = [k for k in PARAMETERS_BILLION if key.startswith(k)]
    return PARAMETERS_BILLION[max(matches, key=len)] if matches else None
