"""Nodes: what the probe sees of a machine's hardware, its load and its health."""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import AwareDatetime, Field, model_validator

from crater.contracts.base import Contract, Event, ExactInt

# No dots: the node id is one token of a node-scoped subject (crater.v1.node.health.<id>).
NODE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$"


class Gpu(Contract):
    index: ExactInt = Field(ge=0)
    uuid: str
    model: str = Field(examples=["NVIDIA A100-SXM4-80GB"])
    vendor: str = "nvidia"
    memory_mb: ExactInt = Field(ge=0)
    pci_bus_id: str | None = None
    numa_node: ExactInt | None = None
    nvlink_peers: list[ExactInt] = Field(
        default_factory=list, description="GPU indexes over NVLink."
    )
    mig_capable: bool = False
    mig_enabled: bool | None = Field(default=None, description="MIG mode (current); None: no MIG.")
    pcie_generation_max: ExactInt | None = Field(
        default=None, ge=1, description="PCIe gen the link can run."
    )
    pcie_width_max: ExactInt | None = Field(
        default=None, ge=1, description="PCIe lanes the link can run."
    )
    pci_root: str | None = Field(
        default=None,
        description="PCI root complex (host bridge, e.g. pci0000:17): devices sharing one "
        "share the upstream PCIe path.",
    )
    mig_profiles: list[str] = Field(
        default_factory=list,
        description="MIG profiles the card can be partitioned into (e.g. 1g.10gb, 3g.40gb).",
        examples=[["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]],
    )
    pcie_bandwidth_gbps: float | None = Field(
        default=None,
        ge=0,
        description="Measured host-to-card copy bandwidth over the PCIe link, GB/s one way "
        "(pinned memory); None: not measured, the link counts at its nominal figure "
        "(pcie_generation_max x pcie_width_max).",
    )

    def pcie_link_gbps(self) -> float | None:
        """What the link carries, GB/s one way: measured, else nominal; None: neither known."""
        if self.pcie_bandwidth_gbps is not None:
            return self.pcie_bandwidth_gbps
        return pcie_nominal_gbps(self.pcie_generation_max, self.pcie_width_max)


# GB/s one way per lane, after line encoding (8b/10b to gen 2, 128b/130b gens 3-5, FLIT 6-7).
PCIE_LANE_GBPS: dict[int, float] = {
    1: 0.25,
    2: 0.5,
    3: 0.985,
    4: 1.969,
    5: 3.938,
    6: 7.563,
    7: 15.125,
}


def pcie_nominal_gbps(generation: int | None, width: int | None) -> float | None:
    """A link's nominal bandwidth (GB/s one way): x16 gen 4 is 31.5; None when the
    generation or the width is unknown, or the generation is one no table lists."""
    if generation is None or width is None or generation not in PCIE_LANE_GBPS:
        return None
    return round(PCIE_LANE_GBPS[generation] * width, 3)


# Where a figure in the datasheets' sense comes from: the probe measured it, the device's
# datasheet states it (the probe's table of models), or an operator set it.
FigureSource = Literal["measured", "datasheet", "operator"]


class NumaNode(Contract):
    id: ExactInt = Field(ge=0)
    cpus: list[ExactInt]
    memory_mb: ExactInt = Field(ge=0)
    memory_bandwidth_gbps: float | None = Field(
        default=None,
        ge=0,
        description="Measured copy bandwidth (GB/s, read + write) of one thread pinned to this "
        "node: what one process sees, several times below the node's aggregate.",
    )
    memory_bandwidth_gbps_all_cores: float | None = Field(
        default=None,
        ge=0,
        description="Measured copy bandwidth (GB/s, read + write) of all this node's CPUs "
        "copying at once, one process pinned to each, memory local: the node's aggregate, "
        "the figure STREAM reports and AllData's memory.bandwidth_gbps asks.",
    )


class Cpu(Contract):
    model: str
    sockets: ExactInt = Field(ge=1)
    cores: ExactInt = Field(ge=1, description="Physical cores.")
    threads: ExactInt = Field(ge=1, description="Logical CPUs.")
    flags: list[str] = Field(default_factory=list, description="Relevant flags: avx, avx2, ...")


class Disk(Contract):
    name: str
    model: str | None = None
    capacity_gb: ExactInt = Field(ge=0)
    rotational: bool
    nvme: bool
    numa_node: ExactInt | None = None
    mount_path: str | None = None
    pci_root: str | None = Field(default=None, description="PCI root complex of its controller.")
    random_read_iops: float | None = Field(
        default=None,
        ge=0,
        description="Measured 4 KiB random reads per second at queue depth 1, one thread "
        "(about 1 / latency): far below the datasheet figure, which is at depth.",
    )
    read_latency_us_p50: float | None = Field(
        default=None, ge=0, description="Measured at queue depth 1."
    )
    read_latency_us_p99: float | None = Field(
        default=None, ge=0, description="Measured at queue depth 1."
    )
    random_read_iops_at_depth: float | None = Field(
        default=None,
        ge=0,
        description="4 KiB random reads per second at high queue depth (32 or more, several "
        "jobs): the figure datasheets and fio benchmarks state, and AllData's ssd.iops_min "
        "asks. Measured by the probe, it is a lower bound (many threads, Python's cost per "
        "read caps it).",
    )
    random_read_iops_at_depth_source: FigureSource | None = Field(
        default=None,
        description="Where random_read_iops_at_depth comes from; set with it, None without.",
    )

    @model_validator(mode="after")
    def _figure_with_source(self) -> Disk:
        if (self.random_read_iops_at_depth is None) != (
            self.random_read_iops_at_depth_source is None
        ):
            raise ValueError("random_read_iops_at_depth and its source go together")
        return self


class TaintEffect(StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


class Taint(Contract):
    """Keeps tasks off a node unless they tolerate it (Kubernetes semantics)."""

    key: str = Field(min_length=1, max_length=253, examples=["dedicated"])
    value: str = Field(default="", max_length=63, examples=["inference"])
    effect: TaintEffect = TaintEffect.NO_SCHEDULE

    @classmethod
    def parse(cls, text: str) -> Taint:
        """`key=value:Effect`, `key:Effect` or `key=value` (NoSchedule)."""
        spec, _, effect = text.partition(":")
        key, _, value = spec.partition("=")
        return cls(key=key.strip(), value=value.strip(), effect=effect.strip() or "NoSchedule")

    def __str__(self) -> str:
        return f"{self.key}{'=' + self.value if self.value else ''}:{self.effect.value}"


class Toleration(Contract):
    """Lets a task onto nodes with a matching taint. `operator` Exists matches any value;
    no `key` with Exists matches every taint; no `effect` matches every effect."""

    key: str | None = Field(default=None, max_length=253)
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str = Field(default="", max_length=63)
    effect: TaintEffect | None = None

    @model_validator(mode="after")
    def _key_unless_exists(self) -> Toleration:
        if self.key is None and self.operator != "Exists":
            raise ValueError("a toleration without key must use operator Exists")
        return self

    def tolerates(self, taint: Taint) -> bool:
        if self.effect is not None and self.effect is not taint.effect:
            return False
        if self.key is None:
            return True
        return self.key == taint.key and (self.operator == "Exists" or self.value == taint.value)


class FabricLevel(StrEnum):
    """A level of the network fabric between nodes, tightest first: the nodes of one NVLink
    domain (a rack such as an NVL72) share NVLink between them, those under one leaf switch
    are one hop apart, those under one spine three."""

    NVLINK_DOMAIN = "nvlink-domain"
    LEAF = "leaf"
    SPINE = "spine"


# Tightest first: a gang kept within one level is also within every level after it.
FABRIC_LEVELS: tuple[FabricLevel, ...] = (
    FabricLevel.NVLINK_DOMAIN,
    FabricLevel.LEAF,
    FabricLevel.SPINE,
)
# The node labels a probe reads a node's place from (CRATER_PROBE_LABELS, a fleet file's
# labels): a cluster's own labelling, as Kueue's topology levels read node labels.
FABRIC_LABELS: dict[FabricLevel, str] = {
    FabricLevel.NVLINK_DOMAIN: "crater.ai/nvlink-domain",
    FabricLevel.LEAF: "crater.ai/leaf-switch",
    FabricLevel.SPINE: "crater.ai/spine-switch",
}
# A switch or domain name: one label value's characters (Kubernetes label values).
FABRIC_NAME_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$"
FabricName = Annotated[str, Field(pattern=FABRIC_NAME_PATTERN)]


class FabricPlace(Contract):
    """Where a node sits in the network fabric, each level by the name of its switch or
    domain. A level's name is read within the levels above it (Kueue's topology domains): two
    leaves both named leaf-1 under different spines are two leaves. Any level may be left out;
    a node that declares none of them has no place, and a gang that requires a level stays off
    it."""

    nvlink_domain: FabricName | None = Field(
        default=None,
        description="The NVLink domain (multi-node NVLink: a rack such as an NVL72) the node "
        "is part of.",
        examples=["nvl72-rack-07"],
    )
    leaf: FabricName | None = Field(
        default=None,
        description="The leaf (top-of-rack) switch the node hangs off.",
        examples=["leaf-3"],
    )
    spine: FabricName | None = Field(
        default=None,
        description="The spine switch (or block) above its leaf.",
        examples=["spine-1"],
    )

    def name_at(self, level: FabricLevel) -> str | None:
        return {
            FabricLevel.NVLINK_DOMAIN: self.nvlink_domain,
            FabricLevel.LEAF: self.leaf,
            FabricLevel.SPINE: self.spine,
        }[level]

    def path_to(self, level: FabricLevel) -> tuple[str, ...] | None:
        """The level's domain, as the names from the spine down to it ("" where a level above
        is left out); None when the node declares no name at `level`."""
        if self.name_at(level) is None:
            return None
        above = FABRIC_LEVELS[FABRIC_LEVELS.index(level) :]
        return tuple(self.name_at(lv) or "" for lv in reversed(above))

    @classmethod
    def from_labels(cls, labels: dict[str, str]) -> FabricPlace | None:
        """The place a node's labels declare (`FABRIC_LABELS`); None when they declare none.
        A value that is not a name is refused, naming the label."""
        found = {lv: labels[key] for lv, key in FABRIC_LABELS.items() if key in labels}
        if not found:
            return None
        for level, value in found.items():
            if not re.fullmatch(FABRIC_NAME_PATTERN, value):
                raise ValueError(
                    f"label {FABRIC_LABELS[level]}={value!r} is not a {level.value} name "
                    "(1-63 letters, digits, '.', '_' or '-', starting and ending with a letter "
                    "or digit)"
                )
        return cls(
            nvlink_domain=found.get(FabricLevel.NVLINK_DOMAIN),
            leaf=found.get(FabricLevel.LEAF),
            spine=found.get(FabricLevel.SPINE),
        )


class NodeTopology(Contract):
    node_id: str = Field(pattern=NODE_ID_PATTERN)
    hostname: str
    pool: str = "default"
    labels: dict[str, str] = Field(default_factory=dict)
    taints: list[Taint] = Field(
        default_factory=list, description="Tasks without a matching toleration stay off."
    )
    cpu: Cpu
    numa_nodes: list[NumaNode]
    memory_mb: ExactInt = Field(ge=0)
    gpus: list[Gpu] = Field(default_factory=list)
    disks: list[Disk] = Field(default_factory=list)
    simulated: bool = False
    fingerprint: str = Field(description="Stable hash of the hardware; changes when it does.")
    # Left out of the JSON when None: a node without a place reads byte for byte as before,
    # so recorded inputs and decisions replay identically.
    fabric: FabricPlace | None = Field(
        default=None,
        exclude_if=lambda fabric: fabric is None,
        description="Its place in the network fabric between nodes (the probe reads it from "
        "the crater.ai/nvlink-domain, crater.ai/leaf-switch and crater.ai/spine-switch "
        "labels); None: undeclared. Gangs that require or prefer a level (network_topology) "
        "are placed by it (docs/architecture.md, Network topology across nodes).",
    )


class NodeTopologyReported(Event):
    """A probe discovered (or re-discovered) a node's hardware."""

    node: NodeTopology


class GpuMetrics(Contract):
    index: ExactInt = Field(ge=0)
    utilization_percent: float = Field(ge=0, le=100)
    memory_used_mb: ExactInt = Field(ge=0)
    memory_total_mb: ExactInt = Field(ge=0)
    temperature_c: float | None = None
    power_w: float | None = None
    sm_clock_mhz: float | None = None
    memory_clock_mhz: float | None = None
    pcie_generation: ExactInt | None = Field(default=None, description="Current PCIe link gen.")
    pcie_width: ExactInt | None = Field(default=None, description="Current PCIe link width.")
    ecc_errors_corrected: ExactInt | None = Field(default=None, ge=0, description="Since boot.")
    ecc_errors_uncorrected: ExactInt | None = Field(default=None, ge=0, description="Since boot.")

    @property
    def memory_pressure(self) -> float:
        return self.memory_used_mb / self.memory_total_mb if self.memory_total_mb else 0.0


class DiskMetrics(Contract):
    """One disk's IO over the last metrics interval."""

    name: str = Field(examples=["nvme0n1"])
    read_mb_s: float = Field(ge=0, description="MiB read per second.")
    write_mb_s: float = Field(ge=0, description="MiB written per second.")
    read_iops: float = Field(ge=0, description="Reads completed per second.")
    write_iops: float = Field(ge=0, description="Writes completed per second.")
    in_flight: ExactInt | None = Field(
        default=None, ge=0, description="I/Os in flight (queue depth) when sampled; None: unknown."
    )
    wait_ms: float | None = Field(
        default=None,
        ge=0,
        le=3_600_000,
        description="Mean time an I/O completed in the interval spent queued and being served, "
        "in ms (iostat's await): how long a data transfer waits on this disk; None: unknown, "
        "or no I/O completed.",
    )


class NodeMetricsReported(Event):
    node_id: str = Field(pattern=NODE_ID_PATTERN)
    cpu_utilization_percent: float = Field(ge=0, le=100)
    memory_used_mb: ExactInt = Field(ge=0)
    memory_total_mb: ExactInt = Field(ge=0)
    gpus: list[GpuMetrics] = Field(default_factory=list)
    numa_cpu_utilization_percent: dict[ExactInt, float] = Field(
        default_factory=dict,
        description="CPU use (0-100) per NUMA node id, over its CPU list; empty: not reported.",
    )
    disks: list[DiskMetrics] = Field(
        default_factory=list, description="IO per local disk; empty: not reported."
    )
    numa_memory_bandwidth_gbps: dict[ExactInt, Annotated[float, Field(ge=0, le=1_000_000)]] = Field(
        default_factory=dict,
        description="Memory bandwidth in use (GB/s, reads and writes) per NUMA node id, over "
        "the interval; empty: not measured (it needs memory bandwidth monitoring, resctrl).",
    )


class NodeCondition(StrEnum):
    READY = "Ready"
    DEGRADED = "Degraded"
    NOT_READY = "NotReady"


class HealthCheck(Contract):
    name: str
    passed: bool
    detail: str


class RunningAllocation(Contract):
    """One allocation a node's agent runs now (its inventory), as the grant named it."""

    allocation_id: str = Field(min_length=1, max_length=512)
    task_id: str = Field(min_length=1, max_length=512)
    gpu_ids: list[Annotated[int, Field(ge=0, le=1023)]] = Field(
        default_factory=list, max_length=1024, description="The cards it runs on; empty: none."
    )


class GpuProcess(Contract):
    """A process holding memory on one of the node's cards, as NVML lists it."""

    gpu: int = Field(ge=0, le=1023, description="The card's index.")
    pid: ExactInt = Field(ge=0)
    memory_mb: ExactInt = Field(ge=0, description="GPU memory it holds; 0: NVML cannot say.")


class GpuFaultKind(StrEnum):
    """What the probe found wrong with one card (NVML)."""

    XID = "xid"  # an Xid event (nvmlEventTypeXidCriticalError): `xid` names the code
    ECC_UNCORRECTED = "ecc-uncorrected"  # uncorrected ECC errors since the driver loaded
    PAGES_PENDING_RETIREMENT = "pages-pending-retirement"  # retired at the next reset
    ROW_REMAP_FAILURE = "row-remap-failure"  # the card could not remap a failing row
    LOST = "lost"  # NVML answers GPU_IS_LOST: the card has fallen off the bus
    # Live readings that only lower the card's rank (action `none`):
    HOT = "hot"  # at or past the probe's warning temperature
    PCIE_DEGRADED = "pcie-degraded"  # the link runs narrower (or, busy, slower) than it can
    NVLINK_DEGRADED = "nvlink-degraded"  # an NVLink the topology lists is down


class GpuFaultAction(StrEnum):
    """What a card's fault asks of the scheduler, after the "Resolution Bucket (Immediate
    Action)" of NVIDIA's Xid catalog (docs/health.md lists the table and its source)."""

    NONE = "none"  # RESTART_APP, IGNORE: the application's fault; the card is fine
    RESET_CARD = "reset-card"  # RESET_GPU: the card is cordoned until reported healthy
    REBOOT_NODE = "reboot-node"  # RESTART_BM: the node is cordoned until reported healthy
    OPERATOR = "operator"  # CONTACT_SUPPORT: the card is cordoned until an operator lifts it


# Kinds that are readings, never a reason to cordon.
READING_KINDS = frozenset(
    {GpuFaultKind.HOT, GpuFaultKind.PCIE_DEGRADED, GpuFaultKind.NVLINK_DEGRADED}
)


class GpuFault(Contract):
    """One card's fault, as the probe reports it with every heartbeat while it lasts."""

    gpu: int = Field(ge=0, le=1023, description="The card's index.")
    kind: GpuFaultKind
    action: GpuFaultAction = Field(
        description="What the scheduler does: none (a reading: the card ranks lower), "
        "reset-card, reboot-node or operator (docs/health.md)."
    )
    xid: int | None = Field(
        default=None, ge=0, le=65_535, description="The Xid code, with kind xid only."
    )
    since: AwareDatetime = Field(
        description="When the probe first saw this fault: the same fault keeps its time "
        "from heartbeat to heartbeat, a new occurrence has a new one."
    )
    detail: str = Field(default="", max_length=512, description="For a person.")

    @model_validator(mode="after")
    def _xid_with_kind(self) -> GpuFault:
        if (self.kind is GpuFaultKind.XID) != (self.xid is not None):
            raise ValueError("xid is given with kind xid, and only with it")
        if self.kind in READING_KINDS and self.action is not GpuFaultAction.NONE:
            raise ValueError(f"a {self.kind.value} reading has action none")
        return self

    @property
    def key(self) -> tuple[int, str, int | None, datetime]:
        """The fault's identity: an operator's uncordon clears this one, not a later one."""
        return (self.gpu, self.kind.value, self.xid, self.since)


class GpuCordonRequested(Event):
    """An operator cordons one card of a node (no new work lands on it; what runs there goes
    on), or lifts its cordon, whatever put it there: a fault the probe reported (that
    occurrence stays lifted while the probe reports it) or an operator."""

    node_id: str = Field(pattern=NODE_ID_PATTERN)
    gpu: int = Field(ge=0, le=1023, description="The card's index on the node.")
    cordon: bool = Field(description="True: cordon the card; False: lift its cordon.")
    reason: str = Field(default="", max_length=512, description="Why, for the record.")
    requested_by: str = Field(default="", max_length=256, description="Who asked.")


class NodeHealthReported(Event):
    """Health, sent on an interval: it is also the node's heartbeat."""

    node_id: str = Field(pattern=NODE_ID_PATTERN)
    condition: NodeCondition
    score: ExactInt = Field(ge=0, le=100)
    checks: list[HealthCheck] = Field(default_factory=list)
    # Left out of the JSON when None: a heartbeat of an agent that keeps no inventory reads
    # byte for byte as before, so recorded decisions replay identically (audit).
    running: list[RunningAllocation] | None = Field(
        default=None,
        max_length=100_000,
        exclude_if=lambda running: running is None,
        description="What this node's agent runs now, every allocation of it (the scheduler "
        "reconciles its ledger against it: docs/architecture.md, Reconciling against "
        "reality); empty: nothing. None: the agent keeps no inventory (a probe that does not "
        "run tasks), and the node is not reconciled.",
    )
    # Left out of the JSON when None, as `running`.
    gpu_processes: list[GpuProcess] | None = Field(
        default=None,
        max_length=100_000,
        exclude_if=lambda processes: processes is None,
        description="The compute processes holding memory on this node's cards now (NVML); "
        "the scheduler counts a card it holds free busy while processes stay on it "
        "(docs/architecture.md, Reconciling against reality). None: not read (no GPUs, no "
        "NVML, a simulated node).",
    )
    # Left out of the JSON when None, as `running`.
    gpu_faults: list[GpuFault] | None = Field(
        default=None,
        max_length=8192,
        exclude_if=lambda faults: faults is None,
        description="Each card's faults and degraded readings now (NVML: Xid events, "
        "uncorrected ECC, retired pages pending, row-remap failures, a card off the bus, "
        "temperature, links); the scheduler cordons a faulty card, or the node, and ranks "
        "a card with readings lower (docs/health.md). None: not read (no NVML, a simulated "
        "node without faults).",
    )
