"""What `crater up` prints of a decision reads as a sentence: never `None`, core lists as
ranges (issue #23)."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from rich.console import Console

from crater.cli import demo
from crater.contracts import AllocationGranted, utc_now


def test_core_ranges() -> None:
    assert demo.core_ranges([0, 1, 2, 3]) == "0-3"
    assert demo.core_ranges([5]) == "5"
    assert demo.core_ranges([64, 65, 0, 1, 7]) == "0-1, 7, 64-65"
    assert demo.core_ranges([]) == "none"


def placed(**fields: object) -> AllocationGranted:
    base: dict[str, object] = {
        "allocation_id": "a1",
        "task_id": "tune-0066",
        "node": "a100-03",
        "pool": "training",
        "tenant": "ads",
        "gpu_ids": list(range(8)),
        "gpu_memory_mb": 81920,
        "cpu_cores": [*range(0, 32), *range(64, 96)],
        "numa_node": None,  # the grant spans both NUMA nodes
        "memory_mb": 1024,
        "checkpoint_path": None,
        "reservation_token": "token",
        "reservation_expires_at": utc_now() + timedelta(seconds=30),
        "score": 0.5,
        "explanation": "a100-03: score 0.500 (strongest: GpuBinPack); across NUMA 0 and 1",
        "environment": {},
    }
    return AllocationGranted.model_validate({**base, **fields})


def test_a_placement_line_names_its_cores_as_ranges_and_never_says_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = io.StringIO()
    monkeypatch.setattr(demo, "console", Console(file=out, width=400, highlight=False))
    watcher = demo.Watcher()
    watcher.show(placed())
    watcher.show(placed(task_id="client-0001", node="local-01", gpu_ids=[], cpu_cores=[1]))
    first, second = out.getvalue().splitlines()
    assert "tune-0066 placed on a100-03 GPUs [0, 1, 2, 3, 4, 5, 6, 7], cores 0-31, 64-95: " in first
    assert "client-0001 placed on local-01, no GPU, cores 1: " in second
    assert "None" not in out.getvalue()
