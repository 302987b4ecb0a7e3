"""The executing node agent with real processes: what it starts, how it stops them, what it
reports, and what survives its own restart. The bus is left out (the reports are collected
as published); tests/e2e/test_local_execution.py runs the same through every service."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path
from typing import Any
from uuid import uuid4

from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    Event,
    ReleaseReason,
    ResourcePrediction,
    TaskPreempted,
    TaskProfiled,
    TaskRequest,
    TaskStatusReported,
    utc_now,
)
from crater.probe.executor import TaskExecutor, find_logs
from crater.probe.reports import GrantOutcome

NODE = "node-a"
CORE = min(os.sched_getaffinity(0))
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "train_cpu_checkpointed.py"


class Reports:
    def __init__(self) -> None:
        self.events: list[TaskStatusReported] = []

    async def __call__(self, event: Event) -> None:
        assert isinstance(event, TaskStatusReported)
        self.events.append(event)

    def of(self, allocation: str) -> list[tuple[str, str]]:
        return [
            (e.status.value, e.message or "") for e in self.events if e.allocation_id == allocation
        ]


def profile(task_id: str, **body: Any) -> TaskProfiled:
    task = TaskRequest.model_validate(
        {"task_id": task_id, "task_type": "training", "model_config": {"name": "m"}, **body}
    )
    prediction = ResourcePrediction(
        gpu_memory_per_gpu_mb=0,
        host_memory_mb=0,
        confidence="low",
        method="test",
        dataloader_num_workers=0,
        dataloader_prefetch_factor=2,
    )
    return TaskProfiled(task=task, prediction=prediction)


def grant(task_id: str, checkpoints: Path, attempt: int = 1) -> AllocationGranted:
    allocation = f"{task_id}-a{attempt}-{uuid4().hex[:6]}"
    environment = {
        "CRATER_TASK_ID": task_id,
        "CRATER_ALLOCATION_ID": allocation,
        "CRATER_ATTEMPT": str(attempt),
        "CRATER_GPU_IDS": "",
        "CRATER_CPU_CORES": "1",
        "CRATER_CPU_CORE_IDS": str(CORE),
        "CRATER_MEMORY_MB": "256",
        "CRATER_CHECKPOINT_PATH": str(checkpoints / task_id),
    }
    return AllocationGranted(
        allocation_id=allocation,
        task_id=task_id,
        node=NODE,
        pool="default",
        tenant="default",
        gpu_ids=[],
        gpu_memory_mb=0,
        cpu_cores=[CORE],
        numa_node=None,
        memory_mb=256,
        checkpoint_path=str(checkpoints / task_id),
        reservation_token="v1.test",
        reservation_expires_at=utc_now() + timedelta(seconds=30),
        score=1.0,
        explanation="test",
        environment=environment,
        attempt=attempt,
    )


def script(tmp_path: Path, name: str, body: str) -> list[str]:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return [sys.executable, str(path)]


def executor(tmp_path: Path, reports: Reports, grace: float = 0.5) -> TaskExecutor:
    return TaskExecutor(
        NODE,
        reports,
        state_dir=tmp_path / "state",
        kill_grace_seconds=grace,
        poll_seconds=0.05,
        cgroup_root=tmp_path / "no-cgroup",
    )


async def until(check: Any, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("timed out")


async def test_a_command_runs_pinned_with_its_environment_and_exit_codes_map(
    tmp_path: Path,
) -> None:
    reports = Reports()
    agent = executor(tmp_path, reports)
    await agent.start()
    out = tmp_path / "seen.json"
    agent.profiled(
        profile(
            "ok-1",
            command=script(
                tmp_path,
                "ok",
                f"""
        import json, os, crater_client
        status = dict(l.split(":", 1) for l in open("/proc/self/status") if ":" in l)
        json.dump({{
            "cpus": status["Cpus_allowed_list"].strip(),
            "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "task": os.environ["CRATER_TASK_ID"],
            "mine": os.environ["MINE"],
            "leaked": [k for k in os.environ if k.startswith("CRATER_PROBE")],
            "cwd": os.getcwd(),
            "config": crater_client.get_allocation_config(),
            "checkpoint_dir": os.path.isdir(os.environ["CRATER_CHECKPOINT_PATH"]),
        }}, open({str(out)!r}, "w"))
        print("hello from the task")
    """,
            ),
            env={"MINE": "yes"},
            working_dir=str(tmp_path),
        )
    )
    agent.profiled(profile("bad-1", command=[sys.executable, "-c", "import sys; sys.exit(3)"]))
    os.environ["CRATER_PROBE_SECRET"] = "not for tasks"
    try:
        ok, bad = grant("ok-1", tmp_path / "ckpt"), grant("bad-1", tmp_path / "ckpt")
        assert agent.granted(ok) is GrantOutcome.STARTED
        assert agent.granted(bad) is GrantOutcome.STARTED
        assert agent.granted(ok) is GrantOutcome.DUPLICATE  # a redelivered grant runs once
        await until(lambda: not agent.runs)
    finally:
        del os.environ["CRATER_PROBE_SECRET"]
        await agent.close()
    seen = json.loads(out.read_text())
    assert seen["cpus"] == str(CORE)
    assert seen["cuda"] == ""  # no GPUs granted: none visible
    assert seen["task"] == "ok-1"
    assert seen["mine"] == "yes"
    assert seen["leaked"] == []
    assert seen["cwd"] == str(tmp_path)
    assert seen["config"]["cpu_cores"] == [CORE]
    assert seen["config"]["memory_mb"] == 256
    assert seen["checkpoint_dir"] is True
    assert [s for s, _ in reports.of(ok.allocation_id)] == ["running", "succeeded"]
    assert reports.of(bad.allocation_id)[-1] == ("failed", "exit code 3")
    log = find_logs(tmp_path / "state", "ok-1")[1][0].read_text()
    assert "hello from the task" in log
    assert "[crater] exit code 0" in log


async def test_release_sends_sigterm_then_sigkill_and_reports_nothing(tmp_path: Path) -> None:
    reports = Reports()
    agent = executor(tmp_path, reports, grace=0.5)
    await agent.start()
    agent.profiled(
        profile(
            "stubborn",
            command=script(
                tmp_path,
                "stubborn",
                """
        import signal, time
        signal.signal(signal.SIGTERM, lambda *_: print("ignoring SIGTERM", flush=True))
        print("started", flush=True)
        time.sleep(60)
    """,
            ),
        )
    )
    agent.profiled(profile("polite", command=[sys.executable, "-c", "import time; time.sleep(60)"]))
    stubborn, polite = grant("stubborn", tmp_path), grant("polite", tmp_path)
    for g in (stubborn, polite):
        agent.granted(g)
    await until(lambda: len(reports.events) == 2)  # both running
    await until(lambda: "started" in find_logs(tmp_path / "state", "stubborn")[1][0].read_text())
    began = time.monotonic()
    for g in (stubborn, polite):
        agent.released(
            AllocationReleased(
                allocation_id=g.allocation_id,
                task_id=g.task_id,
                node=NODE,
                gpu_ids=[],
                cpu_cores=g.cpu_cores,
                reason=ReleaseReason.CANCELLED,
            )
        )
    await until(lambda: not agent.runs)
    await agent.close()
    assert time.monotonic() - began >= 0.5  # the stubborn one had its grace
    assert [s for s, _ in reports.of(stubborn.allocation_id)] == ["running"]
    stubborn_log = find_logs(tmp_path / "state", "stubborn")[1][0].read_text()
    assert "ignoring SIGTERM" in stubborn_log
    assert "killed by SIGKILL" in stubborn_log
    assert "killed by SIGTERM" in find_logs(tmp_path / "state", "polite")[1][0].read_text()


async def test_an_image_or_a_missing_program_fails_with_the_reason(tmp_path: Path) -> None:
    reports = Reports()
    agent = executor(tmp_path, reports)
    await agent.start()
    agent.profiled(profile("boxed", command=["true"], image="pytorch/pytorch:2.3.0"))
    agent.profiled(profile("missing", command=["/no/such/program"]))
    boxed, missing = grant("boxed", tmp_path), grant("missing", tmp_path)
    agent.granted(boxed)
    agent.granted(missing)
    await until(lambda: not agent.runs)
    await agent.close()
    [(status, why)] = reports.of(boxed.allocation_id)
    assert status == "failed"
    assert "image 'pytorch/pytorch:2.3.0'" in why
    assert "no container runtime" in why
    [(status, why)] = reports.of(missing.allocation_id)
    assert status == "failed"
    assert "could not start '/no/such/program'" in why


async def test_a_grant_waits_for_its_body_and_one_without_command_is_left_to_a_launcher(
    tmp_path: Path,
) -> None:
    reports = Reports()
    agent = executor(tmp_path, reports)
    await agent.start()
    early = grant("early", tmp_path)
    assert agent.granted(early) is GrantOutcome.WAITING
    agent.profiled(profile("early", command=["true"]))
    launched = grant("launched", tmp_path)
    assert agent.granted(launched) is GrantOutcome.WAITING
    assert agent.profiled(profile("launched")) is False  # no command: its launcher confirms it
    other = grant("early", tmp_path).model_copy(update={"node": "node-b"})
    assert agent.granted(other) is GrantOutcome.NOT_OURS
    await until(lambda: not agent.runs)
    await agent.close()
    assert [s for s, _ in reports.of(early.allocation_id)] == ["running", "succeeded"]
    assert reports.of(launched.allocation_id) == []


async def test_a_restarted_agent_reattaches_and_never_loses_an_outcome(tmp_path: Path) -> None:
    reports = Reports()
    first = executor(tmp_path, reports)
    await first.start()
    first.profiled(profile("long", command=[sys.executable, "-c", "import time; time.sleep(1.0)"]))
    first.profiled(
        profile(
            "quick",
            command=[sys.executable, "-c", "import time; time.sleep(0.4); raise SystemExit(5)"],
        )
    )
    first.profiled(profile("orphan", command=[sys.executable, "-c", "import time; time.sleep(60)"]))
    long, quick, orphan = (
        grant("long", tmp_path),
        grant("quick", tmp_path),
        grant("orphan", tmp_path),
    )
    for g in (long, quick, orphan):
        first.granted(g)
    await until(lambda: len(reports.events) >= 3)  # each reported running
    await first.close()  # the agent goes; its tasks do not
    reports_before = len(reports.events)
    await asyncio.sleep(0.6)  # "quick" ends while no agent watches
    supervisor = json.loads(
        (first.runs[orphan.allocation_id].directory / "launched.json").read_text()
    )
    os.kill(supervisor["pid"], signal.SIGKILL)  # a supervisor dies without a word

    second = executor(tmp_path, reports)
    await second.start()
    assert set(second.runs) == {long.allocation_id, quick.allocation_id, orphan.allocation_id}
    await until(lambda: not second.runs)
    await second.close()
    assert len(reports.events) > reports_before
    assert reports.of(quick.allocation_id)[-1] == ("failed", "exit code 5")
    assert reports.of(long.allocation_id)[-1] == ("succeeded", "exit code 0")
    status, why = reports.of(orphan.allocation_id)[-1]
    assert status == "failed"
    assert "supervisor is gone" in why
    # nothing reported twice, and a third agent has nothing left to do
    assert len({(e.allocation_id, e.status) for e in reports.events}) == len(reports.events)
    third = executor(tmp_path, reports)
    await third.start()
    assert third.runs == {}
    await third.close()


async def test_preempted_training_checkpoints_and_the_next_attempt_resumes(tmp_path: Path) -> None:
    example = EXAMPLE
    reports = Reports()
    agent = executor(tmp_path, reports)
    await agent.start()
    agent.profiled(
        profile(
            "train",
            command=[sys.executable, str(example), "--steps", "400", "--step-seconds", "0.01"],
        )
    )
    first = grant("train", tmp_path / "ckpt")
    agent.granted(first)
    logs = tmp_path / "state" / "logs" / "tasks"
    await until(
        lambda: (
            "step 50 " in (logs / "train-1.log").read_text()
            if (logs / "train-1.log").exists()
            else False
        )
    )
    agent.preempted(
        TaskPreempted(
            task_id="train",
            allocation_id=first.allocation_id,
            node=NODE,
            preempted_by="vip",
            grace_period_seconds=5,
        )
    )
    await until(lambda: not agent.runs)
    status, why = reports.of(first.allocation_id)[-1]
    assert status == "failed"
    assert why.startswith("preempted: stopped, exit code 0")  # it saved and left in its grace
    saved = (logs / "train-1.log").read_text()
    assert "preempted: checkpoint saved at step" in saved
    stopped_at = int(saved.split("preempted: checkpoint saved at step ")[1].split()[0])

    second = grant("train", tmp_path / "ckpt", attempt=2)
    agent.granted(second)
    await until(lambda: not agent.runs, seconds=30)
    await agent.close()
    resumed = (logs / "train-2.log").read_text()
    assert f"resuming from step {stopped_at}" in resumed
    assert reports.of(second.allocation_id)[-1] == ("succeeded", "exit code 0")
    assert "done: 400 steps" in resumed


async def test_crater_logs_prints_and_follows_an_attempt(tmp_path: Path) -> None:
    reports = Reports()
    agent = executor(tmp_path, reports)
    await agent.start()
    agent.profiled(
        profile(
            "chatty",
            command=script(
                tmp_path,
                "chatty",
                """
                import time
                for i in range(5):
                    print(f"line {i}", flush=True)
                    time.sleep(0.1)
                """,
            ),
        )
    )
    agent.granted(grant("chatty", tmp_path))
    env = {**os.environ, "CRATER_PROBE_STATE_DIR": str(tmp_path / "state")}
    await until(lambda: bool(find_logs(tmp_path / "state", "chatty")))
    follow = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "crater.cli", "logs", "chatty", "--follow",
        env=env, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(follow.communicate(), timeout=30)
    await agent.close()
    text = out.decode()
    assert [f"line {i}" for i in range(5)] == [x for x in text.splitlines() if x.startswith("line")]
    assert "[crater] exit code 0" in text
    missing = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "crater.cli", "logs", "chatty", "--attempt", "2",
        env=env, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await missing.communicate()
    assert missing.returncode == 1
    assert b"no attempt 2" in err
