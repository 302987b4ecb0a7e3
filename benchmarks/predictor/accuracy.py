"""The predictor against published, measured GPU-memory figures (reference.yaml beside this).

Every row of the reference set is a real run someone published: a model, a method, a precision,
a batch and sequence, an optimizer, a card, and the memory it took (or that it ran out of
memory). Each row is turned into the task request a user of Crater would send for that run,
as far as the request can say it (what it cannot is listed per row as `unexpressed`), predicted
without learned corrections, and compared with the figure on the figure's own terms: a
`torch.cuda.max_memory_allocated()` figure with the predicted tensors alone, a
`max_memory_reserved()` one with tensors and allocator slack, what stays allocated after a
generation with the weights and KV cache, an nvidia-smi one (or one whose source does not say)
with everything, CUDA context included.

    uv run --frozen python benchmarks/predictor/accuracy.py [--rows]

Prints the error distribution (median absolute error, p90, share within 10%, signed median),
overall and per family, technique and source, whether each published out-of-memory run is
predicted not to fit, and how many figures each family and technique issue #24 names has
(`coverage`: those with none listed as missing); writes
benchmarks/results/predictor_accuracy.json and benchmarks/results/predictor_accuracy_rows.csv.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from crater.contracts import CardFit, ResourcePrediction, TaskRequest
from crater.contracts.gpus import parse_gpu_product
from crater.predictor.domain.estimate import Refused, predict

HERE = Path(__file__).resolve().parent
REFERENCE = HERE / "reference.yaml"
RESULTS = HERE.parent / "results"
MIB = 2**20
UNITS = {"GB": 1e9, "GiB": 2**30, "MB": 1e6, "MiB": 2**20}
# What nvidia-smi reports as a card's total memory where it is not <name>GB x 1024 MiB.
CARD_MIB = {"a10g": 23028, "v100-16": 16160, "rtx4090": 24564}
WITHIN = 0.10


@dataclass
class Row:
    """One published figure and the exact setup it was measured in."""

    id: str
    source: str
    title: str
    url: str
    measured: str  # allocated | reserved | resident | device | unstated | capacity
    setup: dict[str, Any]
    value_bytes: float | None  # None: out of memory
    card_bytes: float | None

    @property
    def oom(self) -> bool:
        return self.value_bytes is None

    @property
    def model(self) -> str:
        return str(self.setup["model"])


@dataclass
class Outcome:
    row: Row
    request: dict[str, Any] | None = None
    unexpressed: list[str] = field(default_factory=list)
    refused: str | None = None
    predicted_bytes: float | None = None  # on the figure's own terms
    predicted_total_bytes: float | None = None
    fits: bool | None = None  # the prediction says the run fits its card

    @property
    def error(self) -> float | None:
        """(predicted - measured) / measured; None for OOM rows and refusals."""
        if self.predicted_bytes is None or self.row.value_bytes is None:
            return None
        return self.predicted_bytes / self.row.value_bytes - 1


def card_bytes(setup: dict[str, Any]) -> float | None:
    if "card_gb" in setup:
        return float(setup["card_gb"]) * 1024 * MIB
    gpu = setup.get("gpu")
    if not gpu:
        return None
    product = parse_gpu_product(str(gpu))
    if product is None or product.memory_gb is None:
        return None
    key = product.model + (f"-{product.memory_gb}" if product.model == "v100" else "")
    return CARD_MIB.get(key, product.memory_gb * 1024) * MIB


def load_rows(path: Path = REFERENCE) -> tuple[list[Row], dict[str, float]]:
    data = yaml.safe_load(path.read_text())
    rows: list[Row] = []
    for source in data["sources"]:
        for n, raw in enumerate(source["rows"], 1):
            setup = {**source.get("setup", {}), **raw}
            value = setup.pop("value")
            setup.pop("notes", None)
            unit = UNITS[source["unit"]]
            if value == "oom":
                value_bytes = None
            elif isinstance(value, list):  # one figure per GPU: the fullest card
                value_bytes = max(value) * unit
            elif setup.get("per") == "total":
                value_bytes = value * unit / setup["gpus"]
            else:
                value_bytes = value * unit
            measured = source["measured"]
            if measured == "capacity" and value_bytes is not None:
                value_bytes = card_bytes(setup)
            rows.append(
                Row(
                    id=f"{source['id']}-{n}",
                    source=source["id"],
                    title=source["title"],
                    url=source["url"],
                    measured=measured,
                    setup=setup,
                    value_bytes=value_bytes,
                    card_bytes=card_bytes(setup),
                )
            )
    return rows, dict(data["models"])


# -- the request a user would send ---------------------------------------------------------

QUANTIZATION_NAMES = {  # the reference set's names -> what model_config.quantization says
    "bnb-nf4": "nf4",
    "bnb-nf4-dq": "nf4-dq",
    "nf4": "nf4",
    "gptq-int4": "gptq-int4",
    "gptq-int8": "gptq-int8",
    "awq": "awq",
    "fp8": "fp8",
}
OPTIMIZERS = {
    "adamw": "adamw",
    "adamw-8bit": "adamw8bit",
    "sgd": "sgd",
    "sgd-plain": "sgd-plain",
    "adafactor": "adafactor",
    "paged-adamw": "paged-adamw",
    "paged-adamw-8bit": "paged-adamw8bit",
}
ENGINES = {"hf-generate": "generate", "litgpt-generate": "generate", "vllm": "paged"}


def lora_targets(targets: object, unexpressed: list[str]) -> list[str]:
    if targets == "all-linear-and-head":
        return ["all-linear", "lm_head"]
    if targets == "all-linear":
        return ["all-linear"]
    return [str(t) for t in targets] if isinstance(targets, list) else ["q_proj", "v_proj"]


def to_request(row: Row, parameters: dict[str, float]) -> tuple[dict[str, Any], list[str]]:
    """The task request for the row's run, in the contract as it stands, and what of the
    setup it cannot say."""
    s = row.setup
    unexpressed: list[str] = []
    task = s["task"]
    quantization = s.get("quantization")
    model: dict[str, Any] = {
        "name": row.model,
        "precision": s.get("precision", "bf16"),
        "parameters_billion": parameters[row.model],
    }
    gpus = int(s.get("gpus", 1))
    body: dict[str, Any] = {
        "task_id": re.sub(r"[^A-Za-z0-9._:-]", "-", row.id),
        "task_type": task,
        "model_config": model,
        "resource_requirements": {"gpu": {"count": gpus}},
    }
    if s.get("gpu") and parse_gpu_product(str(s["gpu"])) is not None:
        body["resource_requirements"]["gpu"]["type"] = str(s["gpu"])
    if s.get("card_gb"):  # a card the source names by its size only
        body["resource_requirements"]["gpu"]["memory_mb"] = int(s["card_gb"]) * 1024
    if quantization:
        if quantization in QUANTIZATION_NAMES:
            model["quantization"] = QUANTIZATION_NAMES[quantization]
        else:
            unexpressed.append(f"quantization {quantization}")
    if task == "inference":
        inference: dict[str, Any] = {
            "batch_size": s.get("batch", 1),
            "context_length": s.get("input_tokens", 0) + s.get("output_tokens", 0),
        }
        engine = s.get("engine", "hf-generate")
        inference["engine"] = ENGINES.get(engine, "generate")
        if s.get("input_tokens"):
            inference["prompt_length"] = s["input_tokens"]
        if s.get("prompt_logits"):
            inference["prompt_logits"] = True
        if not s.get("flash_attention", True):
            inference["flash_attention"] = False
        if s.get("tensor_parallel"):
            inference["tensor_parallel"] = s["tensor_parallel"]
        if s.get("cuda_graphs"):
            unexpressed.append("CUDA graphs captured")
        body["inference_config"] = inference
        return body, unexpressed

    method = s.get("method", "full")
    config: dict[str, Any] = {
        "batch_size": s.get("batch", 1),
        "sequence_length": s.get("seq", 512),
        "gradient_checkpointing": bool(s.get("gradient_checkpointing", False)),
        "flash_attention": bool(s.get("flash_attention", True)),
    }
    if "master_weights" in s and s.get("precision", "bf16") != "fp32":
        config["master_weights"] = bool(s["master_weights"])
    optimizer = s.get("optimizer", "adamw")
    if optimizer in OPTIMIZERS:
        config["optimizer"] = OPTIMIZERS[optimizer]
    else:
        unexpressed.append(f"optimizer {optimizer}")
    if s.get("zero_stage") is not None:
        config["zero_stage"] = s["zero_stage"]
    elif gpus == 1:
        config["zero_stage"] = 0
    if s.get("fsdp"):
        config["sharding"] = "fsdp"
    if s.get("pipeline_parallel"):
        config["pipeline_parallel"] = s["pipeline_parallel"]
        config["data_parallel"] = max(1, gpus // s["pipeline_parallel"])
        config.setdefault("zero_stage", 0)
    if s.get("tensor_parallel"):
        config["tensor_parallel"] = s["tensor_parallel"]
        config["data_parallel"] = max(1, gpus // s["tensor_parallel"])
    if s.get("float8"):
        unexpressed.append("float8 linear layers")
    for key, name in (
        ("optimizer_in_backward", "optimizer_in_backward"),
        ("offload_optimizer", "offload_optimizer"),
        ("offload_params", "offload_parameters"),
        ("compile", "torch_compile"),
        ("full_model_per_rank", "full_model_per_rank"),
    ):
        if s.get(key):
            config[name] = True
    if s.get("chunked_ce"):
        config["cross_entropy"] = "chunked"
    if s.get("fused_ce"):
        config["cross_entropy"] = "fused"
    if s.get("checkpoint_policy"):
        config["checkpoint_policy"] = s["checkpoint_policy"]
        if s.get("checkpoint_every"):
            config["checkpoint_every"] = s["checkpoint_every"]
    if s.get("head") == "classification":
        config["task_head"] = "classification"
    if method in ("lora", "qlora"):
        lora: dict[str, Any] = {
            "rank": s.get("lora_rank", 8),
            "target_modules": lora_targets(s.get("lora_targets"), unexpressed),
        }
        if s.get("lora_train_embeddings"):
            lora["train_embeddings"] = True
        if s.get("lora_dropout"):
            lora["dropout"] = s["lora_dropout"]
        config["lora"] = lora
    elif method != "full":
        unexpressed.append(f"method {method}")
    body["training_config"] = config
    return body, unexpressed


def on_terms(row: Row, prediction: ResourcePrediction) -> float:
    """The prediction measured the way the row's figure was."""
    total = prediction.gpu_memory_per_gpu_mb * MIB
    b = prediction.breakdown_mb
    if row.measured == "allocated":
        return total - (b.get("cuda_context", 0) + b.get("allocator_overhead", 0)) * MIB
    if row.measured == "reserved":
        return total - b.get("cuda_context", 0) * MIB
    if row.measured == "resident":
        return float(b.get("weights", 0) + b.get("kv_cache", 0)) * MIB
    return total


def evaluate(
    rows: Iterable[Row],
    parameters: dict[str, float],
    translate: Callable[[Row, dict[str, float]], tuple[dict[str, Any], list[str]]] = to_request,
) -> list[Outcome]:
    outcomes = []
    for row in rows:
        body, unexpressed = translate(row, parameters)
        outcome = Outcome(row, body, unexpressed)
        try:
            prediction = predict(TaskRequest.model_validate(body))
        except Refused as refused:
            outcome.refused = "; ".join(f"{e.field}: {e.reason}" for e in refused.errors)
            if any(e.field.startswith("resource_requirements.gpu") for e in refused.errors):
                outcome.fits = False  # refused as too large for any card of its kind
        else:
            outcome.predicted_bytes = on_terms(row, prediction)
            outcome.predicted_total_bytes = prediction.gpu_memory_per_gpu_mb * MIB
            if prediction.fit is not None:  # the predictor's own verdict on the card
                outcome.fits = prediction.fit.verdict is not CardFit.DOES_NOT_FIT
            elif row.card_bytes is not None:
                outcome.fits = outcome.predicted_bytes <= row.card_bytes
        outcomes.append(outcome)
    return outcomes


# -- the distribution ----------------------------------------------------------------------

FAMILIES = (  # (pattern on the model id, family), first match wins
    (r"llama-3\.3", "llama-3.3"),
    (r"llama-3\.2", "llama-3.2"),
    (r"llama-3\.1", "llama-3.1"),
    (r"llama-3", "llama-3"),
    (r"llama-2|codellama|tinyllama", "llama-2"),
    (r"qwen3-30b-a3b|qwen3-235b", "qwen3-moe"),
    (r"qwen3", "qwen3"),
    (r"qwen2\.5", "qwen2.5"),
    (r"qwen2", "qwen2"),
    (r"qwen1\.5", "qwen1.5"),
    (r"qwen", "qwen-1"),
    (r"mixtral", "mixtral"),
    (r"mistral", "mistral"),
    (r"deepseek-moe|deepseek-v2|deepseek-v3|deepseek-coder-v2", "deepseek-moe"),
    (r"deepseek", "deepseek"),
    (r"gemma", "gemma"),
    (r"phi", "phi"),
    (r"falcon", "falcon"),
    (r"stablelm", "stablelm"),
    (r"chatglm", "chatglm"),
    (r"yi-", "yi"),
    (r"baichuan", "baichuan"),
    (r"t0_|mt0|t5", "t5"),
    (r"bloom", "bloom"),
    (r"bert", "bert"),
)
# What issue #24 asks the reference set to cover: every family it names ...
ISSUE_FAMILIES = (
    "llama-2", "llama-3", "llama-3.1", "llama-3.2", "llama-3.3", "qwen1.5", "qwen2",
    "qwen2.5", "qwen3", "qwen3-moe", "mistral", "mixtral", "gemma", "phi", "yi", "chatglm",
    "baichuan", "deepseek", "deepseek-moe", "t5", "bert",
)  # fmt: skip


def _trained(s: dict[str, Any]) -> bool:
    return bool(s["task"] != "inference")


def _policy(s: dict[str, Any]) -> str | None:
    if not _trained(s):
        return None
    return s.get("checkpoint_policy") or ("full" if s.get("gradient_checkpointing") else None)


# ... and every technique, each as a test of a row's setup.
ISSUE_TECHNIQUES: dict[str, Callable[[dict[str, Any]], bool]] = {
    "AMP (fp32 master)": lambda s: (
        _trained(s)
        and s.get("precision", "bf16") != "fp32"
        and s.get("master_weights", True) is not False
    ),
    "pure bf16": lambda s: (
        _trained(s) and s.get("precision", "bf16") == "bf16" and s.get("master_weights") is False
    ),
    "optimizer AdamW": lambda s: _trained(s) and s.get("optimizer", "adamw") == "adamw",
    "optimizer 8-bit": lambda s: _trained(s) and "8bit" in str(s.get("optimizer", "")),
    "optimizer paged": lambda s: _trained(s) and "paged" in str(s.get("optimizer", "")),
    "optimizer Adafactor": lambda s: _trained(s) and s.get("optimizer") == "adafactor",
    "optimizer SGD": lambda s: _trained(s) and str(s.get("optimizer")).startswith("sgd"),
    "optimizer in backward": lambda s: bool(s.get("optimizer_in_backward")),
    "offload (optimizer, parameters or activations)": lambda s: bool(
        s.get("offload_optimizer") or s.get("offload_params") or s.get("offload_activations")
    ),
    "checkpointing full": lambda s: _policy(s) == "full",
    "checkpointing selective (Megatron: attention core)": lambda s: _policy(s) == "selective",
    "checkpointing selective (op-level, torchtitan)": lambda s: _policy(s) == "selective-op",
    "checkpointing offloaded": lambda s: _policy(s) == "offloaded",
    "checkpointing every-k": lambda s: _policy(s) == "every-k",
    "chunked cross-entropy": lambda s: bool(s.get("chunked_ce")),
    "fused cross-entropy": lambda s: bool(s.get("fused_ce")),
    "quantization": lambda s: bool(s.get("quantization")),
    "DeepSpeed ZeRO-1": lambda s: s.get("zero_stage") == 1 and not s.get("fsdp"),
    "DeepSpeed ZeRO-2": lambda s: s.get("zero_stage") == 2 and not s.get("fsdp"),
    "DeepSpeed ZeRO-3": lambda s: s.get("zero_stage") == 3 and not s.get("fsdp"),
    "FSDP": lambda s: bool(s.get("fsdp")),
    "tensor parallel": lambda s: int(s.get("tensor_parallel", 1)) > 1,
    "pipeline parallel": lambda s: int(s.get("pipeline_parallel", 1)) > 1,
    "inference: generate": lambda s: (
        not _trained(s) and ENGINES.get(s.get("engine", "hf-generate"), "generate") == "generate"
    ),
    "inference: paged KV cache": lambda s: (
        not _trained(s) and ENGINES.get(s.get("engine", "hf-generate")) == "paged"
    ),
}


def coverage(rows: Iterable[Row]) -> dict[str, Any]:
    """How many published figures (out-of-memory runs among them) each family and technique
    issue #24 names has, and which have none."""
    rows = list(rows)
    families = {f: [r for r in rows if family(r.model) == f] for f in ISSUE_FAMILIES}
    techniques_ = {t: [r for r in rows if test(r.setup)] for t, test in ISSUE_TECHNIQUES.items()}

    def counts(group: dict[str, list[Row]]) -> dict[str, dict[str, int]]:
        return {k: {"rows": len(v), "oom": sum(r.oom for r in v)} for k, v in group.items()}

    return {
        "families": counts(families),
        "techniques": counts(techniques_),
        "missing_families": [f for f, v in families.items() if not v],
        "missing_techniques": [t for t, v in techniques_.items() if not v],
    }


def family(model: str) -> str:
    key = model.lower()
    return next((f for pattern, f in FAMILIES if re.search(pattern, key)), "other")


def techniques(row: Row) -> list[str]:
    s = row.setup
    tags = [s.get("method", "inference") if s["task"] != "inference" else "inference"]
    if s.get("quantization"):
        q = str(s["quantization"])
        tags.append("gptq" if q.startswith("gptq") else "nf4" if "nf4" in q else q)
        tags.append(f"quantized ({q})")
    if s["task"] != "inference":
        if s.get("precision") == "fp32":
            tags.append("fp32")
        elif s.get("master_weights") is False:
            tags.append("pure 16-bit")
        else:
            tags.append("AMP (fp32 master)")
        tags.append(f"optimizer {s.get('optimizer', 'adamw')}")
        policy = s.get("checkpoint_policy") or ("full" if s.get("gradient_checkpointing") else None)
        tags.append(f"{policy} checkpointing" if policy else "no checkpointing")
        if not s.get("flash_attention", True):
            tags.append("eager attention")
        seq = int(s.get("seq", 512))
        tags.append("seq <=1k" if seq <= 1024 else "seq 2k" if seq <= 2048 else "seq 4-8k")
        if seq > 8192:
            tags.append("seq >8k")
    else:
        length = s.get("input_tokens", 0) + s.get("output_tokens", 0)
        tags.append("context <=8k" if length <= 8192 else "context >8k")
    for key, label in (
        ("zero_stage", None),
        ("fsdp", "FSDP"),
        ("offload_optimizer", "CPU offload"),
        ("chunked_ce", "chunked CE"),
        ("fused_ce", "fused CE"),
        ("compile", "torch.compile"),
        ("optimizer_in_backward", "optimizer in backward"),
        ("lora_train_embeddings", "LoRA + trained embeddings"),
        ("pipeline_parallel", "layers over cards"),
    ):
        if s.get(key):
            tags.append(label or f"ZeRO-{s[key]}")
    if int(s.get("gpus", 1)) > 1:
        tags.append("multi-GPU")
    tags.append(f"measured: {row.measured}")
    return tags


def distribution(errors: list[float]) -> dict[str, float | int]:
    if not errors:
        return {"n": 0}
    absolute = sorted(abs(e) for e in errors)
    p90 = absolute[min(len(absolute) - 1, round(0.9 * (len(absolute) - 1)))]
    return {
        "n": len(errors),
        "median_abs": round(statistics.median(absolute), 4),
        "p90_abs": round(p90, 4),
        "within_10": round(sum(a <= WITHIN for a in absolute) / len(absolute), 4),
        "median_signed": round(statistics.median(errors), 4),
    }


def summarise(outcomes: list[Outcome]) -> dict[str, Any]:
    scored = [o for o in outcomes if o.error is not None]
    groups: dict[str, dict[str, list[float]]] = {
        "task": defaultdict(list),
        "family": defaultdict(list),
        "technique": defaultdict(list),
        "source": defaultdict(list),
    }
    for o in scored:
        assert o.error is not None
        groups["task"][o.row.setup["task"]].append(o.error)
        groups["family"][family(o.row.model)].append(o.error)
        groups["source"][o.row.source].append(o.error)
        for tag in techniques(o.row):
            groups["technique"][tag].append(o.error)
    ooms = [o for o in outcomes if o.row.oom]
    fitting = [o for o in outcomes if not o.row.oom and o.fits is not None]
    return {
        "rows": len(outcomes),
        "scored": len(scored),
        "refused": [
            {"id": o.row.id, "model": o.row.model, "reason": o.refused}
            for o in outcomes
            if o.refused and not o.row.oom
        ],
        "exactly_expressed": distribution(
            [o.error for o in scored if o.error is not None and not o.unexpressed]
        ),
        "overall": distribution([o.error for o in scored if o.error is not None]),
        **{
            f"by_{name}": {k: distribution(v) for k, v in sorted(group.items())}
            for name, group in groups.items()
        },
        "oom_rows": len(ooms),
        "oom_predicted_not_to_fit": sum(o.fits is False for o in ooms),
        "oom_missed": [o.row.id for o in ooms if o.fits is not False],
        "fitting_rows_predicted_not_to_fit": [o.row.id for o in fitting if o.fits is False],
        "coverage": coverage(o.row for o in outcomes),
    }


def _line(name: str, d: dict[str, Any]) -> str:
    if not d.get("n"):
        return f"  {name:<34} n=0"
    return (
        f"  {name:<34} n={d['n']:>3}  median {d['median_abs']:6.1%}  p90 {d['p90_abs']:6.1%}  "
        f"within 10% {d['within_10']:6.1%}  signed median {d['median_signed']:+7.1%}"
    )


def report(summary: dict[str, Any]) -> str:
    lines = [
        f"{summary['rows']} published figures, {summary['scored']} scored "
        f"({summary['oom_rows']} out-of-memory runs, {len(summary['refused'])} refused)",
        _line("overall", summary["overall"]),
        _line("setup fully expressed", summary["exactly_expressed"]),
    ]
    for name in ("task", "family", "technique", "source"):
        lines.append(f"by {name}:")
        lines += [_line(k, v) for k, v in summary[f"by_{name}"].items()]
    lines.append(
        f"out-of-memory runs predicted not to fit: {summary['oom_predicted_not_to_fit']}"
        f"/{summary['oom_rows']}"
        + (f" (missed: {', '.join(summary['oom_missed'])})" if summary["oom_missed"] else "")
    )
    lines.append(
        "runs that fit but are predicted not to: "
        f"{len(summary['fitting_rows_predicted_not_to_fit'])}"
    )
    cover = summary["coverage"]
    for what in ("families", "techniques"):
        lines.append(f"issue #24's {what}, published figures (out-of-memory runs) each:")
        lines += [f"  {k:<46} {v['rows']:>4} ({v['oom']})" for k, v in cover[what].items()]
        missing = cover[f"missing_{what}"]
        lines.append(f"{what} with no figure: {', '.join(missing) if missing else 'none'}")
    for refusal in summary["refused"]:
        lines.append(f"refused {refusal['id']} ({refusal['model']}): {refusal['reason']}")
    return "\n".join(lines)


CSV_COLUMNS = (
    "id", "model", "family", "measured", "measured_gb", "predicted_gb", "error", "card_gb",
    "fits", "unexpressed", "refused", "url",
)  # fmt: skip


def write(outcomes: list[Outcome], summary: dict[str, Any], results: Path = RESULTS) -> None:
    results.mkdir(parents=True, exist_ok=True)
    (results / "predictor_accuracy.json").write_text(json.dumps(summary, indent=1) + "\n")
    with (results / "predictor_accuracy_rows.csv").open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(CSV_COLUMNS)
        for o in outcomes:
            writer.writerow(
                [
                    o.row.id,
                    o.row.model,
                    family(o.row.model),
                    o.row.measured,
                    "oom" if o.row.oom else f"{o.row.value_bytes / 1e9:.2f}",  # type: ignore[operator]
                    "" if o.predicted_bytes is None else f"{o.predicted_bytes / 1e9:.2f}",
                    "" if o.error is None else f"{o.error:+.3f}",
                    "" if o.row.card_bytes is None else f"{o.row.card_bytes / 1e9:.1f}",
                    "" if o.fits is None else o.fits,
                    "; ".join(o.unexpressed),
                    o.refused or "",
                    o.row.url,
                ]
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", action="store_true", help="Print every row's outcome too.")
    parser.add_argument("--no-write", action="store_true", help="Do not write the results.")
    args = parser.parse_args(argv)
    rows, parameters = load_rows()
    outcomes = evaluate(rows, parameters)
    summary = summarise(outcomes)
    if args.rows:
        for o in outcomes:
            extra = {"error": o.error, "fits": o.fits, "unexpressed": o.unexpressed}
            print(json.dumps({**asdict(o.row), **extra, "refused": o.refused}, default=str))
    print(report(summary))
    if not args.no_write:
        write(outcomes, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
