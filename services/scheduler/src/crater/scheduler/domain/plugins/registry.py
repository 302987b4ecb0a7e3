"""Every plugin by name: the filters (`filters.ALL`), the scores named by weight alone
(`scores.ALL`) and those that take arguments (`baselines.ALL`). Pipelines, the pools file,
rejections and the generated docs all read them from here."""

from __future__ import annotations

from crater.scheduler.domain.plugins import baselines, filters, scores
from crater.scheduler.domain.plugins.framework import Filter, ScorePlugin

FILTERS: dict[str, Filter] = {f.name: f for f in filters.ALL}
SCORES: dict[str, ScorePlugin] = {s.name: s for s in scores.ALL}
# Plugins that need configuration (the kube-scheduler's plugin args): name -> plugin taking
# the weight and the plugin's arguments.
CONFIGURED_SCORES: dict[str, ScorePlugin] = {s.name: s for s in baselines.ALL}


def judged_field(filter_name: str) -> str:
    """The request field a filter judges, as a rejection names it; the filter's own name
    where it judges none (NodeReady) or is none of the registry's (the core's Backfill)."""
    known = FILTERS.get(filter_name)
    return known.field or filter_name if known is not None else filter_name
