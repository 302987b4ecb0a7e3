"""The openb trace format (Alibaba cluster-trace-gpu-v2023, as used by the FGD paper): nodes
and pods read from CSV, turned into the events the scheduling core consumes."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from uuid import UUID, uuid5

from crater.contracts import (
    Confidence,
    Cpu,
    Gpu,
    NodeTopology,
    NodeTopologyReported,
    NumaNode,
    ResourcePrediction,
    TaskProfiled,
    TaskRequest,
)

# The trace does not say how much memory a card has: large enough for any request.
UNKNOWN_GPU_MEMORY_MB = 1_048_576
# Every simulated event happens at this one instant: nothing expires, nobody goes silent.
SIM_TIME = datetime(2023, 7, 10, tzinfo=UTC)
_IDS = UUID("5f0f4a52-6f70-4e62-8b0e-6f70656e6221")


@dataclass(frozen=True)
class OpenbNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True)
class OpenbPod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int  # per card
    gpu_spec: str  # allowed models, "|"-separated; "" for any

    @property
    def gpu_request(self) -> int:
        """Thousandths of a card asked for in all."""
        return self.num_gpu * self.gpu_milli

    @property
    def cpu_cores(self) -> int:
        """The request in whole cores, a fraction rounded up."""
        return self.cpu_units(1000)

    def cpu_units(self, cpu_unit_milli: int) -> int:
        """The request in the core's CPUs of `cpu_unit_milli` each, a fraction rounded up."""
        return math.ceil(self.cpu_milli / cpu_unit_milli)


def load_nodes(path: Path) -> list[OpenbNode]:
    with path.open(newline="") as f:
        return [
            OpenbNode(
                name=row["sn"],
                cpu_milli=int(row["cpu_milli"]),
                memory_mib=int(row["memory_mib"]),
                gpus=int(row["gpu"] or 0),
                model=(row.get("model") or "").strip(),
            )
            for row in csv.DictReader(f)
        ]


def load_pods(path: Path) -> list[OpenbPod]:
    with path.open(newline="") as f:
        return [
            OpenbPod(
                name=row["name"],
                cpu_milli=int(row["cpu_milli"]),
                memory_mib=int(row["memory_mib"]),
                num_gpu=int(row["num_gpu"] or 0),
                gpu_milli=int(row["gpu_milli"] or 0) if int(row["num_gpu"] or 0) else 0,
                gpu_spec=(row.get("gpu_spec") or "").strip(),
            )
            for row in csv.DictReader(f)
        ]


# The core counts whole CPUs, and openb asks for fractions (3.152 cores): the simulator lets
# each of the core's CPUs stand for a tenth of a core, so a request rounds up by less than
# 0.1 core instead of up to a whole one. 1000 gives whole cores.
CPU_UNIT_MILLI = 100


def topology(node: OpenbNode, cpu_unit_milli: int = CPU_UNIT_MILLI) -> NodeTopology:
    """One NUMA node holding every CPU (`cpu_unit_milli` each) and card; cards of unknown
    memory."""
    cores = node.cpu_milli // cpu_unit_milli
    return NodeTopology(
        node_id=node.name,
        hostname=node.name,
        cpu=Cpu(model="openb", sockets=1, cores=max(cores, 1), threads=max(cores, 1)),
        numa_nodes=[NumaNode(id=0, cpus=list(range(cores)), memory_mb=node.memory_mib)],
        memory_mb=node.memory_mib,
        gpus=[
            Gpu(
                index=i,
                uuid=f"{node.name}-gpu{i}",
                model=node.model,
                memory_mb=UNKNOWN_GPU_MEMORY_MB,
                numa_node=0,
            )
            for i in range(node.gpus)
        ],
        simulated=True,
        fingerprint=f"openb:{node.name}:{node.cpu_milli}:{node.memory_mib}:{node.gpus}:{node.model}",
    )


def node_event(node: OpenbNode, cpu_unit_milli: int = CPU_UNIT_MILLI) -> NodeTopologyReported:
    return NodeTopologyReported(
        event_id=uuid5(_IDS, f"node:{node.name}"),
        occurred_at=SIM_TIME,
        node=topology(node, cpu_unit_milli),
    )


_NO_PREDICTION = ResourcePrediction(
    gpu_memory_per_gpu_mb=0,
    host_memory_mb=0,
    confidence=Confidence.LOW,
    method="openb trace: no prediction",
    dataloader_num_workers=0,
    dataloader_prefetch_factor=1,
)


def task_request(pod: OpenbPod, task_id: str, cpu_unit_milli: int = CPU_UNIT_MILLI) -> TaskRequest:
    gpu: dict[str, object] = {"count": pod.num_gpu}
    if pod.num_gpu:
        gpu["milli"] = pod.gpu_milli
        if pod.gpu_spec:
            gpu["type"] = pod.gpu_spec
    return TaskRequest.model_validate(
        {
            "task_id": task_id,
            "task_type": "training",
            "model_config": {"name": "openb"},
            "resource_requirements": {
                "gpu": gpu,
                "cpu": {"cores": pod.cpu_units(cpu_unit_milli)},
                "memory": {"capacity_mb": pod.memory_mib},
            },
        }
    )


def task_event(pod: OpenbPod, task_id: str, cpu_unit_milli: int = CPU_UNIT_MILLI) -> TaskProfiled:
    return TaskProfiled(
        event_id=uuid5(_IDS, f"task:{task_id}"),
        occurred_at=SIM_TIME,
        task=task_request(pod, task_id, cpu_unit_milli),
        prediction=_NO_PREDICTION,
    )
