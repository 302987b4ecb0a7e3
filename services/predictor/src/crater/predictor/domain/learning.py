"""Learning from measured use: a multiplicative correction per (model family, task type).

Pure: the store reads and writes the numbers; this decides them.

The rule (README, "How the predictor learns"):
- Only what the task itself used counts: the memory in use on the cards it holds whole
  (`gpu_milli` 1000, no MIG slice), read while it runs (from its `running` report until its
  release), at moments no other allocation holds any of those cards. What was reserved or
  allocated for it never enters: a reservation is the scheduler's answer to the prediction,
  and learning from it would feed the prediction back into itself.
- An observation is the highest such reading; it needs `min_samples` readings. A reading at
  `saturated` of the card or more may be clipped by the card (the task filled it, or ran out
  of memory) and says only "at least", so that observation is set aside.
- The factor moves toward observed / modelled by `alpha` (an exponentially weighted mean),
  at most `max_step` of itself per observation, and stays within [minimum, maximum].
- Predictions apply the factor once `min_observations` observations have been folded in.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from crater.contracts import ReleaseReason

# Allocations that never ran, or whose node vanished, say nothing about a task's peak.
UNINFORMATIVE = frozenset({ReleaseReason.EXPIRED, ReleaseReason.NODE_LOST})
FULL_CARD_MILLI = 1000


class Outcome(StrEnum):
    """What became of one released allocation's readings."""

    LEARNED = "learned"
    UNINFORMATIVE = "uninformative"  # expired or node lost: it never ran, or vanished
    SHARED = "shared"  # a fraction of a card or a MIG slice: the card's use is not its own
    NEVER_RAN = "never-ran"  # no `running` report before the release
    TOO_FEW_SAMPLES = "too-few-samples"
    SATURATED = "saturated"  # a reading at the card's limit: a lower bound, not a peak
    NO_PREDICTION = "no-prediction"  # nothing modelled to correct (unknown or CPU task)


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
    minimum: float = 0.5
    maximum: float = 2.0
    max_step: float = 0.1  # the factor moves at most this share of itself per observation
    min_samples: int = 3  # attributable readings one observation needs
    min_observations: int = 3  # observations before predictions apply the factor
    saturated: float = 0.98  # share of the card at which a reading may be clipped

    def applies(self, track: Track) -> bool:
        return track.samples >= self.min_observations

    def bounded(self, factor: float) -> float:
        """A stored factor within today's range (the range may have been narrowed since)."""
        return min(max(factor, self.minimum), self.maximum)


@dataclass(frozen=True)
class Sample:
    """One metrics report while an allocation was active: the highest memory in use on its
    cards, and that card's size."""

    at: datetime
    used_mb: int
    total_mb: int


@dataclass(frozen=True)
class Held:
    """Another allocation on the same node holding at least one of the same cards."""

    start: datetime
    end: datetime | None  # None: still held


@dataclass(frozen=True)
class Observation:
    peak_mb: int
    samples: int
    saturated: bool = False


def exclusive(gpu_milli: int, mig_profile: str | None) -> bool:
    """Whether the allocation holds its cards whole, so their use is its own."""
    return gpu_milli >= FULL_CARD_MILLI and mig_profile is None


def overlaps(mine: Iterable[int], theirs: Iterable[int]) -> bool:
    return not set(mine).isdisjoint(theirs)


def observe(
    samples: Iterable[Sample],
    running_at: datetime,
    released_at: datetime,
    others: Sequence[Held],
    rule: Rule,
) -> Observation:
    """The task's own peak: readings taken while it ran and held its cards alone."""
    kept = [
        s
        for s in samples
        if running_at <= s.at < released_at
        and not any(h.start <= s.at and (h.end is None or s.at < h.end) for h in others)
    ]
    if not kept:
        return Observation(0, 0)
    saturated = any(s.total_mb and s.used_mb >= rule.saturated * s.total_mb for s in kept)
    return Observation(max(s.used_mb for s in kept), len(kept), saturated)


def judge(observation: Observation, raw_mb: int, rule: Rule) -> Outcome:
    """Whether an observation may be folded into the correction."""
    if raw_mb <= 0:
        return Outcome.NO_PREDICTION
    if observation.samples < rule.min_samples or observation.peak_mb <= 0:
        return Outcome.TOO_FEW_SAMPLES
    if observation.saturated:
        return Outcome.SATURATED
    return Outcome.LEARNED


def learn(track: Track, raw_mb: int, predicted_mb: int, observed_mb: int, rule: Rule) -> Track:
    """Fold one observed peak in: the factor moves toward observed/raw by `alpha`, by at most
    `max_step` of itself, within [minimum, maximum]; the error of what was actually published
    joins the MAPE."""
    if raw_mb <= 0 or observed_mb <= 0:
        return track
    ratio = min(max(observed_mb / raw_mb, rule.minimum), rule.maximum)
    target = (1 - rule.alpha) * track.factor + rule.alpha * ratio
    # one outlier (a misread card, a task that misbehaved) moves the factor a bounded step
    low, high = track.factor / (1 + rule.max_step), track.factor * (1 + rule.max_step)
    factor = min(max(target, low, rule.minimum), high, rule.maximum)
    error = abs(predicted_mb - observed_mb) / observed_mb
    return Track(factor, track.samples + 1, track.abs_pct_error_sum + error)
