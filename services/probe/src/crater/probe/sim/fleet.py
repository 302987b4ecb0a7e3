"""A simulated fleet: hardware profiles, fleet files, and the nodes they generate.

Profiles (`profiles/*.yaml`, package data) describe one kind of machine; a fleet file says
how many of each to run, in which pool, under which seed:

    name: demo
    seed: 42
    profiles: []            # optional: more profiles, same format as profiles/*.yaml
    nodes:
      - {profile: dgx-a100-8, count: 4, pool: training}
      - {profile: cpu-only, count: 8, pool: default, prefix: cpu, labels: {rack: r1}}
      - {profile: h100-sxm-8, count: 2, pool: training, taints: ["dedicated=llm:NoSchedule"]}
    faults:                 # optional; injected only with CRATER_PROBE_FAULTS=true
      - {node: a100-03, kind: gpu-failing, at_seconds: 60, gpu: 2}
      - {node: cpu-02, kind: silent, at_seconds: 90, for_seconds: 60}

Labels and taints (`key=value:Effect`) of an entry add to its profile's. Profiles may carry
the figures a real probe measures (memory bandwidth per NUMA node, of one thread and of all
its CPUs at once; disk random-read IOPS and latency at queue depth 1); each node reports them
jittered by up to 5%, drawn from the seed. A disk whose model is in the datasheet table
(domain/datasheets.py) reports its rated random-read IOPS at depth, as a real probe does.

Node ids are the profile's (or the entry's) prefix and a number per prefix, `a100-01`; the
numbering widens past 99 nodes of one prefix. The same file and seed give the same nodes.
"""

from __future__ import annotations

import random
import re
import uuid
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from crater.contracts import Cpu, Disk, FabricPlace, Gpu, NodeTopology, NumaNode, Taint
from crater.contracts.tasks import MIG_PROFILE_PATTERN
from crater.probe.domain.topology import build_topology
from crater.probe.sim.simulation import GPU_FAULTS, Fault, FaultKind, SimulatedNode

DEFAULT_FLEET = "demo"
MAX_GPUS_PER_NODE = 16
LABEL_PROFILE = "crater.ai/profile"
LABEL_SIMULATED = "crater.ai/simulated"
_POOL = r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$"  # the contracts' pool name
_PREFIX = r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$"


def _taint_text(text: str) -> str:
    Taint.parse(text)  # refuses a bad effect or key, naming it
    return text


TaintText = Annotated[str, AfterValidator(_taint_text)]
# "Measured" figures of simulated nodes vary by up to this much around the profile's.
MEASURED_JITTER = 0.05


class FleetError(ValueError):
    """A fleet or profile file that cannot be used, with the reason."""


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CpuSpec(_Spec):
    model: str
    sockets: int = Field(ge=1, le=16)
    cores_per_socket: int = Field(ge=1, le=1024)
    threads_per_core: int = Field(default=1, ge=1, le=8)
    flags: list[str] = Field(default_factory=list)


class GpuSpec(_Spec):
    model: str
    vendor: str = "nvidia"
    count: int = Field(ge=1, le=MAX_GPUS_PER_NODE)
    memory_mb: int = Field(ge=1)
    # all: NVSwitch fabric; pairs: 0-1, 2-3, ...; none: PCIe only; or explicit index pairs.
    nvlink: Literal["all", "pairs", "none"] | list[tuple[int, int]] = "none"
    mig_capable: bool = False
    mig_profiles: list[str] = Field(
        default_factory=list, description="MIG profiles a card can be cut into (1g.10gb, ...)."
    )
    gpus_per_pci_root: int | None = Field(
        default=None,
        ge=1,
        description="Cards behind each PCIe root complex, in index order; unset: unknown.",
    )
    pcie_generation: int = Field(default=4, ge=1, le=7, description="PCIe gen of the link.")
    pcie_width: int = Field(default=16, ge=1, le=32, description="PCIe lanes of the link.")
    pcie_bandwidth_gbps: float | None = Field(
        default=None,
        gt=0,
        description="Host-to-card copy bandwidth to report as measured, GB/s; unset: none "
        "measured (the link counts at its nominal figure).",
    )
    idle_w: float = Field(default=50.0, ge=0)
    max_w: float = Field(default=300.0, gt=0)
    numa: list[int] | None = Field(
        default=None, description="NUMA node of each GPU; default: spread evenly in order."
    )

    @model_validator(mode="after")
    def _consistent(self) -> GpuSpec:
        if self.numa is not None and len(self.numa) != self.count:
            raise ValueError(f"numa lists {len(self.numa)} GPUs, count is {self.count}")
        if isinstance(self.nvlink, list):
            for a, b in self.nvlink:
                if not (0 <= a < self.count and 0 <= b < self.count) or a == b:
                    raise ValueError(f"nvlink pair ({a}, {b}) is not two of {self.count} GPUs")
        if self.idle_w > self.max_w:
            raise ValueError("idle_w exceeds max_w")
        if self.mig_profiles and not self.mig_capable:
            raise ValueError("mig_profiles on a card that is not mig_capable")
        bad = [p for p in self.mig_profiles if not re.match(MIG_PROFILE_PATTERN, p)]
        if bad:
            raise ValueError(f"not MIG profiles like 1g.10gb: {', '.join(bad)}")
        return self


class DiskSpec(_Spec):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]+$")
    model: str | None = None
    capacity_gb: int = Field(ge=1)
    nvme: bool | None = Field(default=None, description="Default: the name starts with nvme.")
    rotational: bool = False
    numa_node: int | None = Field(default=None, ge=0)
    mount_path: str | None = None
    # "measured" figures the simulated probe reports (jittered a little per node)
    random_read_iops: float | None = Field(default=None, gt=0)
    read_latency_us_p50: float | None = Field(default=None, gt=0)
    read_latency_us_p99: float | None = Field(default=None, gt=0)


class Profile(_Spec):
    name: str
    description: str = ""
    id_prefix: Annotated[str, Field(pattern=_PREFIX, max_length=40)]
    cpu: CpuSpec
    numa_nodes: int = Field(default=1, ge=1, le=64)
    memory_gb: int = Field(ge=1, description="GiB of RAM.")
    memory_bandwidth_gbps: float | None = Field(
        default=None,
        gt=0,
        description="Measured per NUMA node, one thread (jittered a little per node).",
    )
    memory_bandwidth_gbps_all_cores: float | None = Field(
        default=None,
        gt=0,
        description="Measured per NUMA node, all its CPUs at once (jittered a little per node).",
    )
    gpu: GpuSpec | None = None
    disks: list[DiskSpec] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    taints: list[TaintText] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> Profile:
        cores = self.cpu.sockets * self.cpu.cores_per_socket
        if cores % self.numa_nodes:
            raise ValueError(f"{cores} cores do not split evenly over {self.numa_nodes} NUMA nodes")
        homes = [d.numa_node for d in self.disks if d.numa_node is not None]
        if self.gpu is not None and self.gpu.numa is not None:
            homes += self.gpu.numa
        if any(n >= self.numa_nodes for n in homes):
            raise ValueError(f"a device sits on a NUMA node >= numa_nodes ({self.numa_nodes})")
        return self


class FleetEntry(_Spec):
    profile: str
    count: int = Field(ge=0, le=100_000)
    pool: Annotated[str, Field(pattern=_POOL, max_length=63)] = "default"
    prefix: Annotated[str, Field(pattern=_PREFIX, max_length=40)] | None = None
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="Added to the profile's; crater.ai/nvlink-domain, crater.ai/leaf-switch "
        "and crater.ai/spine-switch declare the nodes' place in the network fabric.",
    )
    taints: list[TaintText] = Field(
        default_factory=list, description="key=value:Effect, added to the profile's."
    )

    @field_validator("labels")
    @classmethod
    def _fabric_place(cls, labels: dict[str, str]) -> dict[str, str]:
        FabricPlace.from_labels(labels)  # a bad place is refused with the file, named
        return labels


class FaultSpec(_Spec):
    node: str
    kind: FaultKind
    at_seconds: float = Field(default=0.0, ge=0, description="Seconds after the fleet started.")
    for_seconds: float | None = Field(default=None, gt=0, description="None: for good.")
    gpu: int = Field(default=0, ge=0, description="The card, for GPU faults.")
    xid: int | None = Field(
        default=None, ge=0, le=65_535, description="The Xid code, for kind xid (only)."
    )

    @model_validator(mode="after")
    def _xid_with_kind(self) -> FaultSpec:
        if (self.kind is FaultKind.XID) != (self.xid is not None):
            raise ValueError("xid is given with kind xid, and only with it")
        return self

    def fault(self) -> Fault:
        return Fault(self.node, self.kind, self.at_seconds, self.for_seconds, self.gpu, self.xid)


class FleetSpec(_Spec):
    name: Annotated[str, Field(pattern=_PREFIX, max_length=40)] = DEFAULT_FLEET
    seed: int = 0
    profiles: list[Profile] = Field(default_factory=list)
    nodes: list[FleetEntry]
    faults: list[FaultSpec] = Field(default_factory=list)


@dataclass(frozen=True)
class Fleet:
    name: str
    seed: int
    nodes: list[SimulatedNode]
    faults: tuple[Fault, ...] = ()  # what the file schedules; applied only when asked

    @property
    def topologies(self) -> list[NodeTopology]:
        return [n.topology for n in self.nodes]


def _parse(model: type[BaseModel], text: str, origin: str) -> Any:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise FleetError(f"{origin}: not valid YAML: {error}") from error
    try:
        return model.model_validate(data)
    except ValidationError as error:
        reasons = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}"
            for e in error.errors(include_url=False)
        )
        raise FleetError(f"{origin}: {reasons}") from error


@cache
def builtin_profiles() -> dict[str, Profile]:
    """The profiles shipped with the probe, by name."""
    profiles: dict[str, Profile] = {}
    folder = resources.files("crater.probe.sim") / "profiles"
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            profile: Profile = _parse(Profile, entry.read_text(), f"profiles/{entry.name}")
            profiles[profile.name] = profile
    return profiles


def read_fleet_spec(path: Path | None = None) -> FleetSpec:
    """A fleet file, or the default demo fleet when `path` is None."""
    if path is None:
        text = (
            resources.files("crater.probe.sim") / "fleets" / f"{DEFAULT_FLEET}.yaml"
        ).read_text()
        return _parse(FleetSpec, text, f"fleets/{DEFAULT_FLEET}.yaml")  # type: ignore[no-any-return]
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise FleetError(f"{path}: {error.strerror or error}") from error
    spec: FleetSpec = _parse(FleetSpec, text, str(path))
    if "name" not in spec.model_fields_set:
        # Named after its file, so two different fleets get different durable consumers.
        stem = re.sub(r"[^a-z0-9-]+", "-", Path(path).stem.lower()).strip("-")[:40] or "fleet"
        spec = spec.model_copy(update={"name": stem})
    return spec


def _cpu_lists(cpu: CpuSpec, numa_nodes: int) -> list[list[int]]:
    """Linux numbering: first one thread of every core, socket by socket, then the siblings;
    each NUMA node gets an equal run of cores and their siblings."""
    cores = cpu.sockets * cpu.cores_per_socket
    per_node = cores // numa_nodes
    return [
        [
            thread * cores + core
            for thread in range(cpu.threads_per_core)
            for core in range(node * per_node, (node + 1) * per_node)
        ]
        for node in range(numa_nodes)
    ]


def _nvlink_peers(spec: GpuSpec, index: int) -> list[int]:
    if spec.nvlink == "all":
        return [i for i in range(spec.count) if i != index]
    if spec.nvlink == "pairs":
        peer = index ^ 1
        return [peer] if peer < spec.count else []
    if spec.nvlink == "none":
        return []
    return sorted({b if a == index else a for a, b in spec.nvlink if index in (a, b)})


def profile_topology(
    profile: Profile,
    node_id: str,
    seed: int,
    *,
    pool: str = "default",
    labels: dict[str, str] | None = None,
    taints: list[str] | None = None,
) -> SimulatedNode:
    """One simulated machine of a profile; its GPU UUIDs and its measured figures are drawn
    from (seed, node id)."""
    rng = random.Random(f"{seed}:{node_id}:hardware")
    measured = random.Random(f"{seed}:{node_id}:measured")
    # Figures added later draw from their own stream: the earlier ones stay as they were.
    measured_later = random.Random(f"{seed}:{node_id}:measured-all-cores")

    def jitter(value: float | None, draw: random.Random = measured) -> float | None:
        if value is None:
            return None
        return round(value * (1 + draw.uniform(-MEASURED_JITTER, MEASURED_JITTER)), 1)

    cores = profile.cpu.sockets * profile.cpu.cores_per_socket
    cpu = Cpu(
        model=profile.cpu.model,
        sockets=profile.cpu.sockets,
        cores=cores,
        threads=cores * profile.cpu.threads_per_core,
        flags=sorted(set(profile.cpu.flags)),
    )
    memory_mb = profile.memory_gb * 1024
    numa = [
        NumaNode(
            id=i,
            cpus=cpus,
            memory_mb=memory_mb // profile.numa_nodes,
            memory_bandwidth_gbps=jitter(profile.memory_bandwidth_gbps),
            memory_bandwidth_gbps_all_cores=jitter(
                profile.memory_bandwidth_gbps_all_cores, measured_later
            ),
        )
        for i, cpus in enumerate(_cpu_lists(profile.cpu, profile.numa_nodes))
    ]
    gpus: list[Gpu] = []
    spec = profile.gpu
    if spec is not None:
        for i in range(spec.count):
            gpus.append(
                Gpu(
                    index=i,
                    uuid=f"GPU-{uuid.UUID(int=rng.getrandbits(128), version=4)}",
                    model=spec.model,
                    vendor=spec.vendor,
                    memory_mb=spec.memory_mb,
                    pci_bus_id=f"00000000:{0x18 + 0x0E * i:02X}:00.0",
                    numa_node=spec.numa[i] if spec.numa else i * profile.numa_nodes // spec.count,
                    nvlink_peers=_nvlink_peers(spec, i),
                    mig_capable=spec.mig_capable,
                    mig_profiles=list(spec.mig_profiles),
                    pci_root=(
                        f"pci0000:{0x10 + 0x20 * (i // spec.gpus_per_pci_root):02x}"
                        if spec.gpus_per_pci_root
                        else None
                    ),
                    pcie_generation_max=spec.pcie_generation,
                    pcie_width_max=spec.pcie_width,
                    pcie_bandwidth_gbps=spec.pcie_bandwidth_gbps,
                )
            )
    disks = [
        Disk(
            name=d.name,
            model=d.model,
            capacity_gb=d.capacity_gb,
            rotational=d.rotational,
            nvme=d.name.startswith("nvme") if d.nvme is None else d.nvme,
            numa_node=d.numa_node,
            mount_path=d.mount_path,
            random_read_iops=jitter(d.random_read_iops),
            read_latency_us_p50=jitter(d.read_latency_us_p50),
            read_latency_us_p99=jitter(d.read_latency_us_p99),
        )
        for d in profile.disks
    ]
    topology = build_topology(
        node_id=node_id,
        hostname=node_id,
        pool=pool,
        labels={
            LABEL_PROFILE: profile.name,
            LABEL_SIMULATED: "true",
            **profile.labels,
            **(labels or {}),
        },
        cpu=cpu,
        numa_nodes=numa,
        memory_mb=memory_mb,
        gpus=gpus,
        disks=disks,
        simulated=True,
        taints=[Taint.parse(t) for t in (*profile.taints, *(taints or []))],
    )
    return SimulatedNode(
        topology,
        gpu_idle_w=spec.idle_w if spec else 0.0,
        gpu_max_w=spec.max_w if spec else 0.0,
    )


def build_fleet(spec: FleetSpec, seed: int | None = None) -> Fleet:
    """Every node of a fleet spec; `seed` overrides the file's."""
    seed = spec.seed if seed is None else seed
    profiles = {**builtin_profiles(), **{p.name: p for p in spec.profiles}}
    unknown = sorted({e.profile for e in spec.nodes} - profiles.keys())
    if unknown:
        raise FleetError(
            f"unknown profile {', '.join(unknown)}; known: {', '.join(sorted(profiles))}"
        )
    totals: dict[str, int] = {}
    for entry in spec.nodes:
        prefix = entry.prefix or profiles[entry.profile].id_prefix
        totals[prefix] = totals.get(prefix, 0) + entry.count
    numbers = dict.fromkeys(totals, 0)
    nodes: list[SimulatedNode] = []
    for entry in spec.nodes:
        profile = profiles[entry.profile]
        prefix = entry.prefix or profile.id_prefix
        width = max(2, len(str(totals[prefix])))
        for _ in range(entry.count):
            numbers[prefix] += 1
            node_id = f"{prefix}-{numbers[prefix]:0{width}d}"
            nodes.append(
                profile_topology(
                    profile,
                    node_id,
                    seed,
                    pool=entry.pool,
                    labels=entry.labels,
                    taints=entry.taints,
                )
            )
    seen: set[str] = set()
    for node in nodes:
        if node.topology.node_id in seen:
            raise FleetError(f"node id {node.topology.node_id} generated twice: rename a prefix")
        seen.add(node.topology.node_id)
    gpus = {n.topology.node_id: len(n.topology.gpus) for n in nodes}
    for fault in spec.faults:
        if fault.node not in gpus:
            raise FleetError(f"fault {fault.kind} on {fault.node}: no such node in the fleet")
        if fault.kind in GPU_FAULTS and fault.gpu >= gpus[fault.node]:
            raise FleetError(
                f"fault {fault.kind} on {fault.node}: no GPU {fault.gpu} ({gpus[fault.node]} GPUs)"
            )
    return Fleet(spec.name, seed, nodes, tuple(f.fault() for f in spec.faults))


def open_fleet(path: Path | None = None, seed: int | None = None) -> Fleet:
    """The fleet of a file (None: the demo fleet) with its power figures, for simulating."""
    return build_fleet(read_fleet_spec(path), seed)


def load_fleet(path: Path | None = None, seed: int | None = None) -> list[NodeTopology]:
    """The topologies of a fleet file (None: the demo fleet), deterministic under the seed
    (None: the file's own)."""
    return open_fleet(path, seed).topologies
