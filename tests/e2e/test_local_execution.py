"""Crater runs the task: every service as its own process, the local probe as the node with
execution switched on, commands submitted through the gateway. Settings turned down:
CRATER_PROBE_EXECUTE_POLL_SECONDS 0.1, CRATER_PROBE_KILL_GRACE_SECONDS 1, heartbeats 1 s, the
scheduler's reconciliation against the agent's inventory every 1 s with a 3 s grace."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from crater.cli.stack import Stack

pytestmark = pytest.mark.e2e
SERVICES = ("scheduler", "predictor", "probe", "gateway")


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    with Stack(data_dir=tmp_path / "crater") as running:
        running.start(
            services=SERVICES,
            extra_env={
                "CRATER_PROBE_MODE": "local",
                "CRATER_PROBE_EXECUTE": "true",
                "CRATER_PROBE_NODE_ID": "local-node",
                "CRATER_PROBE_STATE_DIR": str(tmp_path / "agent"),
                "CRATER_PROBE_EXECUTE_POLL_SECONDS": "0.1",
                "CRATER_PROBE_KILL_GRACE_SECONDS": "1",
                "CRATER_PROBE_HEALTH_INTERVAL_SECONDS": "1",
                "CRATER_PROBE_METRICS_INTERVAL_SECONDS": "1",
                "CRATER_SCHEDULER_CHECKPOINT_ROOT": str(tmp_path / "checkpoints"),
                "CRATER_SCHEDULER_RECONCILE_INTERVAL_SECONDS": "1",
                "CRATER_SCHEDULER_RECONCILE_GRACE_SECONDS": "3",
            },
        )
        yield running


def submit(stack: Stack, task_id: str, command: list[str], **extra: Any) -> None:
    body = {
        "task_id": task_id,
        "task_type": "evaluation",
        "model_config": {"name": "tiny-cpu-model"},
        "resource_requirements": {"cpu": {"cores": 1}, "memory": {"capacity_mb": 64}},
        "command": command,
        **extra,
    }
    answer = httpx.post(
        f"{stack.url('gateway')}/api/v1/schedule", json=body, headers=stack.auth_headers, timeout=10
    )
    assert answer.status_code == 202, answer.text


def wait_status(
    stack: Stack, task_id: str, wanted: set[str], seconds: float = 60
) -> dict[str, Any]:
    deadline = time.monotonic() + seconds
    task: dict[str, Any] = {}
    while time.monotonic() < deadline:
        answer = httpx.get(
            f"{stack.url('gateway')}/api/v1/tasks/{task_id}", headers=stack.auth_headers, timeout=5
        )
        if answer.status_code == 200:
            task = answer.json()
            if task["status"] in wanted:
                return task
        time.sleep(0.2)
    raise AssertionError(f"{task_id} never reached {wanted}: {task}")


def test_commands_run_pinned_and_their_exit_codes_become_the_outcome(
    stack: Stack, tmp_path: Path
) -> None:
    seen = tmp_path / "seen.txt"
    probe = (
        "import os; s = dict(l.split(':', 1) for l in open('/proc/self/status') if ':' in l); "
        f"open({str(seen)!r}, 'w').write(s['Cpus_allowed_list'].strip() + ' ' + "
        "os.environ['CRATER_CPU_CORE_IDS'] + ' ' + os.environ['HELLO'])"
    )
    submit(stack, "pinned", [sys.executable, "-c", probe], env={"HELLO": "world"})
    submit(stack, "exit-3", [sys.executable, "-c", "raise SystemExit(3)"])
    done = wait_status(stack, "pinned", {"succeeded", "failed", "cancelled"})
    assert done["status"] == "succeeded", done
    cpus, granted, hello = seen.read_text().split()
    assert cpus == granted
    assert hello == "world"
    failed = wait_status(stack, "exit-3", {"succeeded", "failed", "cancelled"})
    assert failed["status"] == "failed"
    assert "exit code 3" in str(failed)


def test_cancel_kills_a_task_that_ignores_sigterm(stack: Stack, tmp_path: Path) -> None:
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('up', flush=True); time.sleep(120)"
    )
    submit(stack, "stubborn", [sys.executable, "-c", code])
    wait_status(stack, "stubborn", {"running"})
    answer = httpx.post(
        f"{stack.url('gateway')}/api/v1/tasks/stubborn/cancel",
        headers=stack.auth_headers,
        timeout=5,
    )
    assert answer.status_code == 202
    wait_status(stack, "stubborn", {"cancelled"})
    log = tmp_path / "agent" / "logs" / "tasks" / "stubborn-1.log"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and "[crater]" not in log.read_text():
        time.sleep(0.2)
    assert "killed by SIGKILL" in log.read_text()
    assert os.path.exists(log)


def test_a_task_the_agent_runs_is_never_reconciled_away(stack: Stack) -> None:
    """The agent lists the task in every heartbeat while it runs for several graces; it ends
    as its exit code says, and the scheduler found no drift at all."""
    submit(stack, "steady", [sys.executable, "-c", "import time; time.sleep(12)"])
    wait_status(stack, "steady", {"running"})
    done = wait_status(stack, "steady", {"succeeded", "failed", "cancelled"})
    assert done["status"] == "succeeded", done
    metrics = httpx.get(f"{stack.url('scheduler')}/metrics", timeout=5).text
    drift = [
        line
        for line in metrics.splitlines()
        if line.startswith("crater_scheduler_drift_total{") and not line.endswith(" 0.0")
    ]
    assert drift == []
    assert "# TYPE crater_scheduler_drift_total counter" in metrics  # the family is served


def test_a_task_its_agent_forgot_is_released_as_orphaned(stack: Stack, tmp_path: Path) -> None:
    """The agent loses what it knew of a running task (killed, its run directory gone, as on
    a reimaged disk) and comes back: its heartbeats no longer list the task, and the scheduler,
    which would otherwise hold its core until restarted, releases it and ends the task."""
    submit(stack, "forgotten", [sys.executable, "-c", "import time; time.sleep(300)"])
    wait_status(stack, "forgotten", {"running"})
    [run_dir] = (tmp_path / "agent" / "runs").iterdir()
    stack.kill("probe")
    child = json.loads((run_dir / "supervisor.json").read_text())
    os.killpg(child["pid"], signal.SIGKILL)  # the task dies with what the agent knew of it
    deadline = time.monotonic() + 20
    while not (run_dir / "exit.json").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    shutil.rmtree(run_dir)
    stack.restart("probe")
    ended = wait_status(stack, "forgotten", {"succeeded", "failed", "cancelled"})
    assert ended["status"] == "failed", ended
    assert "orphaned allocation" in json.dumps(ended), ended
    metrics = httpx.get(f"{stack.url('scheduler')}/metrics", timeout=5).text
    assert (
        'crater_scheduler_drift_total{action="released",kind="orphaned-allocation"} 1.0' in metrics
    )
