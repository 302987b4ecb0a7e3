from __future__ import annotations

import pytest

from crater.contracts import (
    GpuMetrics,
    NodeCondition,
    NodeHealthReported,
    NodeMetricsReported,
    NodeTopology,
    NumaNode,
)
from crater.probe.domain.health import HealthLimits, evaluate, health_report
from crater.probe.sim.fleet import load_fleet


@pytest.fixture(scope="module")
def a100() -> NodeTopology:
    return next(n for n in load_fleet(None, seed=1) if n.node_id == "a100-01")


def metrics(
    node: NodeTopology,
    *,
    temperature: float = 60.0,
    used_share: float = 0.3,
    drop_gpu: int | None = None,
) -> NodeMetricsReported:
    return NodeMetricsReported(
        node_id=node.node_id,
        cpu_utilization_percent=10,
        memory_used_mb=int(node.memory_mb * used_share),
        memory_total_mb=node.memory_mb,
        gpus=[
            GpuMetrics(
                index=g.index,
                utilization_percent=90,
                memory_used_mb=1000,
                memory_total_mb=g.memory_mb,
                temperature_c=temperature,
            )
            for g in node.gpus
            if g.index != drop_gpu
        ],
    )


def check(assessment: object, name: str) -> tuple[bool, str]:
    found = {c.name: c for c in assessment.checks}[name]  # type: ignore[attr-defined]
    return found.passed, found.detail


def test_healthy_node_is_ready_with_every_named_check(a100: NodeTopology) -> None:
    assessment = evaluate(a100, metrics(a100))
    assert assessment.condition is NodeCondition.READY
    assert assessment.score == 100
    assert [c.name for c in assessment.checks] == [
        "gpus-visible",
        "gpu-temperature",
        "gpu-ecc",
        "pcie-link",
        "memory-pressure",
        "disk-present",
        "disk-wear",
        "numa-balance",
    ]
    assert all(c.passed for c in assessment.checks)
    assert check(assessment, "numa-balance")[1].startswith("2 NUMA nodes")


def test_without_metrics_the_topology_checks_still_run(a100: NodeTopology) -> None:
    assessment = evaluate(a100)
    assert assessment.condition is NodeCondition.READY
    assert check(assessment, "gpus-visible") == (True, "no metrics sample yet")


def test_a_hot_gpu_degrades_and_a_very_hot_one_takes_the_node_out(a100: NodeTopology) -> None:
    warm = evaluate(a100, metrics(a100, temperature=88))
    assert warm.condition is NodeCondition.DEGRADED
    assert warm.score == 85
    assert check(warm, "gpu-temperature") == (False, "hottest GPU 7 at 88 C >= 85 C")
    hot = evaluate(a100, metrics(a100, temperature=97))
    assert hot.condition is NodeCondition.NOT_READY
    assert hot.score == 50


def test_limits_are_configurable(a100: NodeTopology) -> None:
    strict = HealthLimits(gpu_temperature_warn_c=50, gpu_temperature_critical_c=99)
    assert evaluate(a100, metrics(a100), strict).condition is NodeCondition.DEGRADED


def test_a_gpu_that_stopped_reporting_is_critical(a100: NodeTopology) -> None:
    assessment = evaluate(a100, metrics(a100, drop_gpu=3))
    assert assessment.condition is NodeCondition.NOT_READY
    assert check(assessment, "gpus-visible") == (False, "GPU 3 of 8 not reporting")


@pytest.mark.parametrize(
    ("share", "condition"),
    [
        (0.5, NodeCondition.READY),
        (0.96, NodeCondition.DEGRADED),
        (0.995, NodeCondition.NOT_READY),
    ],
)
def test_memory_pressure(a100: NodeTopology, share: float, condition: NodeCondition) -> None:
    assert evaluate(a100, metrics(a100, used_share=share)).condition is condition


def test_no_disk_and_unbalanced_numa_each_cost_a_warning(a100: NodeTopology) -> None:
    broken = a100.model_copy(
        update={
            "disks": [],
            "numa_nodes": [
                NumaNode(id=0, cpus=list(range(128)), memory_mb=1_048_576),
                NumaNode(id=1, cpus=list(range(128, 256)), memory_mb=262_144),  # dead DIMMs
            ],
        }
    )
    assessment = evaluate(broken, metrics(broken))
    assert assessment.condition is NodeCondition.DEGRADED
    assert assessment.score == 70
    assert not check(assessment, "disk-present")[0]
    passed, detail = check(assessment, "numa-balance")
    assert not passed
    assert detail.startswith("unbalanced")


def test_a_gpu_on_an_unknown_numa_node_fails_numa_balance(a100: NodeTopology) -> None:
    gpus = [g.model_copy(update={"numa_node": 5}) if g.index == 0 else g for g in a100.gpus]
    assessment = evaluate(a100.model_copy(update={"gpus": gpus}))
    assert check(assessment, "numa-balance") == (
        False,
        "GPU 0 on a NUMA node the host does not list",
    )


def test_memory_only_numa_nodes_are_not_counted_as_imbalance(a100: NodeTopology) -> None:
    cxl = NumaNode(id=2, cpus=[], memory_mb=16384)
    node = a100.model_copy(update={"numa_nodes": [*a100.numa_nodes, cxl]})
    assert evaluate(node).condition is NodeCondition.READY


def test_health_report_is_the_heartbeat_event(a100: NodeTopology) -> None:
    report = health_report(a100, metrics(a100, temperature=90))
    assert isinstance(report, NodeHealthReported)
    assert report.node_id == "a100-01"
    assert report.condition is NodeCondition.DEGRADED
    assert report.score == 85
    assert len(report.checks) == 8
