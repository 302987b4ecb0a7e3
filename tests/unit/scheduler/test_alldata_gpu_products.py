"""AllData's task (../shared/compat/alldata_task.json, unedited) placed by the scheduling
core: `a100-pcie-40gb` is an A100, PCIe, 40 GB or more per card, read against the model
names the probe reports."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from crater.contracts import (
    AllocationGranted,
    Confidence,
    NodeTopology,
    NodeTopologyReported,
    ResourcePrediction,
    TaskPending,
    TaskProfiled,
    TaskRejected,
    TaskRequest,
)
from crater.probe.sim.fleet import load_fleet
from crater.scheduler.domain.core import Scheduler
from tests.support.alldata import fixture
from tests.support.topologies import node

T0 = datetime(2026, 1, 1, tzinfo=UTC)
TASK = TaskRequest.model_validate_json(fixture("alldata_task.json"))


def measured(name: str, gpu_model: str, gpu_memory_mb: int, gpus: int = 4) -> NodeTopology:
    """A node fit for AllData's task in memory bandwidth and SSD, as a real probe reports
    one: 18 GB/s one thread but 180 GB/s all cores at once; 13,000 IOPS at queue depth 1 but
    1,450,000 at depth (a PCIe 4 NVMe's datasheet figure)."""
    t = node(name, gpus=gpus, gpu_model=gpu_model, gpu_memory_mb=gpu_memory_mb, cores=64)
    return t.model_copy(
        update={
            "numa_nodes": [
                n.model_copy(
                    update={
                        "memory_bandwidth_gbps": 18.0,
                        "memory_bandwidth_gbps_all_cores": 180.0,
                    }
                )
                for n in t.numa_nodes
            ],
            "disks": [
                d.model_copy(
                    update={
                        "random_read_iops": 13_000.0,
                        "read_latency_us_p50": 90.0,
                        "random_read_iops_at_depth": 1_450_000.0,
                        "random_read_iops_at_depth_source": "datasheet",
                    }
                )
                for d in t.disks
            ],
        }
    )


def place(*nodes: NodeTopology, task: TaskRequest = TASK) -> object:
    scheduler = Scheduler()
    for t in nodes:
        scheduler.handle(NodeTopologyReported(occurred_at=T0, node=t))
    prediction = ResourcePrediction(
        gpu_memory_per_gpu_mb=12000,
        host_memory_mb=16000,
        confidence=Confidence.LOW,
        method="test",
        dataloader_num_workers=3,
        dataloader_prefetch_factor=2,
    )
    [decision] = scheduler.handle(TaskProfiled(occurred_at=T0, task=task, prediction=prediction))
    return decision


A100_PCIE_40 = ("NVIDIA A100-PCIE-40GB", 40960)


def test_alldatas_task_lands_on_the_a100_pcie_40gb_node_among_others() -> None:
    granted = place(
        measured("h100-01", "NVIDIA H100 80GB HBM3", 81559),
        measured("a10-01", "NVIDIA A10", 23028),
        measured("a100-sxm-01", "NVIDIA A100-SXM4-80GB", 81920),
        measured("a100-pcie-01", *A100_PCIE_40),
        measured("v100-01", "Tesla V100-PCIE-32GB", 32768),
    )
    assert isinstance(granted, AllocationGranted), granted
    assert granted.node == "a100-pcie-01"
    assert len(granted.gpu_ids) == 2


@pytest.mark.parametrize(
    ("model", "memory_mb"),
    [
        ("NVIDIA H100 PCIe", 81559),  # another model
        ("NVIDIA A10", 23028),  # a prefix of the name, not the model
        ("NVIDIA A100-SXM4-40GB", 40960),  # an A100, but SXM
        ("NVIDIA A100-PCIE-16GB", 16384),  # no such card; less memory than the product's
    ],
)
def test_alldatas_task_is_refused_on_other_products(model: str, memory_mb: int) -> None:
    refused = place(measured("other-01", model, memory_mb))
    assert isinstance(refused, TaskRejected | TaskPending), refused
    if isinstance(refused, TaskRejected):
        assert refused.errors[0].field == "resource_requirements.gpu.type"
    else:
        assert {r.code for r in refused.reasons} == {"GpuModelMismatch"}


def test_a_card_whose_name_does_not_say_its_form_factor_passes_on_model_and_memory() -> None:
    granted = place(measured("a100-01", "NVIDIA A100", 40960))
    assert isinstance(granted, AllocationGranted), granted
    too_small = place(measured("a100-02", "NVIDIA A100", 16384))
    assert not isinstance(too_small, AllocationGranted)


def test_a_larger_a100_pcie_card_serves_a_40gb_request() -> None:
    granted = place(measured("a100-80", "NVIDIA A100 80GB PCIe", 81920))
    assert isinstance(granted, AllocationGranted), granted


def test_a_cluster_trace_model_is_matched_exactly_as_the_trace_protocol_places_it() -> None:
    """openb's V100M16 is a model of its own there: a task pinned to it does not go to a
    V100M32 node, though the simulator gives every card the same memory."""
    pinned = TASK.model_copy(
        update={
            "resource_requirements": TASK.resource_requirements.model_copy(
                update={
                    "gpu": TASK.resource_requirements.gpu.model_copy(update={"type": "V100M16"})
                }
            )
        }
    )
    granted = place(
        measured("a-m32", "V100M32", 40960), measured("b-m16", "V100M16", 40960), task=pinned
    )
    assert isinstance(granted, AllocationGranted), granted
    assert granted.node == "b-m16"  # "a-m32" would win a tie by name


def test_alldatas_task_on_the_demo_fleet_lands_on_an_a100_pcie_node() -> None:
    """The demo fleet as the simulated probe reports it: AllData's figures (140 GB/s, 800,000
    IOPS) are met by the a100-pcie nodes' all-core bandwidth and their PM1733's datasheet
    IOPS, though no node comes near them one thread or one read at a time."""
    fleet = load_fleet(None)
    granted = place(*fleet)
    assert isinstance(granted, AllocationGranted), granted
    assert granted.node in {"a100-pcie-01", "a100-pcie-02"}
    assert len(granted.gpu_ids) == 2


def _one_thread_only(t: NodeTopology) -> NodeTopology:
    numa = [n.model_copy(update={"memory_bandwidth_gbps_all_cores": None}) for n in t.numa_nodes]
    return t.model_copy(update={"numa_nodes": numa})


def _qd1_only(t: NodeTopology) -> NodeTopology:
    disks = [
        d.model_copy(
            update={"random_read_iops_at_depth": None, "random_read_iops_at_depth_source": None}
        )
        for d in t.disks
    ]
    return t.model_copy(update={"disks": disks})


@pytest.mark.parametrize(
    ("strip", "reason"),
    [
        (
            _one_thread_only,
            "2 nodes have less than 140 GB/s of memory bandwidth over a NUMA node's cores",
        ),
        (
            _qd1_only,
            "2 nodes have no SSD doing 800000 random-read IOPS at depth (at QD1 where no such "
            "figure)",
        ),
    ],
)
def test_on_the_figures_at_queue_depth_1_or_one_thread_alone_it_is_refused(
    strip: Callable[[NodeTopology], NodeTopology], reason: str
) -> None:
    """What the figures in AllData's sense change: without either (a probe that measures
    one thread or QD1 only) no node of the demo fleet could ever reach the ask."""
    refused = place(*(strip(t) for t in load_fleet(None)))
    assert isinstance(refused, TaskRejected), refused
    assert reason in " ".join(e.reason for e in refused.errors)
