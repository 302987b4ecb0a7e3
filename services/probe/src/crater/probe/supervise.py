"""The supervisor of one task process: `python -m crater.probe.supervise RUN_DIR`.

The node agent starts one per attempt, in a session of its own, so that it outlives the
agent: a restarted agent finds the task still watched, and its exit code written down. It
reads `spec.json` from the run directory, joins the task's cgroup where one was prepared,
pins itself to the granted cores (the task inherits them), starts the command in a process
group of its own with stdout and stderr to the task's log, records both pids with their
start times (`supervisor.json`), and when the command ends writes `exit.json` (the exit code,
or the signal, or why it could not start) and kills what the task left in its group.
Only the standard library: it starts in a few tens of milliseconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SPEC = "spec.json"
SUPERVISOR = "supervisor.json"
EXIT = "exit.json"


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Atomically: a reader sees the whole file or none."""
    part = path.with_name(f".{path.name}.{os.getpid()}")
    part.write_text(json.dumps(data))
    os.replace(part, path)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    return data


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot, /proc/PID/stat field 22): with the
    pid it names one process, never a later one that reused the pid. None: it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":  # a zombie has ended; only its exit status is left
        return None
    return int(fields[19])


def alive(pid: int, started: int | None) -> bool:
    return started is not None and start_time(pid) == started


def join_cgroup(spec: dict[str, Any], log: Any) -> None:
    """Move this process (and so the task) into the cgroup the agent prepared, if any."""
    cgroup = spec.get("cgroup")
    if not cgroup:
        return
    try:
        Path(cgroup, "cgroup.procs").write_text(str(os.getpid()))
    except OSError as error:
        log.write(f"[crater] could not join cgroup {cgroup}: {error}\n".encode())


def supervise(run_dir: Path) -> int:
    spec = read_json(run_dir / SPEC)
    assert spec is not None, f"{run_dir / SPEC} is missing"
    log_path = Path(spec["log"])
    log_path.parent.mkdir(parents=True, exist_ok=True)
    me = {"supervisor_pid": os.getpid(), "supervisor_started": start_time(os.getpid())}
    with open(log_path, "ab", buffering=0) as log:
        join_cgroup(spec, log)
        why = None
        try:
            os.sched_setaffinity(0, spec["cpu_cores"])
        except OSError as error:
            why = f"cannot pin to cores {spec['cpu_cores']}: {error.strerror or error}"
        try:
            if why is not None:
                raise OSError(why)
            child = subprocess.Popen(
                spec["argv"],
                env=spec["env"],
                cwd=spec["cwd"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: signalled as a whole
            )
        except OSError as error:
            if why is None:
                why = f"could not start {spec['argv'][0]!r}: {error.strerror or error}"
                if error.filename == spec["cwd"]:
                    why = f"working directory {spec['cwd']!r}: {error.strerror}"
            log.write(f"[crater] {why}\n".encode())
            write_json(run_dir / SUPERVISOR, me)
            write_json(run_dir / EXIT, {"error": why, "ended_at": time.time()})
            return 0
        write_json(
            run_dir / SUPERVISOR,
            {**me, "pid": child.pid, "started": start_time(child.pid)},
        )
        # The agent signals the task's group itself; a signal meant for the supervisor
        # (someone killing the session) is passed on, and the supervisor stays to record.
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda number, _: _signal_group(child.pid, number))
        returncode = child.wait()
        _signal_group(child.pid, signal.SIGKILL)  # what the task left behind in its group
        outcome: dict[str, Any] = {"returncode": returncode, "ended_at": time.time()}
        if returncode < 0:
            outcome["signal"] = signal.Signals(-returncode).name
        log.write(f"[crater] {describe(outcome)}\n".encode())
        write_json(run_dir / EXIT, outcome)
    return 0


def describe(outcome: dict[str, Any]) -> str:
    """One line: what the exit record says."""
    if "error" in outcome:
        return str(outcome["error"])
    if "signal" in outcome:
        return f"killed by {outcome['signal']}"
    return f"exit code {outcome['returncode']}"


def _signal_group(pgid: int, number: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, number)


if __name__ == "__main__":
    sys.exit(supervise(Path(sys.argv[1])))
