"""Issue #14 end to end, through the gateway and a real scheduler: this machine as node
local-01 (`Stack.start(local_node=True)`: the probe in local mode, executing), every service
its own process, a real nats-server, webhooks at the reference receiver. The agent is killed
and restarted under a running task; a checkpointed task is preempted, placed again and
resumes; placements outlive their reservation timeout while their task runs, whether the
agent or a launcher (`crater_client.run_task()`) confirmed them.

Settings turned down: CRATER_PROBE_EXECUTE_POLL_SECONDS 0.1, CRATER_PROBE_KILL_GRACE_SECONDS
1, probe health and metrics every 1 s, reservation timeouts of 2 s, restart backoff 1 s,
heartbeats every 0.5 s, CRATER_SCHEDULER_CONFIRMATION_LAG_SECONDS 1 (30)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from crater.cli.stack import LOCAL_NODE, LOCAL_POOL, Stack
from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    TaskEnded,
    TaskPreempted,
    TaskStatusReported,
)
from tests.support.events import EventTap

pytestmark = pytest.mark.e2e
SERVICES = ("scheduler", "predictor", "callback", "gateway")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_cpu_checkpointed.py"
CORES = len(os.sched_getaffinity(0))  # the local node's cores: what the agent offers


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    with Stack(data_dir=tmp_path / "crater") as running:
        running.start(
            services=SERVICES,
            local_node=True,
            extra_env={
                "CRATER_PROBE_EXECUTE_POLL_SECONDS": "0.1",
                "CRATER_PROBE_KILL_GRACE_SECONDS": "1",
                "CRATER_PROBE_HEALTH_INTERVAL_SECONDS": "1",
                "CRATER_PROBE_METRICS_INTERVAL_SECONDS": "1",
                "CRATER_SCHEDULER_CHECKPOINT_ROOT": str(tmp_path / "checkpoints"),
                # an unconfirmed reservation expires 1 s after its deadline when no task
                # report is more recent (default 30 s): expiry as prompt as it gets
                "CRATER_SCHEDULER_CONFIRMATION_LAG_SECONDS": "1",
            },
        )
        yield running


@pytest.fixture
async def tap(stack: Stack) -> AsyncIterator[EventTap]:
    watching = await EventTap.start(stack.nats_url)
    yield watching
    await watching.close()


@pytest.fixture
async def gateway(stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    async with stack.gateway_client(timeout=10) as client:
        yield client


def read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def agent_dir(stack: Stack) -> Path:
    return stack.data_dir / "agent"


async def until(what: str, check: Callable[[], Any], seconds: float = 60) -> Any:
    """Poll `check` until it answers something true; fail naming `what`."""
    deadline = time.monotonic() + seconds
    while not (found := check()):
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.1)
    return found


async def submit(gateway: httpx.AsyncClient, task_id: str, **extra: Any) -> None:
    body = {
        "task_id": task_id,
        "task_type": "training",
        "model_config": {"name": "tiny-cpu-model"},
        "resource_requirements": {"cpu": {"cores": 1}, "memory": {"capacity_mb": 64}},
        "pool": LOCAL_POOL,
        **extra,
    }
    answer = await gateway.post("/api/v1/schedule", json=body)
    assert answer.status_code == 202, answer.text


async def task_status(
    gateway: httpx.AsyncClient, task_id: str, wanted: set[str], seconds: float = 60
) -> dict[str, Any]:
    deadline = time.monotonic() + seconds
    task: dict[str, Any] = {}
    while time.monotonic() < deadline:
        answer = await gateway.get(f"/api/v1/tasks/{task_id}")
        if answer.status_code == 200:
            task = answer.json()
            if task["status"] in wanted:
                return task
        await asyncio.sleep(0.1)
    raise AssertionError(f"{task_id} never reached {wanted}: {task}")


async def webhooks(stack: Stack, task_id: str) -> list[tuple[str, str | None]]:
    """(status, attempt) of every webhook the receiver got for the task, in arrival order."""
    async with httpx.AsyncClient(base_url=stack.url("receiver")) as receiver:
        found = (await receiver.get("/deliveries", params={"task_id": task_id})).json()
    return [(d["body"]["status"], d["headers"].get("crater-attempt")) for d in found["deliveries"]]


async def webhooks_until(
    stack: Stack, task_id: str, last: tuple[str, str], seconds: float = 30
) -> list[tuple[str, str | None]]:
    deadline = time.monotonic() + seconds
    while last not in (seen := await webhooks(stack, task_id)):
        assert time.monotonic() < deadline, f"no {last} webhook for {task_id}: {seen}"
        await asyncio.sleep(0.2)
    return seen


def waiting_task(marker: Path, go: Path, code: int) -> list[str]:
    """A task that records each start, waits for the test's go, records its exit, exits."""
    script = (
        "import os, sys, time\n"
        f"open({str(marker)!r}, 'a').write(f'started {{os.getpid()}}\\n')\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.05)\n"
        f"open({str(marker)!r}, 'a').write('exiting\\n')\n"
        f"sys.exit({code})\n"
    )
    return [sys.executable, "-c", script]


async def test_a_killed_agent_restarted_reports_each_end_once_and_starts_nothing_twice(
    stack: Stack, tap: EventTap, gateway: httpx.AsyncClient, tmp_path: Path
) -> None:
    # `during` exits after the agent is back; `down` exits while the agent is dead
    markers = {name: tmp_path / f"{name}.marks" for name in ("during", "down")}
    gos = {name: tmp_path / f"{name}.go" for name in markers}
    for name in markers:
        await submit(gateway, name, command=waiting_task(markers[name], gos[name], 3))
    for name in markers:
        await task_status(gateway, name, {"running"})
        await until(f"{name} started", lambda n=name: markers[n].exists())
    grants = {g.task_id: g for g in tap.of(AllocationGranted)}

    stack.kill("agent")  # SIGKILL: no goodbye; the supervisors live on
    gos["down"].touch()
    exited = agent_dir(stack) / "runs" / grants["down"].allocation_id / "exit.json"
    await until("down's exit recorded by its supervisor", exited.exists)
    assert json.loads(exited.read_text())  # recorded while nobody watched
    assert not tap.of(TaskEnded)  # nobody reported it yet
    await asyncio.to_thread(stack.restart, "agent")  # back once healthy
    assert "exiting" not in markers["during"].read_text()  # still running across the restart
    gos["during"].touch()

    for name in markers:
        ended = await task_status(gateway, name, {"succeeded", "failed", "cancelled"})
        assert ended["status"] == "failed", ended
        assert "exit code 3" in ended["reason"], ended
        await tap.wait_for(TaskEnded, lambda e, n=name: e.task_id == n)
        await webhooks_until(stack, name, ("failed", "1"))
        # started once: one start, one attempt, one log
        assert markers[name].read_text().count("started") == 1, markers[name].read_text()
        logs = sorted(p.name for p in (agent_dir(stack) / "logs" / "tasks").glob(f"{name}-*"))
        assert logs == [f"{name}-1.log"], logs
        assert "[crater] exit code 3" in (agent_dir(stack) / "logs" / "tasks" / logs[0]).read_text()
    for name in markers:
        # the agent reported the end once (a retried publish keeps its event id)
        reports = tap.of(
            TaskStatusReported,
            lambda e, a=grants[name].allocation_id: (
                e.allocation_id == a and e.status.value in {"succeeded", "failed"}
            ),
        )
        assert len({r.event_id for r in reports}) == 1, reports
        ends = tap.of(TaskEnded, lambda e, n=name: e.task_id == n)
        assert len(ends) == 1, ends
        terminal = [w for w in await webhooks(stack, name) if w[0] in {"succeeded", "failed"}]
        assert terminal == [("failed", "1")], await webhooks(stack, name)
    assert len(tap.of(AllocationGranted)) == 2  # neither was placed again
    assert not [m.subject for m in tap.repeats if m.subject == "crater.v1.allocation.granted"]


async def test_preempted_task_checkpoints_is_placed_again_and_resumes(
    stack: Stack, tap: EventTap, gateway: httpx.AsyncClient
) -> None:
    everything = {"cpu": {"cores": CORES}, "memory": {"capacity_mb": 256}}
    # ~10 s of training when left alone; a checkpoint every 50 steps and on SIGTERM
    command = [sys.executable, str(EXAMPLE), "--steps", "2000", "--every", "50"]
    await submit(
        gateway,
        "low",
        command=command,
        resource_requirements=everything,
        priority="low",
        preemptible=True,
        restart_policy={"when": ["preemption"], "max_attempts": 3, "backoff_seconds": 1},
    )
    logs = agent_dir(stack) / "logs" / "tasks"
    first = logs / "low-1.log"
    await until(
        "low trained 100 steps", lambda: first.exists() and "step 100 " in first.read_text()
    )

    await submit(
        gateway,
        "high",
        command=[sys.executable, "-c", "print('the urgent one ran')"],
        resource_requirements=everything,
        priority="high",
    )
    [preempted] = await tap.wait_for(TaskPreempted, lambda e: e.task_id == "low", timeout=30)
    assert preempted.preempted_by == "high"
    high = await task_status(gateway, "high", {"succeeded", "failed", "cancelled"})
    assert high["status"] == "succeeded", high
    done = await task_status(gateway, "low", {"succeeded", "failed", "cancelled"}, seconds=90)
    assert done["status"] == "succeeded", done

    text = first.read_text()
    saved = re.search(r"preempted: checkpoint saved at step (\d+)", text)
    assert saved, text  # within its grace period, on SIGTERM
    assert "[crater] exit code 0" in text, text  # it left on its own, not by SIGKILL
    second = (logs / "low-2.log").read_text()
    assert f"resuming from step {saved.group(1)} " in second, second
    assert "starting fresh" not in second
    steps = [int(s) for s in re.findall(r"^step (\d+) ", second, re.M)]
    assert steps, second
    assert steps[0] > int(saved.group(1)), second  # the count continues
    assert "done: 2000 steps" in second
    assert crater_logs(stack, "low", "2") == second  # what a person reads on the node

    [grant1, grant2] = tap.of(AllocationGranted, lambda e: e.task_id == "low")
    assert grant1.node == grant2.node == LOCAL_NODE
    high_grant = tap.of(AllocationGranted, lambda e: e.task_id == "high")[0]
    assert set(high_grant.cpu_cores) & set(grant1.cpu_cores)  # it needed the same cores
    seen = await webhooks_until(stack, "low", ("succeeded", "2"))
    # attempt 1 is preempted; attempt 2 waits out the backoff, is placed and ends
    assert seen == [
        ("scheduled", "1"),
        ("running", "1"),
        ("preempted", "1"),
        ("pending", "2"),
        ("scheduled", "2"),
        ("running", "2"),
        ("succeeded", "2"),
    ], seen
    ends = tap.of(TaskEnded, lambda e: e.task_id == "low")
    assert [(e.status.value, e.attempt) for e in ends] == [("succeeded", 2)], ends


def crater_logs(stack: Stack, task_id: str, attempt: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "crater.cli", "logs", task_id, "--attempt", attempt],
        env={**os.environ, "CRATER_PROBE_STATE_DIR": str(agent_dir(stack))},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


LAUNCHED = """
import sys, time
import crater_client

with crater_client.run_task(heartbeat_seconds=0.5) as task:
    print("confirmed", task.task_id, flush=True)
    time.sleep(float(sys.argv[1]))  # the work: longer than the reservation timeout
print("heartbeats", task.heartbeats, "lost", task.lost, flush=True)
"""


async def test_no_placement_expires_while_its_task_runs(
    stack: Stack, tap: EventTap, gateway: httpx.AsyncClient
) -> None:
    # the agent runs it and confirms it: 6 s of work on a 2 s reservation
    await submit(
        gateway,
        "long-command",
        command=[sys.executable, "-c", "import time; time.sleep(6)"],
        reservation_timeout_ms=2000,
    )
    # AllData's launcher runs it: no command, so the agent leaves it alone
    await submit(gateway, "long-launched", reservation_timeout_ms=2000)
    # the same placement that nobody confirms does expire (once a core is free): the 2 s
    # are in force
    await submit(gateway, "never-launched", reservation_timeout_ms=2000)
    placed = await task_status(gateway, "long-launched", {"scheduled", "running"})
    [allocation] = placed["allocations"]
    environment = allocation["environment"]
    assert environment["CRATER_RESERVATION_TOKEN"] == allocation["reservation_token"]
    launcher_env = {k: v for k, v in os.environ.items() if not k.startswith("CRATER_")}
    launched = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        LAUNCHED,
        "6",
        env={**launcher_env, **environment},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(launched.communicate(), 60)
    out = output.decode()
    assert launched.returncode == 0, out
    assert "confirmed long-launched" in out, out
    assert "lost None" in out, out  # no heartbeat was refused: the allocation was held

    for task_id in ("long-command", "long-launched"):
        ended = await task_status(gateway, task_id, {"succeeded", "failed", "cancelled"})
        assert ended["status"] == "succeeded", ended
        seen = await webhooks_until(stack, task_id, ("succeeded", "1"))
        assert "expired" not in str(seen), seen
    launched_end = await tap.wait_for(TaskEnded, lambda e: e.task_id == "long-launched")
    assert "launcher reported" in launched_end[0].reason
    for task_id in ("long-command", "long-launched"):  # each ran past its deadline
        [grant] = tap.of(AllocationGranted, lambda e, t=task_id: e.task_id == t)
        [end] = tap.of(TaskEnded, lambda e, t=task_id: e.task_id == t)
        assert end.occurred_at - grant.reservation_expires_at > timedelta(seconds=2), end
    await tap.wait_for(AllocationReleased, lambda e: e.task_id == "never-launched", timeout=30)
    expired = tap.of(AllocationReleased, lambda e: e.reason.value == "expired")
    assert [e.task_id for e in expired] == ["never-launched"], expired
    assert len(tap.of(AllocationGranted)) == 3  # each placed once
    assert not list((agent_dir(stack) / "logs" / "tasks").glob("long-launched*"))
