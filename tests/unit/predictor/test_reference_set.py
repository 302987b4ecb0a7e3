"""The reference set of published GPU-memory figures, and the predictor over it."""

from __future__ import annotations

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
        "llama-2", "llama-3.x", "qwen-1", "qwen2.5", "qwen3", "qwen3-moe", "mistral", "gemma",
        "phi", "chatglm", "yi", "baichuan", "t5", "bert",
    }  # fmt: skip


def test_every_row_is_predicted_and_reported(outcomes) -> None:  # type: ignore[no-untyped-def]
    summary = summarise(outcomes)
    assert summary["rows"] == len(outcomes)
    assert summary["scored"] + summary["oom_rows"] + len(summary["refused"]) == len(outcomes)
    text = report(summary)
    assert "out-of-memory runs predicted not to fit" in text
    print(text)  # the distribution, with -s
