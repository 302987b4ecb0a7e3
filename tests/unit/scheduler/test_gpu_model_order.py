"""Ordered GPU models (issue 27, item 5; docs/scheduling.md, "GPU models in order of
preference"): `gpu.models: [h100, a100-80gb]` takes the first listed model that holds the whole
task now (`models_policy: next`), or waits for the first up to `models_wait_seconds` (`wait`);
the grant says which it took and why, a waiting task says what it waits for, and a bad list
is refused naming the field. A request naming no models decides as before."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from crater.contracts import (
    AllocationGranted,
    Confidence,
    Event,
    NodeTopologyReported,
    ResourcePrediction,
    TaskPending,
    TaskPreempted,
    TaskProfiled,
    TaskRejected,
    TaskRequest,
)
from crater.runtime.bus import field_errors
from crater.scheduler.adapters.repository import _pending
from crater.scheduler.domain.core import Scheduler, SchedulerConfig
from crater.scheduler.domain.demand import Demand
from tests.support.topologies import node
from tests.unit.scheduler.test_core import at
from tests.unit.scheduler.test_preemption_thrashing import of, stopped, tick

H100 = {"gpu_model": "NVIDIA H100 80GB HBM3", "gpu_memory_mb": 81559}
A100 = {"gpu_model": "NVIDIA A100-SXM4-80GB", "gpu_memory_mb": 81920}
L40S = {"gpu_model": "NVIDIA L40S", "gpu_memory_mb": 46068}
MODELS = {"h100": H100, "a100-80gb": A100, "l40s": L40S}
PREDICTION = ResourcePrediction(
    gpu_memory_per_gpu_mb=1000,
    host_memory_mb=1000,
    confidence=Confidence.LOW,
    method="test",
    dataloader_num_workers=1,
    dataloader_prefetch_factor=2,
)


def body(task_id: str, gpus: int, **gpu: Any) -> dict[str, Any]:
    return {
        "task_id": task_id,
        "task_type": "training",
        "model_config": {"name": "m"},
        "resource_requirements": {
            "gpu": {"count": gpus, **gpu},
            "cpu": {"cores": 1},
            "memory": {"capacity_mb": 1000},
        },
    }


# Request keys outside `resource_requirements.gpu`.
TOP_LEVEL = ("gang_size", "node_selector", "priority", "preemptible")


def submit(task_id: str, when: float, gpus: int, **extra: Any) -> TaskProfiled:
    top = {k: extra.pop(k) for k in TOP_LEVEL if k in extra}
    request = TaskRequest.model_validate({**body(task_id, gpus, **extra), **top})
    return TaskProfiled(occurred_at=at(when), task=request, prediction=PREDICTION)


def ordered(task_id: str, when: float, gpus: int, *models: str, **policy: Any) -> TaskProfiled:
    return submit(task_id, when, gpus, models=list(models), **policy)


def fleet(*nodes: tuple[str, str, int]) -> Scheduler:
    """(name, model key, GPUs) per node."""
    scheduler = Scheduler(config=SchedulerConfig())
    for name, model, gpus in nodes:
        topology = node(name, gpus=gpus, **MODELS[model]).model_copy(
            update={"labels": {"host": name}}
        )
        scheduler.handle(NodeTopologyReported(occurred_at=at(0), node=topology))
    return scheduler


def granted(decisions: list[Event]) -> AllocationGranted:
    [grant] = of(decisions, AllocationGranted)
    return grant


def pending(decisions: list[Event]) -> TaskPending:
    [waits] = of(decisions, TaskPending)
    return waits


# -- next: the first model that fits now ---------------------------------------------------------


def test_next_takes_the_first_choice_when_it_fits_and_says_so() -> None:
    scheduler = fleet(("a100-01", "a100-80gb", 8), ("h100-01", "h100", 8))
    grant = granted(scheduler.handle(ordered("t", 1, 4, "h100", "a100-80gb")))
    assert grant.node == "h100-01"
    assert "took h100, first choice of h100, a100-80gb" in grant.explanation


def test_next_takes_the_second_model_when_the_first_is_full_and_says_why() -> None:
    scheduler = fleet(("a100-01", "a100-80gb", 8), ("h100-01", "h100", 8))
    scheduler.handle(submit("filler", 1, 6, type="h100"))
    grant = granted(scheduler.handle(ordered("t", 2, 4, "h100", "a100-80gb")))
    assert grant.node == "a100-01"
    assert (
        "took a100-80gb, second choice of h100, a100-80gb: h100 full (none of its 1 node in "
        "pool default has room now)" in grant.explanation
    )


def test_the_order_wins_over_the_score() -> None:
    """The A100 node is the better fit by score (already part used: best fit); the order
    still sends the task to the H100 first, and the reverse order to the A100."""
    scheduler = fleet(("a100-01", "a100-80gb", 8), ("h100-01", "h100", 8))
    scheduler.handle(submit("filler", 1, 2, type="a100-80gb"))
    twin = copy.deepcopy(scheduler)
    assert granted(scheduler.handle(ordered("t", 2, 2, "h100", "a100-80gb"))).node == "h100-01"
    assert granted(twin.handle(ordered("t", 2, 2, "a100-80gb", "h100"))).node == "a100-01"


def test_a_gang_takes_one_model_for_every_member() -> None:
    """One H100 node has room for one member of two; the A100s hold both: the gang goes on
    the A100s whole, never one member on each model."""
    scheduler = fleet(
        ("a100-01", "a100-80gb", 4), ("a100-02", "a100-80gb", 4), ("h100-01", "h100", 8)
    )
    scheduler.handle(submit("filler", 1, 4, type="h100"))
    grants = of(
        scheduler.handle(ordered("g", 2, 4, "h100", "a100-80gb", gang_size=2)), AllocationGranted
    )
    assert sorted(g.node for g in grants) == ["a100-01", "a100-02"]
    assert all("second choice" in g.explanation for g in grants)


def test_no_listed_model_has_room_the_task_waits_naming_them_all() -> None:
    scheduler = fleet(("a100-01", "a100-80gb", 8), ("l40s-01", "l40s", 8))
    scheduler.handle(submit("filler", 1, 2, type="a100-80gb"))
    waits = pending(scheduler.handle(ordered("t", 2, 8, "h100", "a100-80gb")))
    assert "has no h100 or a100-80gb GPU" in waits.summary
    assert "fewer than 8 free GPUs" in waits.summary


def test_a_model_no_node_of_the_pool_carries_is_said_so_when_the_next_is_taken() -> None:
    scheduler = fleet(("a100-01", "a100-80gb", 8))
    grant = granted(scheduler.handle(ordered("t", 1, 1, "h100", "a100-80gb")))
    assert "second choice of h100, a100-80gb: no h100 node in pool default" in grant.explanation


def test_a_task_no_listed_model_could_ever_hold_is_refused_naming_the_field() -> None:
    scheduler = fleet(("l40s-01", "l40s", 8))
    [refused] = of(scheduler.handle(ordered("t", 1, 1, "h100", "a100-80gb")), TaskRejected)
    assert [e.field for e in refused.errors] == ["resource_requirements.gpu.models"]
    assert "has no h100 or a100-80gb GPU" in refused.errors[0].reason


# -- wait: the first model, up to a bound ---------------------------------------------------------


def waiting_fleet() -> Scheduler:
    scheduler = fleet(("a100-01", "a100-80gb", 8), ("h100-01", "h100", 8))
    scheduler.handle(submit("filler", 1, 8, type="h100"))
    return scheduler


def test_wait_holds_out_for_the_first_model_and_says_until_when() -> None:
    scheduler = waiting_fleet()
    decisions = scheduler.handle(
        ordered("t", 10, 4, "h100", "a100-80gb", models_policy="wait", models_wait_seconds=300)
    )
    waits = pending(decisions)
    [why] = [r for r in waits.reasons if r.filter == "GpuPreference"]
    assert why.code == "WaitingForPreferredModel"
    assert why.message == (
        "waits for h100, its first choice, until 2026-01-01T00:05:10Z (models_policy wait, "
        "300 s); then takes a100-80gb too"
    )
    assert "1 node has no h100 GPU" in waits.summary  # the A100 node is not for it yet
    assert why.message in waits.summary


def test_tasks_waiting_alike_each_say_their_own_bound_after_a_retry_pass() -> None:
    """Tasks of the same demand wait for their first model with different bounds; a retry
    pass judges them together (those behind the pool's head reuse one verdict) and each
    still says its own bound."""
    scheduler = waiting_fleet()
    scheduler.handle(submit("other", 5, 1, type="a100-80gb"))
    for task_id, when in (("t1", 10), ("t2", 20), ("t3", 25), ("t4", 28)):
        scheduler.handle(
            ordered(
                task_id, when, 4, "h100", "a100-80gb", models_policy="wait", models_wait_seconds=300
            )
        )
    scheduler.handle(stopped("other", 30))  # a retry pass: both judged again
    bounds = (("t1", "05:10"), ("t2", "05:20"), ("t3", "05:25"), ("t4", "05:28"))
    for task_id, until in bounds:
        [why] = [r for r in scheduler.pending[task_id].live_reasons if r.filter == "GpuPreference"]
        assert f"until 2026-01-01T00:{until}Z" in why.message
    # a task naming h100 alone, of the same demand, says no preference of its own
    scheduler.handle(submit("plain", 31, 4, type="h100"))
    scheduler.handle(stopped("nothing", 32))
    assert [r.filter for r in scheduler.pending["plain"].live_reasons] == ["GpuCount", "GpuModel"]


def test_wait_takes_the_first_model_when_it_frees_within_the_bound() -> None:
    scheduler = waiting_fleet()
    scheduler.handle(
        ordered("t", 10, 4, "h100", "a100-80gb", models_policy="wait", models_wait_seconds=300)
    )
    grant = granted(scheduler.handle(stopped("filler", 20)))
    assert grant.node == "h100-01"
    assert "took h100, first choice of h100, a100-80gb (while it waits for its first" in (
        grant.explanation
    )


def test_wait_takes_the_next_model_once_the_bound_has_passed() -> None:
    scheduler = waiting_fleet()
    scheduler.handle(
        ordered("t", 10, 4, "h100", "a100-80gb", models_policy="wait", models_wait_seconds=300)
    )
    assert not of(scheduler.handle(tick(309, "a100-01")), AllocationGranted)
    grant = granted(scheduler.handle(tick(310, "a100-01")))  # any event at or past the bound
    assert grant.node == "a100-01"
    assert "took a100-80gb, second choice of h100, a100-80gb: h100 full" in grant.explanation


def test_wait_preempts_for_its_first_model_only() -> None:
    """A high-priority task waiting for its H100 asks the preemptible H100 task to yield,
    not the A100 one, while it waits for its first choice."""
    scheduler = fleet(("a100-01", "a100-80gb", 8), ("h100-01", "h100", 8))
    for name, model in (("low-a", "a100-80gb"), ("low-h", "h100")):
        scheduler.handle(submit(name, 1, 8, type=model, preemptible=True, priority="low"))
    decisions = scheduler.handle(
        submit(
            "t",
            10,
            8,
            models=["h100", "a100-80gb"],
            models_policy="wait",
            models_wait_seconds=600,
            priority="high",
        )
    )
    assert [p.task_id for p in of(decisions, TaskPreempted)] == ["low-h"]


def test_a_dry_run_waits_for_the_first_model_as_the_submission_would() -> None:
    scheduler = waiting_fleet()
    event = ordered("t", 10, 4, "h100", "a100-80gb", models_policy="wait", models_wait_seconds=60)
    answer = scheduler.dry_run_task(event.task, event.prediction)
    assert answer.outcome == "waiting"
    assert [r.filter for r in answer.reasons][-1] == "GpuPreference"
    answer = scheduler.dry_run_task(ordered("t", 10, 4, "h100", "a100-80gb").task, event.prediction)
    assert [m.node_id for m in answer.members] == ["a100-01"]


def test_a_restored_task_waits_out_its_bound_from_its_stored_submission() -> None:
    """As the repository restores a waiting task (its request, prediction and submission
    time): past its bound, the first event lets it take the next model."""
    live = waiting_fleet()
    live.handle(
        ordered("t", 10, 4, "h100", "a100-80gb", models_policy="wait", models_wait_seconds=300)
    )
    stored = live.pending["t"]
    row = type(
        "Row",
        (),
        {
            "request": stored.request.model_dump(mode="json", by_alias=True),
            "prediction": PREDICTION.model_dump(mode="json"),
            "seq": stored.seq,
            "submitted_at": stored.submitted_at,
        },
    )()
    task = _pending(row)
    assert task.demand.gpu_model == "h100"
    assert task.prefer_until == at(310)
    restored = Scheduler(config=live.config)
    restored.restore(
        nodes=[(n.topology, n.condition, n.last_heartbeat_at) for n in live.cluster.nodes],
        allocations=[],
        pending=[task],
        next_seq=10,
    )
    assert granted(restored.handle(tick(400, "a100-01"))).node == "h100-01"  # h100 free here


# -- the old single model, unchanged ---------------------------------------------------------------


def test_a_request_without_models_has_the_demand_and_the_json_it_had() -> None:
    request = TaskRequest.model_validate(body("t", 2, type="a100|h100"))
    assert "models" not in request.model_dump_json()
    demand = Demand.of(request, None)
    assert (demand.gpu_model, demand.gpu_model_order) == ("a100|h100", ())
    one = TaskRequest.model_validate(body("t", 2, models=["h100"]))
    assert (Demand.of(one, None).gpu_model, Demand.of(one, None).gpu_model_order) == ("h100", ())


# -- validation: every bad list refused, naming the field ----------------------------------------


@pytest.mark.parametrize(
    ("gpu", "field", "says"),
    [
        ({"models": []}, "models", "an empty list"),
        ({"models": ["h100", "H100"]}, "models", "entries 1 and 2 ('h100', 'H100') name the same"),
        ({"models": ["h100-sxm-80gb", "H100 SXM5 80GB"]}, "models", "name the same product"),
        ({"models": ["h100", "x9000"]}, "models", "entry 2: unknown GPU product 'x9000'"),
        ({"models": ["h100|a100"]}, "models", "one product per entry"),
        ({"type": "a100", "models": ["h100"]}, "models", "not both"),
        ({"types": ["a100"], "models": ["h100"]}, "models", "not both"),
        ({"models_policy": "next"}, "models_policy", "without models"),
        ({"models": ["h100"], "models_policy": "steal"}, "models_policy", "'wait' or 'borrow'"),
        ({"models": ["h100"], "models_policy": "wait"}, "models_wait_seconds", "needs"),
        ({"models": ["h100"], "models_wait_seconds": 9}, "models_wait_seconds", "only with"),
        (
            {"models": ["h100"], "models_policy": "wait", "models_wait_seconds": 0},
            "models_wait_seconds",
            "greater than or equal to 1",
        ),
        ({"models": ["h100"] * 9}, "models", "at most 8"),
        (  # the list's own error only, not one more for the policy that depends on it
            {"models": ["h100", "H100"], "models_policy": "wait", "models_wait_seconds": 5},
            "models",
            "name the same product",
        ),
    ],
)
def test_a_bad_list_of_models_is_refused_naming_the_field(
    gpu: dict[str, Any], field: str, says: str
) -> None:
    with pytest.raises(ValidationError) as raised:
        TaskRequest.model_validate(body("t", 1, **gpu))
    [error] = field_errors(raised.value)
    assert error.field == f"resource_requirements.gpu.{field}"
    assert says in error.reason


def test_the_flat_key_gpu_models_orders_too() -> None:
    request = TaskRequest.model_validate(
        {**body("t", 0), "resource_requirements": {"gpu": 2, "gpu_models": ["h100", "l40s"]}}
    )
    assert request.resource_requirements.gpu.models == ["h100", "l40s"]


# -- as a property ------------------------------------------------------------------------------

NODES = st.lists(
    st.tuples(st.sampled_from(sorted(MODELS)), st.integers(min_value=0, max_value=8)),
    min_size=1,
    max_size=5,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=NODES,
    order=st.permutations(sorted(MODELS)).flatmap(
        lambda p: st.integers(min_value=2, max_value=3).map(lambda k: p[:k])
    ),
    gpus=st.integers(min_value=1, max_value=8),
)
def test_the_model_taken_is_the_first_listed_one_that_could_take_the_task_alone(
    nodes: list[tuple[str, int]], order: list[str], gpus: int
) -> None:
    """Each node has 8 cards, `used` of them taken; the ordered task lands on the first model
    of its order that a task naming that model alone would be placed on, and on the node that
    task would get; nothing fits: it waits, as each single-model task would."""
    scheduler = fleet(*((f"n{i}", model, 8) for i, (model, _) in enumerate(nodes)))
    for i, (model, used) in enumerate(nodes):
        if used:
            scheduler.handle(
                submit(f"fill-{i}", 1, used, type=model, node_selector={"host": f"n{i}"})
            )
    alone: dict[str, str | None] = {}
    for model in order:
        twin = copy.deepcopy(scheduler)
        grants = of(twin.handle(submit("t", 5, gpus, type=model)), AllocationGranted)
        alone[model] = grants[0].node if grants else None
    decisions = scheduler.handle(ordered("t", 5, gpus, *order))
    grants = of(decisions, AllocationGranted)
    first = next((m for m in order if alone[m] is not None), None)
    if first is None:
        assert not grants
        # refused when no node carries any listed model, else it waits for one
        carried = any(model in order for model, _ in nodes)
        assert ("t" in scheduler.pending) is carried
        assert bool(of(decisions, TaskRejected)) is not carried
        return
    assert [g.node for g in grants] == [alone[first]]
    assert f"took {first}, " in grants[0].explanation
