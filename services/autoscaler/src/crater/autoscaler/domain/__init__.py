"""Pure autoscaling logic: no I/O, and no clock (time is the events' occurred_at)."""

from crater.autoscaler.domain.autoscaler import Autoscaler, gpu_pressures
from crater.autoscaler.domain.decision import Assessment
from crater.autoscaler.domain.scaling_policy import ScalingPolicy
from crater.autoscaler.domain.strategies import DemandStrategy, RuleStrategy
from crater.autoscaler.domain.window import LatencyWindow, nearest_rank

__all__ = [
    "Assessment",
    "Autoscaler",
    "DemandStrategy",
    "LatencyWindow",
    "RuleStrategy",
    "ScalingPolicy",
    "gpu_pressures",
    "nearest_rank",
]
