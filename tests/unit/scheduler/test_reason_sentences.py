"""Why a task waits reads as sentences: counts agree with their nouns and verbs, and no
`None` (issue #23); the reason codes stay as they were."""

from __future__ import annotations

from dataclasses import replace

import pytest

from crater.contracts import FabricLevel, FilterReason
from crater.scheduler.domain.demand import Demand
from crater.scheduler.domain.placer import explained
from crater.scheduler.domain.plugins.filters import ALL
from crater.scheduler.domain.reasons import for_nodes, sentence
from tests.unit.scheduler.test_plugins import demand

FILTERS = {f.name: f for f in ALL}


def gpus(n: int) -> Demand:
    return replace(demand(), gpus=n, gpu_milli=1000)


def test_counts_agree_with_their_nouns_and_verbs() -> None:
    one_gpu = FILTERS["GpuCount"].explain(gpus(1))
    assert for_nodes(2, one_gpu) == "2 nodes have fewer than 1 free GPU"
    assert for_nodes(1, FILTERS["GpuCount"].explain(gpus(4))) == (
        "1 node has fewer than 4 free GPUs"
    )
    assert for_nodes(3, FILTERS["NodeReady"].explain(demand())) == "3 nodes are not ready"
    assert for_nodes(2, FILTERS["NodeLabels"].explain(demand(node_selector={"rack": "r2"}))) == (
        "2 nodes lack the labels rack=r2"
    )
    assert for_nodes(2, "already runs a replica of web") == "2 nodes already run a replica of web"
    assert for_nodes(2, FILTERS["TaintToleration"].explain(demand())) == (
        "2 nodes have a taint the task does not tolerate"
    )


def test_a_reason_about_the_task_is_its_own_sentence() -> None:
    quota = FilterReason(
        filter="TenantQuota",
        code="QuotaExceeded",
        nodes=40,
        message="tenant 'a' is over its quota: gpu would reach 4, over its limit of 2",
    )
    assert sentence(quota) == quota.message
    cores = FilterReason(
        filter="CpuCores", code="InsufficientCpu", nodes=1, message="has fewer than 1 free CPU core"
    )
    assert sentence(cores) == "1 node has fewer than 1 free CPU core"


def test_capacity_verdicts_drop_free() -> None:
    count = FILTERS["GpuCount"]
    assert explained(count, gpus(2), free=False) == "has fewer than 2 GPUs"
    assert explained(count, gpus(2)) == "has fewer than 2 free GPUs"
    assert explained(count, replace(gpus(1), gpu_milli=250)) == (
        "has no card with 25% of a GPU free"
    )


@pytest.mark.parametrize("f", ALL, ids=lambda f: f.name)
def test_every_filter_explains_itself_as_a_predicate_without_none(f: object) -> None:
    d = replace(
        demand(node_selector={"rack": "r1"}),
        gpus=2,
        gpu_model="A100",
        avx="avx512f",
        memory_bandwidth_gbps=20.0,
        pcie_bandwidth_gbps=25.0,
        mig_profile="1g.10gb",
        ssd_iops_min=1000,
        ssd_latency_us_max=200,
        anti_affinity_group="web",
        fabric_required=FabricLevel.LEAF,
    )
    message = f.explain(d)  # type: ignore[attr-defined]
    assert "None" not in message
    assert message.split(" ")[0] in {"has", "is", "lacks", "already", "declares"}, message
