"""`crater dashboards [--out deploy/grafana] [--check]`: Crater's Grafana dashboards, as code.

Each dashboard is a list of rows of panels (title, PromQL, unit, kind) here; the JSON under
deploy/grafana/ is generated from it (Grafana's dashboard model, schemaVersion 39, a
`datasource` variable for the Prometheus to read) and provisioned by docker-compose. The
tests check that every query parses and names metrics the services export, and that the
committed JSON is what this module generates."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

from crater.cli.output import cli_console

console = cli_console(highlight=True)
DEFAULT_OUT = Path("deploy/grafana")
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


@dataclass(frozen=True)
class Panel:
    title: str
    queries: tuple[tuple[str, str], ...]  # (PromQL, legend)
    unit: str = "short"
    kind: str = "timeseries"  # or stat, bargauge, table
    description: str = ""


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    rows: tuple[tuple[str, tuple[Panel, ...]], ...]
    tags: tuple[str, ...] = field(default=("crater",))


def q(expr: str, legend: str = "") -> tuple[str, str]:
    return (expr, legend)


RATE = "[$__rate_interval]"

DASHBOARDS: tuple[Dashboard, ...] = (
    Dashboard(
        "crater-cluster",
        "Crater / Cluster and pools",
        "Each pool at a glance (capacity, allocated, free, fragmented), whether the GPUs are "
        "used, the queue and how long tasks wait.",
        (
            (
                "Capacity",
                (
                    Panel("Nodes known", (q("max(crater_scheduler_nodes)", "nodes"),), kind="stat"),
                    Panel(
                        "Nodes by pool and condition (scheduler)",
                        (
                            q(
                                "max by (pool, condition) (crater_pool_nodes)",
                                "{{pool}} {{condition}}",
                            ),
                        ),
                        kind="bargauge",
                    ),
                    Panel(
                        "GPUs by pool: capacity, allocated, free",
                        (
                            q(
                                'max by (pool, state) (crater_pool_gpus{state=~"capacity|'
                                'allocated|free|unavailable"})',
                                "{{pool}} {{state}}",
                            ),
                        ),
                        kind="table",
                    ),
                    Panel(
                        "GPU fragmentation by pool (free share the workload cannot use)",
                        (q("max by (pool) (crater_pool_gpu_fragmentation_ratio)", "{{pool}}"),),
                        unit="percentunit",
                    ),
                    Panel(
                        "Cluster: GPUs allocated and free",
                        (
                            q(
                                'sum(max by (pool) (crater_pool_gpus{state="allocated"}))',
                                "allocated",
                            ),
                            q('sum(max by (pool) (crater_pool_gpus{state="free"}))', "free"),
                            q(
                                'sum(max by (pool) (crater_pool_gpus{state="fragmented"}))',
                                "fragmented",
                            ),
                        ),
                    ),
                    Panel(
                        "Cluster fragmentation",
                        (
                            q(
                                'sum(max by (pool) (crater_pool_gpus{state="fragmented"})) / '
                                'sum(max by (pool) (crater_pool_gpus{state="free"}))',
                                "fragmented / free",
                            ),
                        ),
                        unit="percentunit",
                        kind="stat",
                    ),
                    Panel(
                        "CPU cores by pool",
                        (
                            q(
                                'max by (pool, state) (crater_pool_cpu_cores{state=~"capacity|'
                                'allocated|free"})',
                                "{{pool}} {{state}}",
                            ),
                        ),
                        kind="table",
                    ),
                    Panel(
                        "Memory and GPU memory allocated share by pool",
                        (
                            q(
                                'max by (pool) (crater_pool_memory_bytes{state="allocated"}) / '
                                'max by (pool) (crater_pool_memory_bytes{state="capacity"})',
                                "{{pool}} memory",
                            ),
                            q(
                                'max by (pool) (crater_pool_gpu_memory_bytes{state="allocated"})'
                                ' / max by (pool) (crater_pool_gpu_memory_bytes{state="capacity"})',
                                "{{pool}} GPU memory",
                            ),
                        ),
                        unit="percentunit",
                    ),
                    Panel(
                        "GPUs busy / idle (probe, utilisation >= 50%)",
                        (q("sum by (state) (crater_probe_gpus)", "{{state}}"),),
                    ),
                ),
            ),
            (
                "Work",
                (
                    Panel(
                        "Allocations held",
                        (q("max(crater_scheduler_active_allocations)", "allocations"),),
                    ),
                    Panel("Tasks waiting", (q("max(crater_scheduler_pending_tasks)", "pending"),)),
                    Panel(
                        "Longest waits now (top 10)",
                        (
                            q(
                                "topk(10, max by (task_id, tenant, pool) "
                                "(crater_task_wait_seconds))",
                                "{{task_id}} ({{tenant}}, {{pool}})",
                            ),
                        ),
                        unit="s",
                        kind="table",
                    ),
                    Panel(
                        "GPUs allocated, by tenant",
                        (q("sum by (tenant) (crater_tenant_gpus_allocated)", "{{tenant}}"),),
                    ),
                    Panel(
                        "GPU memory used over reserved, per task (top 10)",
                        (
                            q(
                                "topk(10, max by (task_id, tenant) "
                                "(crater_task_gpu_memory_request_usage_ratio))",
                                "{{task_id}} ({{tenant}})",
                            ),
                        ),
                        unit="percentunit",
                        kind="table",
                    ),
                    Panel(
                        "Idle share of measured allocated GPU time (month)",
                        (
                            q(
                                "sum(crater_tenant_idle_gpu_hours) / sum(crater_tenant_gpu_hours"
                                " - crater_tenant_unmeasured_gpu_hours)",
                                "idle",
                            ),
                        ),
                        unit="percentunit",
                        kind="stat",
                    ),
                ),
            ),
        ),
    ),
    Dashboard(
        "crater-scheduler",
        "Crater / Scheduler",
        "Decisions, their latency, batches, leadership, the bus.",
        (
            (
                "Decisions",
                (
                    Panel(
                        "Decisions by kind",
                        (
                            q(
                                f"sum by (kind) (rate(crater_scheduler_decisions_total{RATE}))",
                                "{{kind}}",
                            ),
                        ),
                        unit="ops",
                    ),
                    Panel(
                        "Decision latency p99",
                        (
                            q(
                                "histogram_quantile(0.99, sum by (le) (rate("
                                f"crater_scheduler_decision_seconds_bucket{RATE})))",
                                "p99",
                            ),
                        ),
                        unit="s",
                    ),
                    Panel(
                        "Events per transaction p50",
                        (
                            q(
                                "histogram_quantile(0.5, sum by (le) (rate("
                                f"crater_scheduler_batch_events_bucket{RATE})))",
                                "p50",
                            ),
                        ),
                    ),
                    Panel(
                        "Escalated (waited past the queue SLA)",
                        (
                            q(
                                'sum(increase(crater_scheduler_decisions_total{kind="TaskEscalated"}'
                                "[1h]))",
                                "escalated / h",
                            ),
                        ),
                    ),
                ),
            ),
            (
                "Leadership and bus",
                (
                    Panel(
                        "Leader",
                        (q('sum(crater_leader{job="crater-scheduler"})', "leaders"),),
                        kind="stat",
                    ),
                    Panel(
                        "Messages dead-lettered",
                        (
                            q(
                                "sum by (job) (increase(crater_messages_dead_lettered_total[1h]))",
                                "{{job}}",
                            ),
                        ),
                    ),
                    Panel(
                        "Redeliveries",
                        (
                            q(
                                f"sum by (job) (rate(crater_messages_redelivered_total{RATE}))",
                                "{{job}}",
                            ),
                        ),
                        unit="ops",
                    ),
                ),
            ),
        ),
    ),
    Dashboard(
        "crater-autoscaler",
        "Crater / Autoscaler",
        "Inference replicas, latency against target, GPU memory pressure, decisions.",
        (
            (
                "Replicas",
                (
                    Panel("Replicas", (q("crater_autoscaler_replicas", "{{service}}"),)),
                    Panel("Latency p95", (q("crater_inference_latency_p95", "{{service}}"),), "s"),
                    Panel(
                        "GPU memory pressure: highest replica, and mean (HPA/KEDA)",
                        (
                            q("crater_gpu_memory_pressure", "{{service}} highest"),
                            q("crater_inference_gpu_memory_usage_ratio", "{{service}} mean"),
                        ),
                        "percentunit",
                    ),
                    Panel(
                        "Scale decisions",
                        (q(f"sum by (direction) (rate(crater_scale_decisions_total{RATE}))"),),
                        "ops",
                    ),
                    Panel("Panic mode", (q("max(crater_autoscaler_panic)", "panic"),), kind="stat"),
                ),
            ),
        ),
    ),
    Dashboard(
        "crater-callback",
        "Crater / Callback (webhooks)",
        "Webhook deliveries to AllData: outcomes, latency, backlog, circuit breakers.",
        (
            (
                "Deliveries",
                (
                    Panel(
                        "Settled by state",
                        (
                            q(
                                f"sum by (state) (rate(crater_webhook_deliveries_total{RATE}))",
                                "{{state}}",
                            ),
                        ),
                        unit="ops",
                    ),
                    Panel(
                        "Latency p95 by endpoint",
                        (
                            q(
                                "histogram_quantile(0.95, sum by (le, endpoint) (rate("
                                f"crater_webhook_latency_seconds_bucket{RATE})))",
                                "{{endpoint}}",
                            ),
                        ),
                        unit="s",
                    ),
                    Panel(
                        "Backlog",
                        (q("sum by (endpoint) (crater_webhook_backlog)", "{{endpoint}}"),),
                    ),
                    Panel(
                        "Circuit open",
                        (q("max by (endpoint) (crater_webhook_circuit_open)", "{{endpoint}}"),),
                    ),
                    Panel(
                        "Failures by reason",
                        (
                            q(
                                f"sum by (reason) (rate(crater_webhook_failures_total{RATE}))",
                                "{{reason}}",
                            ),
                        ),
                        unit="ops",
                    ),
                ),
            ),
        ),
    ),
    Dashboard(
        "crater-nodes",
        "Crater / Nodes",
        "What the probes report per node and card: GPU utilisation, memory, temperature, "
        "power, clocks, ECC errors; CPU per NUMA node, memory, memory bandwidth, disk IO.",
        (
            (
                "GPUs",
                (
                    Panel(
                        "GPU utilisation",
                        (q("crater_gpu_utilization_percent", "{{node}} {{gpu}}"),),
                        unit="percent",
                    ),
                    Panel(
                        "GPU memory used (share of the card)",
                        (q("crater_gpu_memory_usage_rate", "{{node}} {{gpu}}"),),
                        unit="percentunit",
                    ),
                    Panel(
                        "GPU temperature (hottest 10 cards)",
                        (
                            q(
                                "topk(10, crater_gpu_temperature_celsius)",
                                "{{node}} {{gpu}}",
                            ),
                        ),
                        unit="celsius",
                    ),
                    Panel(
                        "GPU power",
                        (q("sum by (node) (crater_gpu_power_watts)", "{{node}}"),),
                        unit="watt",
                    ),
                    Panel(
                        "SM clock",
                        (q("crater_gpu_sm_clock_hertz", "{{node}} {{gpu}}"),),
                        unit="hertz",
                    ),
                    Panel(
                        "SM utilisation variance across a node's cards",
                        (q("crater_gpu_sm_utilization_variance", "{{node}}"),),
                    ),
                    Panel(
                        "ECC errors, corrected (per hour)",
                        (
                            q(
                                "sum by (node, gpu) (increase(crater_gpu_ecc_errors_total{kind="
                                '"corrected"}[1h]))',
                                "{{node}} {{gpu}}",
                            ),
                        ),
                    ),
                    Panel(
                        "Cards with uncorrected ECC errors",
                        (
                            q(
                                'max by (node, gpu) (crater_gpu_ecc_errors_total{kind="'
                                'uncorrected"}) > 0',
                                "{{node}} {{gpu}}",
                            ),
                        ),
                        kind="table",
                    ),
                ),
            ),
            (
                "Hosts",
                (
                    Panel(
                        "CPU per NUMA node",
                        (
                            q(
                                "crater_node_numa_cpu_utilization_percent",
                                "{{node}} numa {{numa}}",
                            ),
                        ),
                        unit="percent",
                    ),
                    Panel(
                        "Host memory used",
                        (
                            q(
                                "crater_node_memory_used_bytes / crater_node_memory_total_bytes",
                                "{{node}}",
                            ),
                        ),
                        unit="percentunit",
                    ),
                    Panel(
                        "Memory bandwidth per NUMA node",
                        (
                            q(
                                "crater_node_numa_memory_bandwidth_bytes_per_second",
                                "{{node}} numa {{numa}}",
                            ),
                        ),
                        unit="Bps",
                    ),
                    Panel(
                        "Disk read and write",
                        (
                            q(
                                "sum by (node) (crater_node_disk_read_bytes_per_second)",
                                "{{node}} read",
                            ),
                            q(
                                "sum by (node) (crater_node_disk_write_bytes_per_second)",
                                "{{node}} write",
                            ),
                        ),
                        unit="Bps",
                    ),
                    Panel(
                        "Disk queue depth",
                        (q("crater_node_disk_io_in_flight", "{{node}} {{disk}}"),),
                    ),
                    Panel(
                        "Data transfer wait (disk await)",
                        (q("crater_data_transfer_wait_time_ms", "{{node}} {{disk}}"),),
                        unit="ms",
                    ),
                ),
            ),
            (
                "Probes",
                (
                    Panel(
                        "Nodes by condition",
                        (q("sum by (condition) (crater_probe_node_condition)", "{{condition}}"),),
                    ),
                    Panel(
                        "Probe publish failures",
                        (q(f"sum(rate(crater_probe_publish_failures_total{RATE}))", "failures"),),
                        unit="ops",
                    ),
                    Panel(
                        "Nodes left out of /metrics (over the limit)",
                        (q("sum(crater_probe_nodes_not_exported)", "not exported"),),
                        kind="stat",
                    ),
                ),
            ),
        ),
    ),
    Dashboard(
        "crater-tenants",
        "Crater / Tenants (usage, quota, cost)",
        "What each department spends: GPUs held, GPU-hours and idle GPU-hours this month, "
        "cost in each budget's period against it, work held by a hard budget (crater cost "
        "has the exact bill).",
        (
            (
                "Now",
                (
                    Panel(
                        "GPUs held",
                        (q("sum by (tenant) (crater_tenant_gpus_allocated)", "{{tenant}}"),),
                    ),
                    Panel(
                        "GPUs held vs quota (scheduler)",
                        (
                            q(
                                'max by (tenant) (crater_tenant_quota_used{resource="gpus"})',
                                "{{tenant}} held",
                            ),
                            q(
                                'max by (tenant) (crater_tenant_quota{resource="gpus"})',
                                "{{tenant}} quota",
                            ),
                        ),
                    ),
                    Panel(
                        "Over budget",
                        (
                            q(
                                "max by (tenant, limit) (crater_tenant_budget_exceeded)",
                                "{{tenant}} {{limit}}",
                            ),
                        ),
                        kind="table",
                    ),
                    Panel(
                        "Work held by a hard budget (scheduler)",
                        (q("max by (tenant) (crater_tenant_budget_held)", "{{tenant}}"),),
                        kind="table",
                    ),
                ),
            ),
            (
                "This month",
                (
                    Panel(
                        "GPU-hours allocated",
                        (q("max by (tenant) (crater_tenant_gpu_hours)", "{{tenant}}"),),
                        kind="bargauge",
                    ),
                    Panel(
                        "Idle GPU-hours (allocated, measured idle)",
                        (q("max by (tenant) (crater_tenant_idle_gpu_hours)", "{{tenant}}"),),
                        kind="bargauge",
                    ),
                    Panel(
                        "Unmeasured GPU-hours (no usage samples)",
                        (q("max by (tenant) (crater_tenant_unmeasured_gpu_hours)", "{{tenant}}"),),
                        kind="bargauge",
                    ),
                    Panel(
                        "Cost in the budget period vs budget",
                        (
                            q(
                                "max by (tenant) (crater_tenant_budget_cost)",
                                "{{tenant}} cost",
                            ),
                            q(
                                'max by (tenant) (crater_tenant_budget{limit="soft"})',
                                "{{tenant}} soft budget",
                            ),
                            q(
                                'max by (tenant) (crater_tenant_budget{limit="hard"})',
                                "{{tenant}} hard budget",
                            ),
                        ),
                    ),
                ),
            ),
        ),
    ),
)


def _panel(panel: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    return {
        "id": pid,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": 8, "w": 8, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "options": {},
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": e, "legendFormat": lg}
            for i, (e, lg) in enumerate(panel.queries)
        ],
    }


def render(dashboard: Dashboard) -> dict[str, Any]:
    """Grafana's dashboard JSON: a row panel per row, its panels three to a line."""
    panels: list[dict[str, Any]] = []
    y, pid = 0, 1
    for title, row in dashboard.rows:
        panels.append(
            {
                "id": pid,
                "type": "row",
                "title": title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        pid, y = pid + 1, y + 1
        for i, panel in enumerate(row):
            panels.append(_panel(panel, pid, (i % 3) * 8, y + (i // 3) * 8))
            pid += 1
        y += ((len(row) + 2) // 3) * 8
    return {
        "uid": dashboard.uid,
        "title": dashboard.title,
        "description": dashboard.description,
        "tags": list(dashboard.tags),
        "timezone": "utc",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "time": {"from": "now-24h", "to": "now"},
        "refresh": "1m",
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                }
            ]
        },
        "annotations": {"list": []},
        "panels": panels,
    }


def files() -> dict[str, str]:
    """File name -> JSON text of every dashboard."""
    return {
        f"{d.uid}.json": json.dumps(render(d), indent=2, sort_keys=True) + "\n" for d in DASHBOARDS
    }


def queries() -> list[tuple[str, str, str]]:
    """(dashboard uid, panel title, PromQL) of every panel, for the tests."""
    return [
        (d.uid, panel.title, expr)
        for d in DASHBOARDS
        for _, row in d.rows
        for panel in row
        for expr, _ in panel.queries
    ]


def dashboards(
    out: Annotated[Path, typer.Option(help="Where the JSON goes.")] = DEFAULT_OUT,
    check: Annotated[
        bool, typer.Option("--check", help="Fail if the files there are not current.")
    ] = False,
) -> None:
    """Generate Crater's Grafana dashboards (JSON) from their definitions in code."""
    wanted = files()
    if check:
        stale = [
            n
            for n, text in wanted.items()
            if not (out / n).is_file() or (out / n).read_text() != text
        ]
        if stale:
            console.print(f"[red]stale dashboards[/red]: {', '.join(stale)}: run crater dashboards")
            raise typer.Exit(1)
        console.print("dashboards are current")
        return
    out.mkdir(parents=True, exist_ok=True)
    for name, text in wanted.items():
        (out / name).write_text(text)
    console.print(f"wrote {len(wanted)} dashboards under {out}/")
