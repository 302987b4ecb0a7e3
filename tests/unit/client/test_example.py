"""examples/train_with_crater_client.py runs as a placed task would, with a real environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from crater.contracts import TaskUsageReported
from tests.unit.client.test_monitoring import Receiver

SCRIPT = Path(__file__).resolve().parents[3] / "examples" / "train_with_crater_client.py"


def test_the_example_trains_checkpoints_and_reports_its_use(tmp_path: Path) -> None:
    core = sorted(os.sched_getaffinity(0))[0]
    gateway = Receiver()
    env = {
        **os.environ,
        "CRATER_TASK_ID": "demo-1",
        "CRATER_ALLOCATION_ID": "alloc-demo",
        "CRATER_GPU_IDS": "",
        "CRATER_CPU_CORES": "1",
        "CRATER_CPU_CORE_IDS": str(core),
        "CRATER_MEMORY_MB": "2048",
        "CRATER_DATALOADER_NUM_WORKERS": "2",
        "CRATER_DATALOADER_PREFETCH_FACTOR": "2",
        "CRATER_CHECKPOINT_PATH": str(tmp_path / "ckpt"),
        "CRATER_GATEWAY_URL": gateway.url,
    }
    try:
        for run in range(2):  # the second resumes from the first's checkpoint
            done = subprocess.run(
                [sys.executable, str(SCRIPT), "--seconds", "3", "--monitor-interval", "1"],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert done.returncode == 0, done.stderr
            assert ("resumed at step" in done.stdout) == (run == 1)
    finally:
        gateway.shutdown()
    state = json.loads((tmp_path / "ckpt" / "model.json").read_text())
    assert state["step"] > 0
    assert abs(state["w"] - 3.0) < 0.1  # it did learn the line
    assert abs(state["b"] + 1.0) < 0.1
    samples = [TaskUsageReported.model_validate(body) for _, body in gateway.bodies]
    assert len(samples) >= 2
    assert {s.task_id for s in samples} == {"demo-1"}
    assert all(s.host_memory_used_mb for s in samples)  # the workers' memory is counted too
