"""Read queries answered over NATS request-reply (core NATS, not JetStream): the scheduler owns
cluster and task state, and the gateway and CLI ask it."""

from __future__ import annotations

from pydantic import AwareDatetime, Field

from crater.contracts.base import Contract
from crater.contracts.catalog import PREFIX
from crater.contracts.nodes import NodeCondition
from crater.contracts.tasks import Priority, TaskStatus, TaskType


class QuerySubjects:
    NODES = f"{PREFIX}.query.nodes"
    TASKS = f"{PREFIX}.query.tasks"


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


class NodesAnswer(Contract):
    nodes: list[NodeSummary]


class TasksQuery(Contract):
    task_id: str | None = None
    status: TaskStatus | None = None
    limit: int = Field(default=100, ge=1, le=10_000)


class TaskSummary(Contract):
    task_id: str
    task_type: TaskType
    status: TaskStatus
    pool: str
    tenant: str
    priority: Priority
    gpus: int = Field(ge=0)
    node: str | None = None
    gpu_ids: list[int] = Field(default_factory=list)
    reason: str | None = Field(default=None, description="Why it waits or was rejected.")
    submitted_at: AwareDatetime
    updated_at: AwareDatetime


class TasksAnswer(Contract):
    tasks: list[TaskSummary]
