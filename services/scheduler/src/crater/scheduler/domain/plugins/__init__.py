"""Placement as a pipeline of small plugins, after the kube-scheduler framework.

`framework`: what a filter and a score are; `filters`, `scores`: the plugins every pool can
name; `baselines`: the paper baselines of the simulator (random, BestFit, FGD), scores that
take arguments; `registry`: every plugin by name; `pipeline`: pipelines composed by name,
the default and the named policies. The names below are the package's public face."""

from crater.scheduler.domain.gpu_match import TRACE_MODEL, model_matches
from crater.scheduler.domain.plugins.baselines import (
    BESTFIT_CPU_SCALE,
    BESTFIT_GPU_SCALE,
    TaskShape,
    bestfit_score,
    fgd_score,
    random_score,
    typical_shapes,
)
from crater.scheduler.domain.plugins.filters import tolerated
from crater.scheduler.domain.plugins.framework import (
    Filter,
    FloatArray,
    Score,
    ScorePlugin,
    plain_score,
)
from crater.scheduler.domain.plugins.pipeline import (
    DEFAULT_PIPELINE,
    POLICIES,
    TIE_BREAK,
    Pipeline,
    policy_pipeline,
)
from crater.scheduler.domain.plugins.registry import (
    CONFIGURED_SCORES,
    FILTERS,
    SCORES,
    judged_field,
)
from crater.scheduler.domain.plugins.scores import FIELD_WEIGHTS

__all__ = [
    "BESTFIT_CPU_SCALE",
    "BESTFIT_GPU_SCALE",
    "CONFIGURED_SCORES",
    "DEFAULT_PIPELINE",
    "FIELD_WEIGHTS",
    "FILTERS",
    "POLICIES",
    "SCORES",
    "TIE_BREAK",
    "TRACE_MODEL",
    "Filter",
    "FloatArray",
    "Pipeline",
    "Score",
    "ScorePlugin",
    "TaskShape",
    "bestfit_score",
    "fgd_score",
    "judged_field",
    "model_matches",
    "plain_score",
    "policy_pipeline",
    "random_score",
    "tolerated",
    "typical_shapes",
]
