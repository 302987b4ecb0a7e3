"""The new filters through the core: reason codes in dry runs, pending tasks and rejections;
MIG slices granted and returned; pools with their own pipeline and over-commit."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from crater.contracts import (
    AllocationGranted,
    Confidence,
    NodeTopology,
    NodeTopologyReported,
    PlacementQuery,
    ResourcePrediction,
    Taint,
    TaskPending,
    TaskPreempted,
    TaskProfiled,
    TaskRejected,
    TaskRequest,
    TaskStatus,
    TaskStatusReported,
)
from crater.scheduler.adapters.pools_file import PoolsFileError, load_pools, parse_pools
from crater.scheduler.app import SchedulerSettings
from crater.scheduler.domain.cluster import Overcommit
from crater.scheduler.domain.core import Scheduler, SchedulerConfig
from crater.scheduler.domain.demand import Demand
from crater.scheduler.domain.plugins import DEFAULT_PIPELINE, FILTERS
from crater.scheduler.domain.pools import PoolPolicy
from tests.support.topologies import node

T0 = datetime(2026, 1, 1, tzinfo=UTC)
A100_MIG = ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def scheduler_with(*nodes: NodeTopology, config: SchedulerConfig | None = None) -> Scheduler:
    scheduler = Scheduler(config=config or SchedulerConfig())
    for t in nodes:
        scheduler.handle(NodeTopologyReported(occurred_at=at(0), node=t))
    return scheduler


def submit(task_id: str, when: float = 1, **body: Any) -> TaskProfiled:
    request = TaskRequest.model_validate(
        {"task_id": task_id, "task_type": "training", "model_config": {"name": "m"}, **body}
    )
    prediction = ResourcePrediction(
        gpu_memory_per_gpu_mb=0,
        host_memory_mb=0,
        confidence=Confidence.LOW,
        method="test",
        dataloader_num_workers=1,
        dataloader_prefetch_factor=1,
    )
    return TaskProfiled(occurred_at=at(when), task=request, prediction=prediction)


def finished(task_id: str, when: float) -> TaskStatusReported:
    return TaskStatusReported(occurred_at=at(when), task_id=task_id, status=TaskStatus.SUCCEEDED)


def mig_node(name: str, gpus: int = 1, **kw: Any) -> NodeTopology:
    t = node(name, gpus=gpus, **kw)
    cards = [g.model_copy(update={"mig_capable": True, "mig_profiles": A100_MIG}) for g in t.gpus]
    return t.model_copy(update={"gpus": cards})


def tainted(t: NodeTopology, *taints: str) -> NodeTopology:
    return t.model_copy(update={"taints": [Taint.parse(x) for x in taints]})


def test_dry_run_names_each_new_filter_with_its_code() -> None:
    scheduler = scheduler_with(
        tainted(node("llm-01", gpus=2), "dedicated=llm:NoSchedule"),
        node("plain-01", gpus=2).model_copy(update={"labels": {"rack": "r1"}}),
        node("other-01", gpus=2).model_copy(update={"labels": {"rack": "r2"}}),
    )
    query = PlacementQuery.model_validate(
        {"resource_requirements": {"gpu": {"count": 1}}, "node_selector": {"rack": "r1"}}
    )
    answer = scheduler.dry_run(Demand.of_query(query))
    assert [f.node_id for f in answer.fits] == ["plain-01"]
    codes = {m.node_id: m.code for m in answer.misfits}
    assert codes == {"llm-01": "NodeSelectorMismatch", "other-01": "NodeSelectorMismatch"}
    tolerant = PlacementQuery.model_validate(
        {
            "resource_requirements": {"gpu": {"count": 1}, "ssd": {"iops_min": 1000}},
            "tolerations": [{"key": "dedicated", "value": "llm"}],
        }
    )
    answer = scheduler.dry_run(Demand.of_query(tolerant))
    assert answer.fits == []
    assert {m.code for m in answer.misfits} == {"InsufficientSsdIops"}
    assert answer.summary == (
        "0/3 nodes fit; 3 nodes have no SSD doing 1000 random-read IOPS at depth (at QD1 where "
        "no such figure), or none measured"
    )


def test_a_waiting_task_says_which_new_filters_keep_it_out() -> None:
    scheduler = scheduler_with(
        tainted(node("llm-01", gpus=2), "dedicated=llm:NoSchedule"),
        node("busy-01", gpus=2),
    )
    [placed] = scheduler.handle(submit("fill", resource_requirements={"gpu": {"count": 2}}))
    assert isinstance(placed, AllocationGranted)
    assert placed.node == "busy-01"
    [pending] = scheduler.handle(submit("next", 2, resource_requirements={"gpu": {"count": 2}}))
    assert isinstance(pending, TaskPending)
    assert {r.code: r.nodes for r in pending.reasons} == {
        "UntoleratedTaint": 1,
        "InsufficientGpus": 1,
    }
    assert "1 node has a taint the task does not tolerate" in pending.summary


def test_a_request_no_node_can_ever_meet_is_rejected_naming_the_field() -> None:
    scheduler = scheduler_with(node("a", gpus=2), node("b", gpus=2))
    [rejected] = scheduler.handle(
        submit("fast-disk", resource_requirements={"ssd": {"latency_us_max": 50}})
    )
    assert isinstance(rejected, TaskRejected)
    [error] = rejected.errors
    assert error.field == "resource_requirements.ssd.latency_us_max"
    assert "2 nodes have no SSD reading within 50 us, or none measured" in error.reason
    [mig] = scheduler.handle(
        submit("slice", 2, resource_requirements={"gpu": {"count": 1, "mig_profile": "1g.10gb"}})
    )
    assert isinstance(mig, TaskRejected)
    assert mig.errors[0].field == "resource_requirements.gpu.mig_profile"


def test_mig_slices_are_granted_named_and_returned() -> None:
    scheduler = scheduler_with(mig_node("mig-01", gpus=1))
    slices = {"gpu": {"count": 1, "mig_profile": "3g.40gb"}, "cpu": {"cores": 1}}
    grants = []
    for i in range(2):
        [granted] = scheduler.handle(submit(f"s{i}", 1 + i, resource_requirements=slices))
        assert isinstance(granted, AllocationGranted)
        grants.append(granted)
    assert [(g.gpu_ids, g.mig_profile) for g in grants] == [([0], "3g.40gb")] * 2
    assert grants[0].environment["CRATER_MIG_PROFILE"] == "3g.40gb"
    assert grants[0].gpu_milli == 428  # 3 of 7 compute slices
    [third] = scheduler.handle(submit("s2", 3, resource_requirements=slices))
    assert isinstance(third, TaskPending)
    assert "no card with a free MIG 3g.40gb slice" in third.summary
    # a slice returns: the waiting slice takes it
    decisions = scheduler.handle(finished("s0", 4))
    assert [(type(d).__name__, d.task_id) for d in decisions] == [  # type: ignore[attr-defined]
        ("AllocationReleased", "s0"),
        ("TaskEnded", "s0"),
        ("AllocationGranted", "s2"),
    ]
    # the card is cut: a whole-card task waits until every slice is back
    [whole] = scheduler.handle(submit("whole", 5, resource_requirements={"gpu": {"count": 1}}))
    assert isinstance(whole, TaskPending)
    assert not any(isinstance(d, AllocationGranted) for d in scheduler.handle(finished("s1", 6)))
    last = [d for d in scheduler.handle(finished("s2", 7)) if isinstance(d, AllocationGranted)]
    assert [(g.task_id, g.gpu_ids, g.mig_profile) for g in last] == [("whole", [0], None)]


def test_a_pool_with_cpu_over_commit_promises_each_core_twice() -> None:
    pools = {"batch": PoolPolicy(DEFAULT_PIPELINE, Overcommit(cpu=2.0, memory=2.0))}
    scheduler = scheduler_with(
        node("batch-01", cores=16, memory_mb=64_000, pool="batch"),
        node("plain-01", cores=16, memory_mb=64_000),
        config=SchedulerConfig(pools=pools),
    )
    needs = {"cpu": {"cores": 16}, "memory": {"capacity_mb": 64_000}}
    for pool in ("batch", "default"):
        [first] = scheduler.handle(submit(f"{pool}-1", 1, pool=pool, resource_requirements=needs))
        [second] = scheduler.handle(submit(f"{pool}-2", 2, pool=pool, resource_requirements=needs))
        assert isinstance(first, AllocationGranted)
        assert isinstance(second, AllocationGranted if pool == "batch" else TaskPending)
    [third] = scheduler.handle(submit("batch-3", 3, pool="batch", resource_requirements=needs))
    assert isinstance(third, TaskPending)
    held = scheduler.cluster.get("batch-01")
    assert held is not None
    assert set(held.cpu_held.values()) == {2}


def test_a_pool_pipeline_scores_with_its_own_plugins() -> None:
    pools = {
        "default": PoolPolicy(DEFAULT_PIPELINE.from_names(list(FILTERS), {"FieldWeighted": 1}))
    }
    nvme = node("fast", gpus=2)
    fast = nvme.model_copy(
        update={"disks": [d.model_copy(update={"random_read_iops": 20000.0}) for d in nvme.disks]}
    )
    scheduler = scheduler_with(node("a-slow", gpus=2), fast, config=SchedulerConfig(pools=pools))
    [granted] = scheduler.handle(submit("t", resource_requirements={"gpu": {"count": 1}}))
    assert isinstance(granted, AllocationGranted)
    assert granted.node == "fast"  # the default pipeline would pick a-slow (name order)
    assert [s.plugin for s in granted.scores] == ["FieldWeighted"]
    plain = scheduler_with(node("a-slow", gpus=2), fast)
    [other] = plain.handle(submit("t", resource_requirements={"gpu": {"count": 1}}))
    assert isinstance(other, AllocationGranted)
    assert other.node == "a-slow"


# -- the pools file --------------------------------------------------------------------------


POOLS = """
pools:
  training:
    scores: {FieldWeighted: 0.5, TopologyLocality: 0.3, GpuBinPack: 0.2}
  inference:
    filters: [NodeReady, Pool, TaintToleration, GpuCount, GpuMemory, CpuCores, Memory]
    overcommit: {cpu: 2.0, memory: 1.5}
"""


def test_pools_file_sets_each_pools_pipeline_and_ratios(tmp_path: Path) -> None:
    path = tmp_path / "pools.yaml"
    path.write_text(POOLS)
    pools = load_pools(path)
    training, inference = pools["training"], pools["inference"]
    assert [(s.name, s.weight) for s in training.pipeline.scores] == [
        ("FieldWeighted", 0.5),
        ("TopologyLocality", 0.3),
        ("GpuBinPack", 0.2),
    ]
    assert [f.name for f in training.pipeline.filters] == list(FILTERS)
    assert training.overcommit == Overcommit()
    assert inference.overcommit == Overcommit(cpu=2.0, memory=1.5, gpu=1.0)
    assert [f.name for f in inference.pipeline.filters][:3] == [
        "NodeReady",
        "Pool",
        "TaintToleration",
    ]
    assert inference.pipeline.scores == DEFAULT_PIPELINE.scores
    settings = SchedulerSettings(pools_file=path)
    assert settings.pools_file == path
    assert SchedulerSettings().pools_file is None  # unset: today's behaviour


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "pools: {a: {filters: [Pool, Nope]}}",
            "pools.a.filters: Value error, unknown filter Nope",
        ),
        ("pools: {a: {filters: [Pool, GpuCount]}}", "pools.a.filters: Value error, must include"),
        ("pools: {a: {scores: {Fast: 1}}}", "pools.a.scores: Value error, unknown score Fast"),
        ("pools: {a: {scores: {GpuBinPack: -1}}}", "negative weight for GpuBinPack"),
        ("pools: {a: {overcommit: {cpu: 0}}}", "pools.a.overcommit.cpu: Input should be greater"),
        ("pools: {a: {overcommit: {disk: 2}}}", "pools.a.overcommit.disk: Extra inputs"),
        ("pools: {a: {args: {Random: {colour: 1}}}}", "pools.a.args: Random is not"),
        ("pools: {a: {scores: {Random: 1}, args: {Random: {colour: 1}}}}", "pools.a.args:"),
        ("pools: [", "not valid YAML"),
    ],
)
def test_a_bad_pools_file_is_refused_naming_the_field(text: str, message: str) -> None:
    with pytest.raises(PoolsFileError, match="pools file: ") as error:
        parse_pools(text)
    assert message in str(error.value)


def test_a_whole_card_task_preempts_the_slices_cut_from_it() -> None:
    scheduler = scheduler_with(mig_node("mig-01", gpus=1))
    slices = {"gpu": {"count": 1, "mig_profile": "3g.40gb"}, "cpu": {"cores": 1}}
    for i in range(2):
        [granted] = scheduler.handle(
            submit(f"s{i}", 1 + i, resource_requirements=slices, priority="low", preemptible=True)
        )
        assert isinstance(granted, AllocationGranted)
    decisions = scheduler.handle(
        submit("urgent", 3, resource_requirements={"gpu": {"count": 1}}, priority="high")
    )
    assert sorted(d.task_id for d in decisions if isinstance(d, TaskPreempted)) == ["s0", "s1"]
