"""Whether a running task keeps its `sla.min_gpu_utilization_percent`. Pure: the store keeps
the window; this folds one sample into it.

The rule (docs/prediction.md, "GPU utilisation SLA"): per attempt, the task's own samples
(crater_client.start_monitoring) are weighted by the time they cover. The first `warmup`
seconds after the attempt's first sample do not count (loading data and weights). Samples
fill tumbling windows of `window` seconds; a whole window whose time-weighted mean GPU
utilisation is below the minimum is a breach, said once per attempt. A sample without GPU
readings says nothing about GPU utilisation and is left out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta


@dataclass(frozen=True)
class SlaRule:
    window_seconds: float = 300.0
    warmup_seconds: float = 60.0


@dataclass(frozen=True)
class Window:
    """One attempt's measuring so far: since when, the current window's covered seconds and
    utilisation x seconds, its sample count, the last whole window's mean, and whether a
    breach was said."""

    started_at: datetime
    seconds: float = 0.0
    weighted_sum: float = 0.0
    samples: int = 0
    measured: float | None = None
    breached: bool = False


@dataclass(frozen=True)
class Breach:
    measured: float
    seconds: float
    samples: int


def fold(
    window: Window,
    ended_at: datetime,
    interval_seconds: float,
    utilization: float | None,
    minimum: float,
    rule: SlaRule,
) -> tuple[Window, Breach | None]:
    """The window with one sample (covering `interval_seconds` up to `ended_at`) folded in,
    and the breach it completes, if any (only the first of an attempt)."""
    if utilization is None:
        return window, None
    counts_from = window.started_at + timedelta(seconds=rule.warmup_seconds)
    began = max(ended_at - timedelta(seconds=interval_seconds), counts_from)
    covered = (ended_at - began).total_seconds()
    if covered <= 0:  # wholly inside the warm-up
        return window, None
    window = replace(
        window,
        seconds=window.seconds + covered,
        weighted_sum=window.weighted_sum + utilization * covered,
        samples=window.samples + 1,
    )
    if window.seconds < rule.window_seconds:
        return window, None
    mean = window.weighted_sum / window.seconds
    breach = None
    if mean < minimum and not window.breached:
        breach = Breach(mean, window.seconds, window.samples)
    done = Window(window.started_at, measured=mean, breached=window.breached or breach is not None)
    return done, breach
