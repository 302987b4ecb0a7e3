"""The decision record: what one evaluation is judged on, what it decided, and what one
sample batch left behind."""

from __future__ import annotations

from dataclasses import dataclass

from crater.autoscaler.domain.state import ServiceState
from crater.contracts import (
    Event,
    LatencySamplesReported,
    ScaleDecided,
    ScaleDirection,
    derived_event_id,
)


@dataclass(frozen=True)
class Assessment:
    """What one sample batch left behind: the service's numbers now, and any decision."""

    service: str
    p95_ms: float | None
    samples: int
    pressure: float | None
    replicas: int
    decision: ScaleDecided | None = None
    # The same event was seen before (a redelivery): nothing was counted again, and the
    # decision, if any, is the one taken the first time (same event id, so JetStream drops a
    # second copy).
    duplicate: bool = False
    # What else to publish, after the decision: replicas to place, allocations to release.
    requests: tuple[Event, ...] = ()
    panic: bool = False

    @property
    def events(self) -> tuple[Event, ...]:
        """Everything to publish, in order."""
        return ((self.decision,) if self.decision else ()) + self.requests


@dataclass(frozen=True)
class Evaluation:
    """What a strategy decides on, after a sample batch was recorded."""

    state: ServiceState
    sample: LatencySamplesReported
    now: float
    # The replicas believed now (the latest decision or report).
    current: int
    # (p95, samples) since the last decision within the window; None: no samples.
    evidence: tuple[float, int] | None
    # p95 over the panic window when it is over the panic line; else None.
    panic_p95: float | None
    # No scale-in: in a panic or just after.
    held: bool
    # The highest and the mean pressure of the replicas heard of (None: none known).
    pressure: float | None
    mean_pressure: float | None
    # Time per output token (p95, samples) since the last decision within the window; None:
    # no samples, or no TPOT SLO set.
    tpot: tuple[float, int] | None = None


def decision(
    sample: LatencySamplesReported,
    direction: ScaleDirection,
    current: int,
    desired: int,
    p95: float,
    pressure: float | None,
    count: int,
    reason: str,
    *,
    panic: bool = False,
    proportional: int | None = None,
    limited_by: str | None = None,
) -> ScaleDecided:
    return ScaleDecided(
        # Derived from the sample, so a redelivered sample re-publishes the same id.
        event_id=derived_event_id(sample.event_id, "scale-decided"),
        occurred_at=sample.occurred_at,
        service=sample.service,
        direction=direction,
        current_replicas=current,
        desired_replicas=desired,
        p95_latency_ms=p95,
        gpu_memory_pressure=pressure,
        samples=count,
        reason=reason,
        panic=panic,
        proportional_replicas=proportional,
        limited_by=limited_by,
    )
