"""A node's topology as the contracts describe it: labels, node id and fingerprint."""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from crater.contracts import Cpu, Disk, FabricPlace, Gpu, NodeTopology, NumaNode, Taint
from crater.contracts.gpus import gpu_of_inventory, nominal_memory_gb
from crater.probe.domain.datasheets import rate_disks

LABEL_ROLE = "crater.ai/node-role"
LABEL_GPU_VENDOR = "crater.ai/gpu-vendor"
LABEL_GPU_MODEL = "crater.ai/gpu-model"
LABEL_GPU_MEMORY = "crater.ai/gpu-memory"
LABEL_GPU_COUNT = "crater.ai/gpu-count"

_NOT_LABEL_CHARS = re.compile(r"[^A-Za-z0-9._-]+")
_NOT_NODE_ID_CHARS = re.compile(r"[^a-z0-9_-]+")


def node_id_from_hostname(hostname: str) -> str:
    """The short host name, made a valid node id.

    Dots are dropped with the domain because the node id is one NATS subject token
    (`crater.v1.node.health.<node>`): a dot there would split it in two.
    """
    short = hostname.strip().split(".", 1)[0].lower()
    cleaned = _NOT_NODE_ID_CHARS.sub("-", short).strip("-_")
    return cleaned[:63].rstrip("-_") or "node"


def label_value(text: str) -> str:
    """A Kubernetes-style label value: at most 63 of [A-Za-z0-9._-], alphanumeric at both ends."""
    cleaned = _NOT_LABEL_CHARS.sub("-", text.strip()).strip("-_.")
    return cleaned[:63].rstrip("-_.")


def gpu_model_label(model: str) -> str:
    """`NVIDIA A100-SXM4-80GB` -> `A100-SXM4-80GB`: the vendor has its own label."""
    name = model.strip()
    if name.upper().startswith("NVIDIA "):
        name = name[len("NVIDIA ") :]
    return label_value(name)


def gpu_model_key(model: str) -> str:
    """The short model a label names (`NVIDIA A100-SXM4-80GB` -> `a100`, `Tesla T4` -> `t4`,
    `NVIDIA GeForce RTX 4090` -> `rtx4090`): the model of the product names callers write
    (AllData's `a100-pcie-40gb` is an `a100`), so one selector matches both."""
    return label_value(gpu_of_inventory(model).model) or label_value(model).lower()


def node_labels(gpus: Sequence[Gpu], extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The crater.ai/* labels of a node's hardware, as operators write them (gpu-model a100,
    gpu-memory 80Gi), under the labels the operator set (`extra`), which win: a selector is
    written against the operator's word, and placement checks the cards themselves.

    On a node with mixed cards the most common model names it and the smallest card sets the
    memory, since a per-card memory selector must hold on every card."""
    labels: dict[str, str] = {LABEL_ROLE: "gpu" if gpus else "cpu", LABEL_GPU_COUNT: str(len(gpus))}
    if gpus:
        vendor = Counter(g.vendor for g in gpus).most_common(1)[0][0]
        labels[LABEL_GPU_VENDOR] = label_value(vendor).lower()
        labels[LABEL_GPU_MODEL] = gpu_model_key(Counter(g.model for g in gpus).most_common(1)[0][0])
        smallest = min(gpus, key=lambda g: g.memory_mb)
        labels[LABEL_GPU_MEMORY] = f"{nominal_memory_gb(smallest.model, smallest.memory_mb)}Gi"
    return {**labels, **(extra or {})}


# Measured figures vary run to run: they travel with the topology but are not hardware.
MEASURED_FIELDS = {
    "numa_nodes": frozenset({"memory_bandwidth_gbps", "memory_bandwidth_gbps_all_cores"}),
    "gpus": frozenset({"pcie_bandwidth_gbps"}),
    "disks": frozenset(
        {
            "random_read_iops",
            "read_latency_us_p50",
            "read_latency_us_p99",
            # a figure (measured, a datasheet's or an operator's), not hardware: the model is
            "random_read_iops_at_depth",
            "random_read_iops_at_depth_source",
        }
    ),
}
# Fields added after the first release, left out of the fingerprint while unknown (None or
# empty), so an upgraded probe reports the same fingerprint for the same machine.
LATER_FIELDS = {
    "gpus": frozenset(
        {"mig_enabled", "pcie_generation_max", "pcie_width_max", "pci_root", "mig_profiles"}
    ),
    "disks": frozenset({"pci_root"}),
}


def _part(kind: str, dumped: dict[str, Any]) -> dict[str, Any]:
    measured = MEASURED_FIELDS.get(kind, frozenset())
    later = LATER_FIELDS.get(kind, frozenset())
    return {
        k: v
        for k, v in dumped.items()
        if k not in measured and not (k in later and v in (None, []))
    }


def _hardware(
    cpu: Cpu,
    numa_nodes: Sequence[NumaNode],
    memory_mb: int,
    gpus: Sequence[Gpu],
    disks: Sequence[Disk],
) -> dict[str, Any]:
    """The fields the fingerprint covers, in a canonical order. Mount points and measured
    figures are not hardware."""
    return {
        "cpu": {**cpu.model_dump(mode="json"), "flags": sorted(set(cpu.flags))},
        "numa_nodes": [
            _part("numa_nodes", {**n.model_dump(mode="json"), "cpus": sorted(n.cpus)})
            for n in sorted(numa_nodes, key=lambda n: n.id)
        ],
        "memory_mb": memory_mb,
        "gpus": [
            _part("gpus", {**g.model_dump(mode="json"), "nvlink_peers": sorted(g.nvlink_peers)})
            for g in sorted(gpus, key=lambda g: g.index)
        ],
        "disks": [
            _part("disks", d.model_dump(mode="json", exclude={"mount_path"}))
            for d in sorted(disks, key=lambda d: d.name)
        ],
    }


def fingerprint(
    cpu: Cpu,
    numa_nodes: Sequence[NumaNode],
    memory_mb: int,
    gpus: Sequence[Gpu],
    disks: Sequence[Disk],
) -> str:
    """sha256 (hex) of the hardware alone: no ids, times, names, pools or labels, so a
    re-discovery of unchanged hardware yields the same value and any card swap a new one."""
    canonical = json.dumps(
        _hardware(cpu, numa_nodes, memory_mb, gpus, disks),
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def fingerprint_of(node: NodeTopology) -> str:
    """Recompute a topology's fingerprint (to check one received, or after editing)."""
    return fingerprint(node.cpu, node.numa_nodes, node.memory_mb, node.gpus, node.disks)


def measured_figures(node: NodeTopology) -> str:
    """sha256 (hex) of the measured figures alone (`MEASURED_FIELDS`): what the fingerprint
    leaves out, so a figure measured late (a card busy at start) is told apart."""
    parts = {
        "numa_nodes": [
            n.model_dump(mode="json") for n in sorted(node.numa_nodes, key=lambda n: n.id)
        ],
        "gpus": [g.model_dump(mode="json") for g in sorted(node.gpus, key=lambda g: g.index)],
        "disks": [d.model_dump(mode="json") for d in sorted(node.disks, key=lambda d: d.name)],
    }
    figures = {
        kind: [{k: v for k, v in item.items() if k in MEASURED_FIELDS[kind]} for item in items]
        for kind, items in parts.items()
    }
    canonical = json.dumps(figures, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def build_topology(
    *,
    node_id: str,
    hostname: str,
    cpu: Cpu,
    numa_nodes: Sequence[NumaNode],
    memory_mb: int,
    gpus: Sequence[Gpu] = (),
    disks: Sequence[Disk] = (),
    pool: str = "default",
    labels: Mapping[str, str] | None = None,
    simulated: bool = False,
    taints: Sequence[Taint] = (),
    disk_iops_at_depth: Mapping[str, float] | None = None,
) -> NodeTopology:
    """A node's topology; its place in the network fabric read off its labels
    (crater.ai/leaf-switch, ...: `FABRIC_LABELS`). Disks get their at-depth random-read IOPS
    from `disk_iops_at_depth` (an operator's, by disk name) or the datasheet table (see
    datasheets.py)."""
    gpus = sorted(gpus, key=lambda g: g.index)
    disks = sorted(rate_disks(disks, disk_iops_at_depth), key=lambda d: d.name)
    numa_nodes = sorted(numa_nodes, key=lambda n: n.id)
    all_labels = node_labels(gpus, labels)
    return NodeTopology(
        node_id=node_id,
        hostname=hostname,
        pool=pool,
        labels=all_labels,
        # its place in the fabric, as its labels declare it (a bad value is refused, named)
        fabric=FabricPlace.from_labels(all_labels),
        taints=list(taints),
        cpu=cpu,
        numa_nodes=numa_nodes,
        memory_mb=memory_mb,
        gpus=gpus,
        disks=disks,
        simulated=simulated,
        fingerprint=fingerprint(cpu, numa_nodes, memory_mb, gpus, disks),
    )
