"""`crater up` as a person runs it: beside the simulated fleet, this machine is node local-01,
where AllData's kind of training script (examples/train_with_crater_client.py) runs for real,
reads its allocation, binds to it, and its monitoring samples reach the predictor."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support.parallel import HEAVY_STACK

pytestmark = [pytest.mark.e2e, HEAVY_STACK]


def samples_taken(metrics: str) -> float:
    found = re.findall(r'^crater_predictor_usage_samples_total\{gpus="no"\} (\S+)$', metrics, re.M)
    return float(found[0]) if found else 0.0


def test_the_demo_runs_the_example_script_on_this_machine(tmp_path: Path) -> None:
    demo = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "crater.cli",
            "up",
            "--duration",
            "180",
            "--rate",
            "0.2",
            "--data-dir",
            str(tmp_path / "demo"),
        ],
        env={**os.environ, "COLUMNS": "250"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert demo.stdout is not None
    lines: list[str] = []
    taken = 0.0
    try:
        predictor = None
        # The demo is stopped by Ctrl-C once the client has succeeded, so its duration only
        # bounds a slow start on a loaded machine.
        deadline = time.monotonic() + 240
        for line in demo.stdout:
            lines.append(line)
            if m := re.search(r"predictor\s+(http://127\.0\.0\.1:\d+)/healthz", line):
                predictor = m.group(1)
            measured = "client-0001 measured itself" in line or "client-0001 succeeded" in line
            if measured and predictor and not taken:
                # the sample reached the bus; the predictor counts it once taken in
                for _ in range(50):
                    taken = samples_taken(httpx.get(f"{predictor}/metrics").text)
                    if taken:
                        break
                    time.sleep(0.2)
            if taken and "client-0001 succeeded" in line:
                # All this test asks is seen: Ctrl-C, as a person would, instead of the
                # rest of the demo (it must still stop cleanly, exit 0).
                demo.send_signal(signal.SIGINT)
            assert time.monotonic() < deadline, "".join(lines[-40:])
        assert demo.wait(60) == 0, "".join(lines[-40:])
    finally:
        if demo.poll() is None:
            demo.kill()
    out = "".join(lines)
    assert re.search(r"client-0001 placed on local-01, no GPU, cores \d+: ", out), out[-4000:]
    assert "client-0001 running" in out
    assert "client-0001 succeeded" in out
    assert taken >= 1, out[-4000:]
    log = next((tmp_path / "demo" / "agent" / "logs" / "tasks").glob("client-0001*.log"))
    text = log.read_text()
    assert re.search(r"allocation \{.*\"cpu_cores\": \[\d+\]", text), text  # read it
    assert "bound to cores [" in text  # bound to it
    assert re.search(r"usage samples posted [1-9]\d*, failed 0", text), text
    assert "[crater] exit code 0" in text
