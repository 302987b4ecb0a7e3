"""Pure autoscaling logic: no I/O, and no clock (time is the events' occurred_at)."""

from crater.autoscaler.domain.policy import Assessment, Autoscaler, ScalingPolicy, gpu_pressures
from crater.autoscaler.domain.window import LatencyWindow, nearest_rank

__all__ = [
    "Assessment",
    "Autoscaler",
    "LatencyWindow",
    "ScalingPolicy",
    "gpu_pressures",
    "nearest_rank",
]
