"""Read queries answered over NATS request-reply (core NATS, not JetStream): the scheduler owns
cluster and task state, the predictor its memory model, and the gateway and CLI ask them.
Answering one changes nothing anywhere; the one exception, `CONFIG_APPLY` (an operator's new
pools or quotas file, admin only at the gateway), says so in its name."""

from __future__ import annotations

from decimal import Decimal
from typing import Any, Literal

from pydantic import AwareDatetime, Field

from crater.contracts.allocations import ScoreDetail
from crater.contracts.autoscaling import ScaleDecided
from crater.contracts.base import Contract
from crater.contracts.catalog import PREFIX
from crater.contracts.jobs import JobDescription
from crater.contracts.nodes import FabricPlace, NodeCondition, Toleration
from crater.contracts.phases import LendingState
from crater.contracts.tasks import (
    Affinity,
    Confidence,
    FieldError,
    FilterReason,
    Priority,
    ResourcePrediction,
    ResourceRequirements,
    TaskRequest,
    TaskStatus,
    TaskType,
)


class QuerySubjects:
    # answered by the scheduler
    NODES = f"{PREFIX}.query.nodes"
    TASKS = f"{PREFIX}.query.tasks"
    PLACEMENT = f"{PREFIX}.query.placement"
    TASK_PLACEMENT = f"{PREFIX}.query.task-placement"
    ALLOCATION = f"{PREFIX}.query.allocation"
    AUDIT_EXPLAIN = f"{PREFIX}.query.audit-explain"
    POOLS = f"{PREFIX}.query.pools"
    # not a read: applies a new pools or quotas file (the gateway's admin routes)
    CONFIG_APPLY = f"{PREFIX}.admin.config-apply"
    # answered by the predictor
    PREDICTION = f"{PREFIX}.query.prediction"
    RESOLVE = f"{PREFIX}.query.resolve"
    USAGE = f"{PREFIX}.query.usage"
    # answered by the autoscaler
    FLEETS = f"{PREFIX}.query.fleets"
    # answered by the callback
    WEBHOOKS = f"{PREFIX}.query.webhooks"


class NodesQuery(Contract):
    pool: str | None = None


class NodeSummary(Contract):
    node_id: str
    pool: str
    condition: NodeCondition
    gpu_model: str | None
    gpu_memory_mb: int = Field(ge=0, description="Per card.")
    gpus_total: int = Field(ge=0)
    gpus_free: int = Field(ge=0)
    cpu_cores_total: int = Field(ge=0)
    cpu_cores_free: int = Field(ge=0)
    memory_mb_total: int = Field(ge=0)
    memory_mb_free: int = Field(ge=0)
    labels: dict[str, str] = Field(default_factory=dict)
    # Left out of the JSON when empty: answers about nodes without cordons read as before.
    cordoned_gpus: dict[int, str] = Field(
        default_factory=dict,
        exclude_if=lambda cordons: not cordons,
        description="Cards that take no new work, each with why and until what (a fault the "
        "probe reported, or an operator: docs/health.md).",
    )
    cordoned: str | None = Field(
        default=None,
        exclude_if=lambda why: why is None,
        description="Why the whole node takes no new work (a card fault that needs a "
        "reboot); None: it may take work.",
    )
    fabric: FabricPlace | None = Field(
        default=None,
        exclude_if=lambda fabric: fabric is None,  # answers without one read as before
        description="Its place in the network fabric (NVLink domain, leaf, spine); None: "
        "undeclared.",
    )


class NodesAnswer(Contract):
    nodes: list[NodeSummary]


class PoolsQuery(Contract):
    """Each pool's capacity, what is allocated of it and how fragmented it is; the tenants'
    holdings and quotas."""

    pool: str | None = Field(default=None, max_length=63, description="Only this pool.")
    tenant: str | None = Field(
        default=None, max_length=63, description="Only this tenant's holdings and quota."
    )


class Capacity(Contract):
    """One resource of a pool: what its nodes offer (over-commit included) and how much of
    it the allocations held now take."""

    total: float = Field(ge=0)
    allocated: float = Field(ge=0)


class TenantHolding(Contract):
    """What one tenant's tasks of a pool hold now."""

    tenant: str
    gpus: float = Field(ge=0, description="Cards; a shared card counts its share.")
    gpu_memory_mb: int = Field(ge=0, description="GPU memory reserved (per card x cards).")
    cpu_cores: int = Field(ge=0)
    memory_mb: int = Field(ge=0)
    share: float = Field(
        ge=0,
        description="Its dominant share of the pool: the largest fraction of the pool's GPUs, "
        "cores or memory it holds (what orders the queue within a priority, DRF).",
    )


class PoolSummary(Contract):
    pool: str
    nodes: int = Field(ge=0)
    nodes_ready: int = Field(ge=0, description="Ready or Degraded (placeable).")
    gpus: Capacity = Field(
        description="Cards; a shared card counts its share, a MIG-cut one whole."
    )
    gpu_memory_mb: Capacity = Field(
        description="Every card's memory; allocated: what the allocations reserved (the memory "
        "per card their task asked for, or its predicted peak with margin, times its cards)."
    )
    cpu_cores: Capacity
    memory_mb: Capacity
    disk_gb: Capacity = Field(
        description="The nodes' SSD capacity; allocated: what the tasks held here asked for "
        "(ssd.capacity_gb). Disk is checked per node when placing, not reserved."
    )
    gpus_free_whole: int = Field(ge=0, description="Whole cards free now.")
    fragmented_gpus: float | None = Field(
        default=None,
        ge=0,
        description="Free GPU capacity, in cards, that the request shapes seen so far could not "
        "use where it lies (too small a share of a card, too few cards on the node, too little "
        "CPU or memory beside them), weighed by how often each shape is asked for; None: no "
        "GPU request seen yet.",
    )
    fragmentation: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="fragmented_gpus over the free GPU capacity; None: nothing free or no "
        "GPU request seen yet.",
    )
    tasks_waiting: int = Field(ge=0)
    tasks_placed: int = Field(ge=0, description="Tasks holding an allocation in this pool.")
    tenants: list[TenantHolding] = Field(description="Largest share first.")


QuotaResource = Literal["gpus", "gpu_memory_mb", "cpu_cores", "memory_mb", "disk_gb"]


class QuotaUse(Contract):
    resource: QuotaResource
    used: float = Field(description="Held now, across the tenant's tasks in every pool.")
    limit: int | None = Field(
        description="The most the tenant may hold: its hard quota, or an elastic tenant's "
        "cap (guarantee + borrowing limit); None: unlimited."
    )
    guarantee: int | None = Field(
        default=None,
        description="An elastic tenant's guarantee: what it may always hold, taken back from "
        "borrowers when it needs it; None: not elastic in this resource.",
    )
    reserved: int | None = Field(
        default=None,
        description="The part of the guarantee never lent to others; None: none reserved.",
    )
    borrowed: float = Field(
        default=0.0,
        description="What the tenant holds above its guarantee now: reclaimable by owners.",
    )


class TenantQuota(Contract):
    tenant: str
    resources: list[QuotaUse]


class PoolsAnswer(Contract):
    pools: list[PoolSummary] = Field(description="By name.")
    quotas: list[TenantQuota] = Field(
        description="Every tenant with a quota or a holding, by name (quotas files: docs/pools.md)."
    )


ConfigFile = Literal["pools", "quotas"]
CONFIG_TEXT_MAX = 1_048_576  # characters of a pools or quotas file sent over the API


class ConfigApply(Contract):
    """A new pools or quotas file for the scheduler to validate and apply without a restart,
    as if the file had changed on disk (docs/pools.md); the file on disk is not written."""

    file: ConfigFile = Field(description="Which file this replaces.")
    text: str = Field(
        max_length=CONFIG_TEXT_MAX,
        description="The file's content: YAML, or JSON (YAML reads it).",
    )
    requested_by: str | None = Field(
        default=None, max_length=200, description="Who asked (the gateway's caller), logged."
    )


class ConfigApplied(Contract):
    file: ConfigFile
    applied: bool = Field(description="False: refused, the running configuration kept.")
    errors: list[FieldError] = Field(
        default_factory=list, description="Why it was refused: each field and its reason."
    )
    pools: list[str] = Field(default_factory=list, description="The pools configured now.")
    tenants: list[str] = Field(
        default_factory=list, description="The tenants with a quota now (hard or elastic)."
    )
    summary: str


class TasksQuery(Contract):
    task_id: str | None = None
    task_ids: list[str] | None = Field(
        default=None,
        max_length=1000,
        description="Only these tasks, each summary without its history: one question for "
        "many submissions (the gateway's check of known ids).",
    )
    status: TaskStatus | None = None
    limit: int = Field(default=100, ge=1, le=10_000)
    tenant: str | None = Field(default=None, max_length=63, description="Only this tenant's.")
    pool: str | None = Field(default=None, max_length=63, description="Only this pool's.")
    search: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="Only tasks whose id contains this text (any case).",
    )
    # Left out of the JSON when true (the default), so queries read as before.
    estimates: bool = Field(
        default=True,
        exclude_if=lambda wanted: wanted,
        description="Waiting tasks' queue position and estimated start (made at most once "
        "per the scheduler's estimate interval); false: not wanted (the gateway's check of "
        "known ids).",
    )


class AttemptRecord(Contract):
    """One placement of a task (a gang: its first member): where, when, and how it ended."""

    attempt: int = Field(ge=1)
    allocation_id: str
    node: str
    gpu_ids: list[int] = Field(default_factory=list)
    granted_at: AwareDatetime
    released_at: AwareDatetime | None = None
    release_reason: str | None = Field(
        default=None, description="succeeded, failed, expired, node-lost, ...; None: held now."
    )


class HeldAllocation(Contract):
    """What a placed task holds now (a gang: one per member), with the environment to hand
    it: the same as its `scheduled` webhook and AllocationGranted said."""

    allocation_id: str
    node: str
    gpu_ids: list[int] = Field(default_factory=list)
    cpu_cores: list[int] = Field(default_factory=list)
    numa_node: int | None = None
    memory_mb: int = Field(ge=0)
    checkpoint_path: str | None = None
    gang_index: int = Field(default=0, ge=0, description="The member's rank, from 0.")
    attempt: int = Field(default=1, ge=1)
    running: bool = Field(description="Its node reported it running: the reservation holds.")
    reservation_token: str | None = Field(
        default=None,
        description="Its reservation token, as in the grant (CRATER_RESERVATION_TOKEN): what a "
        "launcher confirms it and reports with.",
    )
    reservation_expires_at: AwareDatetime = Field(
        description="Unless running by then, released (expired) at this time."
    )
    environment: dict[str, str] = Field(
        description="The variables to inject into the task's container (docs/"
        "task-environment.md); empty for a placement made before they were kept."
    )


class PredictedPeaks(Contract):
    """The predictor's peaks for a task, in brief (`prediction` has the whole of it)."""

    gpu_memory_per_gpu_mb: int = Field(ge=0, description="Predicted peak per card.")
    host_memory_mb: int = Field(ge=0)
    confidence: Confidence


class TaskSummary(Contract):
    task_id: str
    task_type: TaskType
    status: TaskStatus
    pool: str
    tenant: str
    priority: Priority | int
    gpus: int = Field(ge=0)
    node: str | None = None
    gpu_ids: list[int] = Field(default_factory=list)
    reason: str | None = Field(default=None, description="Why it waits or was rejected.")
    submitted_at: AwareDatetime
    updated_at: AwareDatetime
    attempt: int = Field(default=1, ge=1, description="The attempt now waiting, held or last run.")
    history: list[AttemptRecord] = Field(
        default_factory=list,
        description="Every placement, oldest first; filled when one task is asked for by id.",
    )
    allocations: list[HeldAllocation] = Field(
        default_factory=list,
        description="What it holds now, a gang's members by rank, each with its environment; "
        "filled when one task is asked for by id (GET /api/v1/tasks/{task_id}); empty: "
        "it holds nothing.",
    )
    reasons: list[FilterReason] = Field(
        default_factory=list,
        description="Why a waiting task waits now, per filter, summed over nodes (what `reason` "
        "says in one line); empty for a task that does not wait.",
    )
    predicted: PredictedPeaks | None = Field(
        default=None, description="The predictor's peaks; None: it came without a prediction."
    )
    prediction: ResourcePrediction | None = Field(
        default=None,
        description="The predictor's whole prediction (breakdown, DataLoader settings, "
        "timeline); filled when one task is asked for by id.",
    )
    # A waiting task's place and estimated start (docs/architecture.md, start estimates);
    # left out of the JSON for other tasks, so their answers read as before.
    queue_position: int | None = Field(
        default=None,
        ge=1,
        exclude_if=lambda position: position is None,
        description="A waiting task's place in its pool's queue order (1: next to be tried).",
    )
    estimated_start_at: AwareDatetime | None = Field(
        default=None,
        exclude_if=lambda when: when is None,
        description="When a waiting task is estimated to start if nothing new arrives: the "
        "scheduling core run forward on a copy of its state over the running tasks' expected "
        "ends (expected_run_seconds, else their time limit). None: no estimate (estimate "
        "says why).",
    )
    estimate: str | None = Field(
        default=None,
        exclude_if=lambda text: text is None,
        description="The estimate in words, or why there is none (a task ahead states no run "
        "time), and when it was made.",
    )


class TasksAnswer(Contract):
    tasks: list[TaskSummary]


class PlacementQuery(Contract):
    """A dry run (`crater schedule-test`): where would these resources go, and why not
    elsewhere? Nothing is reserved."""

    resource_requirements: ResourceRequirements
    pool: str = "default"
    affinity: Affinity = Field(default_factory=Affinity)
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Only nodes carrying every one of these labels."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, description="Node taints the task accepts."
    )


class NodeFit(Contract):
    node_id: str
    score: float
    scores: list[ScoreDetail]
    gpu_ids: list[int]
    cpu_cores: list[int]
    numa_node: int | None
    mig_profile: str | None = Field(default=None, description="The MIG slice, on gpu_ids[0].")
    disk: str | None = Field(
        default=None,
        exclude_if=lambda disk: disk is None,  # answers without one read as before
        description="The SSD that would be chosen (the task asks SSD space or speed).",
    )


class NodeMisfit(Contract):
    node_id: str
    filter: str = Field(description="The first filter the node fails.")
    code: str
    reason: str


class PlacementAnswer(Contract):
    fits: list[NodeFit] = Field(description="Best first: the first is where it would go.")
    misfits: list[NodeMisfit]
    summary: str


class TaskPlacementQuery(Contract):
    """A dry run of a whole task: where would it go now, as submitted with this prediction
    (gang, pool, selectors, tolerations, affinities, priority and quota all count)? Nothing is
    queued or reserved."""

    task: TaskRequest
    prediction: ResourcePrediction | None = Field(
        default=None, description="The predictor's, as a real submission would carry."
    )


class MemberPlacement(Contract):
    """Where one member of the task (the task itself when not a gang) would go."""

    member: int = Field(ge=0, description="0 for a task that is not a gang.")
    node_id: str
    score: float
    gpu_ids: list[int]
    cpu_cores: list[int]
    numa_node: int | None
    mig_profile: str | None = None
    disk: str | None = Field(
        default=None,
        exclude_if=lambda disk: disk is None,  # answers without one read as before
        description="The SSD it would be given (the task asks SSD space or speed).",
    )


class TaskPlacementAnswer(PlacementAnswer):
    """`fits`/`misfits` judge each node for what one node must hold (one member, or a
    same-node gang whole); `members` is where the task would really go, every member."""

    outcome: Literal["placed", "waiting", "rejected"] = Field(
        description="placed: it would be granted now; waiting: it would queue (the reasons "
        "say why); rejected: it could never be placed here (`errors`)."
    )
    would_wait: bool
    members: list[MemberPlacement] = Field(
        default_factory=list, description="Every member's node and devices; empty unless placed."
    )
    reasons: list[FilterReason] = Field(
        default_factory=list, description="Why it would wait, per filter."
    )
    errors: list[FieldError] = Field(
        default_factory=list, description="Why it would be rejected, per field."
    )
    gpu_memory_per_gpu_mb: int = Field(ge=0, description="The per-card memory placed on.")
    gpu_memory_source: str = Field(description="requested, or the predicted peak + margin.")


class AuditExplainQuery(Contract):
    """A task's whole story from the scheduler's audit log (docs/audit.md)."""

    task_id: str = Field(min_length=1, max_length=256)
    placements: bool = Field(
        default=True,
        description="Replay the log to each placement: the nodes each filter removed and the "
        "scores of those that remained, as they were then.",
    )
    max_placements: int = Field(
        default=5,
        ge=0,
        le=100,
        description="Replay the first this many placements only; the answer says when there "
        "were more (truncated). `crater audit explain` replays them all.",
    )
    budget_seconds: float = Field(
        default=1.0,
        gt=0,
        le=60,
        description="How long the scheduler may spend; what it could not do in time is left "
        "out and said (truncated), rather than the answer coming too late.",
    )


class AuditStep(Contract):
    """One record of the audit log about the task: an input naming it, or a decision."""

    seq: int = Field(ge=1, le=2**53, description="The record's number in the log.")
    decided_at: str = Field(description="The decision's own time (UTC, ISO 8601).")
    epoch: int | None = Field(description="The leader epoch it was committed under.")
    source: str = Field(description="core, service or leader (docs/audit.md).")
    input_kind: str
    input_occurred_at: str | None
    decision_kind: str | None = Field(description="None: an input naming the task.")
    decision: dict[str, Any] | None = Field(description="The decision as it was published.")
    placement: TaskPlacementAnswer | None = Field(
        default=None,
        description="For a placement: the dry run of the task as things were; None when not "
        "asked, or not replayed (the answer is then truncated, its notes say why).",
    )


class AuditExplainAnswer(Contract):
    task_id: str
    steps: list[AuditStep] = Field(description="In the log's order; empty: never seen.")
    truncated: bool = Field(
        default=False,
        description="Not the whole story: records or placements left out to answer in time "
        "(notes say which); `crater audit explain TASK_ID` tells it all.",
    )
    notes: list[str] = Field(default_factory=list, description="What was left out, and why.")
    records_read: int = Field(
        default=0, ge=0, description="Log records read to find the task's story."
    )
    events_replayed: int = Field(
        default=0, ge=0, description="Inputs replayed to reach the placements."
    )
    replayed_from: list[int] = Field(
        default_factory=list,
        description="The snapshot record each replay started from (0: the log's first record).",
    )


class PredictionQuery(Contract):
    """What the predictor would predict for this task now (learned correction included).
    Nothing is recorded."""

    task: TaskRequest


class PredictionAnswer(Contract):
    prediction: ResourcePrediction | None = Field(
        default=None, description="None when the predictor would refuse the task (errors)."
    )
    errors: list[FieldError] = Field(
        default_factory=list, description="Why the predictor would refuse it, per field."
    )


class ResolveQuery(Contract):
    job: JobDescription


class ResolveAnswer(Contract):
    """A job description resolved into a task request to submit as is."""

    task: TaskRequest | None = Field(default=None, description="None when refused (errors).")
    prediction: ResourcePrediction | None = None
    explanation: str = ""
    errors: list[FieldError] = Field(default_factory=list)


AllocationVerdict = Literal["accepted", "forged", "unknown", "expired", "released"]


class AllocationQuery(Contract):
    """Would the scheduler take a launcher's report about this allocation with this token?"""

    allocation_id: str = Field(min_length=1, max_length=64)
    reservation_token: str = Field(min_length=1, max_length=256)


class AllocationCheck(Contract):
    """The scheduler's verdict on an allocation and a token, by the function that refuses such
    reports on the bus: `accepted` (held, and the token is its own), `forged` (a token that is
    malformed, names another allocation, or was not signed by this scheduler), `unknown` (no
    such allocation), `expired` (its reservation ran out unconfirmed), `released` (it was
    released otherwise: the task ended, was preempted, cancelled, ...)."""

    allocation_id: str
    verdict: AllocationVerdict
    reason: str | None = Field(default=None, description="Why, when not accepted.")
    task_id: str | None = None
    node: str | None = None
    running: bool = Field(default=False, description="Confirmed: it no longer expires.")
    reservation_expires_at: AwareDatetime | None = Field(
        default=None, description="Its real deadline (from when the grant was stored)."
    )
    lending: LendingState | None = Field(
        default=None,
        description="Held now and in a CPU phase: `lent` (its cards may serve replicas) or "
        "`reclaiming` (replicas leave by `must_be_free_by`); None: nothing of it is lent.",
    )
    must_be_free_by: AwareDatetime | None = Field(
        default=None, description="`reclaiming`: when the replicas are gone at the latest."
    )


UsageGrouping = Literal["tenant", "pool", "model", "task"]


class UsageQuery(Contract):
    """Usage of allocations over [since, until): every allocation held in that time counts
    for the part of it inside (one still held, up to `until`)."""

    since: AwareDatetime
    until: AwareDatetime
    by: UsageGrouping = "tenant"
    tenant: str | None = Field(default=None, description="Only this tenant's allocations.")
    hourly: bool = Field(default=False, description="One line per group and UTC hour.")


class UsageLine(Contract):
    """One group's usage (and cost, when a price file is set). Quantities are exact: GPU-
    seconds count each allocation's whole milliseconds times its share of each card."""

    key: str = Field(description="The tenant, pool, GPU model (`-`: none) or task id.")
    hour: AwareDatetime | None = Field(default=None, description="The UTC hour (hourly).")
    allocations: int = Field(ge=0)
    gpu_seconds: Decimal = Field(ge=0, description="GPU-seconds allocated.")
    gpu_hours: Decimal = Field(ge=0, description="gpu_seconds / 3600, to 6 places.")
    idle_gpu_seconds: Decimal = Field(
        ge=0,
        description="Allocated but idle: gpu_seconds x (1 - the task's measured mean GPU "
        "utilisation), over allocations whose task sent usage samples.",
    )
    unmeasured_gpu_seconds: Decimal = Field(
        ge=0, description="GPU-seconds of allocations without any utilisation sample."
    )
    gpu_memory_gib_seconds: Decimal = Field(ge=0, description="GPU memory reserved, GiB-s.")
    cpu_core_seconds: Decimal = Field(ge=0)
    memory_gib_seconds: Decimal = Field(ge=0, description="Host memory granted, GiB-s.")
    cost: Decimal | None = Field(default=None, description="Priced; None: no price file.")


class UsageAnswer(Contract):
    since: AwareDatetime
    until: AwareDatetime
    by: UsageGrouping
    currency: str | None = Field(default=None, description="The price file's; None: none.")
    lines: list[UsageLine]
    total: UsageLine = Field(description="Every line added up (key `total`).")


class FleetsQuery(Contract):
    """The inference fleets the autoscaler scales: each one's figures now and its latest
    decisions (the leader's memory: a restart or a new leader starts them afresh)."""

    service: str | None = Field(default=None, max_length=256, description="Only this fleet.")
    decisions: int = Field(default=10, ge=0, le=100, description="Latest decisions per fleet.")


class FleetSummary(Contract):
    service: str
    replicas: int = Field(ge=0, description="Believed now: the latest decision or report.")
    p95_latency_ms: float | None = Field(
        description="p95 over the window at the latest sample; None: no samples."
    )
    samples: int = Field(ge=0, description="Latencies in that window.")
    gpu_memory_pressure: float | None = Field(
        description="The highest of the replicas heard of within the window (what scale-out "
        "reads); None: none known."
    )
    mean_gpu_memory_pressure: float | None = Field(description="Their mean (what scale-in reads).")
    pressure_source: str | None = Field(
        description="kv-cache (the KV cache their engines report), node-metrics (the GPUs the "
        "replicas hold), samples (their own reports) or mixed."
    )
    panic: bool = Field(description="In panic mode or just after it: no scale-in.")
    warm_pool: list[str] = Field(description="Standby replicas placed (task ids).")
    starting: list[str] = Field(description="Replicas asked for, not yet reporting (task ids).")
    draining: list[str] = Field(description="Replicas draining before their release.")
    last_sample_at: AwareDatetime | None = None
    decisions: list[ScaleDecided] = Field(description="The latest first, with their numbers.")


class FleetsAnswer(Contract):
    strategy: str = Field(description="demand or rule (docs/autoscaling.md).")
    scale_out_p95_ms: float
    scale_out_pressure: float
    scale_in_p95_ms: float
    scale_in_pressure: float
    min_replicas: int
    max_replicas: int
    fleets: list[FleetSummary] = Field(description="By service name.")


WebhookDeliveryState = Literal["pending", "delivered", "dead", "skipped", "superseded"]


class WebhookDeliveriesQuery(Contract):
    """A task's webhook deliveries, as the callback's delivery log holds them (`crater
    webhooks list --task`)."""

    task_id: str = Field(min_length=1, max_length=256)
    limit: int = Field(default=50, ge=1, le=1000)


class WebhookDeliveryRecord(Contract):
    delivery_id: int = Field(description="Its id in the log (`crater webhooks retry ID`).")
    webhook_id: str = Field(description="The `webhook-id` header: the same on every attempt.")
    endpoint: str = Field(description="The endpoint's name; empty: none was configured.")
    task_status: str = Field(description="The status the webhook tells AllData.")
    event_type: str = Field(description="The event it tells of.")
    state: WebhookDeliveryState = Field(
        description="pending (to send, or again), delivered, dead (gave up), skipped (no "
        "endpoint), superseded (never sent: AllData must not hear it, docs/webhooks.md)."
    )
    attempts: int = Field(ge=0)
    round: int = Field(ge=0, description="Rounds of attempts (a retry or replay starts one).")
    last_status_code: int | None = Field(description="The endpoint's last HTTP status.")
    last_error: str | None = Field(description="Why the last attempt failed, or was not made.")
    created_at: AwareDatetime
    updated_at: AwareDatetime
    next_attempt_at: AwareDatetime | None = Field(description="When pending: the next attempt.")


class WebhookDeliveriesAnswer(Contract):
    task_id: str
    deliveries: list[WebhookDeliveryRecord] = Field(description="Newest first.")
