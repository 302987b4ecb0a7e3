"""The guards every strategy shares: the scale-out rate limits, the cooldown, panic detection
and the TPOT SLO's two checks. (The warm pool and drains, which act on what a decision carries
out, are the Autoscaler's.)"""

from __future__ import annotations

import math

from crater.autoscaler.domain.scaling_policy import ScalingPolicy
from crater.autoscaler.domain.state import ServiceState
from crater.contracts import ScaleDirection

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
    """The lowest p95 of the last `panic_windows` consecutive panic windows when every one of
    them is over the panic threshold, on enough samples together; else None. New samples
    only: the windows hold what came after the last decision, and one that ends before it
    fails. Queueing that lasts, not one slow request."""
    if policy.panic_p95_ms is None:
        return None
    width = policy.panic_window_seconds
    judged = state.judged()
    last = -math.inf if state.last_decision_at is None else state.last_decision_at
    lowest, total = math.inf, 0
    for i in range(policy.panic_windows):
        until = now - i * width
        if until <= last:
            return None
        since = max(now - (i + 1) * width, last)
        short = judged.percentile(QUANTILE, since=since, until=until)
        if short is None or short[0] <= policy.panic_p95_ms:
            return None
        lowest, total = min(lowest, short[0]), total + short[1]
    return lowest if total >= policy.min_samples else None


def reversal_held(
    policy: ScalingPolicy,
    state: ServiceState,
    now: float,
    direction: ScaleDirection,
    load: float | None,
) -> str | None:
    """Why a decision the other way from the latest one must wait, or None. Within
    `reversal_window_seconds` of a scale-out, a scale-in needs the load to have fallen by
    more than `scale_in_load_drop` of what it was then; within the window of a scale-in, a
    scale-out needs it to have risen by more than `scale_out_load_rise` (a panic, sustained
    queueing, is not held). So no decision undoes the one before while its cause lasts."""
    last = state.last_direction
    if last is None or last is direction or state.last_decision_at is None:
        return None
    since = now - state.last_decision_at
    if since > policy.reversal_window_seconds:
        return None
    before = state.load_at_decision
    if before is None or load is None:
        moved = False
    elif direction is ScaleDirection.IN:
        moved = load < before * (1 - policy.scale_in_load_drop)
    else:
        moved = load > before * (1 + policy.scale_out_load_rise)
    if moved:
        return None
    margin = (
        f"fallen by {policy.scale_in_load_drop:.0%}"
        if direction is ScaleDirection.IN
        else f"risen by {policy.scale_out_load_rise:.0%}"
    )
    shown = "unknown" if before is None else f"{before:.2f}"
    return (
        f"{since:.0f} s after a scale-{last.value} (window {policy.reversal_window_seconds:g} s), "
        f"the load has not {margin} from {shown}"
    )


def tpot_over(policy: ScalingPolicy, tpot: tuple[float, int] | None) -> float | None:
    """The p95 time per output token since the last decision when a TPOT SLO is set and it
    is over it on at least `min_samples`; else None."""
    line = policy.scale_out_tpot_ms
    if line is None or tpot is None:
        return None
    p95, count = tpot
    return p95 if p95 > line and count >= policy.min_samples else None


def tpot_over_after(
    policy: ScalingPolicy, tpot: tuple[float, int] | None, serving: int, left: int
) -> bool:
    """Whether, with a TPOT SLO set, `left` of the `serving` replicas would carry their load
    with its p95 over the line (it grows with the batch: in proportion)."""
    line = policy.scale_out_tpot_ms
    if line is None or tpot is None or left >= serving:
        return False
    return left <= 0 or tpot[0] * serving / left > line
