"""The executing agent tells an out-of-memory end apart: a task its cgroup's OOM killer
killed is reported failed with out_of_memory (a failure of kind oom, restart_policy)."""

from __future__ import annotations

from pathlib import Path

from crater.contracts import TaskStatus
from crater.probe.executor import Cgroups
from crater.probe.reports import status_report
from tests.unit.probe.test_runner import grant


def test_the_oom_killer_is_read_off_the_tasks_cgroup(tmp_path: Path) -> None:
    group = tmp_path / "task-1"
    group.mkdir()
    events = group / "memory.events"
    events.write_text("low 0\nhigh 0\nmax 12\noom 1\noom_kill 0\n")
    assert not Cgroups.oom_killed(str(group))  # pressed against memory.max, not killed
    events.write_text("low 0\nhigh 0\nmax 40\noom 2\noom_kill 1\n")
    assert Cgroups.oom_killed(str(group))
    assert not Cgroups.oom_killed(str(tmp_path / "gone"))  # removed, or never made
    assert not Cgroups.oom_killed(None)  # no cgroup: affinity only


def test_the_report_carries_it_and_reads_as_before_without() -> None:
    granted = grant("a1")
    plain = status_report(granted, TaskStatus.FAILED, "exit code 1")
    assert "out_of_memory" not in plain.model_dump_json()
    killed = status_report(granted, TaskStatus.FAILED, "killed", out_of_memory=True)
    assert killed.out_of_memory
    assert '"out_of_memory":true' in killed.model_dump_json()
