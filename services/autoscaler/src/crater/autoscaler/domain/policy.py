"""Autoscaling per inference service, driven only by the events it is fed.

Where each part lives:

- domain/scaling_policy.py: `ScalingPolicy`, each number's one definition (default, bounds,
  description), which the service's settings derive from.
- domain/strategies.py: the strategies, `DemandStrategy` ('demand', the default: the count
  Little's law asks for) and `RuleStrategy` ('rule': the field's rule, scale out when p95 >
  200 ms AND GPU memory pressure > 0.8, in when p95 < 100 ms AND pressure < 0.3), each one
  `decide`.
- domain/guards.py: what every strategy goes through: rate limits, cooldown, panic.
- domain/autoscaler.py: `Autoscaler`, the per-service windows fed by events, the pressure
  sources, the warm pool and drains.
- domain/decision.py: what a decision is judged on (`Evaluation`), the decision record, and
  what a sample batch left behind (`Assessment`).
- domain/state.py: what is remembered of each service between events.

This module keeps the names importable from here.
"""

from crater.autoscaler.domain.autoscaler import ANONYMOUS_REPLICA, Autoscaler, gpu_pressures
from crater.autoscaler.domain.decision import Assessment
from crater.autoscaler.domain.guards import QUANTILE
from crater.autoscaler.domain.scaling_policy import STRATEGIES, ScalingPolicy, Strategy
from crater.autoscaler.domain.strategies import DemandStrategy, RuleStrategy

__all__ = [
    "ANONYMOUS_REPLICA",
    "QUANTILE",
    "STRATEGIES",
    "Assessment",
    "Autoscaler",
    "DemandStrategy",
    "RuleStrategy",
    "ScalingPolicy",
    "Strategy",
    "gpu_pressures",
]
