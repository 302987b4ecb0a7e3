"""Scheduler wiring: durable consumers for tasks and nodes, queries over request-reply,
the outbox relay, migrations on start."""

from __future__ import annotations

from pathlib import Path

from faststream.asgi import AsgiFastStream
from faststream.nats import DeliverPolicy
from pydantic import Field, SecretStr, model_validator

from crater.contracts import (
    RESERVATION_TIMEOUT_MS_DEFAULT,
    RESERVATION_TIMEOUT_MS_MAX,
    RESERVATION_TIMEOUT_MS_MIN,
    AllocationCheck,
    AllocationGranted,
    AllocationQuery,
    AuditExplainAnswer,
    AuditExplainQuery,
    ConfigApplied,
    ConfigApply,
    GpuCordonRequested,
    NodeHealthReported,
    NodesAnswer,
    NodesQuery,
    NodeTopologyReported,
    PlacementAnswer,
    PlacementQuery,
    PoolsAnswer,
    PoolsQuery,
    QuerySubjects,
    ReplicaReleaseRequested,
    ReplicasRequested,
    Subjects,
    TaskPhaseReported,
    TaskPlacementAnswer,
    TaskPlacementQuery,
    TaskProfiled,
    TasksAnswer,
    TasksQuery,
    TaskStatusReported,
    TenantBudgetExceeded,
    TenantBudgetRestored,
)
from crater.runtime.batches import Outcome, Received, batch_durable
from crater.runtime.bus import durable
from crater.runtime.leadership import (
    LeaderGate,
    Leadership,
    LeaseSettings,
    default_holder,
    epoch_header,
    leadership_gauges,
    open_lease,
)
from crater.runtime.outbox import OutboxRelay
from crater.runtime.service import Service, create_service, serve
from crater.runtime.settings import ServiceSettings
from crater.scheduler.adapters.config_watch import ConfigWatch
from crater.scheduler.adapters.orm import outbox
from crater.scheduler.adapters.pools_file import load_pools
from crater.scheduler.adapters.quotas_file import load_quotas
from crater.scheduler.audit import SNAPSHOT_EVERY, AuditLog, load_private_key
from crater.scheduler.domain.core import NODE_LOST_SECONDS, SchedulerConfig
from crater.scheduler.domain.inputs import ReservationArmed
from crater.scheduler.domain.quotas import TenantQuotas
from crater.scheduler.service_layer.cluster_metrics import ClusterSeries
from crater.scheduler.service_layer.handlers import SchedulerMetrics, SchedulerService

MIGRATIONS_DIR = Path(__file__).parent / "adapters" / "migrations"
DEVELOPMENT_TOKEN_SECRET = "crater-development-only"
MIN_TOKEN_SECRET_BYTES = 32


class SchedulerSettings(ServiceSettings, LeaseSettings):
    service = "scheduler"
    default_port = 9103  # health and metrics when http_port is 0

    reservation_timeout_ms: int = Field(
        default=RESERVATION_TIMEOUT_MS_DEFAULT,
        ge=RESERVATION_TIMEOUT_MS_MIN,
        le=RESERVATION_TIMEOUT_MS_MAX,
        description="How long a placement waits for its node to report the task running "
        "before it is released (expired), in ms, as AllData's crater.reservation-timeout-ms "
        "(15000 suggested under 50 nodes, 45000 over 200). A pool's reservation_timeout_ms "
        "(pools file) and a task's own override it.",
    )
    reservation_seconds: int | None = Field(
        default=None,
        ge=1,
        le=RESERVATION_TIMEOUT_MS_MAX // 1000,
        description="Deprecated: the same in seconds, still read when RESERVATION_TIMEOUT_MS "
        "is not set; setting both is refused.",
    )
    gateway_url: str | None = Field(
        default=None,
        pattern=r"^https?://[^\s/]+",
        description="The gateway's URL as tasks reach it, handed to them (CRATER_GATEWAY_URL) "
        "to post their usage samples to; unset: not handed.",
    )
    heartbeat_timeout_seconds: float = Field(
        default=30.0, gt=0, description="A node silent this long is NotReady."
    )
    heartbeat_batch: int = Field(
        default=512,
        ge=1,
        le=10_000,
        description="The most node heartbeats decided and committed together (the node-health "
        "consumer's pull batch; consumer_batch for the rest): a fleet sends many, each costs "
        "little beside its commit, and a heartbeat stream that falls behind by more than "
        "heartbeat_lag_seconds has live nodes judged silent.",
    )
    heartbeat_batch_wait_seconds: float = Field(
        default=0.25,
        ge=0,
        le=5,
        description="How long a batch of node heartbeats waits to fill (heartbeat_batch) "
        "before it is decided and committed: heartbeats are many, spread out and cheap one "
        "by one, a commit is not (one for many); 0: each batch as it comes. Keep it well "
        "under heartbeat_timeout_seconds.",
    )
    token_secret: SecretStr = Field(
        default=SecretStr(DEVELOPMENT_TOKEN_SECRET),
        description="Signs and checks reservation tokens (only the scheduler does: the gateway "
        f"asks it): at least {MIN_TOKEN_SECRET_BYTES} random bytes (`openssl rand -base64 48`); "
        "the default is refused outside development.",
    )
    task_heartbeat_grace_seconds: float = Field(
        default=60.0,
        ge=5,
        le=86_400,
        description="A task whose launcher confirmed it with its reservation token is failed "
        "(`no heartbeat for N s`) when its running reports stop this long; a launcher may set "
        "its own (heartbeat_grace_seconds on its running report).",
    )
    require_report_tokens: bool = Field(
        default=False,
        description="Refuse every task running/succeeded/failed report without its "
        "allocation's reservation token (node agents must send it); off: only allocations a "
        "launcher confirmed with the token need it.",
    )
    checkpoint_root: str = Field(default="/var/lib/crater/checkpoints")
    grace_period_seconds: int = Field(
        default=30, ge=0, description="Time a preempted task has to checkpoint and stop."
    )
    prediction_margin: float = Field(
        default=0.10, ge=0, le=2, description="Headroom placed over a predicted memory peak."
    )
    phase_reclaim_grace_seconds: float = Field(
        default=10.0,
        ge=0,
        le=3_600,
        description="Lending by phase: when a task asks its GPUs back, the inference replicas "
        "on them must be gone within this long (then they are released).",
    )
    phase_max_seconds: float = Field(
        default=3_600.0,
        gt=0,
        le=7 * 86_400,
        description="Lending by phase: a CPU phase longer than this ends by itself (its "
        "cards are taken back as if the task had asked).",
    )
    preemption_min_run_seconds: float = Field(
        default=0.0,
        ge=0,
        le=7 * 86_400,
        description="No preemption thrashing: a task is not preempted by a higher priority "
        "before it has held its grant this long (a pool may set its own, min_run_seconds); "
        "reclaims of lent or guaranteed capacity are not held back. 0: off.",
    )
    preemption_victim_cooldown_seconds: float = Field(
        default=0.0,
        ge=0,
        le=7 * 86_400,
        description="No preemption thrashing: a task told to yield is not preempted again by "
        "a higher priority within this long after it had to be gone by (a pool may set its "
        "own, victim_cooldown_seconds). 0: off.",
    )
    ageing_interval_seconds: float = Field(
        default=0.0,
        ge=0,
        le=7 * 86_400,
        description="Ageing: a waiting task ranks ageing_step higher in the queue for every "
        "this long it has waited (at most ageing_max higher), so large tasks are not starved "
        "behind a stream of small ones; its rank to preempt by stays its own. 0: off.",
    )
    ageing_step: int = Field(
        default=100, ge=1, le=1000, description="Ageing: priority gained per interval waited."
    )
    reconcile_interval_seconds: float = Field(
        default=30.0,
        ge=0,
        le=86_400,
        description="Reconciling against reality: every this many seconds of event time the "
        "ledger is checked against itself and against what nodes report running (their "
        "heartbeats' inventory): orphaned allocations released, unknown ones' cards blocked, "
        "over-capacity reported, running figures corrected, each an allocation.drift event. "
        "0: off.",
    )
    reconcile_grace_seconds: float = Field(
        default=60.0,
        ge=1,
        le=86_400,
        description="Reconciling against reality: how long, on the node's own reports, an "
        "allocation must be missing from its node's inventory before it is released "
        "(orphaned), or a task the scheduler does not hold be reported there before its "
        "cards are blocked; longer than a release takes to stop a task and a report to cross "
        "the streams.",
    )
    ageing_max: int = Field(
        default=400, ge=0, le=1000, description="Ageing: the most priority a wait adds."
    )
    scarce_holders_kept: int = Field(
        default=2,
        ge=0,
        le=1000,
        description="Scarce capacity kept: a task asking no GPU does not take one of the last "
        "this many nodes able to hold a multi-card shape of the workload seen that most nodes "
        "cannot hold (eight cards and 120 cores, say); it waits for other room, with the "
        "reason HeldForScarceWork (pools whose pipeline scores Fragmentation). 0: off.",
    )
    scarce_hold_max_wait_seconds: float = Field(
        default=600.0,
        ge=0,
        le=7 * 86_400,
        description="Scarce capacity kept: a task asking no GPU that has waited this long "
        "takes any node, held or not, so a hold for work that may not come starves nothing.",
    )
    estimate_interval_seconds: float = Field(
        default=10.0,
        ge=0,
        le=3_600,
        description="Start estimates of waiting tasks (tasks query, crater tasks) are "
        "computed when asked for, at most once per this long (the core run forward on a "
        "copy of its state; its cost grows with the running and waiting tasks). 0: on "
        "every query.",
    )
    estimate_tell_interval_seconds: float = Field(
        default=300.0,
        ge=0,
        le=86_400,
        description="How often the leader looks for waiting tasks whose start estimate is "
        "news (first known, or its start moved by more than 60 s and a quarter of the wait "
        "told) and tells them on task.estimated: a `pending` webhook with the queue position "
        "and estimated start. Each look runs the forecast (see estimate_interval_seconds). "
        "0: never.",
    )
    pending_interval_seconds: float = Field(
        default=60.0,
        ge=0,
        le=86_400,
        description="A waiting task's task.pending (and webhook) is sent when it starts waiting, "
        "then only when the kind of its reason changed and held this long, and no oftener.",
    )
    node_lost_seconds: float = Field(
        default=NODE_LOST_SECONDS,
        ge=0,
        le=86_400,
        description="Grace after a node's heartbeat timeout: then its allocations are released "
        "(node-lost) and their tasks retried or failed.",
    )
    heartbeat_lag_seconds: float = Field(
        default=60.0,
        ge=0,
        le=3_600,
        description="Silence is measured against the heartbeats consumed; when they lag the "
        "other events more than this (NATS back after an outage), this far behind the clock.",
    )
    confirmation_lag_seconds: float = Field(
        default=30.0,
        ge=0,
        le=3_600,
        description="An unconfirmed reservation expires once task reports of its expiry time "
        "are in; with none that recent, this much after its expiry.",
    )
    max_clock_skew_seconds: float = Field(
        default=30.0,
        gt=0,
        le=86_400,
        description="Events dated further ahead of this clock are refused: they would move "
        "the core's clock for good.",
    )
    quotas_file: Path | None = Field(
        default=None,
        description="YAML (or JSON): tenants: {NAME: {gpus, gpu_memory_mb, cpu_cores, "
        "memory_mb, disk_gb}} for a hard limit, or {NAME: {guarantee: {...}, borrow: {...}, "
        "reserved: {...}}} for an elastic quota (docs/pools.md); with per_user: "
        "{running_gpus, queued_tasks, notebooks} and users: {USER: {...}}, limits per user "
        "inside the tenant; queues: {NAME: {limit: {...}, tenants: [...], queues: {...}}} "
        "for nested queues above tenants (docs/queues.md); reloaded on change, and "
        "replaceable over the API (PUT /api/v1/admin/quotas).",
    )
    pools_file: Path | None = Field(
        default=None,
        description="YAML: pools: {NAME: {filters: [...], scores: {PLUGIN: weight}, "
        "overcommit: {cpu, memory, gpu}, restart_policy: {...}, reservation_timeout_ms, "
        "cohort, lend: {limit, keep_idle, reserved, prewarm, reclaim}, "
        "borrow: {limit, preempt, preempt_max_priority}, "
        "min_run_seconds, victim_cooldown_seconds, max_run_seconds}} "
        "(docs/pools.md); unset: every filter, default scores, no over-commit, the default "
        "timeout, no lending. Reloaded on change, and replaceable over the API "
        "(PUT /api/v1/admin/pools).",
    )
    borrow_half_life_seconds: float | None = Field(
        default=None,
        gt=0,
        description="Fair share among borrowers (docs/pools.md): a lender's idle capacity "
        "goes first to the cohort mate that borrowed least lately, and freed capacity to the "
        "elastic tenant that held least above its guarantee lately, each one's dominant share "
        "integrated over time and halved every this many seconds; unset: the queue order.",
    )
    task_metrics_limit: int = Field(
        default=1000,
        ge=0,
        le=1_000_000,
        description="/metrics has a crater_task_wait_seconds series for at most this many "
        "waiting tasks (the longest waiting); the rest are counted in "
        "crater_scheduler_waiting_tasks_not_exported.",
    )
    config_reload_seconds: float = Field(
        default=5.0,
        gt=0,
        le=3600,
        description="How often, at most, the pools and quotas files are checked for a change "
        "(modification time and size, on the decision cycle); a change is validated, then "
        "applied without a restart, or refused (logged, counted) keeping the running one.",
    )

    audit_signing_key: SecretStr | None = Field(
        default=None,
        description="Ed25519 private key (PEM, PKCS#8; `crater audit keygen`) that signs the "
        "audit log's checkpoints (or CRATER_SCHEDULER_AUDIT_SIGNING_KEY_FILE); unset: the "
        "chain is kept, no checkpoint is signed.",
    )
    audit_checkpoint_every: int = Field(
        default=1_000,
        ge=1,
        le=10_000_000,
        description="A signed checkpoint of the audit log every this many records.",
    )
    audit_snapshot_every: int = Field(
        default=SNAPSHOT_EVERY,
        ge=0,
        le=10_000_000,
        description="A snapshot of the scheduling core's whole state in the audit log every "
        "this many inputs (records; a heartbeat run's heartbeats each) (a replay from --from "
        "starts at the one before it instead of the log's beginning); 0: none but those taken "
        "when the state is loaded.",
    )
    audit_snapshot_min_seconds: float = Field(
        default=60.0,
        ge=0,
        le=86_400,
        description="...but no periodic snapshot within this many seconds (of the core's "
        "time) of the last: a snapshot's cost grows with the fleet (about 0.3 ms of CPU per "
        "node) and a large fleet's heartbeats alone write thousands of records a second; "
        "0: every audit_snapshot_every records.",
    )
    audit_retention_days: float | None = Field(
        default=None,
        gt=0,
        description="`crater audit prune` drops audit records decided longer ago than this; "
        "unset: kept for ever (independent of the streams' limits).",
    )

    @model_validator(mode="after")
    def _one_reservation_timeout(self) -> SchedulerSettings:
        """The old seconds setting still works alone; with the new one it is ambiguous."""
        if self.reservation_seconds is None:
            return self
        if "reservation_timeout_ms" in self.model_fields_set:
            raise ValueError(
                "reservation_seconds: set reservation_timeout_ms alone (reservation_seconds "
                "is its deprecated form in seconds)"
            )
        self.reservation_timeout_ms = self.reservation_seconds * 1000
        return self

    def unsafe_defaults(self) -> list[str]:
        secret = self.token_secret.get_secret_value()
        variable = self.variable("token_secret")
        if secret == DEVELOPMENT_TOKEN_SECRET:
            why = "is the development default"
        elif len(secret.encode()) < MIN_TOKEN_SECRET_BYTES:
            why = f"is shorter than {MIN_TOKEN_SECRET_BYTES} bytes"
        else:
            return []
        return [
            f"token_secret {why}: set {variable} (or {variable}_FILE) to at least "
            f"{MIN_TOKEN_SECRET_BYTES} random bytes"
        ]


def scheduler_config(settings: SchedulerSettings) -> SchedulerConfig:
    """The core's configuration from the settings: the service's, and an audit replay's."""
    tenants = load_quotas(settings.quotas_file) if settings.quotas_file else TenantQuotas()
    return SchedulerConfig(
        reservation_timeout_ms=settings.reservation_timeout_ms,
        gateway_url=settings.gateway_url,
        heartbeat_timeout_seconds=settings.heartbeat_timeout_seconds,
        token_secret=settings.token_secret.get_secret_value().encode(),
        checkpoint_root=settings.checkpoint_root,
        quotas=tenants.limits,
        tenant_shares=tenants.shares,
        user_limits=tenants.users,
        queues=tenants.queues,
        queue_of=tenants.queue_of,
        pools=load_pools(settings.pools_file) if settings.pools_file else {},
        grace_period_seconds=settings.grace_period_seconds,
        prediction_margin=settings.prediction_margin,
        pending_interval_seconds=settings.pending_interval_seconds,
        node_lost_seconds=settings.node_lost_seconds,
        heartbeat_lag_seconds=settings.heartbeat_lag_seconds,
        confirmation_lag_seconds=settings.confirmation_lag_seconds,
        task_heartbeat_grace_seconds=settings.task_heartbeat_grace_seconds,
        require_report_tokens=settings.require_report_tokens,
        borrow_half_life_seconds=settings.borrow_half_life_seconds,
        phase_reclaim_grace_seconds=settings.phase_reclaim_grace_seconds,
        phase_max_seconds=settings.phase_max_seconds,
        preemption_min_run_seconds=settings.preemption_min_run_seconds,
        preemption_victim_cooldown_seconds=settings.preemption_victim_cooldown_seconds,
        ageing_interval_seconds=settings.ageing_interval_seconds,
        ageing_step=settings.ageing_step,
        ageing_max=settings.ageing_max,
        reconcile_interval_seconds=settings.reconcile_interval_seconds,
        reconcile_grace_seconds=settings.reconcile_grace_seconds,
        scarce_holders_kept=settings.scarce_holders_kept,
        scarce_hold_max_wait_seconds=settings.scarce_hold_max_wait_seconds,
    )


def audit_log(settings: SchedulerSettings) -> AuditLog:
    """The audit log's writer, signing checkpoints when the operator gave a key."""
    key = settings.audit_signing_key
    return AuditLog(
        signing_key=load_private_key(key.get_secret_value()) if key is not None else None,
        checkpoint_every=settings.audit_checkpoint_every,
        snapshot_every=settings.audit_snapshot_every or None,
        snapshot_min_seconds=settings.audit_snapshot_min_seconds or None,
    )


def build(settings: SchedulerSettings | None = None) -> tuple[Service, AsgiFastStream]:
    settings = settings or SchedulerSettings()
    service = create_service("scheduler", settings)
    sessions = service.database(MIGRATIONS_DIR)
    relay = OutboxRelay(sessions, outbox, service.broker)
    core = SchedulerService(
        sessions,
        relay,
        scheduler_config(settings),
        SchedulerMetrics(service.registry),
        service.rejections,
        settings.max_clock_skew_seconds,
        audit_log(settings),
        ConfigWatch(settings.pools_file, settings.quotas_file, settings.config_reload_seconds),
        estimate_interval_seconds=settings.estimate_interval_seconds,
        estimate_tell_interval_seconds=settings.estimate_tell_interval_seconds,
    )
    service.registry.register(ClusterSeries(lambda: core.scheduler, settings.task_metrics_limit))
    broker, name, batch = service.broker, service.name, settings.consumer_batch
    # Only the leader consumes and answers: a standby binds nothing (leadership, below).
    gate = LeaderGate(broker)
    leader = gate.router

    # The hot path, a pull batch at a time (crater.runtime.batches): decided and committed in
    # one pass and one transaction, each message acked once its commit is done; the rest
    # (rarer: scaling, budgets) one message at a time.
    @batch_durable(broker, Subjects.TASK_PROFILED, name, batch=batch)
    async def on_task_profiled(received: list[Received[TaskProfiled]]) -> list[Outcome]:
        return await core.handle_batch("task-profiled", [(r.event, r.trace) for r in received])

    @batch_durable(broker, Subjects.TASK_STATUS, name, batch=batch)
    async def on_task_status(received: list[Received[TaskStatusReported]]) -> list[Outcome]:
        return await core.handle_batch("task-status", [(r.event, r.trace) for r in received])

    # Lending by phase: a task enters or leaves a CPU phase (phases.py).
    @durable(broker, Subjects.TASK_PHASE, name, batch=batch, router=leader)
    async def on_task_phase(event: TaskPhaseReported) -> None:
        await core.handle(event, "task-phase")

    # From new grants on: allocations granted before this consumer existed count as armed.
    @batch_durable(
        broker,
        Subjects.ALLOCATION_GRANTED,
        name,
        batch=batch,
        name="own-grants",
        deliver_policy=DeliverPolicy.NEW,
    )
    async def on_own_grant(received: list[Received[AllocationGranted]]) -> list[Outcome]:
        # Its own grant, read back: the stream's time of it is when its node could know.
        armed = [(ReservationArmed.of(r.event, r.stored_at), r.trace) for r in received]
        return await core.handle_batch("own-grants", armed)

    # Every node's reports: heartbeats are as many as the nodes, every few seconds.
    @batch_durable(broker, Subjects.NODE_TOPOLOGY, name, batch=batch)
    async def on_node_topology(received: list[Received[NodeTopologyReported]]) -> list[Outcome]:
        return await core.handle_batch("node-topology", [(r.event, r.trace) for r in received])

    @batch_durable(
        broker,
        Subjects.NODE_HEALTH,
        name,
        batch=settings.heartbeat_batch,
        linger=settings.heartbeat_batch_wait_seconds,
    )
    async def on_node_health(received: list[Received[NodeHealthReported]]) -> list[Outcome]:
        return await core.handle_batch("node-health", [(r.event, r.trace) for r in received])

    for consumer in (
        on_node_topology,
        on_node_health,
        on_task_profiled,
        on_task_status,
        on_own_grant,
    ):
        gate.add(consumer)

    @durable(broker, Subjects.SCALE_REPLICAS_REQUESTED, name, batch=batch, router=leader)
    async def on_replicas_requested(event: ReplicasRequested) -> None:
        await core.request_replicas(event, "replicas-requested")

    @durable(broker, Subjects.SCALE_RELEASE_REQUESTED, name, batch=batch, router=leader)
    async def on_release_requested(event: ReplicaReleaseRequested) -> None:
        await core.handle(event, "release-requested")

    # A tenant's hard budget passed holds its work not yet placed; within it again, it goes.
    @durable(broker, Subjects.TENANT_BUDGET_EXCEEDED, name, batch=batch, router=leader)
    async def on_budget_exceeded(event: TenantBudgetExceeded) -> None:
        await core.handle(event, "budget-exceeded")

    @durable(broker, Subjects.TENANT_BUDGET_RESTORED, name, batch=batch, router=leader)
    async def on_budget_restored(event: TenantBudgetRestored) -> None:
        await core.handle(event, "budget-restored")

    # An operator cordons a card, or lifts its cordon (crater cordon / uncordon).
    @durable(broker, Subjects.NODE_CORDON, name, batch=batch, router=leader)
    async def on_node_cordon(event: GpuCordonRequested) -> None:
        await core.handle(event, "node-cordon")

    @leader.subscriber(QuerySubjects.NODES, title="scheduler-query-nodes")
    async def on_nodes_query(event: NodesQuery) -> NodesAnswer:
        return NodesAnswer(nodes=core.nodes(event.pool))

    @leader.subscriber(QuerySubjects.POOLS, title="scheduler-query-pools")
    async def on_pools_query(event: PoolsQuery) -> PoolsAnswer:
        return core.pools(event)

    @leader.subscriber(QuerySubjects.CONFIG_APPLY, title="scheduler-admin-config-apply")
    async def on_config_apply(event: ConfigApply) -> ConfigApplied:
        return await core.apply_config(event)

    @leader.subscriber(QuerySubjects.PLACEMENT, title="scheduler-query-placement")
    async def on_placement_query(event: PlacementQuery) -> PlacementAnswer:
        return core.dry_run(event)

    @leader.subscriber(QuerySubjects.TASK_PLACEMENT, title="scheduler-query-task-placement")
    async def on_task_placement_query(event: TaskPlacementQuery) -> TaskPlacementAnswer:
        return core.dry_run_task(event)

    @leader.subscriber(QuerySubjects.ALLOCATION, title="scheduler-query-allocation")
    async def on_allocation_query(event: AllocationQuery) -> AllocationCheck:
        return await core.check_allocation(event)

    @leader.subscriber(QuerySubjects.AUDIT_EXPLAIN, title="scheduler-query-audit-explain")
    async def on_audit_explain_query(event: AuditExplainQuery) -> AuditExplainAnswer:
        return await core.explain(event)

    @leader.subscriber(QuerySubjects.TASKS, title="scheduler-query-tasks")
    async def on_tasks_query(event: TasksQuery) -> TasksAnswer:
        return TasksAnswer(tasks=await core.tasks(event))

    async def lead(epoch: int) -> None:
        """Taking over: the fence first (a deposed leader's commits are refused from now),
        then the state as committed, then consume, answer and publish."""
        await core.take_over(epoch, holder)
        relay.headers = epoch_header(name, epoch)
        await gate.open()
        relay.start()

    async def step_down() -> None:
        core.epoch = None
        await core.stop_telling()
        await gate.close()
        await relay.stop(flush=False)

    holder = default_holder(name)

    async def elect() -> None:  # once the broker is connected
        lease = await open_lease(
            broker, name, settings.lease_timing, settings.stream_replicas, holder
        )
        leadership = Leadership(lease, lead, step_down, leadership_gauges(service.registry))
        core.on_deposed = leadership.lost
        service.leadership = leadership
        await leadership.start()

    async def resign() -> None:
        # Consume no more, publish what was committed, and only then hand the lease back.
        await gate.close()
        await core.stop_telling()
        await relay.stop(flush=core.epoch is not None)
        core.epoch = None
        if service.leadership is not None:
            await service.leadership.stop()

    service.after_startup.append(elect)
    service.on_shutdown.append(resign)
    service.state = core
    return service, service.asgi()


def create_app() -> AsgiFastStream:
    """For `faststream run --factory crater.scheduler.app:create_app`."""
    return build()[1]


def main() -> None:
    service, app = build()
    serve(app, service)


if __name__ == "__main__":
    main()
