"""The scheduler's settings: timeouts, quotas, pools and their pipelines, what tasks are
handed."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from crater.contracts import (
    RESERVATION_TIMEOUT_MS_DEFAULT,
    RestartPolicy,
    TaskRequest,
)
from crater.scheduler.domain.cluster import (
    NO_OVERCOMMIT,
    Overcommit,
)
from crater.scheduler.domain.demand import PREDICTION_MARGIN
from crater.scheduler.domain.plugins import DEFAULT_PIPELINE, Pipeline
from crater.scheduler.domain.pools import NEVER_RESTART, PoolPolicy
from crater.scheduler.domain.quotas import Queue, Quota, Share, UserLimits

# How long a node may stay silent past its heartbeat timeout before what it holds is given
# back (`node-lost`).
NODE_LOST_SECONDS = 60.0


@dataclass(frozen=True)
class SchedulerConfig:
    pipeline: Pipeline = DEFAULT_PIPELINE
    # how long a placement waits for its node's `running`, unless the task or its pool says
    reservation_timeout_ms: int = RESERVATION_TIMEOUT_MS_DEFAULT
    heartbeat_timeout_seconds: float = 30.0
    token_secret: bytes = b"crater-development-only"
    checkpoint_root: str = "/var/lib/crater/checkpoints"
    quotas: dict[str, Quota] = field(default_factory=dict)
    # elastic tenants (guarantee, borrowing limit, reserved), from the same quotas file
    tenant_shares: dict[str, Share] = field(default_factory=dict)
    # per-user limits inside a tenant (running GPUs, queued tasks, notebooks), same file
    user_limits: dict[str, UserLimits] = field(default_factory=dict)
    # queues above tenants (organisation, department), and the queue each tenant is part of
    queues: dict[str, Queue] = field(default_factory=dict)
    queue_of: dict[str, str] = field(default_factory=dict)
    grace_period_seconds: int = 30
    prediction_margin: float = PREDICTION_MARGIN
    # per pool: its pipeline and over-commit; a pool not named uses `pipeline`, no over-commit
    pools: dict[str, PoolPolicy] = field(default_factory=dict)
    # a waiting task is announced (task.pending) when it starts waiting, then only when the
    # kind of its reason has changed and held this long, and no oftener than this
    pending_interval_seconds: float = 60.0
    # a node silent this long past its heartbeat timeout is lost: its allocations go back
    node_lost_seconds: float = NODE_LOST_SECONDS
    # silence is judged on the heartbeats consumed: when they lag the other events by more
    # than this (their consumer behind, NATS back after an outage), this far behind the clock
    heartbeat_lag_seconds: float = 60.0
    # an unconfirmed reservation expires once the node reports (task.status) consumed reach
    # past its expiry; with none that recent, this much later (a quiet status stream)
    confirmation_lag_seconds: float = 30.0
    # the gateway's public URL, handed to tasks (CRATER_GATEWAY_URL); None: not handed
    gateway_url: str | None = None
    # A task whose launcher confirmed it with its token is failed when its `running` reports
    # (heartbeats) stop for this long, unless the launcher set its own grace.
    task_heartbeat_grace_seconds: float = 60.0
    # Refuse every running/succeeded/failed report that does not carry its allocation's token
    # (the simulated fleet and node agents then must send it); off: only the allocations a
    # launcher confirmed with the token need it.
    require_report_tokens: bool = False
    # Fair share among borrowers: a lender's idle capacity goes first to the cohort mate that
    # borrowed least lately (its dominant share of its mates' capacity, integrated over time
    # and halved every this many seconds), freed capacity to the elastic tenant that held least
    # above its guarantee lately (guarantees.py). None: borrowers in the ordinary queue order.
    borrow_half_life_seconds: float | None = None
    # Lending by phase (phases.py): the replicas on a lender's cards are gone this long after
    # it asks them back; a phase ends by itself after the maximum.
    phase_reclaim_grace_seconds: float = 10.0
    phase_max_seconds: float = 3_600.0
    # No preemption thrashing (preemptor.py): a task is not asked to yield to a higher
    # priority before it has held its grant this long (its pool may say otherwise), nor
    # again within this long of the time it last had to be gone by. 0: no such rule.
    preemption_min_run_seconds: float = 0.0
    preemption_victim_cooldown_seconds: float = 0.0
    # Ageing (waitlist.py): a waiting task ranks `ageing_step` higher in the queue for every
    # `ageing_interval_seconds` it has waited, at most `ageing_max` higher (0 interval: off).
    # Its rank to preempt by stays its own.
    ageing_interval_seconds: float = 0.0
    ageing_step: int = 100
    ageing_max: int = 400
    # Reconciling against reality (reconcile.py): every this many seconds of event time the
    # ledger is checked against itself and against what nodes report running (0: never);
    # an allocation its node has not run, or a task the core does not hold there, for the
    # grace (measured on the node's own reports) is acted on, so normal lag is not.
    reconcile_interval_seconds: float = 30.0
    reconcile_grace_seconds: float = 60.0
    # Scarce capacity kept (fragmentation.held_for_scarce): a task asking no GPU does not
    # take one of the last this many nodes able to hold a scarce multi-card shape the
    # workload asks for, where the pool's pipeline scores fragmentation; it waits, unless it
    # has waited this long already. 0 nodes: off.
    scarce_holders_kept: int = 2
    scarce_hold_max_wait_seconds: float = 600.0

    def restart_for(self, request: TaskRequest) -> RestartPolicy:
        """The task's own restart policy, else its pool's, else never."""
        if request.restart_policy is not None:
            return request.restart_policy
        policy = self.pools.get(request.pool)
        return NEVER_RESTART if policy is None else policy.restart

    def reservation_for(self, request: TaskRequest | None) -> timedelta:
        """The task's own reservation timeout, else its pool's, else the default."""
        ms = self.reservation_timeout_ms
        if request is not None:
            policy = self.pools.get(request.pool)
            if request.reservation_timeout_ms is not None:
                ms = request.reservation_timeout_ms
            elif policy is not None and policy.reservation_timeout_ms is not None:
                ms = policy.reservation_timeout_ms
        return timedelta(milliseconds=ms)

    def run_limit_for(self, request: TaskRequest) -> int | None:
        """The task's time limit in seconds: its own, else its pool's; None: no limit."""
        if request.max_run_seconds is not None:
            return request.max_run_seconds
        policy = self.pools.get(request.pool)
        return None if policy is None else policy.max_run_seconds

    def expected_run_for(self, request: TaskRequest) -> int | None:
        """How long the task is expected to hold its grant, for start estimates: its own
        expected run time, else its time limit (`run_limit_for`); None: unknown."""
        if request.expected_run_seconds is not None:
            return request.expected_run_seconds
        return self.run_limit_for(request)

    def pipeline_for(self, pool: str) -> Pipeline:
        policy = self.pools.get(pool)
        return self.pipeline if policy is None else policy.pipeline

    def cohort_of(self, pool: str) -> tuple[str, ...]:
        """The other pools of `pool`'s cohort, by name (none: it neither lends nor borrows)."""
        policy = self.pools.get(pool)
        if policy is None or policy.cohort is None:
            return ()
        return tuple(
            sorted(
                name
                for name, other in self.pools.items()
                if other.cohort == policy.cohort and name != pool
            )
        )

    def min_run_for(self, pool: str) -> float:
        """How long a task of `pool` runs before a higher priority may preempt it."""
        policy = self.pools.get(pool)
        if policy is None or policy.min_run_seconds is None:
            return self.preemption_min_run_seconds
        return policy.min_run_seconds

    def victim_cooldown_for(self, pool: str) -> float:
        """How long after it had to yield a task of `pool` is not preempted again."""
        policy = self.pools.get(pool)
        if policy is None or policy.victim_cooldown_seconds is None:
            return self.preemption_victim_cooldown_seconds
        return policy.victim_cooldown_seconds

    def overcommit_for(self, pool: str) -> Overcommit:
        policy = self.pools.get(pool)
        return NO_OVERCOMMIT if policy is None else policy.overcommit
