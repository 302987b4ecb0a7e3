"""Allocations: the resources a placed task holds."""

from __future__ import annotations

from enum import StrEnum

from pydantic import AwareDatetime, Field

from crater.contracts.base import MAX_ATTEMPT, Contract, Event, ExactInt, TaskEvent
from crater.contracts.tasks import MetricsFormat, TaskId

# Every variable a placed task is handed (AllocationGranted.environment), with its meaning:
# the one list the scheduler builds from, docs/task-environment.md is generated from, and
# crater_client reads. AllData's scripts read CRATER_CPU_CORES as a count and CRATER_GPU_IDS
# as a comma list: those meanings stay.
TASK_ENVIRONMENT: dict[str, str] = {
    "CRATER_TASK_ID": "The task's id.",
    "CRATER_ALLOCATION_ID": "This allocation's id (a gang member's own); name it in reports.",
    "CRATER_ATTEMPT": "Which attempt of the task this is, from 1 (restart policy).",
    "CRATER_NODE_ID": "The node the task was placed on (its probe's node id); the task's usage "
    "samples name it.",
    "CRATER_POOL": "The pool the task was placed in.",
    "CRATER_RESERVATION_TOKEN": "The allocation's reservation token: a launcher (crater_client"
    ".run_task) confirms the allocation with it and names it in every report (POST /api/v1/"
    "allocations/{id}/confirm and /status). A credential: keep it out of logs.",
    "CRATER_GPU_IDS": "GPU indexes granted on the node, comma separated (`0,1`); empty: none.",
    "CRATER_CPU_CORES": "How many CPU cores are granted (a count, `4`).",
    "CRATER_CPU_CORE_IDS": "The granted CPU core ids, comma separated (`2,3,4,5`): pin to them "
    "(os.sched_setaffinity).",
    "CRATER_NUMA_NODE": "The NUMA node the GPUs and cores sit on; empty: none or several.",
    "CRATER_MEMORY_MB": "Host memory granted, MiB.",
    "CRATER_SSD_PATH": "The local SSD mount: the chosen disk's (CRATER_SSD_DEVICE) when one was "
    "chosen, else the node's first (NVMe first); absent: none mounted.",
    "CRATER_SSD_DEVICE": "The local SSD chosen for the task (its device name, `nvme1n1`) when "
    "it asked for SSD space or speed: near its GPUs, its space held for it; absent: none "
    "chosen.",
    "CRATER_CHECKPOINT_PATH": "Where to write checkpoints (on the local NVMe when there is one).",
    "CRATER_PRECISION": "The precision the task asked for (bf16, fp16, ...).",
    "CRATER_DATALOADER_NUM_WORKERS": "DataLoader workers per GPU process, for the node chosen "
    "(its disk, the cores and memory granted).",
    "CRATER_DATALOADER_PREFETCH_FACTOR": "DataLoader prefetch_factor, for the node chosen.",
    "CRATER_MIG_PROFILE": "The MIG slice held on the first GPU (`3g.40gb`); absent: whole cards.",
    "CRATER_LENT_BY": "An inference replica on a card lent by this training task during its CPU "
    "phase (docs/pools.md, Lending by phase): it is told to go when the task wants the card "
    "back; absent: the card is not lent.",
    "CRATER_GPU_MEMORY_LIMIT_MB": "With CRATER_LENT_BY: the GPU memory the replica may use on "
    "the lent card (the lender's resident memory stays there); the replica's runtime enforces "
    "it (an MPS or framework memory limit).",
    "CRATER_GANG_RANK": "A gang member's rank, from 0; absent: not a gang.",
    "CRATER_GANG_SIZE": "How many members the gang has; absent: not a gang.",
    "CRATER_GANG_LEADER_NODE": "The node (id) rank 0 was placed on; absent: not a gang.",
    "CRATER_MASTER_ADDR": "The host name rank 0's node reported (its probe's hostname), for "
    "torch.distributed; it resolves where the cluster's DNS knows it. Absent: not a gang.",
    "CRATER_GATEWAY_URL": "The gateway's public URL, where the task posts its usage samples; "
    "absent: the scheduler was not told it (CRATER_SCHEDULER_GATEWAY_URL).",
}


class ScrapeTarget(Contract):
    """An inference replica's metrics endpoint, as its allocation names it: the request's
    `inference_config.metrics` with the node's hostname filled in."""

    service: str = Field(
        min_length=1,
        max_length=128,
        description="The fleet the replica serves: the request's anti_affinity.group, else its "
        "task id (the name its samples would carry).",
    )
    format: MetricsFormat = Field(description="The server whose exposition this is.")
    url: str = Field(min_length=1, max_length=2048, description="What to GET.")


class ScoreDetail(Contract):
    plugin: str
    score: float


class AllocationGranted(TaskEvent):
    """The scheduler placed a task: these exact resources are now its own."""

    allocation_id: str
    task_id: TaskId
    node: str
    pool: str
    tenant: str
    gpu_ids: list[ExactInt] = Field(description="The node's card indexes (its topology's).")
    gpu_memory_mb: ExactInt = Field(ge=0, description="Reserved per card.")
    gpu_model: str | None = Field(
        default=None,
        max_length=128,
        description="The model of the node's cards (its topology), for usage and cost by "
        "model; None: no GPU granted, or a grant made before grants named it.",
    )
    gpu_milli: int = Field(default=1000, ge=1, le=1000, description="Share of each card held.")
    mig_profile: str | None = Field(
        default=None, description="The MIG slice held on gpu_ids[0] (e.g. 1g.10gb); None: none."
    )
    cpu_cores: list[ExactInt]
    numa_node: ExactInt | None
    memory_mb: ExactInt = Field(ge=0)
    checkpoint_path: str | None
    # Left out of the JSON when None: a grant that chose no disk reads byte for byte as one
    # made before grants named disks, so recorded decisions replay identically (audit).
    disk: str | None = Field(
        default=None,
        exclude_if=lambda disk: disk is None,
        description="The local SSD chosen with the GPUs (device name) when the task asked for "
        "SSD space or speed; its asked space is held for the task. None: none chosen.",
    )
    reservation_token: str = Field(
        description="Confirms the allocation and signs the launcher's reports about it "
        "(`v1.<allocation_id>.<expiry>.<signature>`)."
    )
    reservation_expires_at: AwareDatetime = Field(
        description="Confirm before this and the reservation holds: its deadline as decided. "
        "The deadline that counts starts when the grant is stored on the stream, so it is "
        "this or a little later (GET /api/v1/tasks/{id}: allocations[].reservation_expires_at)."
    )
    score: float
    scores: list[ScoreDetail] = Field(default_factory=list)
    explanation: str = Field(description="Why this node, in one line.")
    environment: dict[str, str] = Field(
        description="The variables handed to the task, to inject into its container: "
        + "; ".join(TASK_ENVIRONMENT)
        + " (meanings: docs/task-environment.md)."
    )
    gang_index: ExactInt = Field(
        default=0, ge=0, description="This member of a gang (one grant per member), from 0."
    )
    gang_size: ExactInt = Field(
        default=1, ge=1, description="Members granted together, all or none."
    )
    borrowed_from: str | None = Field(
        default=None,
        description="The pool whose idle nodes this allocation borrows (pools of one cohort "
        "lend each other idle capacity); it is reclaimable: preempted, with its grace period, "
        "when that pool's own tasks need the capacity back. None: on its own pool's nodes.",
    )
    attempt: int = Field(
        default=1, ge=1, le=MAX_ATTEMPT, description="Which attempt of the task (restart policy)."
    )
    scrape: ScrapeTarget | None = Field(
        default=None,
        description="An inference replica that exposes its load on a Prometheus endpoint "
        "(inference_config.metrics, format vllm, tgi or triton): where the autoscaler reads it. "
        "None: nothing to scrape (the replica publishes its own samples, or is no replica).",
    )


class ReleaseReason(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"
    EXPIRED = "expired"
    NODE_LOST = "node-lost"
    SCALED_IN = "scaled-in"
    TIME_LIMIT = "time-limit"  # held its grant for its max_run_seconds, told to stop


class DriftKind(StrEnum):
    """What a reconciliation found the core's ledger and a node's reports disagree on."""

    ORPHANED_ALLOCATION = "orphaned-allocation"  # held here, not run by its node
    UNKNOWN_ALLOCATION = "unknown-allocation"  # run by a node, not held there here
    UNKNOWN_PROCESS = "unknown-process"  # processes on a card held free here
    OVER_CAPACITY = "over-capacity"  # a node's allocations add up past what it offers
    LEDGER_MISMATCH = "ledger-mismatch"  # running figures differ from the allocations' sum


class DriftAction(StrEnum):
    """What the scheduler did about a drift."""

    RELEASED = "released"  # the orphaned allocation went back (its attempt failed)
    HELD = "held"  # the unknown allocation's (process's) cards count busy: nothing goes there
    FREED = "freed"  # the unknown allocation (process) is gone: its cards are free again
    REPORTED = "reported"  # said, nothing changed (over capacity: no task is stopped for it)
    CORRECTED = "corrected"  # the running figures were set to the allocations' sum


class AllocationDriftFound(Event):
    """A periodic reconciliation found the scheduler's ledger and reality apart on one node,
    and what it did about it (docs/architecture.md, Reconciling against reality)."""

    node: str | None = Field(
        description="The node concerned; None: figures of the whole cluster (what tenants and "
        "pools hold)."
    )
    kind: DriftKind
    action: DriftAction
    allocation_id: str | None = Field(default=None, description="The allocation concerned.")
    task_id: str | None = Field(default=None, description="Its task.")
    gpu_ids: list[ExactInt] = Field(default_factory=list, description="The cards concerned.")
    reason: str = Field(description="What was found and what was done, for a person.")


class AllocationReleased(TaskEvent):
    allocation_id: str
    task_id: TaskId
    node: str
    gpu_ids: list[ExactInt]
    cpu_cores: list[ExactInt]
    reason: ReleaseReason
