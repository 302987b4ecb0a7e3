"""crater_client's checkpoint helpers and the allocation config file an agent writes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import crater_client
from crater_client import AllocationError


def test_resume_from_names_the_latest_checkpoint(tmp_path: Path) -> None:
    env = {"CRATER_CHECKPOINT_PATH": str(tmp_path / "ck")}
    assert crater_client.resume_from(env) is None  # a first start
    for step in (50, 150, 100):
        crater_client.checkpoint_file(step, ".npz", env).write_bytes(b"x")
    (tmp_path / "ck" / ".checkpoint-000000200.npz.part.npz").write_bytes(b"torn")
    latest = crater_client.resume_from(env)
    assert latest is not None
    assert crater_client.checkpoint_step(latest) == 150
    with pytest.raises(AllocationError, match="CRATER_CHECKPOINT_PATH"):
        crater_client.resume_from({})


def test_the_allocation_config_file_stands_in_for_absent_variables(tmp_path: Path) -> None:
    path = tmp_path / "allocation.json"
    path.write_text(
        json.dumps(
            {
                "CRATER_GPU_IDS": "",
                "CRATER_CPU_CORE_IDS": "0",
                "CRATER_CPU_CORES": "1",
                "CRATER_MEMORY_MB": "512",
            }
        )
    )
    cfg = crater_client.get_allocation_config({"CRATER_ALLOCATION_CONFIG": str(path)})
    assert cfg["cpu_cores"] == [0]
    assert cfg["memory_mb"] == 512
    path.write_text("[1]")
    with pytest.raises(AllocationError, match="CRATER_ALLOCATION_CONFIG"):
        crater_client.get_allocation_config({"CRATER_ALLOCATION_CONFIG": str(path)})


def test_on_preempt_saves_then_exits_cleanly_on_sigterm(tmp_path: Path) -> None:
    code = (
        "import time, crater_client\n"
        "crater_client.on_preempt(lambda: print('saved', flush=True))\n"
        "print('ready', flush=True)\n"
        "time.sleep(30)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    os.kill(child.pid, signal.SIGTERM)
    out, _ = child.communicate(timeout=10)
    assert out.strip() == "saved"
    assert child.returncode == 0
