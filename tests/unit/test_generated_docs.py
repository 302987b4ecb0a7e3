"""Generated documents in docs/ must match what the contracts generate now."""

from __future__ import annotations

from pathlib import Path

from crater.cli.docs import stale

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_generated_docs_are_current() -> None:
    assert stale(DOCS) == [], "docs/ is stale: run `make docs` (crater docs) and commit"
