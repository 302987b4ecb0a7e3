"""Crater's Python client.

Inside a placed task: `get_allocation_config()`, `bind()`, `start_monitoring()`,
`on_preempt()`, `resume_from()`, `with cpu_phase():` (lend the GPUs while they idle), and
`with run_task():` (confirm the allocation, heartbeat, report the end).
For AllData: `CraterClient` and `AsyncCraterClient`, and the errors they raise.
"""

from crater_client.allocation import (
    AllocationConfig,
    AllocationError,
    Bound,
    Placement,
    bind,
    get_allocation_config,
    get_placement,
)
from crater_client.checkpoint import (
    checkpoint_dir,
    checkpoint_file,
    checkpoint_step,
    on_preempt,
    preempt_requested,
    resume_from,
)
from crater_client.client import (
    FINAL_STATUSES,
    Accepted,
    AsyncCraterClient,
    Conflict,
    CraterClient,
    CraterError,
    EndedOtherwise,
    NotFound,
    Task,
    TaskExists,
    Unavailable,
    ValidationFailed,
    WaitTimedOut,
)
from crater_client.launcher import RunningTask, RunRefused, run_task
from crater_client.monitoring import Monitor, read_tree, start_monitoring
from crater_client.phase import CpuPhase, cpu_phase

__all__ = [
    "FINAL_STATUSES",
    "Accepted",
    "AllocationConfig",
    "AllocationError",
    "AsyncCraterClient",
    "Bound",
    "Conflict",
    "CpuPhase",
    "CraterClient",
    "CraterError",
    "EndedOtherwise",
    "Monitor",
    "NotFound",
    "Placement",
    "RunRefused",
    "RunningTask",
    "Task",
    "TaskExists",
    "Unavailable",
    "ValidationFailed",
    "WaitTimedOut",
    "bind",
    "checkpoint_dir",
    "checkpoint_file",
    "checkpoint_step",
    "cpu_phase",
    "get_allocation_config",
    "get_placement",
    "on_preempt",
    "preempt_requested",
    "read_tree",
    "resume_from",
    "run_task",
    "start_monitoring",
]
