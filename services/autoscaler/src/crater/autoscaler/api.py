"""What the autoscaler offers outside its service (`crater autoscale-sim`): its policy and
strategies. The simulator is `crater.autoscaler.sim`."""

from crater.autoscaler.domain import ScalingPolicy
from crater.autoscaler.domain.policy import STRATEGIES
from crater.autoscaler.domain.scaling_policy import Strategy

__all__ = ["STRATEGIES", "ScalingPolicy", "Strategy"]
