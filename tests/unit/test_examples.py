"""The files under examples/ are what people copy: each must still be accepted as is."""

from __future__ import annotations

from pathlib import Path

import pytest

from crater.contracts import TaskRequest
from crater.scheduler.adapters.pools_file import load_pools

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.json")), ids=lambda p: p.name)
def test_example_task_is_a_valid_request(path: Path) -> None:
    request = TaskRequest.model_validate_json(path.read_text())
    assert request.task_id


def test_example_pools_file_loads() -> None:
    pools = load_pools(EXAMPLES / "pools.yaml")
    assert pools["inference"].overcommit.cpu == 2.0
    assert "training" in pools
    retry = pools["training"].restart
    assert (retry.when, retry.max_attempts) == (["failure", "node-lost"], 3)
    assert [retry.backoff_before(n) for n in (2, 3)] == [30, 60]
    assert pools["inference"].restart.when == []  # never, unless a task asks
