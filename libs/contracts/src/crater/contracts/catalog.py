"""Every subject and JetStream stream, defined once. Services import these; nothing else
spells a subject."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from crater.contracts.allocations import (
    AllocationDriftFound,
    AllocationGranted,
    AllocationReleased,
)
from crater.contracts.autoscaling import (
    LatencySamplesReported,
    ReplicaDrained,
    ReplicaReleaseRequested,
    ReplicasRequested,
    ScaleDecided,
)
from crater.contracts.base import Event
from crater.contracts.budgets import TenantBudgetExceeded, TenantBudgetRestored
from crater.contracts.nodes import (
    GpuCordonRequested,
    NodeHealthReported,
    NodeMetricsReported,
    NodeTopologyReported,
)
from crater.contracts.phases import TaskGpusLending, TaskPhaseReported
from crater.contracts.rejections import MessageDeadLettered, MessageRejected, MessageReplayed
from crater.contracts.tasks import (
    TaskEnded,
    TaskEscalated,
    TaskPending,
    TaskPreempted,
    TaskProfiled,
    TaskRejected,
    TaskStartEstimated,
    TaskStatusReported,
    TaskSubmitted,
)
from crater.contracts.usage import TaskUnderutilized, TaskUsageReported
from crater.contracts.webhooks import WebhookDeadLettered, WebhookDelivered

PREFIX = "crater.v1"


class Retention(StrEnum):
    LIMITS = "limits"
    INTEREST = "interest"
    WORK_QUEUE = "workqueue"


@dataclass(frozen=True)
class StreamSpec:
    name: str
    subjects: tuple[str, ...]
    description: str
    retention: Retention = Retention.LIMITS
    max_age_seconds: int = 30 * 86_400
    duplicate_window_seconds: int = 120
    max_msgs_per_subject: int = -1


@dataclass(frozen=True)
class Channel:
    """One subject (or subject family) and the single event type it carries."""

    subject: str
    event: type[Event]
    stream: StreamSpec
    description: str
    node_scoped: bool = False
    producers: tuple[str, ...] = field(default=())
    consumers: tuple[str, ...] = field(default=())

    @property
    def wildcard(self) -> str:
        """The subject to subscribe to: node-scoped subjects end in the node id."""
        return f"{self.subject}.*" if self.node_scoped else self.subject

    @property
    def short_name(self) -> str:
        """The subject without its prefix, dashed: how durable consumers on it are named."""
        return self.subject.removeprefix(f"{PREFIX}.").replace(".", "-")

    def for_node(self, node_id: str) -> str:
        if not self.node_scoped:
            raise ValueError(f"{self.subject} is not node-scoped")
        return f"{self.subject}.{node_id}"


class Streams:
    TASKS = StreamSpec(
        "CRATER_TASKS",
        (f"{PREFIX}.task.>",),
        "Every task's lifecycle: the audit log of what was asked and decided.",
        max_age_seconds=90 * 86_400,
    )
    ALLOCATIONS = StreamSpec(
        "CRATER_ALLOCATIONS",
        (f"{PREFIX}.allocation.>",),
        "Resources granted to and released by tasks.",
        max_age_seconds=90 * 86_400,
    )
    NODE_TOPOLOGY = StreamSpec(
        "CRATER_NODE_TOPOLOGY",
        (f"{PREFIX}.node.topology.*",),
        "The latest hardware topology of each node (one message kept per node).",
        max_msgs_per_subject=1,
        max_age_seconds=0,
    )
    NODE_TELEMETRY = StreamSpec(
        "CRATER_NODE_TELEMETRY",
        (f"{PREFIX}.node.metrics.*", f"{PREFIX}.node.health.*"),
        "Node metrics and health heartbeats; short-lived.",
        max_age_seconds=3_600,
        max_msgs_per_subject=120,
    )
    NODE_CORDONS = StreamSpec(
        "CRATER_NODE_CORDONS",
        (f"{PREFIX}.node.cordon",),
        "Operators' cordons and uncordons of cards: kept, as every decision they change.",
        max_age_seconds=90 * 86_400,
    )
    TASK_USAGE = StreamSpec(
        "CRATER_TASK_USAGE",
        (f"{PREFIX}.usage.>",),
        "What running tasks measured of themselves (crater_client.start_monitoring); short-lived.",
        max_age_seconds=7 * 86_400,
    )
    AUTOSCALING = StreamSpec(
        "CRATER_AUTOSCALING",
        (f"{PREFIX}.inference.>", f"{PREFIX}.scale.>"),
        "Inference latency samples and the scale decisions taken on them.",
        max_age_seconds=7 * 86_400,
    )
    TENANTS = StreamSpec(
        "CRATER_TENANTS",
        (f"{PREFIX}.tenant.>",),
        "What is said of a tenant as a whole: its budget passed, or within it again.",
        max_age_seconds=90 * 86_400,
    )
    WEBHOOKS = StreamSpec(
        "CRATER_WEBHOOKS",
        (f"{PREFIX}.webhook.>",),
        "Outcomes of webhook deliveries to AllData.",
    )
    REJECTIONS = StreamSpec(
        "CRATER_REJECTIONS",
        (f"{PREFIX}.message.rejected",),
        "Messages a consumer could not accept, with the field and the reason.",
        max_age_seconds=7 * 86_400,
    )
    DEAD_LETTERS = StreamSpec(
        "CRATER_DEAD_LETTERS",
        (f"{PREFIX}.message.dead_lettered", f"{PREFIX}.message.replayed"),
        "Messages a consumer gave up on (undecodable, or failing on every delivery up to the "
        "limit), with payload, headers and reason, to inspect and replay; and their replays.",
        max_age_seconds=90 * 86_400,
    )

    ALL: tuple[StreamSpec, ...] = (
        TASKS,
        ALLOCATIONS,
        NODE_TOPOLOGY,
        NODE_TELEMETRY,
        TASK_USAGE,
        AUTOSCALING,
        TENANTS,
        NODE_CORDONS,
        WEBHOOKS,
        REJECTIONS,
        DEAD_LETTERS,
    )


class Subjects:
    NODE_TOPOLOGY = Channel(
        f"{PREFIX}.node.topology",
        NodeTopologyReported,
        Streams.NODE_TOPOLOGY,
        "A node's hardware topology, on start and whenever it changes.",
        node_scoped=True,
        producers=("probe",),
        consumers=("scheduler",),
    )
    NODE_METRICS = Channel(
        f"{PREFIX}.node.metrics",
        NodeMetricsReported,
        Streams.NODE_TELEMETRY,
        "A node's load on an interval.",
        node_scoped=True,
        producers=("probe",),
        consumers=("predictor", "autoscaler"),
    )
    NODE_HEALTH = Channel(
        f"{PREFIX}.node.health",
        NodeHealthReported,
        Streams.NODE_TELEMETRY,
        "A node's health checks on an interval; the scheduler's heartbeat.",
        node_scoped=True,
        producers=("probe",),
        consumers=("scheduler",),
    )
    NODE_CORDON = Channel(
        f"{PREFIX}.node.cordon",
        GpuCordonRequested,
        Streams.NODE_CORDONS,
        "An operator cordons a card of a node, or lifts its cordon (crater cordon).",
        producers=("gateway",),
        consumers=("scheduler",),
    )
    TASK_SUBMITTED = Channel(
        f"{PREFIX}.task.submitted",
        TaskSubmitted,
        Streams.TASKS,
        "AllData asked for a task to be placed.",
        producers=("gateway",),
        consumers=("predictor",),
    )
    TASK_PROFILED = Channel(
        f"{PREFIX}.task.profiled",
        TaskProfiled,
        Streams.TASKS,
        "A task with its predicted peaks, ready to place.",
        producers=("predictor", "scheduler (replicas the autoscaler asked for)"),
        consumers=("scheduler", "probe (simulated fleet: what the task will really use)"),
    )
    TASK_PENDING = Channel(
        f"{PREFIX}.task.pending",
        TaskPending,
        Streams.TASKS,
        "A task waits; the reasons, per filter, summed over nodes.",
        producers=("scheduler",),
        consumers=("callback",),
    )
    TASK_REJECTED = Channel(
        f"{PREFIX}.task.rejected",
        TaskRejected,
        Streams.TASKS,
        "A task that can never be placed, or whose request is invalid.",
        producers=("scheduler", "predictor"),
        consumers=("callback",),
    )
    TASK_PREEMPTED = Channel(
        f"{PREFIX}.task.preempted",
        TaskPreempted,
        Streams.TASKS,
        "A running task must yield its resources after a grace period.",
        producers=("scheduler",),
        consumers=("callback", "probe"),
    )
    TASK_ESCALATED = Channel(
        f"{PREFIX}.task.escalated",
        TaskEscalated,
        Streams.TASKS,
        "A task waited past its max_queue_time_seconds and now ranks one class higher.",
        producers=("scheduler",),
        consumers=("callback",),
    )
    TASK_ESTIMATED = Channel(
        f"{PREFIX}.task.estimated",
        TaskStartEstimated,
        Streams.TASKS,
        "A waiting task's queue position and estimated start, when first known and when it "
        "moves materially (the leader's start-time forecast).",
        producers=("scheduler",),
        consumers=("callback",),
    )
    TASK_ENDED = Channel(
        f"{PREFIX}.task.ended",
        TaskEnded,
        Streams.TASKS,
        "A task's end as the scheduler decided it, exactly once per task: succeeded, failed "
        "or cancelled (task.rejected is the other end).",
        producers=("scheduler",),
        consumers=("callback",),
    )
    TASK_STATUS = Channel(
        f"{PREFIX}.task.status",
        TaskStatusReported,
        Streams.TASKS,
        "A placed task's progress as its node reports it; `cancelled` also from AllData "
        "through the gateway.",
        producers=("probe", "gateway (cancel)"),
        consumers=("scheduler", "callback", "predictor"),
    )
    TASK_PHASE = Channel(
        f"{PREFIX}.task.phase",
        TaskPhaseReported,
        Streams.TASKS,
        "A running task enters (`cpu`) or leaves (`gpu`) a phase in which its GPUs are idle: "
        "they may be lent to inference replicas meanwhile (docs/pools.md, Lending by phase).",
        producers=("gateway (POST /api/v1/tasks/{task_id}/phase)",),
        consumers=("scheduler",),
    )
    TASK_LENDING = Channel(
        f"{PREFIX}.task.lending",
        TaskGpusLending,
        Streams.TASKS,
        "Where the lending of a task's GPUs stands: lent, reclaiming (replicas leaving by a "
        "deadline), returned (its cards are its own again), or refused with the reason.",
        producers=("scheduler",),
    )
    TASK_UNDERUTILIZED = Channel(
        f"{PREFIX}.task.underutilized",
        TaskUnderutilized,
        Streams.TASKS,
        "A running task used its GPUs less than its sla.min_gpu_utilization_percent over a "
        "whole window; once per attempt.",
        producers=("predictor",),
        consumers=("callback",),
    )
    TASK_USAGE = Channel(
        f"{PREFIX}.usage.task",
        TaskUsageReported,
        Streams.TASK_USAGE,
        "A running task's own GPU, memory and IO use, one sample per interval, as "
        "crater_client.start_monitoring() measured it inside the task.",
        producers=("gateway (POST /api/v1/tasks/{task_id}/usage)",),
        consumers=("predictor",),
    )
    ALLOCATION_GRANTED = Channel(
        f"{PREFIX}.allocation.granted",
        AllocationGranted,
        Streams.ALLOCATIONS,
        "A task was placed: node, GPUs, CPU cores, NUMA node, checkpoint path.",
        producers=("scheduler",),
        consumers=(
            "callback",
            "probe",
            "predictor",
            "autoscaler",
            "scheduler (its own grants read back: when the reservation is armed)",
        ),
    )
    ALLOCATION_RELEASED = Channel(
        f"{PREFIX}.allocation.released",
        AllocationReleased,
        Streams.ALLOCATIONS,
        "A task's resources returned to the pool.",
        producers=("scheduler",),
        consumers=("callback", "probe", "predictor", "autoscaler"),
    )
    ALLOCATION_DRIFT = Channel(
        f"{PREFIX}.allocation.drift",
        AllocationDriftFound,
        Streams.ALLOCATIONS,
        "The scheduler's periodic reconciliation found its ledger and a node's reports apart "
        "(an orphaned or unknown allocation, a node held over capacity, running figures off "
        "their allocations' sum), and what it did about it.",
        producers=("scheduler",),
    )
    INFERENCE_LATENCY = Channel(
        f"{PREFIX}.inference.latency",
        LatencySamplesReported,
        Streams.AUTOSCALING,
        "Batches of inference request latencies per service.",
        producers=("inference replicas",),
        consumers=(
            "autoscaler",
            "probe (simulated fleet: a replica's cards hold the memory it reports)",
        ),
    )
    SCALE_DECIDED = Channel(
        f"{PREFIX}.scale.decided",
        ScaleDecided,
        Streams.AUTOSCALING,
        "A decision to add or remove inference replicas, with the numbers behind it.",
        producers=("autoscaler",),
    )
    SCALE_REPLICAS_REQUESTED = Channel(
        f"{PREFIX}.scale.replicas_requested",
        ReplicasRequested,
        Streams.AUTOSCALING,
        "New replicas of an inference service (cold or warm-pool standbys) to place.",
        producers=("autoscaler",),
        consumers=("scheduler",),
    )
    SCALE_REPLICA_DRAINED = Channel(
        f"{PREFIX}.scale.replica_drained",
        ReplicaDrained,
        Streams.AUTOSCALING,
        "A replica named by a scale-in takes no traffic and has finished its requests.",
        producers=("inference replicas",),
        consumers=("autoscaler",),
    )
    SCALE_RELEASE_REQUESTED = Channel(
        f"{PREFIX}.scale.release_requested",
        ReplicaReleaseRequested,
        Streams.AUTOSCALING,
        "A drained (or drain-timed-out) replica whose allocation should be released.",
        producers=("autoscaler",),
        consumers=("scheduler",),
    )
    TENANT_BUDGET_EXCEEDED = Channel(
        f"{PREFIX}.tenant.budget_exceeded",
        TenantBudgetExceeded,
        Streams.TENANTS,
        "A tenant's cost in its budget period passed its soft or hard limit (price file); "
        "a hard one holds its work not yet placed.",
        producers=("predictor",),
        consumers=("scheduler", "callback"),
    )
    TENANT_BUDGET_RESTORED = Channel(
        f"{PREFIX}.tenant.budget_restored",
        TenantBudgetRestored,
        Streams.TENANTS,
        "A tenant is within its hard budget again (raised, or a new period): its work is "
        "placed again.",
        producers=("predictor",),
        consumers=("scheduler",),
    )
    WEBHOOK_DELIVERED = Channel(
        f"{PREFIX}.webhook.delivered",
        WebhookDelivered,
        Streams.WEBHOOKS,
        "AllData acknowledged a webhook.",
        producers=("callback",),
    )
    WEBHOOK_DEAD_LETTERED = Channel(
        f"{PREFIX}.webhook.dead_lettered",
        WebhookDeadLettered,
        Streams.WEBHOOKS,
        "A webhook that could not be delivered after its last attempt.",
        producers=("callback",),
    )
    MESSAGE_REJECTED = Channel(
        f"{PREFIX}.message.rejected",
        MessageRejected,
        Streams.REJECTIONS,
        "A consumer refused a message it could not decode, validate or apply, naming the field "
        "and reason.",
        producers=("every consumer",),
    )
    MESSAGE_DEAD_LETTERED = Channel(
        f"{PREFIX}.message.dead_lettered",
        MessageDeadLettered,
        Streams.DEAD_LETTERS,
        "A message a consumer gave up on, with its payload, headers, origin and reason "
        "(`crater dead-letters`).",
        producers=("every consumer",),
        consumers=("crater dead-letters",),
    )
    MESSAGE_REPLAYED = Channel(
        f"{PREFIX}.message.replayed",
        MessageReplayed,
        Streams.DEAD_LETTERS,
        "A dead letter re-published to its original subject by `crater dead-letters replay`.",
        producers=("crater dead-letters",),
        consumers=("crater dead-letters",),
    )

    ALL: tuple[Channel, ...] = (
        NODE_TOPOLOGY,
        NODE_METRICS,
        NODE_HEALTH,
        NODE_CORDON,
        TASK_SUBMITTED,
        TASK_PROFILED,
        TASK_PENDING,
        TASK_REJECTED,
        TASK_PREEMPTED,
        TASK_ESCALATED,
        TASK_ESTIMATED,
        TASK_ENDED,
        TASK_STATUS,
        TASK_PHASE,
        TASK_LENDING,
        TASK_UNDERUTILIZED,
        TASK_USAGE,
        ALLOCATION_GRANTED,
        ALLOCATION_RELEASED,
        ALLOCATION_DRIFT,
        INFERENCE_LATENCY,
        SCALE_DECIDED,
        SCALE_REPLICAS_REQUESTED,
        SCALE_REPLICA_DRAINED,
        SCALE_RELEASE_REQUESTED,
        TENANT_BUDGET_EXCEEDED,
        TENANT_BUDGET_RESTORED,
        WEBHOOK_DELIVERED,
        WEBHOOK_DEAD_LETTERED,
        MESSAGE_REJECTED,
        MESSAGE_DEAD_LETTERED,
        MESSAGE_REPLAYED,
    )


def channel_for(event_type: type[Event]) -> Channel:
    for channel in Subjects.ALL:
        if channel.event is event_type:
            return channel
    raise KeyError(f"no channel carries {event_type.__name__}")
