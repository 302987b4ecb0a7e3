"""The guards every strategy shares: the scale-out rate limits, the cooldown and panic
detection. (The warm pool and drains, which act on what a decision carries out, are the
Autoscaler's.)"""

from __future__ import annotations

import math

from crater.autoscaler.domain.scaling_policy import ScalingPolicy
from crater.autoscaler.domain.state import ServiceState

QUANTILE = 0.95


def limit_scale_out(
    policy: ScalingPolicy, state: ServiceState, now: float, current: int, wanted: int
) -> tuple[int, str | None]:
    """`wanted` capped by max_replicas and the per-decision and per-period rate limits;
    and the limit that capped it, if one did."""
    limits = [
        (policy.max_replicas, f"max {policy.max_replicas}"),
        (
            max(current + 1, math.floor(current * policy.max_scale_out_factor)),
            f"x{policy.max_scale_out_factor:g} per decision",
        ),
        (period_ceiling(policy, state, now, current), period_label(policy)),
    ]
    desired, limited_by = wanted, None
    for ceiling, label in limits:
        if ceiling < desired:
            desired, limited_by = ceiling, label
    return desired, limited_by


def period_label(policy: ScalingPolicy) -> str:
    return (
        f"+{policy.scale_out_period_replicas} or x{policy.scale_out_period_factor:g} "
        f"per {policy.scale_out_period_seconds:g} s"
    )


def period_ceiling(policy: ScalingPolicy, state: ServiceState, now: float, current: int) -> int:
    while state.growth and state.growth[0][0] <= now - policy.scale_out_period_seconds:
        state.growth.popleft()
    base = min([current, *(before for _, before in state.growth)])
    return max(
        base + policy.scale_out_period_replicas,
        math.floor(base * policy.scale_out_period_factor),
    )


def cooling_down(policy: ScalingPolicy, last: float | None, now: float) -> bool:
    """Within the cooldown after `last` (a decision's time; None: none yet)."""
    return last is not None and now - last < policy.cooldown_seconds


def panic_p95(policy: ScalingPolicy, state: ServiceState, now: float) -> float | None:
    """p95 over the short panic window (new samples only) when it is over the panic
    threshold on enough samples; else None."""
    if policy.panic_p95_ms is None:
        return None
    since = now - policy.panic_window_seconds
    if state.last_decision_at is not None:
        since = max(since, state.last_decision_at)
    short = state.window.percentile(QUANTILE, since=since)
    if short is None or short[1] < policy.min_samples or short[0] <= policy.panic_p95_ms:
        return None
    return short[0]
