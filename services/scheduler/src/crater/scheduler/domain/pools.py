"""A pool's placement policy: its filter and score pipeline and its over-commit ratios."""

from __future__ import annotations

from dataclasses import dataclass

from crater.scheduler.domain.cluster import NO_OVERCOMMIT, Overcommit
from crater.scheduler.domain.plugins import DEFAULT_PIPELINE, Pipeline


@dataclass(frozen=True)
class PoolPolicy:
    pipeline: Pipeline = DEFAULT_PIPELINE
    overcommit: Overcommit = NO_OVERCOMMIT


DEFAULT_POLICY = PoolPolicy()
