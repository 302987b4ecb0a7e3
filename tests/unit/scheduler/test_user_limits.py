"""Per-user limits inside a tenant (issue 27, item 5; docs/queues.md, "Per-user limits"):
the quotas file's `per_user` and `users` limit what one user (the request's `user`) has at
once: running GPUs (over it the task waits, saying whose limit), tasks waiting and notebooks
(over them a submission is refused naming the field). Reloaded without a restart, restored
from storage, recorded in the audit configuration; a task naming no user decides as before."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crater.contracts import (
    AllocationGranted,
    Event,
    NodeTopologyReported,
    TaskPending,
    TaskProfiled,
    TaskRejected,
    TaskRequest,
)
from crater.scheduler.adapters.quotas_file import QuotasFileError, parse_quotas
from crater.scheduler.audit_state import config_from_json, config_json
from crater.scheduler.domain.core import Scheduler, SchedulerConfig
from crater.scheduler.domain.quotas import UserLimit, UserLimits
from tests.support.topologies import node
from tests.unit.scheduler.test_core import at
from tests.unit.scheduler.test_gpu_model_order import PREDICTION
from tests.unit.scheduler.test_preemption_thrashing import of, stopped

QUOTAS = """
tenants:
  acme:
    guarantee: {gpus: 16}
    per_user: {running_gpus: 4, queued_tasks: 2, notebooks: 1}
    users:
      alice: {running_gpus: 6}
  solo:
    per_user: {queued_tasks: 1}
  plain: {gpus: 8}
"""


def submit(
    task_id: str, when: float, gpus: int, user: str | None = "bob", **top: Any
) -> TaskProfiled:
    body: dict[str, Any] = {
        "task_id": task_id,
        "task_type": "training",
        "model_config": {"name": "m"},
        "tenant": top.pop("tenant", "acme"),
        "resource_requirements": {
            "gpu": {"count": gpus},
            "cpu": {"cores": 1},
            "memory": {"capacity_mb": 1000},
        },
        **top,
    }
    if user is not None:
        body["user"] = user
    return TaskProfiled(
        occurred_at=at(when), task=TaskRequest.model_validate(body), prediction=PREDICTION
    )


def limited(text: str = QUOTAS, *node_gpus: int) -> Scheduler:
    tenants = parse_quotas(text)
    config = SchedulerConfig(
        quotas=tenants.limits, tenant_shares=tenants.shares, user_limits=tenants.users
    )
    scheduler = Scheduler(config=config)
    for i, gpus in enumerate(node_gpus or (8, 8)):
        scheduler.handle(NodeTopologyReported(occurred_at=at(0), node=node(f"n{i}", gpus=gpus)))
    return scheduler


def granted(decisions: list[Event]) -> list[str]:
    return [g.task_id for g in of(decisions, AllocationGranted)]


def refused(decisions: list[Event]) -> TaskRejected:
    [rejection] = of(decisions, TaskRejected)
    return rejection


# -- the quotas file ---------------------------------------------------------------------------


def test_the_file_gives_each_user_the_tenants_limits_and_a_named_user_its_own_over_them() -> None:
    tenants = parse_quotas(QUOTAS)
    acme = tenants.users["acme"]
    assert acme.of("bob") == UserLimit(running_gpus=4, queued_tasks=2, notebooks=1)
    assert acme.of("alice") == UserLimit(running_gpus=6, queued_tasks=2, notebooks=1)
    assert acme.source("acme", "alice", "running_gpus") == "tenants.acme.users.alice.running_gpus"
    assert acme.source("acme", "alice", "queued_tasks") == "tenants.acme.per_user.queued_tasks"
    # a tenant with per-user limits only has no quota of its own; the others are as before
    assert "solo" not in tenants.limits
    assert "solo" not in tenants.shares
    assert tenants.users["solo"].of("x") == UserLimit(queued_tasks=1)
    assert set(tenants.limits) == {"plain"}
    assert set(tenants.shares) == {"acme"}


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("tenants:\n  a:\n    per_user: {running_gpus: -1}\n", "tenants.a.per_user.running_gpus"),
        ("tenants:\n  a:\n    per_user: {queued: 3}\n", "tenants.a.per_user.queued"),
        ("tenants:\n  a:\n    users:\n      Bob!: {notebooks: 1}\n", "tenants.a.users.Bob!"),
        (
            "tenants:\n  a:\n    users:\n      bob: {notebooks: 1.5}\n",
            "tenants.a.users.bob.notebooks",
        ),
    ],
)
def test_a_bad_per_user_limit_is_refused_naming_the_field(text: str, field: str) -> None:
    with pytest.raises(QuotasFileError) as raised:
        parse_quotas(text)
    assert field in str(raised.value)


def test_the_audit_record_of_the_configuration_keeps_the_user_limits() -> None:
    config = limited().config
    again = config_from_json(config_json(config), config.token_secret)
    assert again.user_limits == config.user_limits


# -- running GPUs: over the limit a task waits, saying whose ------------------------------------


def test_a_user_at_its_running_gpu_limit_waits_naming_itself_and_the_limit() -> None:
    scheduler = limited()
    assert granted(scheduler.handle(submit("b1", 1, 4))) == ["b1"]
    decisions = scheduler.handle(submit("b2", 2, 1))
    [waits] = of(decisions, TaskPending)
    [why] = waits.reasons
    assert (why.filter, why.code) == ("UserLimit", "UserGpuLimit")
    assert why.message == (
        "user bob of tenant acme holds 4 of its 4 running GPUs "
        "(tenants.acme.per_user.running_gpus); the task would take it to 5"
    )
    assert waits.summary == f"0/2 nodes available: {why.message}"
    # another user of the tenant is not held by bob's limit; alice's own is 6
    assert granted(scheduler.handle(submit("a1", 3, 6, user="alice"))) == ["a1"]
    # bob's first task ends: his waiting one goes
    assert granted(scheduler.handle(stopped("b1", 4))) == ["b2"]


def test_a_gang_counts_every_member_against_the_users_limit() -> None:
    scheduler = limited()
    [waits] = of(scheduler.handle(submit("g", 1, 3, gang_size=2)), TaskRejected)
    assert waits.errors[0].field == "resource_requirements.gpu.count"
    assert "may hold 4 running GPUs (tenants.acme.per_user.running_gpus); the task alone: 6" in (
        waits.errors[0].reason
    )


def test_a_task_no_user_limit_could_ever_let_run_is_refused_naming_the_field() -> None:
    rejection = refused(limited().handle(submit("big", 1, 5)))
    assert [e.field for e in rejection.errors] == ["resource_requirements.gpu.count"]
    assert rejection.errors[0].reason == (
        "user 'bob' of tenant 'acme' may hold 4 running GPUs "
        "(tenants.acme.per_user.running_gpus); the task alone: 5"
    )


def test_a_task_naming_no_user_is_held_by_no_user_limit() -> None:
    scheduler = limited()
    assert granted(scheduler.handle(submit("x1", 1, 8, user=None))) == ["x1"]


def test_a_task_its_users_limit_holds_claims_no_guarantee_from_other_tenants() -> None:
    """acme's bob waits on his own limit, within acme's guarantee: beta may still borrow
    (no owner of acme could take the capacity back anyway)."""
    text = QUOTAS + "  beta:\n    guarantee: {gpus: 2}\n"
    scheduler = limited(text, 8)
    scheduler.handle(submit("b1", 1, 4))
    assert of(scheduler.handle(submit("b2", 2, 1)), TaskPending)  # his limit, not acme's
    decisions = scheduler.handle(submit("beta-1", 3, 3, user=None, tenant="beta"))
    assert granted(decisions) == ["beta-1"]  # borrows 1 above its guarantee of 2


# -- queued tasks and notebooks: refused at admission ------------------------------------------


def test_one_task_more_than_the_users_queued_limit_is_refused_naming_the_user() -> None:
    scheduler = limited(QUOTAS, 4)
    assert granted(scheduler.handle(submit("run", 1, 4, user="alice"))) == ["run"]
    for i in (1, 2):  # the node is full: both wait
        assert of(scheduler.handle(submit(f"w{i}", 1 + i, 2)), TaskPending)
    rejection = refused(scheduler.handle(submit("w3", 4, 1)))
    assert [e.field for e in rejection.errors] == ["user"]
    assert rejection.errors[0].reason == (
        "user 'bob' of tenant 'acme' has 2 tasks waiting, as many as it may "
        "(tenants.acme.per_user.queued_tasks: 2); submit again once one has started or ended"
    )
    # other users are not counted against bob; once one of his has ended, he may again
    assert of(scheduler.handle(submit("c1", 5, 1, user="carol")), TaskPending)
    scheduler.handle(stopped("w1", 6))
    assert of(scheduler.handle(submit("w4", 7, 1)), TaskPending)


def test_one_notebook_more_than_the_users_limit_is_refused_and_other_work_is_not() -> None:
    scheduler = limited()
    assert granted(scheduler.handle(submit("nb1", 1, 1, interactive=True))) == ["nb1"]
    rejection = refused(scheduler.handle(submit("nb2", 2, 1, interactive=True)))
    assert [e.field for e in rejection.errors] == ["interactive"]
    assert "has 1 notebooks (waiting or placed), as many as it may" in rejection.errors[0].reason
    assert granted(scheduler.handle(submit("job", 3, 1))) == ["job"]
    scheduler.handle(stopped("nb1", 4))
    assert granted(scheduler.handle(submit("nb3", 5, 1, interactive=True))) == ["nb3"]


def test_a_dry_run_says_the_submission_would_be_refused() -> None:
    scheduler = limited()
    scheduler.handle(submit("nb1", 1, 1, interactive=True))
    event = submit("nb2", 2, 1, interactive=True)
    answer = scheduler.dry_run_task(event.task, event.prediction)
    assert answer.outcome == "rejected"
    assert [e.field for e in answer.errors] == ["interactive"]


# -- reload and restore ---------------------------------------------------------------------------


def test_raising_a_users_limit_on_reload_lets_its_waiting_task_go() -> None:
    scheduler = limited()
    scheduler.handle(submit("b1", 1, 4))
    assert of(scheduler.handle(submit("b2", 2, 2)), TaskPending)
    raised = QUOTAS.replace("alice: {running_gpus: 6}", "bob: {running_gpus: 6}")
    tenants = parse_quotas(raised)
    config = SchedulerConfig(
        quotas=tenants.limits, tenant_shares=tenants.shares, user_limits=tenants.users
    )
    assert scheduler.reconfigure(config) is None
    assert granted(scheduler.handle(stopped("nothing", 3))) == ["b2"]


def test_a_restored_core_counts_the_users_restored_grants() -> None:
    live = limited()
    live.handle(submit("b1", 1, 4))
    held = [copy.copy(a) for a in live.allocations.values()]
    for allocation in held:
        allocation.peers = []
    restored = Scheduler(config=live.config)
    restored.restore(
        nodes=[(n.topology, n.condition, n.last_heartbeat_at) for n in live.cluster.nodes],
        allocations=held,
        pending=[],
        next_seq=10,
    )
    assert restored.quotas.user_gpus == {("acme", "bob"): 4}
    [waits] = of(restored.handle(submit("b2", 2, 1)), TaskPending)
    assert waits.reasons[0].code == "UserGpuLimit"


# -- as a property --------------------------------------------------------------------------------

STEPS = st.lists(
    st.tuples(
        st.sampled_from(["alice", "bob", None]),
        st.integers(min_value=0, max_value=4),  # GPUs (0: a CPU task)
        st.booleans(),  # a notebook
        # stop an earlier task, now and then (most steps only add: limits are met)
        st.one_of(st.none(), st.none(), st.none(), st.integers(min_value=0, max_value=30)),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=STEPS)
def test_no_user_ever_holds_waits_or_keeps_more_than_its_limits(
    steps: list[tuple[str | None, int, bool, int | None]],
) -> None:
    """Whatever arrives and ends: each user's GPUs held stay within its running limit and
    are exactly what its grants hold; its waiting tasks within its queued limit; its
    notebooks within its notebook limit; a refusal names the limit it met."""
    scheduler = limited(QUOTAS, 4, 4)
    limits: UserLimits = scheduler.config.user_limits["acme"]
    submitted: list[str] = []
    for i, (user, gpus, notebook, stop) in enumerate(steps):
        if stop is not None and submitted:
            scheduler.handle(stopped(submitted[stop % len(submitted)], i + 0.5))
        task_id = f"t{i}"
        decisions = scheduler.handle(submit(task_id, i + 1, gpus, user=user, interactive=notebook))
        submitted.append(task_id)
        for rejection in of(decisions, TaskRejected):
            assert {e.field for e in rejection.errors} <= {
                "user",
                "interactive",
                "resource_requirements.gpu.count",
            }
        for name in ("alice", "bob"):
            limit = limits.of(name)
            heads = [
                a
                for a in scheduler.allocations.values()
                if a.task is not None and a.task.request.user == name
            ]
            held = sum(m.usage.gpus for a in heads for m in a.members())
            assert held <= (limit.running_gpus or 0) + 1e-9
            assert scheduler.quotas.user_gpus.get(("acme", name), 0) == pytest.approx(held)
            waiting = [t for t in scheduler.pending.values() if t.request.user == name]
            assert len(waiting) <= (limit.queued_tasks or 0)
            notebooks = [
                t for t in [*waiting, *(a.task for a in heads)] if t and t.request.interactive
            ]
            assert len(notebooks) <= (limit.notebooks or 0)
