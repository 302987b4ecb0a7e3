"""Node selectors written in the labels' convention (`crater.ai/gpu-model: a100`,
`crater.ai/gpu-memory: 80Gi`) place on the nodes the probe labelled so."""

from __future__ import annotations

from datetime import UTC, datetime

from crater.contracts import (
    AllocationGranted,
    Confidence,
    NodeTopologyReported,
    PlacementQuery,
    ResourcePrediction,
    TaskProfiled,
    TaskRequest,
)
from crater.contracts.gpus import parse_gpu_product
from crater.probe.sim.fleet import builtin_profiles, load_fleet, profile_topology
from crater.scheduler.domain.core import Scheduler
from crater.scheduler.domain.demand import Demand


def demo_scheduler() -> Scheduler:
    scheduler = Scheduler()
    for topology in load_fleet(None):
        scheduler.handle(NodeTopologyReported(occurred_at=datetime.now(UTC), node=topology))
    return scheduler


def fits(scheduler: Scheduler, body: dict[str, object]) -> list[str]:
    answer = scheduler.dry_run(Demand.of_query(PlacementQuery.model_validate(body)))
    return sorted(f.node_id for f in answer.fits)


def selected(
    scheduler: Scheduler, selector: dict[str, str], pool: str, resources: object = None
) -> list[str]:
    body = {"resource_requirements": resources or {"gpu": 1}, "pool": pool}  # the flat form
    return fits(scheduler, {**body, "node_selector": selector})


def test_selectors_in_the_label_convention_pick_the_nodes_with_that_hardware() -> None:
    scheduler = demo_scheduler()
    a100s = [f"a100-0{i}" for i in range(1, 5)]
    assert selected(scheduler, {"crater.ai/gpu-model": "a100"}, "training") == a100s
    assert selected(scheduler, {"crater.ai/gpu-memory": "80Gi"}, "training") == [
        *a100s,
        "h100-01",
        "h100-02",  # h100-03 and -04 are tainted
    ]
    small = {"crater.ai/gpu-memory": "16Gi", "crater.ai/gpu-vendor": "nvidia"}
    assert selected(scheduler, small, "inference") == [f"t4-0{i}" for i in range(1, 9)]
    cpu = {"crater.ai/node-role": "cpu"}
    assert selected(scheduler, cpu, "default", {"cpu": 4}) == [f"cpu-0{i}" for i in range(1, 9)]
    # other spellings match nothing: the convention is the short lower-case model
    assert selected(scheduler, {"crater.ai/gpu-model": "A100"}, "training") == []
    assert selected(scheduler, {"crater.ai/gpu-model": "A100-SXM4-80GB"}, "training") == []


def test_an_operators_label_overrides_the_derived_one_for_selectors() -> None:
    profile = builtin_profiles()["rtx4090-4"]
    relabelled = profile_topology(
        profile, "ws-01", 1, pool="inference", labels={"crater.ai/gpu-model": "geforce-4090"}
    ).topology
    plain = profile_topology(profile, "ws-02", 1, pool="inference").topology
    scheduler = Scheduler()
    for topology in (relabelled, plain):
        scheduler.handle(NodeTopologyReported(occurred_at=datetime.now(UTC), node=topology))
    body = {"resource_requirements": {"gpu": 1}, "pool": "inference"}
    assert fits(scheduler, {**body, "node_selector": {"crater.ai/gpu-model": "geforce-4090"}}) == [
        "ws-01"
    ]
    assert fits(scheduler, {**body, "node_selector": {"crater.ai/gpu-model": "rtx4090"}}) == [
        "ws-02"
    ]


def test_a_task_selecting_the_model_alldata_names_is_placed_there() -> None:
    scheduler = demo_scheduler()
    model = parse_gpu_product("a100-pcie-40gb").model  # AllData's gpu.type
    request = TaskRequest.model_validate(
        {
            "task_id": "sel-1",
            "task_type": "training",
            "model_config": {"name": "gpt2"},
            "resource_requirements": {"gpu": 2, "gpu_memory": "40Gi", "memory": "64Gi"},
            "pool": "training",
            "node_selector": {"crater.ai/gpu-model": model},
        }
    )
    prediction = ResourcePrediction(
        gpu_memory_per_gpu_mb=30000,
        host_memory_mb=16000,
        confidence=Confidence.LOW,
        method="test",
        dataloader_num_workers=3,
        dataloader_prefetch_factor=2,
    )
    events = scheduler.handle(
        TaskProfiled(occurred_at=datetime.now(UTC), task=request, prediction=prediction)
    )
    [granted] = [e for e in events if isinstance(e, AllocationGranted)]
    assert granted.node.startswith("a100-")
    assert len(granted.gpu_ids) == 2
