"""The reference set of published GPU-memory figures, and the predictor over it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.predictor.accuracy import (
    REFERENCE,
    UNITS,
    evaluate,
    family,
    load_rows,
    report,
    summarise,
)

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def outcomes():  # type: ignore[no-untyped-def]
    rows, parameters = load_rows()
    return evaluate(rows, parameters)


def test_every_row_has_a_source_and_a_measured_figure() -> None:
    import yaml

    data = yaml.safe_load(REFERENCE.read_text())
    rows, parameters = load_rows()
    assert len(rows) >= 100
    for source in data["sources"]:
        if "by_us" in source:
            # measured by this project where nothing was published: the script in this
            # repository and its output, each row's figure in it
            assert (ROOT / source["url"]).is_file(), source["id"]
            runs = json.loads((ROOT / source["by_us"]).read_text())["runs"]
            figures = {round(run["allocated_bytes"] / 1e9, 3) for run in runs}
            assert {row["value"] for row in source["rows"]} <= figures, source["id"]
        else:
            assert source["url"].startswith("https://"), source["id"]
        assert source["title"]
        assert source["unit"] in UNITS
        assert source["measured"] in (
            "allocated",
            "reserved",
            "resident",
            "device",
            "unstated",
            "capacity",
        )
    for row in rows:
        assert row.model in parameters, row.id
        assert row.setup["task"] in ("training", "fine-tuning", "inference"), row.id
        assert row.oom or row.value_bytes > 0  # type: ignore[operator]
    assert sum(row.oom for row in rows) >= 10  # published out-of-memory runs
    assert {family(row.model) for row in rows} >= {
        "llama-2", "llama-3", "llama-3.1", "llama-3.3", "qwen-1", "qwen2", "qwen2.5", "qwen3",
        "qwen3-moe", "mistral", "gemma", "phi", "chatglm", "yi", "baichuan", "deepseek", "t5",
        "bert",
    }  # fmt: skip


def test_the_coverage_of_issue_24s_families_and_techniques_is_reported(outcomes) -> None:  # type: ignore[no-untyped-def]
    from benchmarks.predictor.accuracy import ISSUE_FAMILIES, ISSUE_TECHNIQUES

    summary = summarise(outcomes)
    cover = summary["coverage"]
    assert set(cover["families"]) == set(ISSUE_FAMILIES)
    assert set(cover["techniques"]) == set(ISSUE_TECHNIQUES)
    for what in ("families", "techniques"):
        missing = {k for k, v in cover[what].items() if v["rows"] == 0}
        assert set(cover[f"missing_{what}"]) == missing
    assert "families with no figure: " in report(summary)


def test_every_row_is_predicted_and_reported(outcomes) -> None:  # type: ignore[no-untyped-def]
    summary = summarise(outcomes)
    assert summary["rows"] == len(outcomes)
    assert summary["scored"] + summary["oom_rows"] + len(summary["refused"]) == len(outcomes)
    text = report(summary)
    assert "out-of-memory runs predicted not to fit" in text
    print(text)  # the distribution, with -s


def test_the_predictor_meets_issue_24s_bar_on_the_reference_set(outcomes) -> None:  # type: ignore[no-untyped-def]
    """Median absolute error at most 10%, at least 60% of the figures within 10%, and the
    published out-of-memory runs predicted not to fit, every one (LitGPT's FSDP runs, which
    keep the whole model on each GPU, with `full_model_per_rank`)."""
    summary = summarise(outcomes)
    assert summary["overall"]["median_abs"] <= 0.10
    assert summary["overall"]["within_10"] >= 0.60
    assert summary["oom_predicted_not_to_fit"] == summary["oom_rows"]  # every one
    # 2 before the Unsloth offloaded-checkpointing capacity rows; with them 9: the predictor
    # over-predicts Unsloth on cards up to 24 GB and the 70B on 48 GB by 2-27% (its fused
    # kernels keep less per recomputed layer than Korthikanti's count; a fused loss is
    # modelled as a 1,024-token fp32 chunk), so 7 of its 11 longest-fitting runs read as not
    # fitting. A known over-prediction, kept visible rather than tuned away. With DeepSeek
    # LLM's 7B inference table 10: its batch 8 x 2048 run (eager attention, every prompt
    # token's logits) is predicted 7% over its figure, past its 40 GB card.
    assert len(summary["fitting_rows_predicted_not_to_fit"]) <= 10
    for task in ("training", "fine-tuning", "inference"):
        assert summary["by_task"][task]["median_abs"] <= 0.12


def test_the_predicted_range_covers_most_published_runs(outcomes) -> None:  # type: ignore[no-untyped-def]
    from crater.contracts import TaskRequest
    from crater.predictor.domain.estimate import predict

    covered: dict[str, list[bool]] = {"inference": [], "training": []}
    for o in outcomes:
        if o.error is None or o.row.measured in ("resident", "capacity"):
            continue
        p = predict(TaskRequest.model_validate(o.request))
        scale = o.predicted_bytes / (p.gpu_memory_per_gpu_mb * 2**20)  # on the figure's terms
        low, high = p.gpu_memory_low_mb * 2**20 * scale, p.gpu_memory_high_mb * 2**20 * scale
        kind = "inference" if o.row.setup["task"] == "inference" else "training"
        covered[kind].append(low <= o.row.value_bytes <= high)
    for kind, hits in covered.items():
        assert sum(hits) / len(hits) >= 0.75, kind
