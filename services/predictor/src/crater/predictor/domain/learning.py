"""Learning from observed peaks: a multiplicative correction per (model family, task type).

Pure: the store reads and writes the numbers; this decides them.
"""

from __future__ import annotations

from dataclasses import dataclass

from crater.contracts import ReleaseReason

# Allocations that never ran, or whose node vanished, say nothing about a task's peak.
UNINFORMATIVE = frozenset({ReleaseReason.EXPIRED, ReleaseReason.NODE_LOST})


@dataclass(frozen=True)
class Track:
    """A correction and its record: samples seen and the sum of absolute percentage errors."""

    factor: float = 1.0
    samples: int = 0
    abs_pct_error_sum: float = 0.0

    @property
    def mape(self) -> float | None:
        """Mean absolute percentage error of the predictions published (corrected)."""
        return self.abs_pct_error_sum / self.samples if self.samples else None


@dataclass(frozen=True)
class Rule:
    alpha: float = 0.3  # weight of the newest observation (exponential moving average)
    minimum: float = 0.25
    maximum: float = 4.0


def learn(track: Track, raw_mb: int, predicted_mb: int, observed_mb: int, rule: Rule) -> Track:
    """Fold one observed peak in: the factor moves toward observed/raw by `alpha` (an
    exponentially weighted mean of the ratios, clamped), and the error of what was actually
    published joins the MAPE."""
    if raw_mb <= 0 or observed_mb <= 0:
        return track
    ratio = observed_mb / raw_mb
    factor = (1 - rule.alpha) * track.factor + rule.alpha * ratio
    factor = min(max(factor, rule.minimum), rule.maximum)
    error = abs(predicted_mb - observed_mb) / observed_mb
    return Track(factor, track.samples + 1, track.abs_pct_error_sum + error)
