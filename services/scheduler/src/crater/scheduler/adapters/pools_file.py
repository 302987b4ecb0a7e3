"""Pools from a YAML file: per pool, the placement pipeline and the over-commit ratios.

pools:
  training:
    scores: {FieldWeighted: 0.5, TopologyLocality: 0.3, GpuBinPack: 0.2}
  inference:
    filters: [NodeReady, Pool, TaintToleration, GpuCount, GpuMemory, CpuCores, Memory]
    overcommit: {cpu: 2.0, memory: 1.5}      # GPU stays 1 unless set
    restart_policy: {when: [failure, node-lost], max_attempts: 3, backoff_seconds: 10}
    reservation_timeout_ms: 15000            # a placement waits this long for `running`
    cohort: shared                           # lends its idle nodes to the cohort's pools
    lend: {limit: {gpus: 16}, reserved: {cpu_cores: 64}}  # at most 16 GPUs lent; 64 cores never
    borrow: {limit: {gpus: 16}, preempt: lower-priority}  # borrows by preempting lower priorities
  # (a training pool of the same cohort would say `lend: {reclaim: lower-priority}` so that
  # its tasks do not take back what a higher priority borrowed; see docs/pools.md)
    min_run_seconds: 600                     # not preempted in its first 10 minutes
    victim_cooldown_seconds: 900             # nor again within 15 minutes of yielding
    max_run_seconds: 86400                   # time limit of its tasks that state none

A pool left out, or a field left out, keeps the default: every filter, the default scores,
no over-commit, no restart, the scheduler's reservation timeout (a task's own
`restart_policy` and `reservation_timeout_ms` win). `filters` must keep
NodeReady and Pool, the two that no pool can do without. Without `cohort` a pool neither
lends nor borrows; `lend` and `borrow` need one, and their limits left out are unlimited.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from crater.contracts import (
    PRIORITY_MAX,
    PRIORITY_MIN,
    RESERVATION_TIMEOUT_MS_MAX,
    RESERVATION_TIMEOUT_MS_MIN,
    RUN_SECONDS_MAX,
    RestartPolicy,
)
from crater.scheduler.adapters.yaml_spec import SpecError, parse_yaml_spec
from crater.scheduler.domain.cluster import Overcommit
from crater.scheduler.domain.plugins import (
    CONFIGURED_SCORES,
    DEFAULT_PIPELINE,
    FILTERS,
    SCORES,
    Pipeline,
)
from crater.scheduler.domain.pools import PoolPolicy, Reclaim
from crater.scheduler.domain.prewarm import Prewarm
from crater.scheduler.domain.quotas import Quota

REQUIRED_FILTERS = ("NodeReady", "Pool")


class PoolsFileError(SpecError):
    """A pools file that cannot be used, with the field and the reason."""


class _Overcommit(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cpu: float = Field(default=1.0, gt=0, le=64, description="CPU cores promised per core.")
    memory: float = Field(default=1.0, gt=0, le=64, description="Memory promised per byte.")
    gpu: float = Field(default=1.0, gt=0, le=64, description="Cards promised per card.")


class _Limit(BaseModel):
    """An amount of every resource; a resource left out is unlimited."""

    model_config = ConfigDict(extra="forbid")

    gpus: int | None = Field(default=None, ge=0, description="Cards.")
    gpu_memory_mb: int | None = Field(default=None, ge=0, description="GPU memory, MiB.")
    cpu_cores: int | None = Field(default=None, ge=0, description="CPU cores.")
    memory_mb: int | None = Field(default=None, ge=0, description="Host memory, MiB.")
    disk_gb: int | None = Field(default=None, ge=0, description="Disk (ssd.capacity_gb), GB.")

    def quota(self) -> Quota:
        return Quota(self.gpus, self.gpu_memory_mb, self.cpu_cores, self.memory_mb, self.disk_gb)


class _Prewarm(BaseModel):
    """lend only: take lent capacity back ahead of the pool's recurring demand."""

    model_config = ConfigDict(extra="forbid")

    lead_seconds: float = Field(
        gt=0, le=86_400, description="Borrowers yield this far ahead of expected growth."
    )
    lend_ahead_seconds: float = Field(
        default=1200.0, gt=0, le=86_400, description="No new loan that is expected back sooner."
    )
    bucket_seconds: int = Field(
        default=900, ge=60, le=86_400, description="The daily pattern's resolution."
    )
    half_life_days: float = Field(
        default=7.0, gt=0, le=365, description="A past day's peak counts half after this."
    )

    def settings(self) -> Prewarm:
        return Prewarm(
            self.lead_seconds, self.lend_ahead_seconds, self.bucket_seconds, self.half_life_days
        )


class _Loans(BaseModel):
    model_config = ConfigDict(extra="forbid")

    limit: _Limit = Field(default_factory=_Limit)
    keep_idle: _Limit = Field(
        default_factory=_Limit, description="lend only: GPUs kept idle, never lent (gpus only)"
    )
    reserved: _Limit = Field(
        default_factory=_Limit,
        description="lend only: of the pool's capacity, what is never lent (it lends at most "
        "its capacity less this), per resource",
    )
    prewarm: _Prewarm | None = None
    reclaim: Reclaim | None = Field(
        default=None,
        description="lend only: which borrowers the pool's own tasks take back: any (the "
        "default), lower-priority (only borrowers of lower priority than the task taking "
        "back; Kueue's reclaimWithinCohort), never",
    )
    preempt: Literal["never", "lower-priority"] | None = Field(
        default=None,
        description="borrow only: lower-priority: a task its own pool cannot hold even by "
        "preemption has cohort mates' preemptible tasks of lower priority yield and borrows "
        "their room (Kueue's borrowWithinCohort); never (the default)",
    )
    preempt_max_priority: int | None = Field(
        default=None,
        ge=PRIORITY_MIN,
        le=PRIORITY_MAX,
        description="borrow only, with preempt: victims of at most this priority",
    )


class _Pool(BaseModel):
    model_config = ConfigDict(extra="forbid")

    filters: list[str] | None = None
    scores: dict[str, float] | None = None
    args: dict[str, dict[str, Any]] = Field(default_factory=dict)
    overcommit: _Overcommit = Field(default_factory=_Overcommit)
    restart_policy: RestartPolicy = Field(default_factory=RestartPolicy)
    reservation_timeout_ms: int | None = Field(
        default=None, ge=RESERVATION_TIMEOUT_MS_MIN, le=RESERVATION_TIMEOUT_MS_MAX
    )
    cohort: str | None = Field(default=None, min_length=1, max_length=64)
    min_run_seconds: float | None = Field(
        default=None,
        ge=0,
        le=7 * 86_400,
        description="No preemption thrashing: the pool's tasks are not preempted by a higher "
        "priority before they have held their grant this long (default: the scheduler's).",
    )
    victim_cooldown_seconds: float | None = Field(
        default=None,
        ge=0,
        le=7 * 86_400,
        description="No preemption thrashing: a task of the pool told to yield is not "
        "preempted again this long after it had to be gone by (default: the scheduler's).",
    )
    max_run_seconds: int | None = Field(
        default=None,
        ge=1,
        le=RUN_SECONDS_MAX,
        description="Time limit of the pool's tasks that state no max_run_seconds of their "
        "own: told to checkpoint and stop once they have held their grant this long "
        "(default: none). It also stands for their expected run time in start estimates.",
    )
    lend: _Loans | None = None
    borrow: _Loans | None = None

    @model_validator(mode="after")
    def _loans_need_a_cohort(self) -> _Pool:
        if self.cohort is None and (self.lend is not None or self.borrow is not None):
            raise ValueError("lend and borrow need a cohort (the pools that lend each other)")
        if self.borrow is not None and self.borrow.prewarm is not None:
            raise ValueError("prewarm is a lender's: put it under lend")
        if self.borrow is not None and self.borrow.reserved != _Limit():
            raise ValueError("reserved is a lender's: put it under lend")
        if self.borrow is not None and self.borrow.reclaim is not None:
            raise ValueError("reclaim is a lender's: put it under lend")
        if self.lend is not None and (
            self.lend.preempt is not None or self.lend.preempt_max_priority is not None
        ):
            raise ValueError("preempt is a borrower's: put it under borrow")
        if (
            self.borrow is not None
            and self.borrow.preempt_max_priority is not None
            and self.borrow.preempt != "lower-priority"
        ):
            raise ValueError("preempt_max_priority needs preempt: lower-priority")
        return self

    @field_validator("filters")
    @classmethod
    def _known_filters(cls, names: list[str] | None) -> list[str] | None:
        if names is None:
            return None
        unknown = [n for n in names if n not in FILTERS]
        if unknown:
            raise ValueError(f"unknown filter {', '.join(unknown)}; known: {', '.join(FILTERS)}")
        missing = [n for n in REQUIRED_FILTERS if n not in names]
        if missing:
            raise ValueError(f"must include {', '.join(missing)}")
        return names

    @field_validator("scores")
    @classmethod
    def _known_scores(cls, weights: dict[str, float] | None) -> dict[str, float] | None:
        if weights is None:
            return None
        known = [*SCORES, *CONFIGURED_SCORES]
        unknown = [n for n in weights if n not in known]
        if unknown:
            raise ValueError(f"unknown score {', '.join(unknown)}; known: {', '.join(known)}")
        negative = [n for n, w in weights.items() if w < 0]
        if negative:
            raise ValueError(f"negative weight for {', '.join(negative)}")
        return weights

    def policy(self) -> PoolPolicy:
        default_scores = {s.name: s.weight for s in DEFAULT_PIPELINE.scores}
        scores = self.scores if self.scores is not None else default_scores
        idle = [n for n in self.args if n not in scores or n not in CONFIGURED_SCORES]
        if idle:
            raise ValueError(f"{', '.join(idle)} is not a score of this pool that takes arguments")
        pipeline = Pipeline.from_names(
            self.filters if self.filters is not None else list(FILTERS), scores, self.args
        )
        ratios = self.overcommit
        return PoolPolicy(
            pipeline,
            Overcommit(ratios.cpu, ratios.memory, ratios.gpu),
            self.restart_policy,
            self.reservation_timeout_ms,
            cohort=self.cohort,
            lend_limit=(self.lend or _Loans()).limit.quota(),
            borrow_limit=(self.borrow or _Loans()).limit.quota(),
            keep_idle_gpus=(self.lend or _Loans()).keep_idle.gpus or 0,
            reserved=(self.lend or _Loans()).reserved.quota(),
            prewarm=None
            if self.lend is None or self.lend.prewarm is None
            else self.lend.prewarm.settings(),
            reclaim=(self.lend or _Loans()).reclaim or "any",
            borrow_preempts=(self.borrow or _Loans()).preempt == "lower-priority",
            borrow_preempt_max_priority=(self.borrow or _Loans()).preempt_max_priority,
            min_run_seconds=self.min_run_seconds,
            victim_cooldown_seconds=self.victim_cooldown_seconds,
            max_run_seconds=self.max_run_seconds,
        )


class _PoolsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pools: dict[str, _Pool]


def parse_pools(text: str, origin: str = "pools file") -> dict[str, PoolPolicy]:
    spec = parse_yaml_spec(text, _PoolsFile, PoolsFileError, origin)
    policies: dict[str, PoolPolicy] = {}
    for name, pool in spec.pools.items():
        try:
            policies[name] = pool.policy()
        except (TypeError, ValueError) as error:  # plugin arguments the plugin does not take
            raise PoolsFileError(origin, [(f"pools.{name}.args", str(error))]) from error
    traded = [
        (
            f"pools.{name}.borrow.preempt",
            f"cohort mate {mate} takes back whatever the "
            "priority (lend.reclaim: any): the card would go back and forth; set its "
            "lend.reclaim to lower-priority or never",
        )
        for name, policy in sorted(policies.items())
        if policy.borrow_preempts
        for mate, other in sorted(policies.items())
        if mate != name and other.cohort == policy.cohort and other.reclaim == "any"
    ]
    if traded:
        raise PoolsFileError(origin, traded)
    return policies


def load_pools(path: Path) -> dict[str, PoolPolicy]:
    return parse_pools(path.read_text(), str(path))
