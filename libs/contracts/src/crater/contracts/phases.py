"""Lending by phase: a running training task says it enters a phase in which its GPUs are
idle (a CPU-bound step: evaluation on the host, data preparation, checkpoint upload), so the
scheduler may lend its cards to inference replicas, isolated; and that it leaves it, when it
wants them back. The scheduler answers each with where the lending stands.

`crater_client.Client.cpu_phase()` posts both to the gateway (authenticated by the task's
reservation token), which publishes them here.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import Field

from crater.contracts.base import Event
from crater.contracts.tasks import TaskId
from crater.contracts.usage import GpuUsage

# The longest phase a task may announce (the scheduler's own maximum usually ends it first).
MAX_PHASE_SECONDS = 7 * 86_400


class GpuPhase(StrEnum):
    CPU = "cpu"  # its GPUs are idle: they may be lent
    GPU = "gpu"  # it wants its GPUs back


class TaskPhaseReported(Event):
    """A running task enters (`cpu`) or leaves (`gpu`) a phase in which its GPUs are idle."""

    task_id: TaskId
    allocation_id: str = Field(min_length=1, max_length=256)
    phase: GpuPhase
    expected_seconds: float | None = Field(
        default=None,
        gt=0,
        le=MAX_PHASE_SECONDS,
        description="How long the task expects the phase to last (`cpu` only): lending stops "
        "then, or at the scheduler's maximum, whichever comes first.",
    )
    gpus: list[GpuUsage] = Field(
        default_factory=list,
        max_length=1024,
        description="What the task keeps resident on each card during the phase (`cpu`): a "
        "replica is capped to what is left. A card not named counts as holding the task's "
        "requested GPU memory.",
    )


class LendingState(StrEnum):
    LENT = "lent"  # its cards may be lent to inference replicas
    RECLAIMING = "reclaiming"  # replicas on its cards are leaving, by `must_be_free_by`
    RETURNED = "returned"  # its cards are its own again: the task may use them
    REFUSED = "refused"  # nothing changed: `reason` says why


class TaskGpusLending(Event):
    """Where the lending of a task's GPUs stands, after its phase report or on its own (the
    phase passed its maximum, or the cards came back)."""

    task_id: TaskId
    allocation_id: str | None = Field(default=None, max_length=256)
    node: str | None = Field(default=None, max_length=253)
    state: LendingState
    gpu_ids: list[int] = Field(default_factory=list, max_length=1024)
    must_be_free_by: datetime | None = Field(
        default=None, description="`reclaiming`: when the replicas are gone at the latest."
    )
    lent_until: datetime | None = Field(
        default=None, description="`lent`: when the phase ends by itself (its maximum)."
    )
    reason: str = Field(max_length=2048)
