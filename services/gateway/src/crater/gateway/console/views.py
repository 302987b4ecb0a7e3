"""The console's view models: plain functions from the services' answers to what a page
shows (figures formatted, levels for colour), so the templates only lay them out and the
logic is tested without a browser."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from crater.contracts import (
    FleetsAnswer,
    HealthCheck,
    NodeCondition,
    NodeHealthReported,
    NodeMetricsReported,
    NodeSummary,
    PoolsAnswer,
    Priority,
    ScaleDecided,
    ScaleDirection,
    TaskStatus,
    TaskSummary,
    WebhookDeliveryRecord,
)
from crater.contracts.queries import Capacity, PoolSummary, TenantQuota

# ---- figures ----------------------------------------------------------------------------


def number(value: float, places: int = 1) -> str:
    """12, 12.5, 0.25: no trailing zeros."""
    text = f"{value:.{places}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def mib(value: float) -> str:
    """A size in MiB, in the unit that reads best: 512 MiB, 80 GiB, 1.5 TiB."""
    if abs(value) >= 1024 * 1024:
        return f"{number(value / (1024 * 1024))} TiB"
    if abs(value) >= 1024:
        return f"{number(value / 1024)} GiB"
    return f"{number(value, 0)} MiB"


def gb(value: float) -> str:
    """A disk size in GB (decimal, as disks are sold): 960 GB, 7.6 TB."""
    return f"{number(value / 1000)} TB" if abs(value) >= 1000 else f"{number(value, 0)} GB"


def percent(part: float, whole: float) -> float | None:
    return None if whole <= 0 else round(100 * part / whole, 1)


def level(used_percent: float | None) -> str:
    """A meter's colour: `ok` below 75 %, `high` to 95 %, `full` above."""
    if used_percent is None or used_percent < 75:
        return "ok"
    return "high" if used_percent < 95 else "full"


def ago(moment: datetime | None, now: datetime) -> str:
    if moment is None:
        return "never"
    seconds = max(0.0, (now - moment).total_seconds())
    if seconds < 90:
        return f"{seconds:.0f} s ago"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 36 * 3600:
        return f"{seconds / 3600:.0f} h ago"
    return f"{seconds / 86400:.0f} d ago"


# ---- pools --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Meter:
    label: str
    used: str
    total: str
    percent: float | None
    level: str
    note: str = ""


@dataclass(frozen=True)
class TenantRow:
    tenant: str
    gpus: str
    gpu_memory: str
    cpu_cores: str
    memory: str
    share: float


@dataclass(frozen=True)
class PoolView:
    name: str
    nodes: str
    meters: list[Meter]
    fragmentation: str
    fragmentation_percent: float | None
    tasks_placed: int
    tasks_waiting: int
    tenants: list[TenantRow]


@dataclass(frozen=True)
class QuotaCell:
    resource: str
    used: str
    limit: str
    percent: float | None
    level: str


@dataclass(frozen=True)
class QuotaRow:
    tenant: str
    cells: list[QuotaCell]


def whole(value: float) -> str:
    return number(value, 0)


def cards(value: float) -> str:
    return number(value, 2)


RESOURCES: dict[str, tuple[str, Callable[[float], str]]] = {
    "gpus": ("GPUs", cards),
    "gpu_memory_mb": ("GPU memory", mib),
    "cpu_cores": ("CPU cores", whole),
    "memory_mb": ("Memory", mib),
    "disk_gb": ("SSD", gb),
}


def meter(resource: str, capacity: Capacity, note: str = "") -> Meter:
    label, show = RESOURCES[resource]
    used = percent(capacity.allocated, capacity.total)
    return Meter(label, show(capacity.allocated), show(capacity.total), used, level(used), note)


def pool_view(pool: PoolSummary) -> PoolView:
    if pool.fragmentation is None:
        fragmentation = "no GPU request seen yet" if pool.fragmented_gpus is None else "no GPU free"
    else:
        fragmentation = (
            f"{number(100 * pool.fragmentation)} % of the free GPU capacity "
            f"({number(pool.fragmented_gpus or 0, 2)} GPUs) is stranded for the requests seen"
        )
    return PoolView(
        name=pool.pool,
        nodes=f"{pool.nodes_ready}/{pool.nodes} ready",
        meters=[
            meter("gpus", pool.gpus, f"{pool.gpus_free_whole} whole free"),
            meter("gpu_memory_mb", pool.gpu_memory_mb, "reserved"),
            meter("cpu_cores", pool.cpu_cores),
            meter("memory_mb", pool.memory_mb),
            meter("disk_gb", pool.disk_gb, "asked by tasks held; not reserved"),
        ],
        fragmentation=fragmentation,
        fragmentation_percent=None
        if pool.fragmentation is None
        else round(100 * pool.fragmentation, 1),
        tasks_placed=pool.tasks_placed,
        tasks_waiting=pool.tasks_waiting,
        tenants=[
            TenantRow(
                tenant=h.tenant,
                gpus=number(h.gpus, 2),
                gpu_memory=mib(h.gpu_memory_mb),
                cpu_cores=str(h.cpu_cores),
                memory=mib(h.memory_mb),
                share=round(100 * h.share, 1),
            )
            for h in pool.tenants
        ],
    )


def quota_row(quota: TenantQuota) -> QuotaRow:
    cells = []
    for use in quota.resources:
        label, show = RESOURCES[use.resource]
        used = None if use.limit is None else percent(use.used, use.limit)
        limit = "no limit" if use.limit is None else show(use.limit)
        if use.guarantee is not None:  # an elastic tenant: its guarantee, then its cap
            limit = f"{show(use.guarantee)} guaranteed, up to {limit}"
        cells.append(
            QuotaCell(
                resource=label,
                used=show(use.used) + (f" ({show(use.borrowed)} borrowed)" if use.borrowed else ""),
                limit=limit,
                percent=used,
                level=level(used),
            )
        )
    return QuotaRow(quota.tenant, cells)


@dataclass(frozen=True)
class PoolsView:
    pools: list[PoolView]
    quotas: list[QuotaRow]


def pools_view(answer: PoolsAnswer) -> PoolsView:
    return PoolsView([pool_view(p) for p in answer.pools], [quota_row(q) for q in answer.quotas])


# ---- tasks --------------------------------------------------------------------------------

STATUS_CLASS = {
    TaskStatus.PENDING: "wait",
    TaskStatus.SCHEDULED: "run",
    TaskStatus.RUNNING: "run",
    TaskStatus.SUCCEEDED: "ok",
    TaskStatus.FAILED: "bad",
    TaskStatus.PREEMPTED: "bad",
    TaskStatus.REJECTED: "bad",
    TaskStatus.CANCELLED: "muted",
}


# Statuses whose reason says why the task is not running.
WAITING = (TaskStatus.PENDING, TaskStatus.REJECTED)


@dataclass(frozen=True)
class Reason:
    nodes: int
    filter: str
    message: str


@dataclass(frozen=True)
class TaskRow:
    task_id: str
    status: str
    status_class: str
    task_type: str
    tenant: str
    pool: str
    priority: str
    gpus: int
    where: str
    why: str  # why it waits, or was rejected
    note: str  # the scheduler's word on a task placed or ended (its placement, its end)
    reasons: list[Reason]
    peaks: str
    submitted: str
    updated: str
    attempt: int
    # a waiting task's queue position and estimated start, in words (empty: none)
    estimate: str = ""


def where(summary: TaskSummary) -> str:
    if summary.node is None:
        return ""
    if summary.gpu_ids:
        return f"{summary.node} GPUs {','.join(map(str, summary.gpu_ids))}"
    return summary.node


def peaks(summary: TaskSummary) -> str:
    found = summary.predicted
    if found is None:
        return ""
    gpu = f"{mib(found.gpu_memory_per_gpu_mb)}/GPU, " if summary.gpus else ""
    return f"{gpu}host {mib(found.host_memory_mb)} ({found.confidence.value})"


def task_row(summary: TaskSummary, now: datetime) -> TaskRow:
    priority = summary.priority
    return TaskRow(
        task_id=summary.task_id,
        status=summary.status.value,
        status_class=STATUS_CLASS.get(summary.status, "muted"),
        task_type=summary.task_type.value,
        tenant=summary.tenant,
        pool=summary.pool,
        priority=priority.value if isinstance(priority, Priority) else str(priority),
        gpus=summary.gpus,
        where=where(summary),
        why=(summary.reason or "") if summary.status in WAITING else "",
        note="" if summary.status in WAITING else summary.reason or "",
        reasons=[
            Reason(r.nodes, r.filter, r.message)
            for r in sorted(summary.reasons, key=lambda r: (-r.nodes, r.filter))
        ],
        peaks=peaks(summary),
        submitted=ago(summary.submitted_at, now),
        updated=ago(summary.updated_at, now),
        attempt=summary.attempt,
        estimate=estimate_text(summary),
    )


def estimate_text(summary: TaskSummary) -> str:
    """`#2 in pool training, estimated start 2026-01-01 14:05:00Z: ...` (the scheduler's
    words after the colon); empty for a task with no place in a queue."""
    if summary.queue_position is None:
        return ""
    start = summary.estimated_start_at
    when = f"estimated start {start:%Y-%m-%d %H:%M:%S}Z" if start is not None else "no estimate"
    said = f": {summary.estimate}" if summary.estimate else ""
    return f"#{summary.queue_position} in pool {summary.pool}, {when}{said}"


@dataclass(frozen=True)
class DeliveryRow:
    status: str
    state: str
    state_class: str
    endpoint: str
    attempts: int
    outcome: str
    when: str


DELIVERY_CLASS = {
    "delivered": "ok",
    "pending": "wait",
    "dead": "bad",
    "skipped": "muted",
    "superseded": "muted",
}


def delivery_row(record: WebhookDeliveryRecord, now: datetime) -> DeliveryRow:
    if record.last_status_code is not None:
        outcome = f"HTTP {record.last_status_code}"
    else:
        outcome = record.last_error or ""
    if record.state == "pending" and record.next_attempt_at is not None:
        outcome = f"{outcome}; next attempt {record.next_attempt_at:%H:%M:%S}".lstrip("; ")
    return DeliveryRow(
        status=record.task_status,
        state=record.state,
        state_class=DELIVERY_CLASS.get(record.state, "muted"),
        endpoint=record.endpoint or "(none configured)",
        attempts=record.attempts,
        outcome=outcome,
        when=ago(record.created_at, now),
    )


@dataclass(frozen=True)
class Fact:
    label: str
    value: str


@dataclass(frozen=True)
class TaskDetail:
    row: TaskRow
    facts: list[Fact]
    breakdown: list[Fact]
    held: list[Fact]
    history: list[Fact]


def task_detail(summary: TaskSummary, now: datetime) -> TaskDetail:
    prediction = summary.prediction
    facts = [
        Fact("status", summary.status.value),
        Fact("type", summary.task_type.value),
        Fact("tenant", summary.tenant),
        Fact("pool", summary.pool),
        Fact("GPUs", str(summary.gpus)),
        Fact("attempt", str(summary.attempt)),
        Fact("submitted", f"{summary.submitted_at:%Y-%m-%d %H:%M:%S} UTC"),
    ]
    breakdown: list[Fact] = []
    if prediction is not None:
        facts += [
            Fact("predicted GPU memory", f"{mib(prediction.gpu_memory_per_gpu_mb)} per card"),
            Fact("predicted host memory", mib(prediction.host_memory_mb)),
            Fact("confidence", f"{prediction.confidence.value} ({prediction.method})"),
            Fact(
                "DataLoader",
                f"{prediction.dataloader_num_workers} workers, "
                f"prefetch {prediction.dataloader_prefetch_factor}",
            ),
        ]
        breakdown = [Fact(k, mib(v)) for k, v in prediction.breakdown_mb.items()]
    held = [
        Fact(
            f"{a.node} (member {a.gang_index})",
            f"GPUs {','.join(map(str, a.gpu_ids)) or '-'}, cores "
            f"{len(a.cpu_cores)}, NUMA {a.numa_node if a.numa_node is not None else '-'}, "
            f"{mib(a.memory_mb)}, {'running' if a.running else 'reserved'}",
        )
        for a in summary.allocations
    ]
    history = [
        Fact(
            f"attempt {h.attempt}",
            f"{h.node} GPUs {','.join(map(str, h.gpu_ids)) or '-'} from "
            f"{h.granted_at:%H:%M:%S}"
            + (f" to {h.released_at:%H:%M:%S} ({h.release_reason})" if h.released_at else ""),
        )
        for h in summary.history
    ]
    return TaskDetail(task_row(summary, now), facts, breakdown, held, history)


# ---- nodes ----------------------------------------------------------------------------

CONDITION_CLASS = {
    NodeCondition.READY: "ok",
    NodeCondition.DEGRADED: "wait",
    NodeCondition.NOT_READY: "bad",
}


@dataclass(frozen=True)
class NodeRow:
    node_id: str
    pool: str
    condition: str
    condition_class: str
    gpu_model: str
    gpus: str
    cpu_cores: str
    memory: str
    cpu_use: str
    gpu_use: str
    gpu_memory_use: str
    gpu_memory_percent: float | None
    health: str
    reported: str


def gpu_use(metrics: NodeMetricsReported | None) -> tuple[str, str, float | None]:
    """(mean SM use, GPU memory used of total, its percent) from a node's latest metrics."""
    if metrics is None or not metrics.gpus:
        return "", "", None
    util = sum(g.utilization_percent for g in metrics.gpus) / len(metrics.gpus)
    used = sum(g.memory_used_mb for g in metrics.gpus)
    total = sum(g.memory_total_mb for g in metrics.gpus)
    return f"{util:.0f} %", f"{mib(used)} of {mib(total)}", percent(used, total)


def node_row(
    node: NodeSummary,
    metrics: NodeMetricsReported | None,
    health: NodeHealthReported | None,
    now: datetime,
) -> NodeRow:
    sm, memory, memory_percent = gpu_use(metrics)
    failed = [c.name for c in health.checks if not c.passed] if health else []
    return NodeRow(
        node_id=node.node_id,
        pool=node.pool,
        condition=node.condition.value,
        condition_class=CONDITION_CLASS.get(node.condition, "muted"),
        gpu_model=node.gpu_model or "CPU only",
        gpus=f"{node.gpus_free}/{node.gpus_total} free" if node.gpus_total else "",
        cpu_cores=f"{node.cpu_cores_free}/{node.cpu_cores_total} free",
        memory=f"{mib(node.memory_mb_free)} of {mib(node.memory_mb_total)} free",
        cpu_use="" if metrics is None else f"{metrics.cpu_utilization_percent:.0f} %",
        gpu_use=sm,
        gpu_memory_use=memory,
        gpu_memory_percent=memory_percent,
        health=""
        if health is None
        else f"{health.score}/100" + (f", failing: {', '.join(failed)}" if failed else ""),
        reported=ago(metrics.occurred_at if metrics else None, now),
    )


@dataclass(frozen=True)
class GpuRow:
    index: int
    utilization: str
    memory: str
    memory_percent: float | None
    temperature: str
    power: str


@dataclass(frozen=True)
class NodeDetail:
    node_id: str
    condition: str
    condition_class: str
    score: str
    checks: list[HealthCheck]
    checked: str
    cpu_use: str
    numa_use: list[Fact]
    memory_use: str
    gpus: list[GpuRow]
    disks: list[Fact]
    measured: str


def node_detail(
    node_id: str,
    summary: NodeSummary | None,
    health: NodeHealthReported | None,
    metrics: NodeMetricsReported | None,
    now: datetime,
) -> NodeDetail:
    condition = health.condition if health else summary.condition if summary else None
    return NodeDetail(
        node_id=node_id,
        condition=condition.value if condition else "unknown",
        condition_class=CONDITION_CLASS.get(condition, "muted") if condition else "muted",
        score="" if health is None else f"{health.score}/100",
        checks=list(health.checks) if health else [],
        checked=ago(health.occurred_at if health else None, now),
        cpu_use="" if metrics is None else f"{metrics.cpu_utilization_percent:.0f} %",
        numa_use=[
            Fact(f"NUMA {n}", f"{u:.0f} %")
            for n, u in sorted((metrics.numa_cpu_utilization_percent if metrics else {}).items())
        ],
        memory_use=""
        if metrics is None
        else f"{mib(metrics.memory_used_mb)} of {mib(metrics.memory_total_mb)}",
        gpus=[
            GpuRow(
                index=g.index,
                utilization=f"{g.utilization_percent:.0f} %",
                memory=f"{mib(g.memory_used_mb)} of {mib(g.memory_total_mb)}",
                memory_percent=percent(g.memory_used_mb, g.memory_total_mb),
                temperature="" if g.temperature_c is None else f"{g.temperature_c:.0f} °C",
                power="" if g.power_w is None else f"{g.power_w:.0f} W",
            )
            for g in (metrics.gpus if metrics else [])
        ],
        disks=[
            Fact(
                d.name,
                f"read {number(d.read_mb_s)} MiB/s ({d.read_iops:.0f} IOPS), "
                f"write {number(d.write_mb_s)} MiB/s",
            )
            for d in (metrics.disks if metrics else [])
        ],
        measured=ago(metrics.occurred_at if metrics else None, now),
    )


# ---- fleets -------------------------------------------------------------------------------


@dataclass(frozen=True)
class DecisionRow:
    when: str
    direction: str
    arrow: str
    replicas: str
    p95: str
    pressure: str
    samples: int
    reason: str
    panic: bool
    limited_by: str


@dataclass(frozen=True)
class FleetRow:
    service: str
    replicas: int
    p95: str
    p95_class: str
    pressure: str
    pressure_class: str
    source: str
    panic: bool
    warm_pool: int
    starting: int
    draining: int
    heard: str
    decisions: list[DecisionRow]


@dataclass(frozen=True)
class FleetsView:
    rule: str
    fleets: list[FleetRow]


def against(value: float | None, out_line: float, in_line: float) -> str:
    """`hot` over the scale-out line, `cool` under the scale-in line, else `ok`."""
    if value is None:
        return "muted"
    return "hot" if value > out_line else "cool" if value < in_line else "ok"


def decision_row(decision: ScaleDecided, now: datetime) -> DecisionRow:
    out = decision.direction is ScaleDirection.OUT
    return DecisionRow(
        when=ago(decision.occurred_at, now),
        direction=decision.direction.value,
        arrow="↑" if out else "↓",
        replicas=f"{decision.current_replicas} → {decision.desired_replicas}",
        p95=f"{decision.p95_latency_ms:.0f} ms",
        pressure=""
        if decision.gpu_memory_pressure is None
        else f"{decision.gpu_memory_pressure:.2f}",
        samples=decision.samples,
        reason=decision.reason,
        panic=decision.panic,
        limited_by=decision.limited_by or "",
    )


def fleets_view(answer: FleetsAnswer, now: datetime) -> FleetsView:
    rule = (
        f"{answer.strategy} strategy; scale out above p95 {number(answer.scale_out_p95_ms)} ms "
        f"and pressure {number(answer.scale_out_pressure, 2)}, in below "
        f"{number(answer.scale_in_p95_ms)} ms and {number(answer.scale_in_pressure, 2)}; "
        f"{answer.min_replicas} to {answer.max_replicas} replicas"
    )
    rows = []
    for fleet in answer.fleets:
        rows.append(
            FleetRow(
                service=fleet.service,
                replicas=fleet.replicas,
                p95="" if fleet.p95_latency_ms is None else f"{fleet.p95_latency_ms:.0f} ms",
                p95_class=against(
                    fleet.p95_latency_ms, answer.scale_out_p95_ms, answer.scale_in_p95_ms
                ),
                pressure=""
                if fleet.gpu_memory_pressure is None
                else f"{fleet.gpu_memory_pressure:.2f}",
                pressure_class=against(
                    fleet.gpu_memory_pressure, answer.scale_out_pressure, answer.scale_in_pressure
                ),
                source=fleet.pressure_source or "",
                panic=fleet.panic,
                warm_pool=len(fleet.warm_pool),
                starting=len(fleet.starting),
                draining=len(fleet.draining),
                heard=ago(fleet.last_sample_at, now),
                decisions=[decision_row(d, now) for d in fleet.decisions],
            )
        )
    return FleetsView(rule, rows)
