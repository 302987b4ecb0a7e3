"""The node agent's task executor: local mode with execution switched on
(`CRATER_PROBE_EXECUTE=true`) runs the `command` of each task granted to this node as a real
process, as a cluster's own node daemon does.

A grant is run once its task's body is known: the task's `command`, `env`, `working_dir` and
`image` come with `task.profiled` (kept on disk per task, so a restarted agent still knows
them). Each attempt gets a run directory (`STATE_DIR/runs/ALLOCATION/`) holding the grant,
the supervisor's spec, the allocation config the task reads (`allocation.json`, the grant's
CRATER_* environment, path in `CRATER_ALLOCATION_CONFIG`) and what became of it. A
supervisor process (`crater.probe.supervise`) of its own session starts the command pinned
to the granted cores and writes its exit code to the run directory, so the outcome survives
the agent: a restarted agent reads it, or keeps watching a task still running, or reports
the attempt failed when the supervisor died without a word.

The agent reports `running` once the command has started (that confirms the reservation),
then `succeeded` (exit 0) or `failed` (the exit code, the signal or why it could not start).
A release (cancel, expiry, lost node) stops the process: SIGTERM to its process group, SIGKILL
after `kill_grace_seconds`; nothing more is reported (the scheduler has decided). A preemption
stops it the same way after the preemption's grace period and reports it `failed`
("preempted: ..."), which the scheduler takes as the yield. Reports carry ids derived from the
grant's (`status_report`), and are retried until the broker takes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    RunningAllocation,
    TaskPreempted,
    TaskProfiled,
    TaskStatus,
    utc_now,
)
from crater.probe.reports import STALE_AFTER, GrantOutcome, Publish, publish_retried, status_report
from crater.probe.supervise import EXIT, SPEC, SUPERVISOR, alive, describe, read_json, start_time
from crater.probe.supervise import write_json as _write_json

log = logging.getLogger("crater.probe.executor")

# What of the agent's own environment a task sees; the rest (the agent's CRATER_* settings,
# its credentials) stays with the agent.
PASSTHROUGH = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")
GRANT = "grant.json"
LAUNCHED = "launched.json"
STOP = "stop.json"
REPORTED = "reported.json"
ALLOCATION_CONFIG = "allocation.json"
PREEMPTED = "preempted"
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def safe_name(text: str) -> str:
    """A file name for an id: anything but letters, digits, '.', '_' and '-' becomes '_'."""
    return _SAFE.sub("_", text)[:200] or "_"


def log_name(task_id: str, attempt: int, gang_index: int = 0, gang_size: int = 1) -> str:
    """`TASK-ATTEMPT.log` (a gang member's: `TASK-ATTEMPT-RANK.log`)."""
    member = f"-{gang_index}" if gang_size > 1 else ""
    return f"{safe_name(task_id)}-{attempt}{member}.log"


@dataclass
class TaskBody:
    """What a task asked its node to run (from its profile)."""

    command: list[str] | None
    env: dict[str, str]
    working_dir: str | None
    image: str | None


@dataclass
class Run:
    """One attempt on this node: its run directory and what the agent knows of it."""

    directory: Path
    grant: AllocationGranted
    popen: subprocess.Popen[bytes] | None = None  # ours to reap; None after a restart
    reported: set[str] = field(default_factory=set)
    stop: dict[str, Any] | None = None

    @property
    def allocation_id(self) -> str:
        return self.grant.allocation_id


class Cgroups:
    """cgroup v2 per task (cpuset.cpus, memory.max) under ROOT/crater, where the machine lets
    the agent write; otherwise nothing, said once."""

    def __init__(self, root: Path | None) -> None:
        self.parent: Path | None = None
        self.why_not: str | None = None
        if root is None:
            self.why_not = "switched off (CRATER_PROBE_CGROUP_ROOT unset)"
            return
        controllers = root / "cgroup.controllers"
        try:
            available = controllers.read_text().split()
        except OSError:
            self.why_not = f"no cgroup v2 at {root} (no {controllers.name})"
            return
        missing = {"cpuset", "memory"} - set(available)
        if missing:
            self.why_not = f"cgroup v2 at {root} lacks the {', '.join(sorted(missing))} controller"
            return
        try:
            parent = root / "crater"
            parent.mkdir(exist_ok=True)
            for level in (root, parent):
                (level / "cgroup.subtree_control").write_text("+cpuset +memory")
        except OSError as error:
            self.why_not = f"cgroup v2 at {root} is not writable here: {error.strerror or error}"
            return
        self.parent = parent

    def prepare(self, name: str, cpu_cores: list[int], memory_mb: int) -> Path | None:
        if self.parent is None:
            return None
        group = self.parent / name
        try:
            group.mkdir(exist_ok=True)
            (group / "cpuset.cpus").write_text(",".join(str(c) for c in cpu_cores))
            if memory_mb > 0:
                (group / "memory.max").write_text(str(memory_mb * 1024 * 1024))
        except OSError as error:
            log.warning("cgroup %s not prepared (%s); CPU affinity only", group, error)
            return None
        return group

    @staticmethod
    def oom_killed(group: str | None) -> bool:
        """Whether the kernel's OOM killer killed a process of the task's cgroup (its
        memory.events `oom_kill` count); False without a cgroup or where it cannot be read."""
        if not group:
            return False
        try:
            lines = (Path(group) / "memory.events").read_text().splitlines()
        except OSError:
            return False
        counts = dict(line.split(maxsplit=1) for line in lines if " " in line)
        return counts.get("oom_kill", "0").strip() not in ("", "0")

    def remove(self, group: str | None) -> None:
        if group:
            with contextlib.suppress(OSError):
                Path(group).rmdir()


class TaskExecutor:
    def __init__(
        self,
        node_id: str,
        publish: Publish,
        *,
        state_dir: Path,
        kill_grace_seconds: float = 10.0,
        poll_seconds: float = 0.5,
        cgroup_root: Path | None = None,
        passthrough: tuple[str, ...] = PASSTHROUGH,
        python: str = sys.executable,
        clock: Callable[[], datetime] = utc_now,
        stale_after: timedelta = STALE_AFTER,
    ) -> None:
        self.node_id = node_id
        self._publish = publish
        self.state_dir = state_dir
        self.runs_dir = state_dir / "runs"
        self.tasks_dir = state_dir / "tasks"
        self.logs_dir = state_dir / "logs" / "tasks"
        self._grace = kill_grace_seconds
        self._poll = poll_seconds
        self._cgroup_root = cgroup_root
        self._passthrough = passthrough
        self._python = python
        self._clock = clock
        self._stale_after = stale_after
        self.runs: dict[str, Run] = {}  # attempts not yet over here
        self._waiting: dict[str, list[AllocationGranted]] = {}  # task id -> grants, no body yet
        self._watch: asyncio.Task[None] | None = None
        self.cgroups: Cgroups | None = None

    @property
    def running(self) -> int:
        """Attempts this agent watches."""
        return len(self.runs)

    def inventory(self) -> list[RunningAllocation]:
        """The allocations this agent runs now (started, not yet over here), for the
        heartbeat: what the scheduler reconciles its ledger against."""
        return [
            RunningAllocation(
                allocation_id=run.allocation_id,
                task_id=run.grant.task_id,
                gpu_ids=list(run.grant.gpu_ids),
            )
            for run in sorted(self.runs.values(), key=lambda r: r.allocation_id)
        ]

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Pick up the attempts a previous agent left (re-attach or report), then watch."""
        for directory in (self.runs_dir, self.tasks_dir, self.logs_dir):
            directory.mkdir(parents=True, exist_ok=True)
        self.cgroups = Cgroups(self._cgroup_root)
        if self.cgroups.why_not:
            log.info(
                "no cgroup limits for tasks: %s; tasks are pinned by CPU affinity only, "
                "memory is not limited",
                self.cgroups.why_not,
            )
        for directory in sorted(self.runs_dir.iterdir()):
            if (directory / "final.json").exists() or not (directory / GRANT).exists():
                continue
            grant = AllocationGranted.model_validate_json((directory / GRANT).read_text())
            reported = read_json(directory / REPORTED) or {}
            run = Run(
                directory,
                grant,
                reported=set(reported.get("statuses", [])),
                stop=read_json(directory / STOP),
            )
            self.runs[grant.allocation_id] = run
            log.info(
                "re-attached to %s (task %s attempt %d)",
                grant.allocation_id,
                grant.task_id,
                grant.attempt,
            )
        self._watch = asyncio.create_task(self._watch_loop(), name="executor-watch")

    async def close(self) -> None:
        """Stop watching; the tasks go on under their supervisors for the next agent."""
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
            self._watch = None

    # --- events ----------------------------------------------------------------------------

    def profiled(self, event: TaskProfiled) -> bool:
        """Keep the body of a task that names a command or an image; run its waiting grants."""
        task = event.task
        waiting = self._waiting.pop(task.task_id, [])
        if task.command is None and task.image is None:
            for grant in waiting:
                log.info(
                    "task %s (%s) has no command: left to its launcher",
                    task.task_id,
                    grant.allocation_id,
                )
            return False
        body = {
            "command": task.command,
            "env": task.env,
            "working_dir": task.working_dir,
            "image": task.image,
        }
        self.tasks_dir.mkdir(parents=True, exist_ok=True)
        _write_json(self.tasks_dir / f"{safe_name(task.task_id)}.json", body)
        for grant in waiting:
            self.granted(grant)
        return True

    def granted(self, event: AllocationGranted) -> GrantOutcome:
        if event.node != self.node_id:
            return GrantOutcome.NOT_OURS
        directory = self.runs_dir / safe_name(event.allocation_id)
        if directory.exists() or event.allocation_id in self.runs:
            return GrantOutcome.DUPLICATE
        if event.reservation_expires_at + self._stale_after <= self._clock():
            return GrantOutcome.STALE
        body = self._body(event.task_id)
        if body is None:
            # Its profile is still on its way (another consumer): run it when it comes.
            waiting = self._waiting.setdefault(event.task_id, [])
            if all(g.allocation_id != event.allocation_id for g in waiting):
                waiting.append(event)
            return GrantOutcome.WAITING
        directory.mkdir(parents=True)
        (directory / GRANT).write_text(event.model_dump_json())
        run = Run(directory, event)
        self.runs[event.allocation_id] = run
        try:
            self._launch(run, body)
        except _CannotStart as error:
            log.warning("task %s (%s) cannot start: %s", event.task_id, event.allocation_id, error)
            _write_json(directory / EXIT, {"error": str(error), "ended_at": time.time()})
        return GrantOutcome.STARTED

    def released(self, event: AllocationReleased) -> bool:
        """The scheduler took the allocation back: a process still running is stopped."""
        self._drop_waiting(event.task_id, event.allocation_id)
        run = self.runs.get(event.allocation_id)
        if run is None:
            return False
        self._stop(run, event.reason.value, self._grace)
        return True

    def preempted(self, event: TaskPreempted) -> bool:
        """SIGTERM now; SIGKILL when its grace period (to checkpoint) is over."""
        self._drop_waiting(event.task_id, event.allocation_id)
        run = self.runs.get(event.allocation_id)
        if run is None:
            return False
        self._stop(run, PREEMPTED, float(event.grace_period_seconds))
        return True

    # --- launching ---------------------------------------------------------------------------

    def _body(self, task_id: str) -> TaskBody | None:
        data = read_json(self.tasks_dir / f"{safe_name(task_id)}.json")
        return None if data is None else TaskBody(**data)

    def _launch(self, run: Run, body: TaskBody) -> None:
        grant, directory = run.grant, run.directory
        if body.image is not None:
            raise _CannotStart(
                f"image {body.image!r}: this node agent runs commands directly, it has no "
                "container runtime (submit the command without an image, or use a launcher)"
            )
        if body.command is None:
            raise _CannotStart("no command")
        if grant.checkpoint_path:
            try:
                Path(grant.checkpoint_path).mkdir(parents=True, exist_ok=True)
            except OSError as error:
                raise _CannotStart(
                    f"checkpoint directory {grant.checkpoint_path!r}: {error.strerror or error}"
                ) from None
        config = directory / ALLOCATION_CONFIG
        _write_json(config, dict(grant.environment))
        env = {k: v for k, v in os.environ.items() if k in self._passthrough}
        env["PYTHONUNBUFFERED"] = "1"  # a Python task's prints reach its log as they happen
        env.update(grant.environment)
        env["CRATER_ALLOCATION_CONFIG"] = str(config)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in grant.gpu_ids)
        env.update(body.env)
        assert self.cgroups is not None, "start() first"
        group = self.cgroups.prepare(
            f"{safe_name(grant.allocation_id)}", grant.cpu_cores, grant.memory_mb
        )
        spec = {
            "argv": body.command,
            "env": env,
            "cwd": body.working_dir or str(directory),
            "cpu_cores": grant.cpu_cores,
            "log": str(
                self.logs_dir
                / log_name(grant.task_id, grant.attempt, grant.gang_index, grant.gang_size)
            ),
            "cgroup": None if group is None else str(group),
        }
        _write_json(directory / SPEC, spec)
        popen = subprocess.Popen(
            [self._python, "-m", "crater.probe.supervise", str(directory)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(directory / "supervisor.err", "wb"),  # noqa: SIM115 - the child holds it
            start_new_session=True,  # outlives the agent; a signal to the agent is not its
        )
        run.popen = popen
        _write_json(directory / LAUNCHED, {"pid": popen.pid, "started": start_time(popen.pid)})
        log.info(
            "started %s (task %s attempt %d) on cores %s: %s",
            grant.allocation_id,
            grant.task_id,
            grant.attempt,
            grant.cpu_cores,
            " ".join(body.command),
        )

    # --- stopping ----------------------------------------------------------------------------

    def _stop(self, run: Run, reason: str, grace: float) -> None:
        if run.stop is not None:
            # A release after a preemption keeps the preemption's reason, and its deadline
            # unless the release comes sooner.
            run.stop["deadline"] = min(run.stop["deadline"], time.time() + grace)
        else:
            run.stop = {"reason": reason, "deadline": time.time() + grace, "term_sent": False}
        _write_json(run.directory / STOP, run.stop)
        self._signal(run)

    def _signal(self, run: Run) -> None:
        """SIGTERM once to the task's process group; SIGKILL once the deadline has passed."""
        stop = run.stop
        child = read_json(run.directory / SUPERVISOR)
        if stop is None or child is None or "pid" not in child:
            return
        if not alive(child["pid"], child.get("started")):
            return
        if time.time() >= stop["deadline"]:
            _killpg(child["pid"], signal.SIGKILL)
        elif not stop["term_sent"]:
            _killpg(child["pid"], signal.SIGTERM)
            stop["term_sent"] = True
            _write_json(run.directory / STOP, stop)

    def _drop_waiting(self, task_id: str, allocation_id: str) -> None:
        waiting = [g for g in self._waiting.get(task_id, []) if g.allocation_id != allocation_id]
        if waiting:
            self._waiting[task_id] = waiting
        else:
            self._waiting.pop(task_id, None)

    # --- watching ----------------------------------------------------------------------------

    async def _watch_loop(self) -> None:
        while True:
            for run in list(self.runs.values()):
                try:
                    await self.check(run)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("watching %s failed", run.allocation_id)
            await asyncio.sleep(self._poll)

    async def check(self, run: Run) -> None:
        """One look at an attempt: report it started, signal it, report its end."""
        if run.popen is not None:
            run.popen.poll()  # reap the supervisor once it is done
        outcome = read_json(run.directory / EXIT)
        child = read_json(run.directory / SUPERVISOR)
        if outcome is None and not self._supervisor_alive(run):
            outcome = read_json(run.directory / EXIT)  # written just before it ended?
            if outcome is None:
                outcome = {
                    "error": "its supervisor is gone without recording an exit status "
                    "(the node agent restarted or the supervisor was killed)"
                }
                if child is not None and "pid" in child and alive(child["pid"], child["started"]):
                    _killpg(child["pid"], signal.SIGKILL)  # nobody would record its end
                    outcome["error"] += "; the orphaned task was killed"
        if child is not None and "pid" in child and run.stop is None:
            await self._report(
                run,
                TaskStatus.RUNNING,
                f"running on {self.node_id} (pid {child['pid']}, cores {run.grant.cpu_cores})",
            )
        if outcome is None:
            self._signal(run)
            return
        await self._ended(run, outcome)

    def _supervisor_alive(self, run: Run) -> bool:
        if run.popen is not None:
            return run.popen.poll() is None
        launched = read_json(run.directory / LAUNCHED)
        return launched is not None and alive(launched["pid"], launched.get("started"))

    async def _ended(self, run: Run, outcome: dict[str, Any]) -> None:
        what = describe(outcome)
        stop = run.stop
        status: TaskStatus | None
        spec = read_json(run.directory / SPEC) or {}
        oom = False
        if stop is None:
            ok = outcome.get("returncode") == 0
            status = TaskStatus.SUCCEEDED if ok else TaskStatus.FAILED
            message = what
            # Killed for its memory.max: a failure of kind oom (restart_policy).
            oom = not ok and Cgroups.oom_killed(spec.get("cgroup"))
            if oom:
                message += " (out of memory: the kernel's OOM killer, memory.max)"
        elif stop["reason"] == PREEMPTED:
            status, message = TaskStatus.FAILED, f"preempted: stopped, {what}"
        else:
            status, message = None, f"released ({stop['reason']}): stopped, {what}"
        if status is not None:
            await self._report(run, status, message, out_of_memory=oom)
        log.info(
            "%s (task %s attempt %d) ended: %s",
            run.allocation_id,
            run.grant.task_id,
            run.grant.attempt,
            message,
        )
        assert self.cgroups is not None
        self.cgroups.remove(spec.get("cgroup"))
        _write_json(
            run.directory / "final.json",
            {"status": None if status is None else status.value, "message": message},
        )
        del self.runs[run.allocation_id]

    async def _report(
        self, run: Run, status: TaskStatus, message: str, out_of_memory: bool = False
    ) -> None:
        if status.value in run.reported:
            return
        assert status in (TaskStatus.RUNNING, TaskStatus.SUCCEEDED, TaskStatus.FAILED)
        report = status_report(run.grant, status, message, out_of_memory)
        await publish_retried(self._publish, report)
        run.reported.add(status.value)
        _write_json(run.directory / REPORTED, {"statuses": sorted(run.reported)})


class _CannotStart(Exception):
    pass


def _killpg(pgid: int, number: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, number)


def find_logs(state_dir: Path, task_id: str) -> dict[int, list[Path]]:
    """Every log of a task on this node, by attempt (a gang's members: several)."""
    found: dict[int, list[Path]] = {}
    pattern = re.compile(rf"{re.escape(safe_name(task_id))}-(\d+)(-\d+)?\.log")
    directory = state_dir / "logs" / "tasks"
    for path in sorted(directory.glob(f"{safe_name(task_id)}-*.log")):
        match = pattern.fullmatch(path.name)
        if match:
            found.setdefault(int(match.group(1)), []).append(path)
    return found


def log_finished(state_dir: Path, log_path: Path) -> bool:
    """Whether the attempt writing `log_path` has ended (its supervisor recorded the exit)."""
    for spec_path in (state_dir / "runs").glob(f"*/{SPEC}"):
        spec = read_json(spec_path)
        if spec is not None and Path(spec["log"]) == log_path:
            return (spec_path.parent / EXIT).exists()
    return True  # no run writes it: nothing more will come
