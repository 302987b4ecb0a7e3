"""Autoscaling: what inference replicas report and what the autoscaler decides."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from crater.contracts.base import Event


class LatencySamplesReported(Event):
    """A batch of request latencies from one inference replica or gateway."""

    service: str = Field(min_length=1, max_length=128)
    replica_id: str | None = Field(default=None, max_length=128)
    latencies_ms: list[float] = Field(min_length=1, max_length=10_000)
    gpu_memory_pressure: float | None = Field(
        default=None, ge=0, le=1, description="Used/total GPU memory of the replica's cards."
    )
    replicas: int | None = Field(default=None, ge=0, description="Replicas serving now.")


class ScaleDirection(StrEnum):
    OUT = "out"
    IN = "in"


class ScaleDecided(Event):
    service: str
    direction: ScaleDirection
    current_replicas: int = Field(ge=0)
    desired_replicas: int = Field(ge=0)
    p95_latency_ms: float
    gpu_memory_pressure: float | None
    samples: int = Field(ge=0, description="Samples in the window that decided.")
    reason: str
