"""Ordered GPU models with `models_policy: borrow` (issue 27, item 5; docs/queues.md, "GPU
models in order of preference"; Kueue's flavor fungibility `whenCanBorrow: Borrow`): each
listed model is tried on the task's own pool, then on a cohort mate's idle nodes, before the
next model. Every lending rule holds for each model (docs/pools.md); a pool without a cohort
decides as with `next`; the grant says which model it took, that it was borrowed and why."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from crater.contracts import (
    AllocationGranted,
    Event,
    NodeTopologyReported,
    TaskPending,
    TaskProfiled,
    TaskRequest,
)
from crater.runtime.bus import field_errors
from crater.scheduler.domain.core import Scheduler, SchedulerConfig
from crater.scheduler.domain.pools import PoolPolicy
from crater.scheduler.domain.quotas import Quota
from tests.support.topologies import node
from tests.unit.scheduler.test_core import at
from tests.unit.scheduler.test_gpu_model_order import MODELS, PREDICTION, body
from tests.unit.scheduler.test_preemption_thrashing import of, stopped

ORDER = ("h100", "a100-80gb")


def cohort(lend: Quota | None = None, half_life: float | None = None) -> SchedulerConfig:
    """Pools training and inference lending each other (inference within `lend`); with
    `half_life`, borrowers served by fair share after the retry pass."""
    return SchedulerConfig(
        pools={
            "inference": PoolPolicy(cohort="shared", lend_limit=lend or Quota()),
            "training": PoolPolicy(cohort="shared"),
        },
        borrow_half_life_seconds=half_life,
    )


def fleet(config: SchedulerConfig, *nodes: tuple[str, str, str, int]) -> Scheduler:
    """(name, pool, model key, GPUs) per node."""
    scheduler = Scheduler(config=config)
    for name, pool, model, gpus in nodes:
        topology = node(name, gpus=gpus, pool=pool, **MODELS[model]).model_copy(
            update={"labels": {"host": name}}
        )
        scheduler.handle(NodeTopologyReported(occurred_at=at(0), node=topology))
    return scheduler


def submit(task_id: str, when: float, gpus: int, pool: str, **gpu: Any) -> TaskProfiled:
    """A task of `pool`; `gpu` the GPU requirement's fields, and `top` (a dict under that
    key) the request's own (gang_size, affinity, node_selector)."""
    top = gpu.pop("top", {})
    request = TaskRequest.model_validate({**body(task_id, gpus, **gpu), "pool": pool, **top})
    return TaskProfiled(occurred_at=at(when), task=request, prediction=PREDICTION)


def task(task_id: str, when: float, gpus: int, policy: str, **top: Any) -> TaskProfiled:
    """An ordered task of pool training: h100, else a100-80gb, under `policy`."""
    return submit(
        task_id, when, gpus, "training", models=list(ORDER), models_policy=policy, top=top
    )


def granted(decisions: list[Event]) -> AllocationGranted:
    [grant] = of(decisions, AllocationGranted)
    return grant


def training_h100_full(config: SchedulerConfig) -> Scheduler:
    """Training's own H100s are full, its A100s free; inference's H100s idle."""
    scheduler = fleet(
        config,
        ("trn-h100", "training", "h100", 8),
        ("trn-a100", "training", "a100-80gb", 8),
        ("inf-h100", "inference", "h100", 8),
    )
    assert granted(scheduler.handle(submit("filler", 1, 8, "training", type="h100")))
    return scheduler


# (1) the first model borrowed before the second at home --------------------------------------


def test_borrow_takes_the_first_model_on_a_mate_where_next_takes_the_second_at_home() -> None:
    scheduler = training_h100_full(cohort())
    twin = copy.deepcopy(scheduler)
    grant = granted(scheduler.handle(task("t", 2, 4, "borrow")))
    assert (grant.node, grant.borrowed_from, grant.gpu_model) == (
        "inf-h100",
        "inference",
        "NVIDIA H100 80GB HBM3",
    )
    assert (
        "took h100, first choice of h100, a100-80gb, borrowed from pool inference "
        "(models_policy borrow: before a100-80gb on its own pool): h100 full (none of its 1 "
        "node in pool training has room now)" in grant.explanation
    )
    assert "borrowed 4 GPUs from pool inference" in grant.explanation
    home = granted(twin.handle(task("t", 2, 4, "next")))
    assert (home.node, home.borrowed_from) == ("trn-a100", None)
    assert "took a100-80gb, second choice of h100, a100-80gb: h100 full" in home.explanation


def test_the_dry_run_answers_what_the_submission_then_does() -> None:
    for policy, where in (("borrow", "inf-h100"), ("next", "trn-a100")):
        scheduler = training_h100_full(cohort())
        event = task("t", 2, 4, policy)
        answer = scheduler.dry_run_task(event.task, event.prediction)
        assert [m.node_id for m in answer.members] == [where], policy
        assert granted(scheduler.handle(event)).node == where


def test_borrow_takes_the_first_model_at_home_when_it_fits_there() -> None:
    scheduler = fleet(
        cohort(), ("trn-h100", "training", "h100", 8), ("inf-h100", "inference", "h100", 8)
    )
    grant = granted(scheduler.handle(task("t", 2, 4, "borrow")))
    assert (grant.node, grant.borrowed_from) == ("trn-h100", None)
    assert grant.explanation.endswith("took h100, first choice of h100, a100-80gb")


def test_the_second_model_goes_home_before_it_is_borrowed() -> None:
    """Neither pool has an H100 free; both have A100s free: the A100 at home."""
    scheduler = fleet(
        cohort(),
        ("trn-a100", "training", "a100-80gb", 8),
        ("inf-a100", "inference", "a100-80gb", 8),
    )
    grant = granted(scheduler.handle(task("t", 1, 4, "borrow")))
    assert (grant.node, grant.borrowed_from) == ("trn-a100", None)
    assert (
        "took a100-80gb, second choice of h100, a100-80gb: no h100 node in pool training; "
        "h100 not borrowed (cannot borrow: no idle node of pool inference fits)"
        in grant.explanation
    )


def test_the_last_model_borrowed_says_so() -> None:
    scheduler = fleet(
        cohort(),
        ("trn-a100", "training", "a100-80gb", 8),
        ("inf-a100", "inference", "a100-80gb", 8),
    )
    assert granted(scheduler.handle(submit("filler", 0, 8, "training", type="a100-80gb")))
    grant = granted(scheduler.handle(task("t", 1, 4, "borrow")))
    assert grant.borrowed_from == "inference"
    assert (
        "took a100-80gb, second choice of h100, a100-80gb, borrowed from pool inference "
        "(models_policy borrow: its last choice)" in grant.explanation
    )


# (2) the lender's rules still refuse: the next model at home --------------------------------


def test_a_lend_limit_sends_it_to_the_next_model_at_home() -> None:
    scheduler = training_h100_full(cohort(lend=Quota(gpus=2)))
    grant = granted(scheduler.handle(task("t", 2, 4, "borrow")))
    assert (grant.node, grant.borrowed_from) == ("trn-a100", None)
    assert (
        "h100 not borrowed (cannot borrow: pool inference lends no more (gpus 4 > 2))"
        in grant.explanation
    )


def test_a_mate_with_its_own_tasks_waiting_lends_nothing_so_the_next_model_at_home() -> None:
    scheduler = fleet(
        cohort(),
        ("trn-h100", "training", "h100", 8),
        ("trn-a100", "training", "a100-80gb", 8),
        ("inf-h100", "inference", "h100", 8),
        ("inf-l40s", "inference", "l40s", 8),
    )
    scheduler.handle(submit("filler", 1, 8, "training", type="h100"))
    scheduler.handle(submit("inf-filler", 1, 8, "inference", type="l40s"))
    assert of(scheduler.handle(submit("inf-waits", 2, 8, "inference", type="l40s")), TaskPending)
    grant = granted(scheduler.handle(task("t", 3, 4, "borrow")))
    assert (grant.node, grant.borrowed_from) == ("trn-a100", None)
    assert "pool inference has tasks of its own waiting" in grant.explanation


def test_nothing_fits_anywhere_the_task_waits_with_its_reason_to_borrow() -> None:
    scheduler = training_h100_full(cohort(lend=Quota(gpus=2)))
    scheduler.handle(submit("a100-filler", 2, 8, "training", type="a100-80gb"))
    waits = of(scheduler.handle(task("t", 3, 4, "borrow")), TaskPending)
    assert waits
    assert any(
        r.message == "cannot borrow: pool inference lends no more (gpus 4 > 2)"
        for r in waits[-1].reasons
    )


@pytest.mark.parametrize("half_life", [None, 600.0])
def test_a_waiting_task_borrows_its_first_model_once_the_lender_frees_it(
    half_life: float | None,
) -> None:
    """Through the retry pass (and with fair share, after it): inference's H100s were busy;
    when they free up the waiting task (training's A100s full too) borrows an H100."""
    scheduler = training_h100_full(cohort(half_life=half_life))
    scheduler.handle(submit("a100-filler", 2, 8, "training", type="a100-80gb"))
    assert granted(scheduler.handle(submit("inf-busy", 2, 8, "inference", type="h100")))
    assert of(scheduler.handle(task("t", 3, 4, "borrow")), TaskPending)
    grant = granted(scheduler.handle(stopped("inf-busy", 4)))
    assert (grant.task_id, grant.node, grant.borrowed_from) == ("t", "inf-h100", "inference")
    assert "borrowed from pool inference (models_policy borrow" in grant.explanation


# (3) a same-node gang: every member on one model ---------------------------------------------


def test_a_same_node_gang_borrows_its_first_model_whole() -> None:
    scheduler = training_h100_full(cohort())
    decisions = scheduler.handle(
        task("g", 2, 4, "borrow", gang_size=2, affinity={"gpu": "same-node"})
    )
    grants = of(decisions, AllocationGranted)
    assert [(g.node, g.borrowed_from) for g in grants] == [("inf-h100", "inference")] * 2
    assert {g.gpu_model for g in grants} == {"NVIDIA H100 80GB HBM3"}
    assert all("first choice of h100, a100-80gb, borrowed from" in g.explanation for g in grants)


# (4) no cohort: as next ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "config",
    [
        SchedulerConfig(),
        SchedulerConfig(pools={"training": PoolPolicy(), "inference": PoolPolicy()}),
        # a cohort elsewhere: lending runs, but not for training
        SchedulerConfig(
            pools={
                "training": PoolPolicy(),
                "inference": PoolPolicy(cohort="shared"),
                "batch": PoolPolicy(cohort="shared"),
            }
        ),
    ],
)
def test_without_a_cohort_borrow_decides_as_next(config: SchedulerConfig) -> None:
    scheduler = training_h100_full(config)
    twin = copy.deepcopy(scheduler)
    mine = granted(scheduler.handle(task("t", 2, 4, "borrow")))
    theirs = granted(twin.handle(task("t", 2, 4, "next")))
    assert (mine.node, mine.borrowed_from) == ("trn-a100", None)
    assert mine.explanation == theirs.explanation
    assert mine.gpu_ids == theirs.gpu_ids


# (5) the contract -------------------------------------------------------------------------------


def test_borrow_is_accepted_and_written_back() -> None:
    request = TaskRequest.model_validate(body("t", 1, models=list(ORDER), models_policy="borrow"))
    assert request.resource_requirements.gpu.models_policy == "borrow"
    assert '"models_policy":"borrow"' in request.model_dump_json()


@pytest.mark.parametrize(
    ("gpu", "field", "says"),
    [
        ({"models": ["h100"], "models_policy": "steal"}, "models_policy", "'wait' or 'borrow'"),
        (
            {"models": ["h100"], "models_policy": "borrow", "models_wait_seconds": 5},
            "models_wait_seconds",
            "only with models_policy wait",
        ),
        ({"models_policy": "borrow"}, "models_policy", "without models"),
    ],
)
def test_a_bad_borrow_policy_is_refused_naming_the_field(
    gpu: dict[str, Any], field: str, says: str
) -> None:
    with pytest.raises(ValidationError) as raised:
        TaskRequest.model_validate(body("t", 1, **gpu))
    [error] = field_errors(raised.value)
    assert error.field == f"resource_requirements.gpu.{field}"
    assert says in error.reason


# -- as a property --------------------------------------------------------------------------------

NODES = st.lists(
    st.tuples(
        st.sampled_from(["training", "inference"]),
        st.sampled_from(sorted(MODELS)),
        st.integers(min_value=0, max_value=8),
        st.integers(min_value=0, max_value=8),  # GPUs taken by a filler of its own pool
    ),
    min_size=1,
    max_size=5,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=NODES,
    gpus=st.integers(min_value=1, max_value=8),
    order=st.permutations(sorted(MODELS)),
)
def test_borrow_never_takes_a_later_model_than_next_nor_more_than_there_is(
    nodes: list[tuple[str, str, int, int]], gpus: int, order: list[str]
) -> None:
    """Against the same cluster with `next`: `borrow` never takes a model later in the list
    than the one `next` takes on its own pool, nothing is held past a node's capacity, and
    whatever it takes is one of its models."""
    scheduler = Scheduler(config=cohort())
    for i, (pool, model, size, _) in enumerate(nodes):
        topology = node(f"n{i}", gpus=size, pool=pool, **MODELS[model]).model_copy(
            update={"labels": {"host": f"n{i}"}}
        )
        scheduler.handle(NodeTopologyReported(occurred_at=at(0), node=topology))
    for i, (pool, _, size, used) in enumerate(nodes):
        if 0 < used <= size:
            selector = {"node_selector": {"host": f"n{i}"}}
            scheduler.handle(submit(f"f{i}", 1, used, pool, top=selector))
    twin = copy.deepcopy(scheduler)
    rank = {model: r for r, model in enumerate(order)}
    by_name = {v["gpu_model"]: k for k, v in MODELS.items()}
    mine = of(
        scheduler.handle(submit("t", 2, gpus, "training", models=order, models_policy="borrow")),
        AllocationGranted,
    )
    theirs = of(
        twin.handle(submit("t", 2, gpus, "training", models=order, models_policy="next")),
        AllocationGranted,
    )
    cluster = scheduler.cluster
    assert ((cluster.gpus_free >= 0) & (cluster.gpus_free <= cluster.gpus_total)).all()
    held: dict[str, list[int]] = {}
    for g in mine:
        held.setdefault(g.node, []).extend(g.gpu_ids)
    for name, ids in held.items():  # no card granted twice, none the node lacks
        assert len(set(ids)) == len(ids)
        assert set(ids) <= set(range(int(cluster.gpus_total[cluster.index[name]])))
    if theirs and theirs[0].borrowed_from is None:
        assert mine, "next placed it at home: borrow places it too"
        assert rank[by_name[mine[0].gpu_model or ""]] <= rank[by_name[theirs[0].gpu_model or ""]]
    if mine:
        assert by_name[mine[0].gpu_model or ""] in order
