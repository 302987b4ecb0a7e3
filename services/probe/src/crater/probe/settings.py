"""The probe's own settings, read from CRATER_PROBE_<FIELD>."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from crater.contracts import FabricPlace, GpuFaultAction, Taint
from crater.contracts.nodes import NODE_ID_PATTERN
from crater.probe.adapters.measure import Bounds
from crater.probe.adapters.pcie_bandwidth import CopyBounds
from crater.probe.domain.faults import DEFAULT_UNKNOWN_ACTION, DEFAULT_XID_ACTIONS, parse_action
from crater.runtime.settings import ServiceSettings


class ProbeSettings(ServiceSettings):
    """The shared CRATER_* settings, and the probe's own from CRATER_PROBE_<FIELD>."""

    service = "probe"
    default_port = 9101  # health and metrics when http_port is 0

    mode: Literal["local", "fleet"] = Field(
        default="local",
        description="local: this machine; fleet: a simulated fleet and its task runner.",
    )
    fleet_file: Path | None = Field(
        default=None, description="Fleet YAML for fleet mode; unset: the 38-node demo fleet."
    )
    seed: int | None = Field(default=None, description="Simulation seed; unset: the file's.")
    faults: bool = Field(
        default=False,
        description="Fleet mode: inject the fleet file's faults (the demo fleet's: a failing "
        "GPU, a silent node, ECC errors, a degraded PCIe link, an Xid 48), timed from the "
        "probe's start.",
    )
    node_id: str | None = Field(
        default=None,
        pattern=NODE_ID_PATTERN,
        description="Local mode: this node's id; unset: the short host name.",
    )
    pool: str = Field(default="default", description="Local mode: the pool this node serves.")
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="Local mode: this node's labels, over the crater.ai/* ones derived from "
        'its hardware (JSON: {"rack": "r1", "crater.ai/gpu-model": "a100"}); '
        "crater.ai/nvlink-domain, crater.ai/leaf-switch and crater.ai/spine-switch declare "
        "its place in the network fabric (docs/architecture.md, Network topology across nodes).",
    )
    taints: list[str] = Field(
        default_factory=list,
        description='Local mode: taints, key=value:Effect (JSON: ["dedicated=llm:NoSchedule"]).',
    )
    host_root: Path = Field(
        default=Path("/"), description="Local mode: where the host's /sys and /proc are."
    )
    disk_iops_at_depth: dict[str, float] = Field(
        default_factory=dict,
        description="Local mode: each disk's 4 KiB random-read IOPS at depth as the operator "
        "knows it (datasheet, fio), by disk name; it wins over the probe's datasheet table "
        'and its own lower bound (JSON: {"nvme0n1": 1450000}).',
    )
    metrics_interval_seconds: float = Field(
        default=5.0, gt=0, description="Seconds between metrics reports."
    )
    health_interval_seconds: float = Field(
        default=5.0, gt=0, description="Seconds between health reports (the heartbeat)."
    )
    metrics_max_nodes: int = Field(
        default=5000,
        ge=0,
        le=1_000_000,
        description="The per node and card series of /metrics (crater_gpu_*, crater_node_*, "
        "crater_data_transfer_wait_time_ms) cover at most this many nodes, the first by node "
        "id (a simulated fleet's; a local probe has one); the rest are counted in "
        "crater_probe_nodes_not_exported. Their metrics still go on the bus.",
    )
    topology_interval_seconds: float = Field(
        default=300.0, gt=0, description="Seconds between topology re-publications."
    )
    discovery_interval_seconds: float = Field(
        default=60.0,
        gt=0,
        description="Seconds between re-discoveries; a changed fingerprint is published at once.",
    )
    full_measurement: bool = Field(
        default=False,
        description="Local mode: measure memory bandwidth per NUMA node (one thread, all "
        "cores) and disk random reads (queue depth 1, at depth) once after start (a few "
        "seconds), and publish them with the topology.",
    )
    measure_seconds: float = Field(
        default=1.5, gt=0, le=60, description="Full measurement: seconds per disk (memory: 1/3)."
    )
    measure_disk_file_mb: int = Field(
        default=64, ge=1, le=4096, description="Full measurement: temp file size per disk (MiB)."
    )
    measure_memory_mb: int = Field(
        default=64, ge=1, le=4096, description="Full measurement: copy buffer size (MiB)."
    )
    measure_pcie_bandwidth: bool = Field(
        default=False,
        description="Local mode: at start, before the first topology report, measure each "
        "idle card's host-to-card copy bandwidth (pinned memory, CUDA's bandwidthTest figure; "
        "0.1-0.5 s and 2 x measure_pcie_buffer_mb of memory a card) and report it as "
        "pcie_bandwidth_gbps, which PCIe bandwidth requests are then checked against instead "
        "of the nominal generation x width. Needs the probe's `cuda` extra (cuda-bindings); "
        "a card with a compute process on it is measured at a later re-discovery, once idle "
        "(docs/architecture.md, The data path: SSD and PCIe).",
    )
    measure_pcie_buffer_mb: int = Field(
        default=128, ge=1, le=4096, description="PCIe measurement: bytes per copy (MiB)."
    )
    task_seconds_min: float = Field(
        default=8.0, ge=0, description="Fleet mode: shortest simulated task run."
    )
    task_seconds_max: float = Field(
        default=30.0, ge=0, description="Fleet mode: longest simulated task run."
    )
    task_start_seconds: float = Field(
        default=1.0, ge=0, description="Fleet mode: most seconds from grant to running."
    )
    task_failure_rate: float = Field(
        default=0.0, ge=0, le=1, description="Fleet mode: share of simulated tasks that fail."
    )
    execute: bool = Field(
        default=False,
        description="Local mode: run the `command` of each task granted to this node as a "
        "process pinned to the granted cores, and report its outcome (docs/execution.md).",
    )
    report_inventory: bool = Field(
        default=True,
        description="With each heartbeat, list the allocations this agent runs (the simulated "
        "fleet's, or the executing agent's) and, in local mode, the processes NVML sees on "
        "the cards, which the scheduler reconciles its ledger against (docs/architecture.md, "
        "Reconciling against reality). Switch it off where this probe does not see all that "
        "runs on its nodes (two replicas sharing one simulated fleet's grants). A probe that "
        "runs nothing sends no list of allocations either way.",
    )
    state_dir: Path = Field(
        default=Path("var/probe"),
        description="Execution: run directories (runs/), task bodies (tasks/) and task logs "
        "(logs/tasks/TASK-ATTEMPT.log); keep it across restarts of the agent.",
    )
    kill_grace_seconds: float = Field(
        default=10.0,
        ge=0,
        le=3600,
        description="Execution: seconds from SIGTERM to SIGKILL when an allocation is released "
        "(cancel, expiry); a preemption gives its own grace period.",
    )
    execute_poll_seconds: float = Field(
        default=0.5, gt=0, le=60, description="Execution: seconds between looks at the tasks."
    )
    cgroup_root: Path | None = Field(
        default=Path("/sys/fs/cgroup"),
        description="Execution: the cgroup v2 mount where each task gets cpuset.cpus and "
        "memory.max (under crater/); used where writable, else affinity only, logged once.",
    )
    xid_actions: dict[int, str] = Field(
        default_factory=dict,
        description="Local mode: what an Xid code asks, over the default table (NVIDIA's Xid "
        "catalog, docs/health.md): none, reset-card, reboot-node or operator, or the "
        "catalog's bucket (RESTART_APP, RESET_GPU, RESTART_BM, CONTACT_SUPPORT) (JSON: "
        '{"13": "reset-card", "200": "operator"}).',
    )
    xid_unknown_action: str = Field(
        default=DEFAULT_UNKNOWN_ACTION.value,
        description="Local mode: what an Xid in no table asks (it is also logged and counted "
        'in crater_probe_gpu_xid_events_total{catalog="unknown"}); default reset-card '
        "(docs/health.md says why).",
    )
    publish_chunk: int = Field(
        default=256, ge=1, le=10_000, description="Events published concurrently per chunk."
    )

    @model_validator(mode="after")
    def _task_seconds_ordered(self) -> ProbeSettings:
        if self.task_seconds_min > self.task_seconds_max:
            raise ValueError("task_seconds_min exceeds task_seconds_max")
        for taint in self.taints:
            Taint.parse(taint)  # a bad one stops the probe at start, named
        FabricPlace.from_labels(self.labels)  # a bad place too (crater.ai/leaf-switch, ...)
        if self.execute and self.mode != "local":
            raise ValueError("execute needs mode local: a simulated fleet runs nothing")
        self.xid_table()  # a bad action stops the probe at start, named
        return self

    def xid_table(self) -> tuple[dict[int, GpuFaultAction], GpuFaultAction]:
        """The Xid table in force (the default, the operator's entries over it) and the
        action of a code in neither."""
        table = dict(DEFAULT_XID_ACTIONS)
        for code, text in self.xid_actions.items():
            try:
                table[code] = parse_action(text)
            except ValueError:
                raise ValueError(
                    f"xid_actions.{code}: {text!r} is none of none, reset-card, reboot-node, "
                    "operator (or RESTART_APP, IGNORE, RESET_GPU, RESTART_BM, CONTACT_SUPPORT)"
                ) from None
        try:
            unknown = parse_action(self.xid_unknown_action)
        except ValueError:
            raise ValueError(
                f"xid_unknown_action: {self.xid_unknown_action!r} is none of none, reset-card, "
                "reboot-node, operator"
            ) from None
        return table, unknown

    @property
    def bounds(self) -> Bounds:
        return Bounds(
            memory_buffer_mb=self.measure_memory_mb,
            memory_seconds=self.measure_seconds / 3,
            disk_file_mb=self.measure_disk_file_mb,
            disk_seconds=self.measure_seconds,
        )

    @property
    def copy_bounds(self) -> CopyBounds:
        return CopyBounds(buffer_mb=self.measure_pcie_buffer_mb)
