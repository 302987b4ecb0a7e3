"""What `crater up` prints of a decision, and what `crater probe` prints of this machine, read
as sentences: never `None`, core lists as ranges (issue #23)."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from rich.console import Console
from typer.testing import CliRunner

from crater.cli import demo, hardware
from crater.cli.main import app
from crater.contracts import AllocationGranted, utc_now
from tests.support.topologies import node


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


def test_probe_says_what_it_does_not_know_in_words(monkeypatch: pytest.MonkeyPatch) -> None:
    topology = node("vm", gpus=1)
    topology.disks[0] = topology.disks[0].model_copy(
        update={"numa_node": None, "pci_root": None, "model": None}
    )
    topology.gpus[0] = topology.gpus[0].model_copy(update={"numa_node": None})
    monkeypatch.setattr(hardware, "discover_local", lambda: topology)
    result = CliRunner().invoke(app, ["probe"])
    assert result.exit_code == 0, result.output
    assert "None" not in result.output
    assert "disk nvme0n1: NVMe 3800 GB, NUMA node unknown, under no PCIe root found, at " in (
        result.output
    )
    assert "GPU 0: NVIDIA A100-SXM4-80GB 81920 MiB, NUMA node unknown" in result.output


def test_piped_lines_are_never_wrapped(monkeypatch: pytest.MonkeyPatch) -> None:
    """In a pipe a long line stays one line (docs/cli.md), whatever the console's width."""
    flags = tuple(f"avx512_flag{n}" for n in range(40))
    monkeypatch.setattr(hardware, "discover_local", lambda: node("vm", flags=flags))
    result = CliRunner().invoke(app, ["probe"])
    [cpu] = [line for line in result.output.splitlines() if line.startswith("CPU ")]
    assert cpu.endswith("avx512_flag39"), cpu  # all on the one line
    assert len(cpu) > 400
